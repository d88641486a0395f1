// lost_worker_sim.h — a RoundPipe run that loses a worker mid-iteration, as the engine recovers
// (scheduler/runtime/slot_recovery.h, docs/DAEMON.md "When a GPU fails"):
//   - the fault fires as one micro-batch of one stage slot starts on its worker; the micro-batches
//     before it on that worker ran;
//   - every slot already dispatched to that worker that had not finished (the faulted one and
//     those queued behind it) runs again from the host state, whole, on fresh lanes of the
//     survivors — in dispatch order, round robin over the survivors in index order. A fresh
//     lane has its own streams (its copies on links of its own); its compute is a resource of its
//     own, beside the survivor's (what the paced backend does: a lane without a gate sleeps
//     beside the device's other lanes; a GPU would share its SMs between them);
//   - iterations dispatched after the loss are planned over the N-1 survivors, the partition
//     kept, the round robin continued from where it was (g0 mod N-1).
// When is an iteration dispatched: sync, once the one before has stepped; async, once the one
// two before has (two in flight), as the paced runs submit them.
//
// Contract: pure functions; safe from any thread.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/planning/cost_model.h"
#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/schedules.h"
#include "scheduler/planning/simulator.h"

namespace rp::planning {

struct LostWorkerFault {
  int iteration = 0;
  int slot_in_round = 0;  // the stage slot (F_1.. = 0.., then B_1, B_2..) ...
  int microbatch = 0;     // ... and the micro-batch (within the iteration) that starts as it fires
};

struct LostWorkerRun {
  SimSchedule schedule;  // the run with the loss (re-runs on resources after the plan's)
  SimResult result;
  int lost_worker = 0;
  double lost_at_s = 0;
  int last_iteration_before = 0;  // the last iteration dispatched over N workers
  int slots_rerun = 0;
  std::vector<double> iteration_end;  // each iteration's last compute, re-runs included
};

// `dispatch`: the run's plan options (N, M, M_R, iterations, mode, g0).
absl::StatusOr<LostWorkerRun> SimulateLostWorker(const Partition& partition, const CostModel& costs,
                                                 const DispatchOptions& dispatch, const SimOptions& options,
                                                 const LostWorkerFault& fault);

}  // namespace rp::planning
