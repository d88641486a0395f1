// activation_store.h — stage-boundary checkpoints and inter-stage activations / gradients in
// host memory, per micro-batch (paper §3.1). A slot is addressed by (kind, layer, micro-batch):
//   kActivation(l, m): the input of layer l (layer 0: the token ids), written by the forward
//                      stage that computes layer l-1 (or by the controller for l = 0);
//   kGradient(l, m):   the gradient w.r.t. the input of layer l, written by the backward or fused
//                      stage that starts at l;
//   kLabels(0, m):     the micro-batch's labels, read by the fused stage;
//   kRouting(l, m):    what the router of sparse block layer l decided in the forward
//                      (models::PackRouting), read by the backward stage that recomputes l.
// Each Put names how many consumers will Take the slot; the slot is freed after the last Take.
//
// Contract: thread-safe. Take blocks until the slot is Put (or its iteration is aborted: then it
// returns an error). A Restore counts as one more consumer of the slot (re-creating it if the
// last Take had freed it). Peak bytes are tracked over the store's lifetime (ResetPeak to restart).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "workers/base/mutex.h"

namespace rp::workers {

enum class ActKind { kActivation = 0, kGradient = 1, kLabels = 2, kRouting = 3 };

class ActivationStore {
 public:
  // Stores `t` (the store keeps this tensor; pass a host copy) for `consumers` Takes. Slots of
  // different iterations are distinct (in async mode two iterations are in flight).
  void Put(ActKind kind, int layer, int microbatch, at::Tensor t, int consumers, int iteration = 0);
  // Waits for the slot, returns it and counts one consumer off.
  absl::StatusOr<at::Tensor> Take(ActKind kind, int layer, int microbatch, int iteration = 0);
  // The same, giving up with Cancelled once `cancelled()` is true (looked at on every Put and
  // every 50 ms): a stage slot on a device that was lost meanwhile stops waiting.
  absl::StatusOr<at::Tensor> Take(ActKind kind, int layer, int microbatch, int iteration,
                                  const std::function<bool()>& cancelled);
  // Gives back what a Take returned, for one more Take: a stage slot that will be re-run
  // elsewhere returns the inputs it had taken (slot_attempt.h).
  void Restore(ActKind kind, int layer, int microbatch, int iteration, at::Tensor t);
  // Wakes every waiter of `iteration` with an error; its later Takes fail until Discard.
  void Abort(absl::Status why, int iteration = 0);
  // Drops the slots of `iteration` and forgets its abort (after a failed iteration drained).
  void Discard(int iteration);
  // Drops everything; keeps the peak.
  void Reset();
  int64_t live_bytes() const;
  int64_t peak_bytes() const;
  void ResetPeak();
  size_t live_slots() const;

 private:
  using Key = std::tuple<int, int, int, int>;  // iteration, kind, layer, micro-batch
  struct Slot {
    at::Tensor tensor;
    int remaining = 0;
    bool present = false;
  };
  mutable base::Mutex mu_;
  base::CondVar cv_;
  std::map<Key, Slot> slots_ ABSL_GUARDED_BY(mu_);
  std::map<int, absl::Status> aborted_ ABSL_GUARDED_BY(mu_);  // per iteration
  int64_t live_ ABSL_GUARDED_BY(mu_) = 0, peak_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rp::workers
