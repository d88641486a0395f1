// simulator.h — discrete-event execution of a SimSchedule (paper §5.8.1 methodology).
//
// Contract: pure functions; safe from any thread. Each resource runs its tasks in the given
// order; a task starts at max(resource free, every dependency satisfied + latency). A schedule
// whose orders and dependencies form a cycle is reported as an error (deadlock), never hangs.
#pragma once

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
  // Whole-run bubble: 1 - gpu_work / (N * makespan).
  double bubble_ratio = 0;
  // Steady state (iterations >= 2): period = mean spacing of iteration ends after the first;
  // bubble = 1 - (gpu_work / iterations) / (N * period). Equals bubble_ratio for one iteration.
  double period = 0;
  double steady_bubble_ratio = 0;
};

absl::StatusOr<SimResult> Simulate(const SimSchedule& schedule);

// Bubble ratio of the steady-state iteration split into three parts that add up to the total:
//   fill_drain: the bubble of the same schedule with every GPU task of a phase set to that
//               phase's mean time (balanced stages) and no optimizer time (structural);
//   optimizer:  extra bubble from waiting for the optimizer at iteration boundaries (balanced);
//   imbalance:  the rest, caused by unequal stage times.
struct BubbleBreakdown {
  double total = 0, fill_drain = 0, optimizer = 0, imbalance = 0;
  double period_s = 0;             // steady-state iteration time
  double tokens_per_s_factor = 0;  // 1 / period_s (multiply by tokens per iteration)
};

// `with_optimizer` and `without_optimizer` are the same schedule built with and without
// optimizer time; the balanced variants are derived with Balanced().
absl::StatusOr<BubbleBreakdown> AnalyzeBubbles(const SimSchedule& with_optimizer, const SimSchedule& without_optimizer);

// Replaces each GPU task's duration by the mean over GPU tasks of its phase class
// (forward, or fused+backward).
SimSchedule Balanced(SimSchedule s);

}  // namespace rp::planning
