// The profile round trip: a job's measured profile (per-layer times and the activation hop the
// engine measured), written and read back in the profile format, replayed by the simulator on
// the partition the job planned from it, predicts the job's measured iteration time.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/profile_file.h"
#include "scheduler/planning/schedules.h"
#include "scheduler/planning/simulator.h"
#include "scheduler/runtime/controller.h"
#include "tests/support/rig.h"
#include "tests/support/tiny_models.h"
#include "tests/support/tokens.h"

namespace rp::scheduler {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A model whose layers take tens of milliseconds on one CPU thread, so the engine's own
// dispatch costs are small beside them (the prediction has no term for them).
spec::ModelConfig MidSizeLlama() {
  spec::ModelConfig c = rp::testing::TinyLlama();
  c.vocab = 2048;
  c.hidden = 256;
  c.intermediate = 704;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 32;
  return c;
}

// One job: profiled, planned, measured; its profile written, read back (every time and the hop
// compared) and replayed. Returns predicted / measured iteration time, and says what it saw.
double RoundTrip(int attempt, std::string* seen) {
  const spec::ModelConfig cfg = MidSizeLlama();
  ControllerOptions o;
  o.auto_partition = true;
  o.profile_iterations = 2;
  o.microbatches = 4;
  const int workers = 2;
  auto e = rp::testing::MakeRig(cfg, workers, o);
  EXPECT_TRUE(e->controller);
  if (!e->controller) return 0;
  const int64_t rows = 1, seq = 256;
  std::vector<double> seconds, optimizer_seconds;
  std::string partition;
  for (int it = 0; it < 9; ++it) {
    auto st = e->controller->RunIteration(
        rp::testing::RandomTokens(rows * o.microbatches, seq, cfg.vocab, 7 + it + 100 * attempt));
    EXPECT_TRUE(st.ok()) << st.status();
    if (!st.ok()) return 0;
    // The planned partition applies from the iteration after profiling; the first one with it
    // is a warm-up.
    if (it >= 4) {
      seconds.push_back(st->seconds);
      optimizer_seconds.push_back(st->optimizer_seconds);
      if (partition.empty()) partition = st->partition;
      EXPECT_EQ(st->partition, partition) << "the plan changed after profiling";
    }
  }
  EXPECT_TRUE(e->controller->measured_costs().has_value()) << "the profile never completed";
  if (!e->controller->measured_costs()) return 0;
  const double hop = e->controller->measured_activation_hop_s();
  EXPECT_GT(hop, 0) << "the engine measured no activation hop";

  // Written and read back in the profile format: every time and the hop survive.
  planning::Profile written{"round trip", *e->controller->measured_costs(), hop};
  auto read = planning::ParseProfile(planning::ProfileJson(written));
  EXPECT_TRUE(read.ok()) << read.status();
  if (!read.ok()) return 0;
  EXPECT_EQ(read->costs.num_layers(), written.costs.num_layers());
  for (int l = 0; l < std::min(read->costs.num_layers(), written.costs.num_layers()); ++l) {
    const planning::LayerCost& a = written.costs.layers[static_cast<size_t>(l)];
    const planning::LayerCost& b = read->costs.layers[static_cast<size_t>(l)];
    EXPECT_DOUBLE_EQ(a.fwd_s, b.fwd_s) << l;
    EXPECT_DOUBLE_EQ(a.bwd_s, b.bwd_s) << l;
    EXPECT_DOUBLE_EQ(a.fused_s, b.fused_s) << l;
    EXPECT_EQ(a.param_bytes, b.param_bytes) << l;
  }
  EXPECT_DOUBLE_EQ(read->activation_hop_s, hop);

  // Replayed: one sync iteration of the planned partition with the measured hop and optimizer
  // time (weight uploads on the CPU backend are memory copies: a 100 GB/s link).
  planning::DispatchOptions d;
  d.num_workers = workers;
  d.microbatches_per_iteration = o.microbatches;
  d.iterations = 1;
  d.mode = planning::OptimizerMode::kSync;
  const planning::Partition& p = e->controller->partition();
  EXPECT_EQ(p.ToString(), partition);
  auto plan = planning::BuildDispatchPlan(p, read->costs.num_layers(), d);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return 0;
  planning::SimOptions so;
  so.transfers = true;
  so.host_link_bandwidth = 100e9;
  so.activation_hop_s = read->activation_hop_s;
  so.optimizer_s_per_layer = Median(optimizer_seconds) / read->costs.num_layers();
  auto schedule = planning::RoundPipeSchedule(*plan, read->costs, so);
  EXPECT_TRUE(schedule.ok()) << schedule.status();
  if (!schedule.ok()) return 0;
  auto sim = planning::Simulate(*schedule);
  EXPECT_TRUE(sim.ok()) << sim.status();
  if (!sim.ok()) return 0;
  const double predicted = sim->makespan, measured = Median(seconds);
  std::string layers;
  for (const planning::LayerCost& c : read->costs.layers)
    layers += absl::StrFormat(" %.2f/%.2f", c.fwd_s * 1e3, c.bwd_s * 1e3);
  *seen = absl::StrFormat(
      "predicted %.1f ms, measured %.1f ms (median of %d, %+.1f %%), partition %s, hop %.3f ms, layers (fwd/bwd "
      "ms):%s",
      predicted * 1e3, measured * 1e3, static_cast<int>(seconds.size()), 100 * (predicted / measured - 1), partition,
      hop * 1e3, layers);
  return predicted / measured;
}

// Tolerance: 20 % on a shared 2-core machine (RUN_SERIAL keeps other tests off it; a remaining
// difference is the engine's per-operation dispatch, which the profile does not measure). A
// burst of load from outside during the measured iterations (once in a full suite run: 338 ms
// measured against 265 predicted) slows the iteration and not its profile, so up to three jobs
// are tried; a broken prediction misses on all three (profile backward times dropped: -65 %).
TEST(ProfileRoundTrip, TheMeasuredProfileReplayedBySimulatorPredictsTheIteration) {
  at::set_num_threads(1);  // one core per worker: the two workers do not contend
  std::vector<std::string> attempts;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::string seen;
    const double ratio = RoundTrip(attempt, &seen);
    if (::testing::Test::HasFailure()) return;
    std::printf("round trip %d: %s\n", attempt, seen.c_str());
    attempts.push_back(seen);
    if (std::abs(ratio - 1) <= 0.20) return;
  }
  ADD_FAILURE() << "the replayed profile missed the measured iteration by more than 20 % three times:\n"
                << absl::StrJoin(attempts, "\n");
}

}  // namespace
}  // namespace rp::scheduler
