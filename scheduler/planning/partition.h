// partition.h — RoundPipe's asymmetric stage partition (paper §3.2) and the partitioner (§4.4).
//
// Contract: pure functions over a CostModel; no global state, safe from any thread.
// Layers 0..L-1. The forward partition (F_1..F_Sf, B_1) and the backward partition
// (B_1..B_Sb) share B_1, the fused stage made of the LAST B_1 layers. `forward` lists F_1..F_Sf
// in layer order; `backward` lists B_2..B_Sb in execution order, i.e. B_2 holds the layers just
// below B_1 and the last entry holds layer 0. S = Sf + Sb stage slots per round.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/planning/cost_model.h"
#include "workers/spec/stage_kind.h"

namespace rp::planning {

struct Partition {
  std::vector<int> forward;   // F_1..F_Sf layer counts
  int fused = 0;              // B_1 layer count
  std::vector<int> backward;  // B_2..B_Sb layer counts

  int num_forward_stages() const { return static_cast<int>(forward.size()); }
  int num_backward_stages() const { return 1 + static_cast<int>(backward.size()); }  // incl. B_1
  int num_stages() const { return num_forward_stages() + num_backward_stages(); }
  std::string ToString() const;  // e.g. "F[3,3,2] B1=2 B[1,2,2,2,2]"
  bool operator==(const Partition&) const = default;
};

// Layer range [first, first+count) and time of every stage slot in dispatch order
// (F_1..F_Sf, B_1, B_2..B_Sb).
struct StageShape {
  spec::StageKind kind;  // kForward, kFused or kBackward
  int first_layer;
  int num_layers;
  double time_s;         // per micro-batch
  int64_t memory_bytes;  // device memory of the stage (weights, grads, activations)
};
std::vector<StageShape> DescribeStages(const Partition& p, const CostModel& costs);

struct PartitionProblem {
  const CostModel* costs = nullptr;
  int num_workers = 1;       // N
  int num_microbatches = 1;  // M per iteration
  // Per-stage device memory cap in bytes (one stage runs while the next is prefetched, so pass
  // about half the usable device memory); 0 = unlimited.
  int64_t stage_memory_cap = 0;
  // The authors' two knobs (their library's `min_stages` and t_max window), both off at 0:
  // min_stages K: partitions have at least K stage slots, and the objective counts S as at least
  //   max(N, K). 1 <= K <= 2L-1 (more is refused).
  int min_stages = 0;
  // t_max_window X >= 1: only partitions whose t_max lies in [W, X*W], W the smallest t_max any
  //   partition of this problem has (MinimumTmax). The authors search X = 1.1 only.
  double t_max_window = 0;
};

struct PartitionResult {
  Partition partition;
  double t_max = 0;  // slowest stage time per micro-batch
  // (M*max(S, N, K) + N(N-1)) * t_max: the paper's objective, with S counted as at least N (with
  // fewer slots than workers some workers idle every round; the reference implementation's
  // min_stages does the same) and at least the problem's min_stages K.
  double objective = 0;
  // Model-predicted bubble ratio when every slot is paced by t_max:
  // 1 - M*sum(stage times) / objective.
  double predicted_bubble = 0;
  // The round size M_R the simulated choice picked with the partition (SimulatedChoice::
  // choose_round_size); 0 = the one asked for.
  int microbatches_per_round = 0;
};

// Optimal partition for the objective (M*max(S,N,K) + N(N-1)) * t_max under the memory cap, with
// at least min_stages slots and t_max inside the window when those are set; among optima the one
// with the largest B_1. O(L^3) at worst: candidate t_max values are contiguous sums of the layer
// times, each checked by an O(L) greedy packing (bounds prune most of them).
// Errors: INVALID_ARGUMENT for a bad problem (no layers, N or M < 1, negative times, min_stages
// above 2L-1, a window below 1); RESOURCE_EXHAUSTED when no partition fits the memory cap.
absl::StatusOr<PartitionResult> AutoPartition(const PartitionProblem& problem);

// W: the smallest t_max any partition of the problem can have (its memory cap respected). The
// lower end of the t_max window. Errors as AutoPartition.
absl::StatusOr<double> MinimumTmax(const PartitionProblem& problem);

// Whether `r` respects the problem's min_stages and t_max window (true when neither is set).
bool PartitionAllowed(const PartitionProblem& problem, const PartitionResult& r);

// The distinct greedy partitions of every candidate t_max, best objective first: the search space
// a simulation-guided choice ranks (see SimulatedBestPartition in comparison.h). With
// `per_stage_count` > 0 only the best that many of each stage count are kept (so every slot
// count the exact search reaches is represented, not only the objective's favourites); then at
// most `max_candidates` (0 = all).
std::vector<PartitionResult> CandidatePartitions(const PartitionProblem& problem, int max_candidates = 0,
                                                 int per_stage_count = 0);

// `shape`'s B_1 and stage counts with each side's layers spread to minimise its slowest stage
// (MinMaxContiguousPartition per side): the greedy packs leave a small remainder stage, which
// the balanced twin spreads out (e.g. F[2,9,9,9] -> F[8,7,7,7]); same slots, often a shorter
// critical path.
// `forward_stages` > 0 asks for that many forward stages instead of `shape`'s (more, smaller
// forward slots: what the authors' minimum-slot rule produces; the backward side is unchanged).
absl::StatusOr<PartitionResult> BalancedPartition(const PartitionProblem& problem, const Partition& shape,
                                                  int forward_stages = 0);

// Minimal t_max with exactly `num_stages` stage slots (3 <= ... <= 2L-1, or 1 when L==1... see
// errors); B_1 as large as allowed.
absl::StatusOr<PartitionResult> PartitionWithStageCount(const PartitionProblem& problem, int num_stages);

// Validates a user-given partition (clear errors) and evaluates it.
absl::StatusOr<PartitionResult> EvaluatePartition(const PartitionProblem& problem, const Partition& p);

// Symmetric contiguous partition of all layers into exactly `num_stages` stages minimizing the
// maximum of sum(weights) per stage, each stage's sum(memory) <= cap (0 = unlimited). Used by
// the weight-bound baselines (weights = forward + backward time). Returns layer counts.
absl::StatusOr<std::vector<int>> MinMaxContiguousPartition(const std::vector<double>& weights,
                                                           const std::vector<int64_t>& memory, int64_t cap,
                                                           int num_stages);

}  // namespace rp::planning
