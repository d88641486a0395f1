// schedules.h — builders that turn a RoundPipe DispatchPlan or a weight-bound baseline
// (GPipe, 1F1B, Interleaved 1F1B, Looped BFS) into a SimSchedule for the simulator.
//
// Contract: pure functions; safe from any thread.
// Resources: 0..N-1 GPU workers, N = the CPU optimizer worker, N+1+w = worker w's
// parameter-upload link, 2N+1+w its gradient-download link (RoundPipe; only with transfers on).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/planning/cost_model.h"
#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/sim_schedule.h"

namespace rp::planning {

struct SimOptions {
  // CPU optimizer time per layer per iteration (AdamW + copies); 0 = infinitely fast.
  double optimizer_s_per_layer = 0;
  // Model transfers: activation/gradient edges cost 2 x boundary bytes / link bandwidth
  // (device -> host -> device); RoundPipe slots also upload their weights on a per-worker link,
  // prefetched one stage ahead, and training slots download their weight gradients on a second
  // per-worker link after their last micro-batch (the optimizer waits for them).
  bool transfers = false;
  // With transfers: false leaves out the weight uploads and gradient downloads, keeping only the
  // activation hops (what the authors' simulator models, for comparison with it).
  bool weight_transfers = true;
  double host_link_bandwidth = 0;  // bytes/s, required with transfers
  // A measured activation hop (one micro-batch's boundary activation device -> host -> device,
  // e.g. from a profile); >= 0 replaces 2 x boundary bytes / bandwidth.
  double activation_hop_s = -1;
  // RoundPipe backward stages recompute ahead of the upstream gradient: a micro-batch's
  // recompute (its layers' forward time) starts once the stage's weights and the checkpoint are
  // there, and only the backward proper waits for the gradient from the stage after it, as the
  // engine runs them. false: the whole stage waits for every input (the ablation).
  bool recompute_ahead = true;
  // Ablation, impossible on hardware: the authors' simulator lets the forward share of a
  // backward stage (its recompute) and of B_1 (the LM head's forward) start before its input is
  // there, only the rest waiting for the checkpoint, activation or gradient. Used to measure what
  // that freedom is worth against their makespans (docs/ENGINE.md); the engine never does it.
  bool early_starts_before_inputs = false;
};

// RoundPipe: sync (optimizer step after the iteration, next iteration waits) or async
// (staleness 1 with the per-layer consistency constraints: P_cp of layer l for iteration k
// waits until iteration k+1 has uploaded layer l; iteration k+2 uses layer l only after it).
absl::StatusOr<SimSchedule> RoundPipeSchedule(const DispatchPlan& plan, const CostModel& costs,
                                              const SimOptions& options);

enum class Baseline { kGPipe, k1F1B, kInterleaved1F1B, kLoopedBFS };
const char* BaselineName(Baseline b);

struct BaselineOptions {
  int num_workers = 1;
  int num_microbatches = 1;
  int iterations = 1;
  int chunks_per_worker = 1;     // v: S = v*N stages (GPipe and 1F1B use 1)
  int64_t stage_memory_cap = 0;  // per-stage device memory cap, 0 = unlimited
  // An explicit partition as Megatron users write it: decoder blocks per stage (S entries); the
  // first stage also holds the embedding and the last the head, so either may list 0 blocks.
  // Empty: the min-max partition.
  std::vector<int> blocks_per_stage;
};

// Weights bound to GPUs: stage s on worker s mod N, the symmetric min-max partition of the
// layers into S stages. Always synchronous (flush at the iteration boundary).
absl::StatusOr<SimSchedule> BaselineSchedule(Baseline kind, const CostModel& costs, const BaselineOptions& options,
                                             const SimOptions& sim, std::vector<int>* stage_layers = nullptr);

}  // namespace rp::planning
