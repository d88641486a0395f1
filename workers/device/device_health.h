// device_health.h — whether a device still works. A device is lost when it fails for good (on
// CUDA a sticky error such as a lost or reset device; on any backend a fault injected by a test
// hook, test_hooks.h): from then on its streams run nothing — every queued operation is skipped,
// every wait ends, every event is still set — so whatever was queued on it drains at once, and
// the jobs that had stage slots on it re-run them elsewhere (scheduler/runtime/slot_recovery.h).
// A lost device comes back only by Restore (an operator putting it back). A drained device (an
// operator taking it out gracefully) still works — what is queued on it runs — but no job plans
// new stage slots on it until it is drained no more.
//
// Contract: thread-safe. Listeners are called on the thread that marks the device lost, after
// the state changed and outside the lock; they must be quick (post a message) and must not add
// or remove listeners. RemoveListener returns once no call of that listener runs.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "workers/base/mutex.h"

namespace rp::workers {

class DeviceHealth {
 public:
  explicit DeviceHealth(int device_index) : index_(device_index) {}
  int device_index() const { return index_; }
  bool lost() const { return lost_.load(std::memory_order_acquire); }
  bool drained() const { return drained_.load(std::memory_order_acquire); }
  // How many times it was lost so far: work started before a loss is dead even once the device
  // was restored (slot_attempt.h compares it).
  int64_t losses() const { return losses_.load(std::memory_order_acquire); }
  // Whether jobs may plan stage slots on it.
  bool usable() const { return !lost() && !drained(); }
  void SetDrained(bool drained) { drained_.store(drained, std::memory_order_release); }
  // Why it was lost (OK while it works).
  absl::Status why() const;
  // Idempotent: the first call's reason is kept. Returns true when this call lost it.
  bool MarkLost(absl::Status why);
  // The device works again (an operator's enable after a repair, or a test).
  void Restore();
  int AddListener(std::function<void()> on_lost);
  void RemoveListener(int id);

 private:
  const int index_;
  std::atomic<bool> lost_{false};
  std::atomic<bool> drained_{false};
  std::atomic<int64_t> losses_{0};
  mutable base::Mutex mu_;
  absl::Status why_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::function<void()>> listeners_ ABSL_GUARDED_BY(mu_);
  int next_listener_ ABSL_GUARDED_BY(mu_) = 0;
  // Serialises listener calls with RemoveListener (a listener never runs after its removal).
  base::Mutex call_mu_;
};

}  // namespace rp::workers
