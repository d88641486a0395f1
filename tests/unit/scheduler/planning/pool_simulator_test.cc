// The pool simulator: one job alone is exactly the single-job simulator (every task's start and
// end, sync and async, recompute ahead, transfers); jobs side by side never overlap on a worker
// and keep each job's own order; backlogged jobs split a worker by their shares; a job starts
// nothing before it was submitted; the gate's hold keeps a worker for a lane that comes back in
// time; a cycle is reported.
#include "scheduler/planning/pool_simulator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/schedules.h"
#include "scheduler/planning/simulator.h"
#include "tests/unit/scheduler/planning/growing_layers.h"

namespace rp::planning {
namespace {

SimSchedule RoundPipe(const CostModel& c, int N, int K, OptimizerMode mode, bool transfers) {
  DispatchOptions o;
  o.num_workers = N;
  o.microbatches_per_iteration = 8;
  o.iterations = K;
  o.mode = mode;
  o.g0 = 1;
  auto plan = BuildDispatchPlan(Partition{{2, 2}, 2, {2, 2}}, c.num_layers(), o);
  EXPECT_TRUE(plan.ok()) << plan.status();
  SimOptions so;
  so.transfers = transfers;
  so.host_link_bandwidth = 4000;
  so.optimizer_s_per_layer = 0.25;
  auto s = RoundPipeSchedule(*plan, c, so);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

// A hand-made job on one worker: `n` tasks of `duration`, each after the one before plus `gap`.
SimSchedule Chain(int n, double duration, double gap) {
  SimSchedule s;
  s.num_workers = 1;
  s.num_resources = 1;
  for (int i = 0; i < n; ++i) {
    SimTask t;
    t.duration_s = duration;
    if (i > 0) t.deps.push_back({i - 1, gap});
    s.Add(t);
  }
  return s;
}

TEST(PoolSimulator, OneJobAloneIsTheSingleJobSimulator) {
  const CostModel c = GrowingLayers(6);
  for (OptimizerMode mode : {OptimizerMode::kSync, OptimizerMode::kAsync}) {
    for (bool transfers : {false, true}) {
      const SimSchedule s = RoundPipe(c, 4, 3, mode, transfers);
      auto want = Simulate(s);
      ASSERT_TRUE(want.ok()) << want.status();
      auto got = SimulatePool({{s, 1.0, 0.0, mode == OptimizerMode::kAsync}});
      ASSERT_TRUE(got.ok()) << got.status();
      const PoolSimJobResult& j = got->jobs.front();
      for (size_t t = 0; t < s.tasks.size(); ++t) {
        ASSERT_DOUBLE_EQ(j.start[t], want->start[t]) << s.name << " transfers " << transfers << " task " << t;
        ASSERT_DOUBLE_EQ(j.finish[t], want->finish[t]) << s.name << " transfers " << transfers << " task " << t;
      }
      EXPECT_DOUBLE_EQ(got->makespan_s, want->makespan);
      EXPECT_EQ(j.iteration_end, want->iteration_end);
      EXPECT_NEAR(got->utilisation, 1 - want->bubble_ratio, 1e-12);
    }
  }
}

// Every worker runs one job's operation at a time, and each job's tasks in its own order.
void ExpectNoOverlapAndOwnOrder(const std::vector<PoolSimJob>& jobs, const PoolSimResult& r) {
  std::map<int, std::vector<std::pair<double, double>>> by_worker;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const SimSchedule& s = jobs[j].schedule;
    for (int w = 0; w < s.num_workers; ++w) {
      double prev_end = 0;
      for (int t : s.order[static_cast<size_t>(w)]) {
        const double st = r.jobs[j].start[static_cast<size_t>(t)], en = r.jobs[j].finish[static_cast<size_t>(t)];
        ASSERT_GE(st + 1e-9, prev_end) << "job " << j << " task " << t << " ran before its predecessor ended";
        ASSERT_GE(st + 1e-9, jobs[j].start_s);
        prev_end = en;
        // Only a task with tail-only dependencies may wait inside; then its two parts are
        // checked through their total (the other job may use the gap).
        if (en - st <= s.tasks[static_cast<size_t>(t)].duration_s + 1e-9) by_worker[w].push_back({st, en});
      }
    }
  }
  for (auto& [w, spans] : by_worker) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      ASSERT_LE(spans[i - 1].second, spans[i].first + 1e-9) << "worker " << w << " ran two operations at once";
    }
  }
}

TEST(PoolSimulator, JobsSideBySideShareTheWorkersWithoutOverlap) {
  const CostModel c = GrowingLayers(6);
  const SimSchedule sync = RoundPipe(c, 4, 3, OptimizerMode::kSync, false);
  const SimSchedule async = RoundPipe(c, 4, 3, OptimizerMode::kAsync, false);
  auto alone_sync = SimulatePool({{sync}});
  auto alone_async = SimulatePool({{async, 1, 0, true}});
  std::vector<PoolSimJob> jobs = {{sync}, {async, 1, 0, true}, {sync, 2, 7.5}};
  auto together = SimulatePool(jobs);
  ASSERT_TRUE(together.ok() && alone_sync.ok() && alone_async.ok()) << together.status();
  ExpectNoOverlapAndOwnOrder(jobs, *together);
  const double serial = 2 * alone_sync->makespan_s + alone_async->makespan_s;
  EXPECT_LT(together->makespan_s, serial);  // the bubbles of one are the others' compute
  EXPECT_GT(together->utilisation, alone_sync->utilisation);
  for (size_t j = 0; j < jobs.size(); ++j) {
    EXPECT_NEAR(together->jobs[j].compute_s, j == 1 ? alone_async->jobs[0].compute_s : alone_sync->jobs[0].compute_s,
                1e-9);
  }
}

TEST(PoolSimulator, BackloggedJobsSplitAWorkerByTheirShares) {
  for (double share : {1.0, 3.0}) {
    auto r = SimulatePool({{Chain(400, 1.0, 0), share}, {Chain(400, 1.0, 0), 1}});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_NEAR(r->compute_split[0], share / (share + 1), 0.01) << "share " << share;
    EXPECT_DOUBLE_EQ(r->makespan_s, 800);  // work-conserving
  }
}

TEST(PoolSimulator, AJobSubmittedLaterStartsNothingBefore) {
  auto r = SimulatePool({{Chain(10, 1.0, 0)}, {Chain(10, 1.0, 0), 1, 4.5}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->jobs[1].start[0], 5.0);   // ready at 4.5, the worker busy until 5
  EXPECT_DOUBLE_EQ(r->jobs[0].finish[4], 5.0);  // alone until then
  EXPECT_DOUBLE_EQ(r->makespan_s, 20);
}

// Job A's next operation is ready 0.1 after the last one ends; job B is always ready. Without a
// hold the worker alternates; with one of 0.25 x 1 s, A (share 3) keeps it while it is owed.
TEST(PoolSimulator, TheHoldKeepsTheWorkerForALaneThatComesBackInTime) {
  const std::vector<PoolSimJob> jobs = {{Chain(100, 1.0, 0.1), 3}, {Chain(400, 1.0, 0), 1}};
  auto plain = SimulatePool(jobs);
  PoolSimOptions hold;
  hold.hold_max_s = 1;
  auto held = SimulatePool(jobs, hold);
  ASSERT_TRUE(plain.ok() && held.ok());
  EXPECT_NEAR(plain->compute_split[0], 0.5, 0.02);
  EXPECT_NEAR(held->compute_split[0], 0.75, 0.02);
  hold.hold_max_s = 0.05;  // shorter than A's gap: no use
  auto short_hold = SimulatePool(jobs, hold);
  ASSERT_TRUE(short_hold.ok());
  EXPECT_NEAR(short_hold->compute_split[0], 0.5, 0.02);
}

TEST(PoolSimulator, ACycleIsReportedAndBadJobsAreRefused) {
  SimSchedule s = Chain(2, 1.0, 0);
  s.tasks[0].deps.push_back({1});
  auto r = SimulatePool({{s}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("deadlock"), std::string::npos) << r.status();
  EXPECT_FALSE(SimulatePool({}).ok());
  EXPECT_FALSE(SimulatePool({{Chain(2, 1, 0), 0}}).ok());
  SimSchedule two = Chain(2, 1, 0);
  two.num_workers = 2;
  EXPECT_FALSE(SimulatePool({{Chain(2, 1, 0)}, {two}}).ok());
}

}  // namespace
}  // namespace rp::planning
