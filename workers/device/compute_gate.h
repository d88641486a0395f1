// compute_gate.h — one device's compute shared by the jobs that run on it side by side: an
// operation of a job's compute stream runs only when the gate gives that job its turn, and the
// turns follow the jobs' shares (FairShare: weighted fair queueing on the compute time each
// used). A turn is taken once the operation is ready (its stream's waits are behind it), so no
// job ever holds the device while it waits for data: the gate orders compute, it cannot
// deadlock two pipelines that feed each other's workers.
//
// A lane's stream hands the gate one operation at a time, so when one ends the lane is not
// waiting yet even if its next operation is ready: a plain work-conserving gate would then
// alternate between jobs whatever their shares. So an operation that ends with more of its
// lane's compute queued, and whose lane is still owed compute, holds the device for that lane a
// moment (a quarter of the operation, at most kAnticipation): long enough for a ready next
// operation to arrive, bounded so a lane whose next operation waits for data costs the others
// little and never blocks them.
//
// On the CPU and paced backends an operation computes (or sleeps its profiled time) inside its
// function, so the gate orders the device's work itself. On CUDA an operation only enqueues
// kernels: the gate then orders the launches, and the GPU's own scheduler overlaps the jobs'
// kernels (shares are a launch order there, not a measured split).
//
// Contract: thread-safe. A lane is one job's compute stream on the device: it runs one operation
// at a time (at most one Run of a lane at once). A lane is removed only when no operation of it
// runs or waits.
#pragma once

#include <chrono>
#include <functional>
#include <optional>

#include "workers/base/mutex.h"
#include "workers/spec/fair_share.h"

namespace rp::workers {

class ComputeGate {
 public:
  static constexpr std::chrono::microseconds kAnticipation{1000};

  int AddLane(double weight);
  void RemoveLane(int lane);
  // Runs `fn` on the calling thread when the lane's turn comes; charges the lane the time it took.
  // `more_queued` (optional), asked as `fn` ends: the lane has further compute operations queued.
  void Run(int lane, const std::function<void()>& fn, const std::function<bool()>& more_queued = {});
  double virtual_time(int lane) const;
  double used_seconds(int lane) const;  // the time the lane's operations took so far

 private:
  void GrantLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable base::Mutex mu_;
  base::CondVar cv_;
  spec::FairShare share_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;            // a lane's operation holds the device
  std::optional<int> granted_ ABSL_GUARDED_BY(mu_);   // the lane whose turn came, until it takes it
  std::optional<int> reserved_ ABSL_GUARDED_BY(mu_);  // the device is held for this lane ...
  std::chrono::steady_clock::time_point reserved_until_ ABSL_GUARDED_BY(mu_);  // ... until then
};

}  // namespace rp::workers
