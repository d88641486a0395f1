// partitioner_bench — wall time of AutoPartition (the exact search for the paper's objective)
// for L = 28, 36, 64, 94 blocks, and of the automatic partition the engine and roundpipe-sim
// use (SimulatedBestPartition: the exact search's candidates, their balanced twins and wider
// variants, each simulated in steady state; sync and async). A benchmark, not a test: it prints
// tables and never fails on timing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "scheduler/planning/comparison.h"
#include "scheduler/planning/cost_model.h"
#include "scheduler/planning/model_config.h"
#include "scheduler/planning/partition.h"

int main() {
  using rp::planning::PartitionProblem;
  std::printf("%-34s %6s %10s %10s %8s  %s\n", "cost model", "layers", "median ms", "min ms", "stages", "partition");
  auto device = *rp::planning::DevicePreset("rtx4090");
  struct Case {
    const char* label;
    rp::planning::CostModel costs;
  };
  std::vector<Case> cases;
  for (int blocks : {28, 36, 64, 94}) {
    auto m = *rp::planning::ModelPreset(blocks == 94 ? "qwen3-235b-a22b" : "llama-3.1-8b");
    m.num_blocks = blocks;
    cases.push_back({blocks == 94 ? "qwen3-235b-a22b (94 blocks)" : "llama-3.1-8b shape",
                     *rp::planning::AnalyticCostModel(m, device, {})});
  }
  for (auto& c : cases) {
    PartitionProblem pr{&c.costs, 8, 16, (device.memory_bytes - (int64_t{2} << 30)) / 2};
    std::vector<double> ms;
    rp::planning::PartitionResult res;
    for (int rep = 0; rep < 21; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      res = *rp::planning::AutoPartition(pr);
      const auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    std::printf("%-34s %6d %10.3f %10.3f %8d  %s\n", c.label, c.costs.num_layers(), ms[ms.size() / 2], ms.front(),
                res.partition.num_stages(), res.partition.ToString().c_str());
  }
  std::printf("\nsimulated choice (SimulatedBestPartition, N=8, M=16, median of 3)\n%-34s %6s %12s %12s\n",
              "cost model", "layers", "sync ms", "async ms");
  for (auto& c : cases) {
    PartitionProblem pr{&c.costs, 8, 16, (device.memory_bytes - (int64_t{2} << 30)) / 2};
    double t[2];
    for (int mode = 0; mode < 2; ++mode) {
      rp::planning::SimulatedChoice choice;
      choice.mode = mode == 0 ? rp::planning::OptimizerMode::kSync : rp::planning::OptimizerMode::kAsync;
      std::vector<double> ms;
      for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        (void)rp::planning::SimulatedBestPartition(pr, choice);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      t[mode] = ms[1];
    }
    std::printf("%-34s %6d %12.1f %12.1f\n", c.label, c.costs.num_layers(), t[0], t[1]);
  }
  return 0;
}
