// partitioner_bench — wall time of AutoPartition for L = 28, 36, 64, 94 layers (paper §5.8.1:
// the reference Python takes 2.9-5.0 ms up to 64 layers and 1.47 s at 94). A benchmark, not a
// test: it prints a table and never fails on timing.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

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
  return 0;
}
