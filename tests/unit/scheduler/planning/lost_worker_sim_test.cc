// A lost worker in the simulator, as the engine recovers: the lost worker computes nothing from
// the fault on; its unfinished slots run again whole on fresh lanes of the survivors, round robin,
// none before the fault; iterations dispatched after the loss use only the survivors; every
// dependency holds; the compute added is exactly the faulted slot's micro-batches that had run.
#include "scheduler/planning/lost_worker_sim.h"

#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "tests/unit/scheduler/planning/growing_layers.h"

namespace rp::planning {
namespace {

const Partition kPartition{{2, 2}, 2, {2, 2}};  // 5 slots per round

DispatchOptions Dispatch(OptimizerMode mode) {
  DispatchOptions d;
  d.num_workers = 4;
  d.microbatches_per_iteration = 8;
  d.iterations = 5;
  d.mode = mode;
  return d;
}

bool IsCompute(TaskPhase p) { return p == TaskPhase::kForward || p == TaskPhase::kFused || p == TaskPhase::kBackward; }

double ComputeSum(const SimSchedule& s) {
  double sum = 0;
  for (const SimTask& t : s.tasks) sum += IsCompute(t.phase) ? t.duration_s : 0;
  return sum;
}

void ExpectDependenciesHold(const LostWorkerRun& r) {
  const SimSchedule& s = r.schedule;
  for (size_t t = 0; t < s.tasks.size(); ++t) {
    for (const TaskDep& d : s.tasks[t].deps) {
      const double at =
          d.on_start ? r.result.start[static_cast<size_t>(d.task)] : r.result.finish[static_cast<size_t>(d.task)];
      const double tail = s.tasks[t].duration_s * (1 - s.tasks[t].head_fraction);
      const double gated = d.tail_only ? r.result.finish[t] - tail : r.result.start[t];
      ASSERT_GE(gated + 1e-9, at + d.latency_s) << "task " << t << " dep " << d.task;
    }
  }
}

TEST(LostWorkerSim, TheLostWorkersSlotsRunAgainOnTheSurvivorsAndLaterIterationsAvoidIt) {
  for (OptimizerMode mode : {OptimizerMode::kSync, OptimizerMode::kAsync}) {
    for (bool transfers : {false, true}) {
      SimOptions so;
      so.transfers = transfers;
      so.host_link_bandwidth = 4000;
      const DispatchOptions d = Dispatch(mode);
      const LostWorkerFault fault{2, 1, 3};  // iteration 2, F_2, micro-batch 3
      auto r = SimulateLostWorker(kPartition, GrowingLayers(6), d, so, fault);
      ASSERT_TRUE(r.ok()) << r.status();
      SCOPED_TRACE(absl::StrCat(OptimizerModeName(mode), transfers ? " transfers" : ""));
      ExpectDependenciesHold(*r);
      auto plan = BuildDispatchPlan(kPartition, 6, d);
      ASSERT_TRUE(plan.ok());
      const StageSlot* faulted = nullptr;
      for (const StageSlot& sl : plan->slots) {
        if (sl.iteration == 2 && sl.slot_in_round == 1) faulted = &sl;
      }
      ASSERT_NE(faulted, nullptr);
      EXPECT_EQ(r->lost_worker, faulted->worker);
      EXPECT_GE(r->last_iteration_before, 2);
      EXPECT_LE(r->last_iteration_before, mode == OptimizerMode::kSync ? 2 : 3);
      // The slots re-run: the faulted one and every later one of its worker dispatched before.
      int expect_rerun = 0;
      for (const StageSlot& sl : plan->slots) {
        expect_rerun +=
            sl.worker == faulted->worker && sl.index >= faulted->index && sl.iteration <= r->last_iteration_before;
      }
      EXPECT_EQ(r->slots_rerun, expect_rerun);
      const SimSchedule& s = r->schedule;
      std::set<int> rerun_resources;
      for (size_t t = 0; t < s.tasks.size(); ++t) {
        const SimTask& task = s.tasks[t];
        if (!IsCompute(task.phase)) continue;
        if (task.resource == r->lost_worker) {
          EXPECT_LT(r->result.start[t], r->lost_at_s) << "the lost worker computed after the fault";
          EXPECT_LE(task.iteration, 2);
        }
        if (task.resource >= d.num_workers) {
          rerun_resources.insert(task.resource);
          EXPECT_GE(r->result.start[t] + 1e-9, r->lost_at_s) << "a re-run before the fault";
          EXPECT_LE(task.iteration, r->last_iteration_before);
        }
      }
      // One fresh lane per survivor as long as there are slots to spread.
      EXPECT_EQ(static_cast<int>(rerun_resources.size()), std::min(expect_rerun, d.num_workers - 1));
      // The extra compute: the faulted slot's micro-batches that had run on the lost worker.
      auto clean = RoundPipeSchedule(*plan, GrowingLayers(6), so);
      ASSERT_TRUE(clean.ok());
      const double slot_time =
          s.tasks[static_cast<size_t>(s.slots[static_cast<size_t>(faulted->index)].first)].duration_s;
      EXPECT_NEAR(ComputeSum(s), ComputeSum(*clean) + 3 * slot_time, 1e-9);
      EXPECT_GT(r->iteration_end.back(), 0);
    }
  }
}

TEST(LostWorkerSim, AFaultThatNamesNoSlotIsRefused) {
  SimOptions so;
  auto r = SimulateLostWorker(kPartition, GrowingLayers(6), Dispatch(OptimizerMode::kSync), so, {2, 9, 0});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no slot 9"), std::string::npos) << r.status();
}

}  // namespace
}  // namespace rp::planning
