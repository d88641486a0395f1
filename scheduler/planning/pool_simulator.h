// pool_simulator.h — several jobs' schedules on one pool of workers, the way the engine runs them
// side by side (docs/DAEMON.md, "The pool"): each job keeps its own order on every worker (its
// stage slots are never reordered), its own optimizer and links; the workers' compute is shared,
// and when more than one job has an operation ready on a worker, the one with the least virtual
// time goes first (spec::FairShare, the order a device's ComputeGate follows). A job's lane that
// ends an operation with more of its own work queued and still owed compute holds the worker a
// moment for it (the gate's anticipation). Predicts what workers/device/compute_gate.h measures
// on the paced backend (tests/bench/paced_pool_bench): the makespan of jobs together, the pool's
// utilisation, and how the compute splits by share.
//
// Compute is split where the engine splits it: a task with tail-only dependencies (a backward
// stage's recompute ahead of its gradient) is two operations on the worker, so another job may
// compute in between; with one job this equals Simulate (simulator.h).
//
// Contract: pure functions; safe from any thread. Resources 0..workers-1 of every job's
// schedule are the pool's workers; a job's other resources are its own. Orders and dependencies
// that form a cycle are reported as an error (deadlock), never hang.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/planning/sim_schedule.h"

namespace rp::planning {

struct PoolSimJob {
  SimSchedule schedule;  // its num_workers must be the pool's
  double share = 1;      // > 0: the job's weight on every worker
  double start_s = 0;    // submitted at: nothing of it starts earlier
  bool async = false;    // staleness-1: the next iteration's slots are queued while one runs
};

struct PoolSimOptions {
  // The gate's anticipation: a lane still owed compute, with more of its own operations queued,
  // holds the worker for min(hold_max_s, hold_fraction x the operation it ended). 0: none.
  // (The engine's gate holds up to 1 ms of wall time: 1 ms / time scale in real time.)
  double hold_max_s = 0;
  double hold_fraction = 0.25;
};

struct PoolSimJobResult {
  std::vector<double> start, finish;  // per task of its schedule
  std::vector<double> iteration_end;  // completion of each iteration's last worker task
  double end_s = 0;                   // its last task
  double compute_s = 0;               // its worker tasks' durations
};

struct PoolSimResult {
  std::vector<PoolSimJobResult> jobs;
  double makespan_s = 0;
  double utilisation = 0;  // compute of every job / (workers x makespan)
  // Until the first job ended: each job's part of the compute done, and its iterations per
  // second (iterations that ended by then, warm-up included, as the paced pool counts them).
  double first_end_s = 0;
  std::vector<double> compute_split;
  std::vector<double> iterations_per_s;
};

absl::StatusOr<PoolSimResult> SimulatePool(const std::vector<PoolSimJob>& jobs, const PoolSimOptions& options = {});

}  // namespace rp::planning
