// stage_state.h — what a DeviceWorker keeps for one stage slot while it runs, and the steps of
// its execution that live in files of their own (stage_upload.cc: the weights' upload). Internal
// to the data plane's device worker (device_worker.cc); nothing else includes it.
//
// Contract: a StageState is shared by the closures its worker enqueues on the stage's streams;
// each field is written by one stream's operations in their order (see device_worker.cc).
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "workers/consistency.h"
#include "workers/device/device.h"
#include "workers/device/out_of_memory.h"
#include "workers/device/transfer_windows.h"
#include "workers/run_context.h"
#include "workers/slot_attempt.h"
#include "workers/stage_compute.h"
#include "workers/stage_task.h"

namespace rp::workers::stage_internal {

// Everything one stage keeps on the device while it runs.
struct StageState {
  StageTask task;
  std::shared_ptr<RunContext> ctx;
  std::shared_ptr<SlotAttempt> attempt;  // this run of the slot (slot_attempt.h)
  c10::Device device = c10::Device(c10::kCPU);
  Device* dev = nullptr;
  std::vector<int> param_ids;                       // unique parameter indices of the stage
  std::vector<at::Tensor> params;                   // device copies, aligned with param_ids
  std::vector<at::Tensor> sources;                  // a re-run's host weights (else the masters)
  std::vector<at::Tensor> grads;                    // their gradients once the last micro-batch ran (weights freed)
  std::vector<std::vector<int>> layer_param_index;  // per layer: indices into params
  StageWeights weights;
  models::Rope rope;
  std::vector<at::Tensor> in, grad_out, labels, positions;  // per micro-batch, on device
  std::vector<std::vector<std::pair<int, at::Tensor>>> fwd_out;
  std::vector<at::Tensor> grad_in;
  std::vector<at::Tensor> last_logits;  // generation: per micro-batch, on device until downloaded
  std::vector<Recomputed> recomputed;   // backward stages recomputing ahead: the graph awaiting its gradient
  std::vector<RoutingTape> routing;     // per micro-batch: recorded (forward) or to replay (backward)
};

// Runs `fn`, turning any exception into the iteration's error; skips the work once the
// iteration has failed (events are still recorded by the streams, so nobody waits forever). A run
// of the slot that was abandoned (its device lost) skips the rest of its work, and what it throws
// meanwhile is no error of the iteration: the slot is re-run elsewhere. A run that ran out of
// device memory (out_of_memory.h) stops the same way when a recovery re-runs it; otherwise that
// is the iteration's error too (RESOURCE_EXHAUSTED).
void FailStage(StageState& s, const char* what, const std::exception& e);
template <typename Fn>
void Guarded(StageState& s, const char* what, Fn&& fn) {
  if (s.ctx->failed() || s.attempt->abandoned()) return;
  try {
    ThrowIfOutOfMemoryInjected();
    fn();
  } catch (const std::exception& e) {
    if (s.attempt->abandoned()) return;
    FailStage(s, what, e);
  }
}

// LPT-packed transfer chunks (PlanTransferWindows); should planning ever fail, one chunk of
// whole tensors, so no tensor is ever left untransferred.
std::vector<std::vector<TransferPiece>> PlanChunks(const std::vector<TensorExtent>& extents, int windows,
                                                   int64_t split_threshold_bytes);
// A timeline label: "<what>F3 mb2" (forward, eval "E", backward "B"; mb < 0: none).
std::string Label(const StageTask& sl, const char* what, int mb);

// Takes an input of the stage from the activation store for this run (leased: it goes back if the
// run is abandoned); throws when the run is abandoned or the iteration aborted.
at::Tensor TakeInput(StageState& s, ActKind kind, int layer, int microbatch);

// Fused and backward stages form weight gradients; forward and evaluation stages do not.
inline bool Trains(spec::StageKind k) { return k == spec::StageKind::kFused || k == spec::StageKind::kBackward; }

// Step 1 (param-up stream): the stage's unique parameters to the device, chunk j of the weights
// after the running stage's j-th input upload; returns the event compute waits on. `owners`:
// the owner layers of its parameters (async consistency), `older_compute`: the compute this
// upload may not run ahead of (one stage prefetched).
EventPtr EnqueueWeightUpload(Device& dev, const std::shared_ptr<StageState>& s, const std::vector<int>& owners,
                             const EventPtr& older_compute, const std::vector<EventPtr>& running_inputs);

// The paced backend's stage math (stage_paced.cc): each takes the Pacer's time for one
// micro-batch on the compute stream and leaves data-free (meta) results of the shapes the real
// math gives, so the downloads, the activation store and the gradient download see what they
// would: a forward stage's checkpoints and output, B_1's and a backward stage's input gradient,
// a zero loss over the micro-batch's tokens.
void PacedComputeMicrobatch(StageState& s, int m, const Pacer& pacer);
void PacedRecomputeMicrobatch(StageState& s, int m, const Pacer& pacer);
void PacedBackwardMicrobatch(StageState& s, int m, const Pacer& pacer);
// After the last micro-batch of a training stage: data-free gradients of its trainable weights.
void PacedKeepGradients(StageState& s);

}  // namespace rp::workers::stage_internal
