// paced_pool.h — (runtime) several jobs on one pool of paced workers, the way the engine runs
// them side by side (engine_impl.h): each job's real controller on its own lanes of the shared
// workers (lane_device.h), their compute given turns by the workers' gates by the jobs' shares.
// Measures what sharing the pool buys against running the jobs one after another (makespan,
// compute utilisation) and how the compute splits by share while every job runs. Paced figures
// only (real-time equivalents of scaled sleeps), like paced_run.h.
//
// Contract: RunPacedPool blocks for the jobs' scaled time; thread-safe with respect to other
// paced runs (each builds its own workers).
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/runtime/paced_run.h"

namespace rp::scheduler::runtime {

struct PacedPoolJob {
  PacedRunOptions run;  // warmup + iterations are run (all jobs: same workers, time scale and links)
  double share = 1;
  double start_s = 0;  // side by side: submitted this long (real-time equivalent) after the first
};

struct PacedPoolOptions {
  std::vector<PacedPoolJob> jobs;
  bool side_by_side = true;  // false: one after another, in order (the baseline)
};

struct PacedPoolResult {
  double makespan_s = 0;                             // from the start until every job ended
  std::vector<double> job_end_s;                     // when each job ended
  std::vector<std::vector<double>> iteration_end_s;  // per job: when each of its iterations ended
  double utilisation = 0;                            // compute time of every job / (workers x makespan)
  // While every job ran (until the first one ended): each job's part of the pool's compute time
  // and its iterations per second.
  std::vector<double> compute_split;
  std::vector<double> iterations_per_s;
  double wall_s = 0;
};

absl::StatusOr<PacedPoolResult> RunPacedPool(const PacedPoolOptions& options);

// What the pool simulator (scheduler/planning/pool_simulator.h) predicts for the same jobs: each
// job's schedule from the simulator (PacedSchedule), shared by the fair share with the gate's
// hold (ComputeGate::kAnticipation at the run's time scale); one after another, each job alone
// from where the one before ended. wall_s stays 0.
absl::StatusOr<PacedPoolResult> SimulatePacedPool(const PacedPoolOptions& options);

}  // namespace rp::scheduler::runtime
