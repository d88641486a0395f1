// The controller's automatic partition from measured times: the per-stage memory cap counts the
// activations at the batch's shape, min_stages is a floor, and an impossible cap keeps one layer
// per slot and says why.
#include "scheduler/runtime/controller.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "tests/support/reference_model.h"
#include "tests/support/rig.h"
#include "tests/support/tiny_models.h"
#include "tests/support/tokens.h"
#include "workers/device/device.h"

namespace rp::scheduler {
namespace {

using rp::testing::RandomTokens;
using rp::testing::TinyLlama;
using spec::ModelConfig;

// The automatic partition under a per-stage memory cap counts the activations autograd keeps
// (from the model shape at the profiled batches' micro-batch shape), not only the weights: with
// long sequences and a cap far above the whole model's weights the plan must still split.
TEST(ControllerAutoPartition, MemoryCapCountsActivationsAtTheBatchShape) {
  const spec::ModelConfig cfg = TinyLlama();
  ControllerOptions o;
  o.auto_partition = true;
  o.profile_iterations = 2;
  o.microbatches = 2;
  workers::HostModelStore probe(cfg, at::kFloat, 1);
  int64_t weights = 0;
  for (int i = 0; i < probe.num_params(); ++i) weights += static_cast<int64_t>(probe.param(i).master.nbytes());
  // Far above the whole model's weights and gradients, above any single layer's working set at
  // this batch shape (the largest: the head's 4096-token loss chunk, ~2.1 MB), below all layers'.
  o.stage_memory_cap = int64_t{3} << 20;
  ASSERT_GT(o.stage_memory_cap, 10 * weights);
  auto e = rp::testing::MakeRig(cfg, 1, o);
  ASSERT_TRUE(e->controller);
  const int64_t rows = 2, seq = 256;
  for (int it = 0; it < 4; ++it) {
    auto st = e->controller->RunIteration(RandomTokens(rows * o.microbatches, seq, cfg.vocab, 40 + it));
    ASSERT_TRUE(st.ok()) << st.status();
  }
  auto costs = e->controller->measured_costs();
  ASSERT_TRUE(costs.has_value()) << "the profile never completed";
  EXPECT_EQ(costs->tokens_per_microbatch, rows * seq);
  int64_t all_in_one = 0;
  for (int l = 0; l < costs->num_layers(); ++l) {
    EXPECT_GT(costs->layers[static_cast<size_t>(l)].act_bytes_per_token, 0) << "layer " << l;
    all_in_one += costs->BackwardMemory(l);
  }
  ASSERT_GT(all_in_one, o.stage_memory_cap) << "the test needs a cap that one fused stage would break";
  const planning::Partition& p = e->controller->partition();
  int fused_or_backward = 0;
  for (const planning::StageShape& st : planning::DescribeStages(p, *costs)) {
    EXPECT_LE(st.memory_bytes, o.stage_memory_cap) << p.ToString();
    fused_or_backward += st.kind != spec::StageKind::kForward;
  }
  EXPECT_GE(fused_or_backward, 2) << p.ToString();
}

// The authors' knobs in the engine: the partition planned from the measured times has at least
// min_stages slots (the free choice has fewer), and with a window of 1 its slowest slot is the
// least possible one of the measured costs. Bad values are refused before anything runs.
TEST(ControllerAutoPartition, MinStagesIsAFloorForThePlannedPartition) {
  const spec::ModelConfig cfg = TinyLlama();
  auto planned = [&](int min_stages, double window) {
    ControllerOptions o;
    o.auto_partition = true;
    o.profile_iterations = 2;
    o.microbatches = 2;
    o.min_stages = min_stages;
    o.t_max_window = window;
    auto e = rp::testing::MakeRig(cfg, 1, o);
    EXPECT_TRUE(e->controller);
    for (int it = 0; it < 4; ++it) {
      auto st = e->controller->RunIteration(RandomTokens(4, 32, cfg.vocab, 80 + it));
      EXPECT_TRUE(st.ok()) << st.status();
    }
    EXPECT_TRUE(e->controller->measured_costs().has_value());
    return std::make_pair(e->controller->partition(), *e->controller->measured_costs());
  };
  const auto [free, free_costs] = planned(0, 0);
  ASSERT_LT(free.num_stages(), 9) << free.ToString();
  const auto [floor, floor_costs] = planned(9, 0);
  EXPECT_GE(floor.num_stages(), 9) << floor.ToString();
  const auto [tight, tight_costs] = planned(0, 1.0);
  planning::PartitionProblem pr{&tight_costs, 1, 2, 0};
  const double w = *planning::MinimumTmax(pr);
  auto eval = planning::EvaluatePartition(pr, tight);
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_NEAR(eval->t_max, w, 1e-12 * w) << tight.ToString();

  ControllerOptions bad;
  bad.auto_partition = true;
  bad.microbatches = 2;
  bad.min_stages = 12;  // 6 layers make at most 11 slots
  auto st = Controller::ValidateOptions(bad, cfg, 1);
  EXPECT_NE(st.message().find("min_stages 12 is outside 0..11"), std::string::npos) << st;
  bad.min_stages = 0;
  bad.t_max_window = 0.9;
  EXPECT_NE(Controller::ValidateOptions(bad, cfg, 1).message().find("t_max_window"), std::string::npos);
  bad.t_max_window = 1.1;
  bad.auto_partition = false;
  bad.partition = {{3}, 3, {3}};
  EXPECT_NE(Controller::ValidateOptions(bad, cfg, 1).message().find("automatic partition only"), std::string::npos);
}

// A cap no single layer fits: the job goes on with the smallest stages there are (one layer per
// slot) and every iteration says why.
TEST(ControllerAutoPartition, AnImpossibleCapKeepsOneLayerPerSlotAndSaysWhy) {
  const spec::ModelConfig cfg = TinyLlama();
  ControllerOptions o;
  o.auto_partition = true;
  o.profile_iterations = 2;
  o.microbatches = 2;
  o.stage_memory_cap = 1024;  // bytes: not even the smallest layer's weights fit
  auto e = rp::testing::MakeRig(cfg, 1, o);
  ASSERT_TRUE(e->controller);
  IterationStats last;
  for (int it = 0; it < 4; ++it) {
    auto st = e->controller->RunIteration(RandomTokens(4, 16, cfg.vocab, 60 + it));
    ASSERT_TRUE(st.ok()) << st.status();
    if (it < 1) {
      EXPECT_TRUE(st->partition_problem.empty()) << "still profiling: " << st->partition_problem;
    }
    last = *st;
  }
  EXPECT_NE(last.partition_problem.find("automatic partition failed"), std::string::npos) << last.partition_problem;
  EXPECT_EQ(last.partition, "F[1,1,1,1,1] B1=1 B[1,1,1,1,1]");
}

}  // namespace
}  // namespace rp::scheduler
