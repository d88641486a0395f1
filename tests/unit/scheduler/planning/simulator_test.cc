#include "scheduler/planning/simulator.h"

#include <gtest/gtest.h>

#include <map>

#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/schedules.h"

namespace rp::planning {
namespace {

CostModel Uniform(int L, double f, double b) {
  CostModel c;
  for (int l = 0; l < L; ++l) {
    LayerCost x;
    x.fwd_s = f;
    x.bwd_s = b;
    x.fused_s = b;
    x.param_bytes = 1000;
    c.layers.push_back(x);
  }
  c.tokens_per_microbatch = 10;
  c.boundary_bytes_per_token = 10;
  return c;
}

// The paper's rule: a backward stage starts once every input is there. The closed forms below are
// for it; recompute-ahead (the default of SimOptions) is tested on its own.
SimOptions PaperRule() {
  SimOptions o;
  o.recompute_ahead = false;
  return o;
}

SimSchedule RoundPipe(const CostModel& c, const Partition& p, int N, int M, int MR, int K, OptimizerMode mode,
                      SimOptions so = PaperRule()) {
  DispatchOptions o;
  o.num_workers = N;
  o.microbatches_per_iteration = M;
  o.microbatches_per_round = MR;
  o.iterations = K;
  o.mode = mode;
  auto plan = BuildDispatchPlan(p, c.num_layers(), o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  auto s = RoundPipeSchedule(*plan, c, so);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// Every dependency respected; a resource runs one task at a time, in its order.
void ExpectConsistent(const SimSchedule& s, const SimResult& r) {
  for (size_t t = 0; t < s.tasks.size(); ++t) {
    for (const TaskDep& d : s.tasks[t].deps) {
      const double at = d.on_start ? r.start[static_cast<size_t>(d.task)] : r.finish[static_cast<size_t>(d.task)];
      // A tail-only dependency gates the part after the head: it starts at finish - tail.
      const double tail = s.tasks[t].duration_s * (1 - s.tasks[t].head_fraction);
      const double gated = d.tail_only ? r.finish[t] - tail : r.start[t];
      ASSERT_GE(gated + 1e-12, at + d.latency_s) << s.name << " task " << t << " dep " << d.task;
    }
  }
  for (const auto& ord : s.order) {
    for (size_t i = 1; i < ord.size(); ++i) {
      ASSERT_GE(r.start[static_cast<size_t>(ord[i])] + 1e-12, r.finish[static_cast<size_t>(ord[i - 1])]) << s.name;
    }
  }
}

TEST(Simulator, RoundPipeClosedFormForBalancedSlots) {
  // 4 layers, all slot times 1: F[1,1,1] B1=1 B[1,1,1] -> S = 7.
  CostModel c = Uniform(4, 1, 1);
  const Partition p{{1, 1, 1}, 1, {1, 1, 1}};
  // The closed form N(N-1)/(M*S + N(N-1)) is exact when every worker's slots tile the round:
  // M_R = N (any S), or S a multiple of N. (With M_R > N and S mod N != 0 one iteration ends on
  // an uneven wave; the async steady state below closes it.)
  for (auto [N, M, MR] : std::vector<std::tuple<int, int, int>>{
           {2, 2, 0}, {4, 4, 0}, {3, 6, 3}, {4, 8, 4}, {4, 16, 4}, {1, 3, 0}, {7, 14, 0}, {7, 7, 0}}) {
    SimSchedule s = RoundPipe(c, p, N, M, MR, 1, OptimizerMode::kSync);
    auto r = Simulate(s);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectConsistent(s, *r);
    const double S = 7;
    EXPECT_NEAR(r->bubble_ratio, N * (N - 1.0) / (M * S + N * (N - 1.0)), 1e-12) << "N=" << N << " M=" << M;
  }
}

TEST(Simulator, GPipeAnd1F1BClosedForm) {
  for (auto [N, M] : std::vector<std::pair<int, int>>{{2, 4}, {4, 4}, {4, 16}, {8, 16}, {3, 1}}) {
    CostModel c = Uniform(N, 1.0, 2.5);  // one layer per stage, backward 2.5x forward
    for (Baseline b : {Baseline::kGPipe, Baseline::k1F1B}) {
      auto s = BaselineSchedule(b, c, {N, M, 1, 1, 0}, {});
      ASSERT_TRUE(s.ok()) << s.status();
      auto r = Simulate(*s);
      ASSERT_TRUE(r.ok()) << r.status();
      ExpectConsistent(*s, *r);
      const double S = N;
      EXPECT_NEAR(r->bubble_ratio, (S - 1) / (M + S - 1), 1e-12) << BaselineName(b) << " N=" << N << " M=" << M;
    }
  }
}

TEST(Simulator, LoopedBFSClosedForm) {
  for (auto [N, M, v] : std::vector<std::tuple<int, int, int>>{{2, 4, 2}, {4, 4, 3}, {4, 8, 2}, {8, 16, 2}}) {
    CostModel c = Uniform(N * v, 1.0, 1.0);
    auto s = BaselineSchedule(Baseline::kLoopedBFS, c, {N, M, 1, v, 0}, {});
    ASSERT_TRUE(s.ok()) << s.status();
    auto r = Simulate(*s);
    ASSERT_TRUE(r.ok());
    ExpectConsistent(*s, *r);
    const double S = N * v;
    EXPECT_NEAR(r->bubble_ratio, N * (N - 1.0) / (S * M + N * (N - 1.0)), 1e-12) << N << " " << M << " " << v;
  }
}

TEST(Simulator, InterleavedBeatsPlain1F1BWhenBalanced) {
  const int N = 4, M = 8;
  CostModel c = Uniform(16, 1.0, 2.0);
  auto plain = *Simulate(*BaselineSchedule(Baseline::k1F1B, c, {N, M, 1, 1, 0}, {}));
  for (int v : {2, 4}) {
    auto s = BaselineSchedule(Baseline::kInterleaved1F1B, c, {N, M, 1, v, 0}, {});
    ASSERT_TRUE(s.ok()) << s.status();
    auto r = Simulate(*s);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectConsistent(*s, *r);
    EXPECT_LT(r->bubble_ratio, plain.bubble_ratio) << "v=" << v;
    // Megatron's estimate for the interleaved bubble: (N-1)/(v*M + N-1) (within a few percent).
    EXPECT_NEAR(r->bubble_ratio, (N - 1.0) / (v * M + N - 1.0), 0.05);
  }
  EXPECT_FALSE(BaselineSchedule(Baseline::kInterleaved1F1B, c, {N, 6, 1, 2, 0}, {}).ok());  // M % N != 0
}

ScheduleBuilder RoundPipeBuilder(const CostModel& c, const Partition& p, int N, int M, int MR, OptimizerMode mode,
                                 SimOptions so = {}) {
  return [=](int k, bool with_opt) -> absl::StatusOr<SimSchedule> {
    SimOptions o = so;
    if (!with_opt) o.optimizer_s_per_layer = 0;
    return RoundPipe(c, p, N, M, MR, k, mode, o);
  };
}

TEST(Simulator, AsyncRoundPipeHasNoSteadyStateBubbleWhenBalanced) {
  CostModel c = Uniform(4, 1, 1);
  const Partition p{{1, 1, 1}, 1, {1, 1, 1}};
  auto async = MeasureSteadyState(RoundPipeBuilder(c, p, 4, 8, 4, OptimizerMode::kAsync), 3, true, false);
  ASSERT_TRUE(async.ok()) << async.status();
  EXPECT_NEAR(async->bubble_ratio, 0, 1e-12);
  EXPECT_NEAR(async->period_s, 8 * 7 / 4.0, 1e-12);  // M*S slot-times of work over N workers
  auto sync = MeasureSteadyState(RoundPipeBuilder(c, p, 4, 8, 4, OptimizerMode::kSync), 3, true, false);
  ASSERT_TRUE(sync.ok());
  // Sync pays fill + drain every iteration: N(N-1) slot-times per iteration.
  EXPECT_NEAR(sync->bubble_ratio, 4 * 3.0 / (8 * 7 + 4 * 3.0), 1e-12);
  // With optimizer time the async pipeline hides it (per-layer steps overlap the next
  // iteration), the sync one pays it in full.
  SimOptions so;
  so.optimizer_s_per_layer = 0.25;
  auto async_opt = MeasureSteadyState(RoundPipeBuilder(c, p, 4, 8, 4, OptimizerMode::kAsync, so), 3, true, false);
  auto sync_opt = MeasureSteadyState(RoundPipeBuilder(c, p, 4, 8, 4, OptimizerMode::kSync, so), 3, true, false);
  ASSERT_TRUE(async_opt.ok() && sync_opt.ok());
  EXPECT_NEAR(async_opt->period_s, async->period_s, 1e-12);
  EXPECT_NEAR(sync_opt->period_s, sync->period_s + 4 * 0.25, 1e-12);
}

TEST(Simulator, AsyncHonoursTheLayerwiseConsistencyConstraints) {
  CostModel c = Uniform(6, 1, 3);
  const Partition p{{2, 2}, 2, {2, 2}};
  SimOptions so;
  so.optimizer_s_per_layer = 0.7;
  so.transfers = true;
  so.host_link_bandwidth = 2000;  // 1000-byte layers upload in 0.5
  SimSchedule s = RoundPipe(c, p, 3, 6, 3, 4, OptimizerMode::kAsync, so);
  auto r = Simulate(s);
  ASSERT_TRUE(r.ok()) << r.status();
  ExpectConsistent(s, *r);
  // Reconstruct per layer: optimizer step (k, l), uploads of iteration k covering l.
  std::map<std::pair<int, int>, int> opt;
  for (size_t t = 0; t < s.tasks.size(); ++t) {
    if (s.tasks[t].phase == TaskPhase::kOptimizer) opt[{s.tasks[t].iteration, s.tasks[t].layer}] = static_cast<int>(t);
  }
  ASSERT_EQ(opt.size(), 4u * 6);
  // Map each upload task to its layers through the compute task that depends on it.
  int checked = 0;
  for (size_t t = 0; t < s.tasks.size(); ++t) {
    const SimTask& task = s.tasks[t];
    if (task.resource >= s.num_workers) continue;
    for (const TaskDep& d : task.deps) {
      if (s.tasks[static_cast<size_t>(d.task)].phase != TaskPhase::kParamUpload) continue;
      const double up_start = r->start[static_cast<size_t>(d.task)];
      const double up_end = r->finish[static_cast<size_t>(d.task)];
      // Which layers? Stage slot -> layers from the partition layout.
      const int slot = task.stage;
      const int firsts[] = {0, 2, 4, 2, 0};
      for (int l = firsts[slot]; l < firsts[slot] + 2; ++l) {
        const int k = task.iteration;
        // Staleness 1: iteration k reads the weights stepped with iteration k-2's gradients...
        if (k >= 2) {
          EXPECT_GE(up_start + 1e-12, r->finish[static_cast<size_t>(opt[{k - 2, l}])]);
        }
        // ...and constraint 1: step k-1 may overwrite them only after this upload.
        if (k >= 1) {
          EXPECT_GE(r->start[static_cast<size_t>(opt[{k - 1, l}])] + 1e-12, up_end);
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 50);
}

TEST(Simulator, BaselinesRunEveryStageAndMicrobatchForwardAndBackwardOnce) {
  CostModel c = Uniform(13, 1.0, 2.0);
  for (Baseline b : {Baseline::kGPipe, Baseline::k1F1B, Baseline::kInterleaved1F1B, Baseline::kLoopedBFS}) {
    const int N = 3, M = 6, K = 2;
    const int v = (b == Baseline::kGPipe || b == Baseline::k1F1B) ? 1 : 4;
    std::vector<int> layers;
    auto s = BaselineSchedule(b, c, {N, M, K, v, 0}, {}, &layers);
    ASSERT_TRUE(s.ok()) << s.status();
    const int S = v * N;
    ASSERT_EQ(static_cast<int>(layers.size()), S);
    int covered = 0;
    for (int n : layers) covered += n;
    EXPECT_EQ(covered, 13);
    std::map<std::tuple<int, int, int, int>, int> seen;  // (iteration, bwd, stage, mb)
    for (const SimTask& t : s->tasks) {
      if (t.resource >= N) continue;
      EXPECT_EQ(t.resource, t.stage % N) << BaselineName(b);  // weights bound to GPUs
      ++seen[{t.iteration, t.phase == TaskPhase::kBackward, t.stage, t.microbatch}];
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(K * 2 * S * M)) << BaselineName(b);
    for (const auto& [key, n] : seen) EXPECT_EQ(n, 1) << BaselineName(b);
    auto r = Simulate(*s);
    ASSERT_TRUE(r.ok()) << r.status();
    ExpectConsistent(*s, *r);
  }
}

TEST(Simulator, ATailOnlyDependencyGatesOnlyTheTail) {
  SimSchedule s;
  s.name = "tail";
  s.num_workers = 2;
  s.num_resources = 2;
  s.Add({0, 2.0});  // produces the gradient at t = 2
  SimTask b{1, 3.0, {{0, 0.5, false, /*tail_only=*/true}}};
  b.head_fraction = 1.0 / 3;  // 1 s of recompute, then 2 s of backward
  s.Add(b);
  auto r = Simulate(s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->start[1], 0);      // the recompute does not wait
  EXPECT_DOUBLE_EQ(r->finish[1], 4.5);   // the backward starts at 2 + 0.5
  EXPECT_DOUBLE_EQ(r->gpu_work, 5);      // the wait inside the task is no work
  s.tasks[1].deps[0].tail_only = false;  // the paper's rule: 2.5 + 3
  r = Simulate(s);
  ASSERT_TRUE(r.ok());
  EXPECT_DOUBLE_EQ(r->start[1], 2.5);
  EXPECT_DOUBLE_EQ(r->finish[1], 5.5);
}

// Recompute-ahead only relaxes dependencies of a fixed-order schedule (a max-plus system), so no
// task ends later; where backward stages wait for their gradients it ends sooner.
TEST(Simulator, RecomputeAheadNeverLosesAndWinsWhereStagesWaitForGradients) {
  CostModel c = Uniform(8, 1, 3);
  c.layers.back().fwd_s = 2;  // a heavy head: the backward stages wait on B_1's gradients
  c.layers.back().fused_s = 7;
  for (OptimizerMode mode : {OptimizerMode::kSync, OptimizerMode::kAsync}) {
    bool won = false;
    for (const Partition& p :
         {Partition{{3, 4}, 1, {2, 2, 3}}, Partition{{7}, 1, {1, 1, 1, 1, 1, 1, 1}}, Partition{{2, 2, 2}, 2, {3, 3}}}) {
      SimOptions ahead;
      ahead.recompute_ahead = true;
      SimSchedule with = RoundPipe(c, p, 3, 6, 3, 3, mode, ahead);
      SimSchedule without = RoundPipe(c, p, 3, 6, 3, 3, mode);
      auto a = Simulate(with), b = Simulate(without);
      ASSERT_TRUE(a.ok() && b.ok());
      ExpectConsistent(with, *a);
      ASSERT_EQ(with.tasks.size(), without.tasks.size());
      for (size_t t = 0; t < with.tasks.size(); ++t) ASSERT_LE(a->finish[t], b->finish[t] + 1e-9) << t;
      EXPECT_DOUBLE_EQ(a->gpu_work, b->gpu_work);
      won = won || a->makespan < b->makespan - 1e-9;
    }
    EXPECT_TRUE(won) << OptimizerModeName(mode);
  }
}

// Baselines with an explicit partition as Megatron users write it (blocks per stage; the first
// stage holds the embedding, the last the head, so they may list 0): the min-max partition written
// that way simulates identically; an empty first and last stage is accepted; bad lists are refused.
TEST(Simulator, BaselinesTakeMegatronStylePartitions) {
  CostModel c = Uniform(14, 1, 3);  // embedding, 12 blocks, head
  for (Baseline b : {Baseline::k1F1B, Baseline::kInterleaved1F1B}) {
    const int v = b == Baseline::k1F1B ? 1 : 2;
    std::vector<int> layers;
    auto auto_part = BaselineSchedule(b, c, {3, 6, 2, v, 0}, {}, &layers);
    ASSERT_TRUE(auto_part.ok()) << auto_part.status();
    std::vector<int> blocks = layers;
    blocks.front() -= 1;
    blocks.back() -= 1;
    BaselineOptions given{3, 6, 2, v, 0, blocks};
    std::vector<int> used;
    auto explicit_part = BaselineSchedule(b, c, given, {}, &used);
    ASSERT_TRUE(explicit_part.ok()) << explicit_part.status();
    EXPECT_EQ(used, layers) << BaselineName(b);
    EXPECT_EQ(Simulate(*explicit_part)->makespan, Simulate(*auto_part)->makespan) << BaselineName(b);
    // Megatron's habit: nothing but the embedding on the first stage, the head alone on the last.
    std::vector<int> megatron(static_cast<size_t>(3 * v), 0);
    for (int k = 0; k < 12; ++k) megatron[1 + static_cast<size_t>(k % (3 * v - 2))] += 1;
    given.blocks_per_stage = megatron;
    auto m = BaselineSchedule(b, c, given, {}, &used);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_EQ(used.front(), 1);
    EXPECT_EQ(used.back(), 1);
    ExpectConsistent(*m, *Simulate(*m));
  }
  for (const auto& [blocks, needle] :
       std::vector<std::pair<std::vector<int>, std::string>>{{{4, 4, 3}, "3 stages of 11 blocks"},
                                                             {{4, 0, 8}, "only the first and the last may list 0"},
                                                             {{4, 4}, "2 stages"}}) {
    auto bad = BaselineSchedule(Baseline::k1F1B, c, {3, 6, 1, 1, 0, blocks}, {});
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(bad.status().message().find(needle), std::string::npos) << bad.status();
  }
}

TEST(Simulator, DetectsDeadlock) {
  SimSchedule s;
  s.name = "cycle";
  s.num_workers = 2;
  s.num_resources = 2;
  s.Add({0, 1.0, {{1}}});
  s.Add({1, 1.0, {{0}}});
  auto r = Simulate(s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("deadlock"), std::string::npos);
}

TEST(Simulator, BreakdownPartsAddUp) {
  CostModel c = Uniform(8, 1, 3);
  c.layers.back().fwd_s = 4;  // a heavy head
  c.layers.back().bwd_s = 12;
  c.layers.back().fused_s = 12;
  SimOptions so;
  so.optimizer_s_per_layer = 0.5;
  ScheduleBuilder build = [&](int k, bool with_opt) {
    return BaselineSchedule(Baseline::k1F1B, c, {4, 8, k, 1, 0}, with_opt ? so : SimOptions{});
  };
  auto b = AnalyzeBubbles(build, 3);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_NEAR(b->total, b->fill_drain + b->imbalance + b->optimizer, 1e-12);
  EXPECT_GT(b->imbalance, 0.05);  // the head stage dominates
  // 4 s of optimizer per iteration on the critical path, as a share of 4 workers x period.
  EXPECT_NEAR(b->optimizer, 4.0 / b->period_s, 1e-9);
  // The balanced variant's fill/drain is (S-1)/(M+S-1) of ITS iteration, a smaller share of the
  // longer actual one.
  EXPECT_GT(b->fill_drain, 0.05);
  EXPECT_LT(b->fill_drain, 3.0 / (8 + 3) + 1e-9);
}

}  // namespace
}  // namespace rp::planning
