// sim_pool.h — roundpipe-sim's two what-if modes over the planning library: several jobs of the
// model side by side on one pool (`--pool`, pool_simulator.h) and a worker lost mid-iteration
// (`--lose_worker`, lost_worker_sim.h). Each job runs RoundPipe on the partition the simulator
// picks for its optimizer mode (or --partition). They print tables and return the tool's exit code.
//
// Contract: called once from roundpipe-sim's main thread.
#pragma once

#include <vector>

#include "scheduler/planning/comparison.h"
#include "scheduler/planning/cost_model.h"
#include "scheduler/planning/lost_worker_sim.h"

namespace rp::planning {

struct PoolJobFlags {
  OptimizerMode mode = OptimizerMode::kSync;
  double share = 1;
  double start_s = 0;
};

// Parses --pool MODES (sync/async, comma-separated), --pool_shares and --pool_starts_s (one per
// job or empty).
absl::StatusOr<std::vector<PoolJobFlags>> ParsePoolFlags(const std::string& modes, const std::string& shares,
                                                         const std::string& starts);
// Parses --lose_worker ITERATION,SLOT,MICROBATCH.
absl::StatusOr<LostWorkerFault> ParseLostWorkerFlag(const std::string& spec);

// Returns the tool's exit status (0: printed; otherwise the error was printed to stderr).
int RunPool(const CostModel& costs, const ComparisonOptions& options, const std::vector<PoolJobFlags>& jobs);
int RunLostWorker(const CostModel& costs, const ComparisonOptions& options, OptimizerMode mode,
                  const LostWorkerFault& fault);

}  // namespace rp::planning
