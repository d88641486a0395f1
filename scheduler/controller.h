// controller.h — one per job: turns the DispatchPlan into stage tasks for the device workers,
// splits each global batch into micro-batches, wires the per-micro-batch dependencies through
// the ActivationStore's events, runs the synchronous optimizer step, and reports per-iteration
// stats (paper §4.1; the asynchronous optimizer is the next issue).
//
// Contract: RunIteration is called from one thread at a time. The controller does not own the
// devices, the store or the timeline; they must outlive it. A failed iteration (bad input, a
// kernel error) returns a Status, discards the iteration's gradients and leaves the controller
// usable for the next batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/planning/partition.h"
#include "workers/device/device.h"
#include "workers/device/timeline.h"
#include "workers/device_worker.h"
#include "workers/models/transformer_config.h"
#include "workers/optim/adamw.h"
#include "workers/optim/loss_scaler.h"
#include "workers/store/activation_store.h"
#include "workers/store/host_model_store.h"

namespace rp::scheduler {

struct ControllerOptions {
  planning::Partition partition;
  int microbatches = 1;            // M per iteration
  int microbatches_per_round = 0;  // M_R (0 = M)
  workers::AdamWOptions adamw;
  workers::LrSchedule lr_schedule;
  workers::LossScalerOptions loss_scaler;  // enable for fp16 master copies
  int64_t head_chunk_tokens = 4096;
};

struct IterationStats {
  int iteration = 0;
  double loss = 0;     // mean CE over the batch's non-ignored tokens
  int64_t tokens = 0;  // non-ignored tokens
  double seconds = 0;  // forward/backward + optimizer, wall clock
  double lr = 0;
  double grad_norm = 0;               // before clipping
  std::vector<double> worker_busy_s;  // compute-stream busy time per worker
  double bubble_ratio = 0;            // 1 - sum(busy) / (N x pipeline span)
  int64_t activation_peak_bytes = 0;
  double loss_scale = 1;      // dynamic loss scale used for this iteration's gradients
  bool skipped_step = false;  // fp16: gradients overflowed, the step was skipped
};

class Controller {
 public:
  static absl::StatusOr<std::unique_ptr<Controller>> Create(ControllerOptions options, workers::HostModelStore* store,
                                                            std::vector<workers::Device*> devices,
                                                            workers::Timeline* timeline);

  // tokens: [B, S] int64 (int32 accepted); labels: same shape, -100 = ignored (default: the
  // next-token shift of `tokens`). B must be divisible by the micro-batch count.
  absl::StatusOr<IterationStats> RunIteration(const at::Tensor& tokens,
                                              const std::optional<at::Tensor>& labels = std::nullopt);

  // The checks RunIteration applies to a batch (shape, dtype, divisibility, id ranges), for
  // callers that accept batches before they run (Engine::FeedBatch).
  absl::Status ValidateBatch(const at::Tensor& tokens, const std::optional<at::Tensor>& labels) const;

  int next_g0() const { return next_g0_; }
  int iterations_done() const { return iteration_; }
  const workers::ActivationStore& activations() const { return acts_; }

 private:
  Controller(ControllerOptions options, workers::HostModelStore* store, std::vector<workers::Device*> devices,
             workers::Timeline* timeline);

  ControllerOptions opt_;
  workers::HostModelStore* store_;
  std::vector<workers::Device*> devices_;
  std::vector<std::unique_ptr<workers::DeviceWorker>> workers_;
  workers::Timeline* timeline_;
  workers::ActivationStore acts_;
  workers::AdamW adamw_;
  workers::LossScaler scaler_;
  std::vector<int> act_consumers_;
  int next_g0_ = 0;
  int iteration_ = 0;
};

}  // namespace rp::scheduler
