// partitioner_bench — wall time of AutoPartition (the exact search for the paper's objective)
// for L = 28, 36, 64, 94 blocks, and of the automatic partition the engine and roundpipe-sim
// use (SimulatedBestPartition: the exact search's candidates, their balanced twins and wider
// variants, each simulated in steady state; sync and async). Side by side in the same run: the
// exact search confined to the authors' window [W, 1.1 W] (PartitionProblem::t_max_window), and
// the simulated choice without its near-minimum candidates (SimulatedChoice::near_minimum_window
// = 0). A benchmark, not a test: it prints tables and never fails on timing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "scheduler/planning/comparison.h"
#include "scheduler/planning/cost_model.h"
#include "scheduler/planning/partition.h"
#include "scheduler/planning/presets.h"

int main() {
  using rp::planning::PartitionProblem;
  std::printf("%-34s %6s %10s %10s %12s %8s  %s\n", "cost model", "layers", "median ms", "min ms", "window1.1 ms",
              "stages", "partition");
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
    PartitionProblem windowed = pr;
    windowed.t_max_window = 1.1;
    std::vector<double> wms;
    for (int rep = 0; rep < 21; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      (void)rp::planning::AutoPartition(windowed);
      wms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(wms.begin(), wms.end());
    std::printf("%-34s %6d %10.3f %10.3f %12.3f %8d  %s\n", c.label, c.costs.num_layers(), ms[ms.size() / 2],
                ms.front(), wms[wms.size() / 2], res.partition.num_stages(), res.partition.ToString().c_str());
  }
  std::printf("\nsimulated choice (SimulatedBestPartition, N=8, M=16, median of 3)\n%-34s %6s %12s %12s %16s %16s\n",
              "cost model", "layers", "sync ms", "async ms", "sync no-near ms", "async no-near ms");
  for (auto& c : cases) {
    PartitionProblem pr{&c.costs, 8, 16, (device.memory_bytes - (int64_t{2} << 30)) / 2};
    double t[4];
    for (int k = 0; k < 4; ++k) {
      const int mode = k % 2;
      rp::planning::SimulatedChoice choice;
      choice.mode = mode == 0 ? rp::planning::OptimizerMode::kSync : rp::planning::OptimizerMode::kAsync;
      if (k >= 2) choice.near_minimum_window = 0;
      std::vector<double> ms;
      for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        (void)rp::planning::SimulatedBestPartition(pr, choice);
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      t[k] = ms[1];
    }
    std::printf("%-34s %6d %12.1f %12.1f %16.1f %16.1f\n", c.label, c.costs.num_layers(), t[0], t[1], t[2], t[3]);
  }
  return 0;
}
