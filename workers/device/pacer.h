// pacer.h — the clock of the paced device backend (paced_device.h): how long a stage slot's
// compute and a copy take when no data moves, from a profile's per-layer times and a link
// model, and a sleep that keeps a stream's operations on that schedule at a scaled time.
//
// A paced run is a benchmark harness for the scheduling code, never training: the controller,
// dispatch plan, consistency protocol, activation store and optimizer worker run for real on
// data-free (meta) tensors, and every device operation takes the time the Pacer gives.
//
//   compute      a slot's layers' forward / backward / fused seconds per micro-batch; a backward
//                slot that recomputes ahead spends its layers' forward seconds on the recompute
//                and the rest (backward_s - forward_s) on the backward proper;
//   copy         bytes / link bandwidth, each worker its own link (PCIe), all of them sharing
//                `host_bytes_per_s` (0: no shared limit) while several copy at once;
//   optimizer    trainable bytes / `optimizer_bytes_per_s` (0: instantaneous).
//
// Times are real-time seconds; operations sleep `time_scale` times as long (e.g. 0.05: twenty
// times faster); whoever reads the timeline divides its spans by it. Sleeping overshoots by tens of
// microseconds; a stream that runs operations back to back carries the overshoot into its next
// sleep, so the error does not accumulate along a stream (bounded at 2 ms).
//
// Contract: immutable after construction except the shared-link counter (atomic); every member
// is safe from any thread. The Pacer outlives the devices and stores that use it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::workers {

struct PacedLayerTimes {
  double forward_s = 0;   // forward, no autograd, one micro-batch
  double backward_s = 0;  // recompute + backward
  double fused_s = 0;     // forward with autograd + backward (+ loss for the head)
};

struct PacerOptions {
  std::vector<PacedLayerTimes> layers;  // engine order: embedding, blocks, head
  double time_scale = 0.05;             // wall seconds per real second, (0, 1]
  double link_bytes_per_s = 25e9;       // one worker's host link, per direction
  double host_bytes_per_s = 0;          // shared by every link; 0 = unlimited
  double optimizer_bytes_per_s = 0;     // host optimizer rate over trainable bytes; 0 = free
};

enum class PacedCompute { kForward, kFused, kBackward, kRecompute, kBackwardAfterRecompute };

class Pacer {
 public:
  // InvalidArgument naming the field: no layers, a negative or non-finite time, a scale outside
  // (0, 1], a non-positive link bandwidth, a negative host or optimizer rate.
  static absl::StatusOr<std::unique_ptr<Pacer>> Create(PacerOptions options);

  const PacerOptions& options() const { return options_; }
  int num_layers() const { return static_cast<int>(options_.layers.size()); }
  // Real seconds of one micro-batch of layers [first, first + n) (clamped to the profile).
  double ComputeSeconds(PacedCompute kind, int first_layer, int num_layers) const;
  // Real seconds of a copy of `bytes` given `concurrent` copies in flight (this one included).
  double CopySeconds(int64_t bytes, int concurrent) const;
  double OptimizerSeconds(int64_t trainable_bytes) const;

  // Sleeps time_scale x `real_seconds`, less what the calling thread (a stream) runs behind its
  // schedule from earlier sleeps' overshoot when it runs operations back to back.
  void Spend(double real_seconds) const;
  // A copy of `bytes`: counts itself among the copies in flight while it sleeps.
  void SpendCopy(int64_t bytes) const;

 private:
  explicit Pacer(PacerOptions o) : options_(std::move(o)) {}
  PacerOptions options_;
  mutable std::atomic<int> copies_in_flight_{0};
};

}  // namespace rp::workers
