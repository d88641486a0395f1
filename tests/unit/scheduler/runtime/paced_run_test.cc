// The engine's schedule at full width without a GPU: 8 paced workers, a 24-layer model, the
// real controller against the simulator on the same partition. Both must agree on the order in
// which stage slots start (and the worker each runs on) and on the iteration time.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "scheduler/planning/comparison.h"
#include "scheduler/planning/partition.h"
#include "scheduler/runtime/paced_run.h"

namespace rp::scheduler::runtime {
namespace {

// 24 layers: embedding, 22 blocks, a heavy head (times in seconds per micro-batch).
planning::Profile Profile24() {
  planning::Profile p;
  p.name = "paced test: 22 blocks";
  p.costs.layers.push_back({planning::LayerKind::kEmbedding, 0, 0, 0});
  for (int b = 0; b < 22; ++b) p.costs.layers.push_back({planning::LayerKind::kBlock, 0.004, 0.011, 0.013});
  p.costs.layers.push_back({planning::LayerKind::kHead, 0.006, 0.012, 0.020});
  return p;
}

spec::ModelConfig Model24() {
  spec::ModelConfig c;
  c.vocab = 512;
  c.hidden = 64;
  c.intermediate = 128;
  c.num_blocks = 22;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  return c;
}

PacedRunOptions Options(bool async) {
  PacedRunOptions o;
  o.profile = Profile24();
  o.model = Model24();
  o.workers = 8;
  o.microbatches = 16;
  o.async = async;
  o.microbatch_rows = 1;
  o.sequence_length = 16;
  // Sync mode's barrier between iterations is host work (the step, the next dispatch: about 5 ms
  // of wall time on a loaded 2-core machine) that a smaller scale would magnify; async has none.
  o.time_scale = async ? 0.3 : 0.5;
  o.iterations = 3;
  o.warmup = 2;
  return o;
}

planning::Partition SimulatorsChoice(const PacedRunOptions& o) {
  auto costs = PacedCosts(o);
  EXPECT_TRUE(costs.ok()) << costs.status();
  planning::PartitionProblem problem{&*costs, o.workers, o.microbatches, 0};
  planning::SimulatedChoice choice;
  choice.mode = o.async ? planning::OptimizerMode::kAsync : planning::OptimizerMode::kSync;
  auto r = planning::SimulatedBestPartition(problem, choice);
  EXPECT_TRUE(r.ok()) << r.status();
  return r->partition;
}

// Where the engine's order of slot starts departs from the simulator's: the first slot the
// engine started although the simulator starts it more than `slack_s` after one the engine
// started later, or a slot on another worker. Empty: they agree.
std::string OrderDifference(const PacedRunResult& engine, const SimulatedRun& sim, double slack_s) {
  std::map<std::pair<int, int>, SlotStart> simulated;
  for (const SlotStart& s : sim.starts) simulated[{s.iteration, s.slot}] = s;
  double latest = -1e300;
  std::pair<int, int> latest_key{-1, -1};
  for (const SlotStart& e : engine.starts) {
    auto it = simulated.find({e.iteration, e.slot});
    if (it == simulated.end()) continue;  // an iteration the simulator's window does not hold
    if (it->second.worker != e.worker) {
      return absl::StrCat("iteration ", e.iteration, " slot ", e.slot, ": engine worker ", e.worker,
                          ", simulator worker ", it->second.worker);
    }
    if (it->second.start_s + slack_s < latest) {
      return absl::StrCat("iteration ", e.iteration, " slot ", e.slot, " (simulated start ", it->second.start_s,
                          " s) started after iteration ", latest_key.first, " slot ", latest_key.second,
                          " (simulated start ", latest, " s)");
    }
    if (it->second.start_s > latest) {
      latest = it->second.start_s;
      latest_key = {e.iteration, e.slot};
    }
  }
  return "";
}

// Slots the simulator starts less than this apart (real seconds; a micro-batch of a slot takes
// 4-30 ms here) may start in either order: a loaded machine delays a wake-up by a few ms of wall
// time, i.e. up to 30 ms of real time at scale 0.2 (measured with both cores busy elsewhere).
constexpr double kSlack = 0.05;

// The share of all CPU time the hypervisor gave this machine's vCPUs to others (/proc/stat's
// steal) between two readings. A burstable virtual machine whose CPU credit is spent shows
// 20-30 % here under load, and then every wake-up a paced run is made of comes late (measured:
// the same engine 27 % slower than in a quiet minute, order unchanged).
struct CpuTimes {
  double steal = 0, total = 0;
  static CpuTimes Now() {
    std::ifstream stat("/proc/stat");
    std::string cpu;
    CpuTimes t;
    stat >> cpu;
    for (int field = 0; field < 10 && stat; ++field) {
      double v = 0;
      stat >> v;
      t.total += v;
      if (field == 7) t.steal = v;
    }
    return t;
  }
  double StealSince(const CpuTimes& before) const {
    return total > before.total ? (steal - before.steal) / (total - before.total) : 0;
  }
};

struct Measured {
  PacedRunResult run;
  double steal = 0;  // during that run
};

// Runs until one run's period lies within `tolerance` of `reference_s` (at most five runs, a
// pause after a stolen one to let the host settle) and returns the fastest with its steal. The
// host's noise (scheduler, steal) only ever delays a paced run, never speeds it up, so the
// fastest run is the best estimate of the engine's own schedule.
absl::StatusOr<Measured> FastestRun(const PacedRunOptions& o, double reference_s, double tolerance) {
  std::optional<Measured> best;
  for (int k = 0; k < 5; ++k) {
    const CpuTimes before = CpuTimes::Now();
    auto r = RunPaced(o);
    if (!r.ok()) return r.status();
    const double steal = CpuTimes::Now().StealSince(before);
    if (!best || r->period_s < best->run.period_s) best = Measured{std::move(*r), steal};
    if (std::abs(best->run.period_s / reference_s - 1.0) <= tolerance) break;
    if (steal > 0.02) std::this_thread::sleep_for(std::chrono::seconds(2));
  }
  return *best;
}

// The engine's period against the simulator's: within `tolerance`, widened above by the steal
// measured during the run (a stolen vCPU delays the wake-ups it holds); a quiet host gets none.
void ExpectPeriodNear(const Measured& m, double sim_period_s, double tolerance) {
  const double ratio = m.run.period_s / sim_period_s;
  const double slack = m.steal > 0.02 ? m.steal : 0.0;
  std::cerr << "  engine/simulator " << ratio << ", steal " << m.steal << "\n";
  EXPECT_GE(ratio, 1.0 - tolerance);
  EXPECT_LE(ratio, 1.0 + tolerance + slack)
      << "engine " << m.run.period_s << " s, simulator " << sim_period_s << " s, steal " << m.steal;
}

class PacedRunTest : public ::testing::Test {
 protected:
  // The host work of a paced run is small; LibTorch's spinning intra-op threads would only take
  // the cores from the stream threads.
  void SetUp() override { at::set_num_threads(1); }
};

TEST_F(PacedRunTest, TheEngineRunsTheSimulatedScheduleAtFullWidth) {
  for (bool async : {false, true}) {
    SCOPED_TRACE(async ? "async" : "sync");
    PacedRunOptions o = Options(async);
    o.partition = SimulatorsChoice(o);
    auto sim = SimulatePaced(o);
    ASSERT_TRUE(sim.ok()) << sim.status();
    auto measured = FastestRun(o, sim->period_s, 0.05);
    ASSERT_TRUE(measured.ok()) << measured.status();
    const PacedRunResult* run = &measured->run;
    ASSERT_FALSE(run->starts.empty());
    std::cerr << (async ? "async" : "sync") << " " << o.partition.ToString() << ": engine " << run->period_s
              << " s, bubble " << run->bubble << "; simulator " << sim->period_s << " s, bubble " << sim->bubble
              << "\n";
    EXPECT_EQ(OrderDifference(*run, *sim, kSlack), "") << o.partition.ToString();
    ExpectPeriodNear(*measured, sim->period_s, 0.05);
  }
}

// The comparison can fail: an engine that waits for the upstream gradient before recomputing
// (the rule removed) runs a schedule the simulator with the rule does not predict.
TEST_F(PacedRunTest, AnEngineWithoutRecomputeAheadIsCaught) {
  PacedRunOptions o = Options(/*async=*/false);
  o.partition = SimulatorsChoice(o);
  auto sim = SimulatePaced(o);
  ASSERT_TRUE(sim.ok()) << sim.status();
  PacedRunOptions without = o;
  without.recompute_ahead = false;
  auto sim_without = SimulatePaced(without);
  ASSERT_TRUE(sim_without.ok()) << sim_without.status();
  auto measured = FastestRun(without, sim_without->period_s, 0.05);
  ASSERT_TRUE(measured.ok()) << measured.status();
  const PacedRunResult* run = &measured->run;
  const std::string order = OrderDifference(*run, *sim, kSlack);
  const bool order_differs = !order.empty();
  std::cerr << "without the rule: engine " << run->period_s << " s; simulator with it " << sim->period_s
            << " s; order: " << order << "\n";
  const bool time_differs = std::abs(run->period_s / sim->period_s - 1.0) > 0.06;
  EXPECT_TRUE(order_differs || time_differs) << "engine " << run->period_s << " s, simulator " << sim->period_s;
  // And the simulator without the rule predicts that engine, order and time.
  std::cerr << "simulator without the rule " << sim_without->period_s << " s\n";
  ExpectPeriodNear(*measured, sim_without->period_s, 0.05);
  EXPECT_EQ(OrderDifference(*run, *sim_without, kSlack), "");
  // The order check catches a slot on another worker and a slot started out of turn.
  SimulatedRun moved = *sim_without;
  moved.starts[3].worker = (moved.starts[3].worker + 1) % o.workers;
  EXPECT_NE(OrderDifference(*run, moved, kSlack), "");
  SimulatedRun swapped = *sim_without;
  std::swap(swapped.starts[2].start_s, swapped.starts[swapped.starts.size() - 1].start_s);
  EXPECT_NE(OrderDifference(*run, swapped, kSlack), "");
}

TEST(PacedRunErrors, AProfileThatDoesNotFitTheModelIsRefused) {
  PacedRunOptions o = Options(false);
  o.profile.costs.layers.pop_back();
  o.partition = {{4}, 1, {}};
  auto run = RunPaced(o);
  EXPECT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(run.status().message().find("layers"), std::string::npos) << run.status();
}

}  // namespace
}  // namespace rp::scheduler::runtime
