// simulator.h — discrete-event execution of a SimSchedule (paper §5.8.1 methodology).
//
// Contract: pure functions; safe from any thread. Each resource runs its tasks in the given
// order; a task starts at max(resource free, every dependency satisfied + latency), except that
// its tail_only dependencies gate only its tail (the part after head_fraction of its duration),
// which may leave the resource waiting inside the task: finish - start >= duration. A schedule
// whose orders and dependencies form a cycle is reported as an error (deadlock), never hangs.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/planning/sim_schedule.h"

namespace rp::planning {

struct SimResult {
  std::vector<double> start, finish;  // per task
  double makespan = 0;
  std::vector<double> busy;           // per resource, seconds
  std::vector<double> iteration_end;  // completion of each iteration's last GPU task
  double gpu_work = 0;                // sum of GPU task durations
  double bubble_ratio = 0;            // whole run: 1 - gpu_work / (N * makespan)
};

absl::StatusOr<SimResult> Simulate(const SimSchedule& schedule);

// Builds the schedule for `iterations` iterations, with or without optimizer time.
using ScheduleBuilder = std::function<absl::StatusOr<SimSchedule>(int iterations, bool with_optimizer)>;

// Steady state without start-up or tail effects: the schedule is simulated for k and 2k
// iterations and period = (makespan(2k) - makespan(k)) / k, the marginal cost of one more
// iteration. bubble = 1 - work per iteration / (N * period).
struct SteadyState {
  double period_s = 0;
  double work_per_iteration_s = 0;
  double bubble_ratio = 0;
};
absl::StatusOr<SteadyState> MeasureSteadyState(const ScheduleBuilder& build, int k, bool with_optimizer, bool balanced);

// Steady-state bubble ratio split into three parts that add up to the total:
//   fill_drain: the bubble of the same schedule with balanced stage times (see Balanced) and
//               no optimizer time (structural);
//   optimizer:  extra bubble from waiting for the optimizer (balanced stages);
//   imbalance:  the rest, caused by unequal stage times.
// Each part is GPU idle time per iteration over N x the actual steady-state period.
struct BubbleBreakdown {
  double total = 0, fill_drain = 0, optimizer = 0, imbalance = 0;
  double period_s = 0;  // steady-state iteration time
};
absl::StatusOr<BubbleBreakdown> AnalyzeBubbles(const ScheduleBuilder& build, int k);

// Replaces each GPU task's duration by the mean over GPU tasks of its phase class (forward, or
// fused+backward; one class when schedule.balance_all_phases_together).
SimSchedule Balanced(SimSchedule s);

}  // namespace rp::planning
