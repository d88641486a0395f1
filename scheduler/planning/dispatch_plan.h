// dispatch_plan.h — the RoundPipe schedule (paper §3.2) as data: which worker runs which stage
// slot on which micro-batches, in what order, after what.
//
// Contract: DispatchPlan is an immutable value built by BuildDispatchPlan; safe to share across
// threads once built. The controller (a later issue) turns its slots into device tasks; the
// simulator executes it with per-layer times.
//
// Rounds: an iteration's M micro-batches form R = M / M_R rounds of M_R >= N micro-batches.
// Within a round the S = Sf + Sb stage slots (F_1..F_Sf, B_1 fused, B_2..B_Sb) run in that
// order; slot i of a round goes to worker (g0 + i) mod N. g0 advances by S per round and carries
// across rounds AND iterations (never reset). Each worker runs its slots in dispatch order and a
// slot's micro-batches in order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/planning/partition.h"
#include "workers/spec/stage_kind.h"

namespace rp::planning {

enum class OptimizerMode { kSync, kAsync };
const char* OptimizerModeName(OptimizerMode m);

// The slot kinds are spec::StageKind (kForward F_i, kFused B_1, kBackward B_j; never kEval).
const char* SlotKindName(spec::StageKind k);

struct SlotDependency {
  enum class Reason {
    kActivation,  // forward: output activation of the previous forward slot
    kGradient,    // backward: input gradient of the previous backward slot (or of B_1)
    kCheckpoint,  // backward: stage-boundary checkpoint written by a forward slot
  };
  int slot;  // index into DispatchPlan::slots (same round)
  Reason reason;
};

struct StageSlot {
  int index = 0;  // position in DispatchPlan::slots
  int iteration = 0;
  int round = 0;          // round within the iteration
  int slot_in_round = 0;  // i in 0..S-1
  spec::StageKind kind = spec::StageKind::kForward;
  int stage = 0;  // forward: 1..Sf (F_i); fused: 1 (B_1); backward: 2..Sb (B_j)
  int first_layer = 0;
  int num_layers = 0;
  int first_microbatch = 0;  // global index within the iteration
  int num_microbatches = 0;  // M_R
  int worker = 0;
  std::vector<SlotDependency> deps;
};

struct DispatchOptions {
  int num_workers = 1;                 // N
  int microbatches_per_iteration = 1;  // M
  int microbatches_per_round = 0;      // M_R (0 = M)
  int iterations = 1;
  int g0 = 0;  // starting worker of the very first round
  OptimizerMode mode = OptimizerMode::kAsync;
};

struct DispatchPlan {
  DispatchOptions options;
  Partition partition;
  int num_layers = 0;
  int rounds_per_iteration = 0;
  std::vector<StageSlot> slots;  // dispatch order: iteration, round, slot
  int next_g0 = 0;               // where a following plan continues

  int stages_per_round() const { return partition.num_stages(); }
};

// Errors: M_R < N, M not a multiple of M_R, no workers, an invalid partition.
absl::StatusOr<DispatchPlan> BuildDispatchPlan(const Partition& partition, int num_layers,
                                               const DispatchOptions& options);

}  // namespace rp::planning
