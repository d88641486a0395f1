// event.h — a one-shot host event: Set() once, any number of threads Wait() for it.
//
// Contract: thread-safe. The engine's cross-worker and worker<->optimizer dependencies are
// point-to-point Events (ARCHITECTURE §3), never global barriers. Set() is idempotent. On GPU a CUDA
// event is paired with one of these as its "recorded" flag, so nothing waits on a CUDA event
// before it is recorded.
#pragma once

#include <chrono>
#include <memory>
#include "workers/base/mutex.h"

namespace rp::workers {

class Event {
 public:
  void Set() {
    {
      base::MutexLock lock(&mu_);
      set_ = true;
    }
    cv_.SignalAll();
  }
  bool IsSet() const {
    base::MutexLock lock(&mu_);
    return set_;
  }
  void Wait() const {
    base::MutexLock lock(&mu_);
    while (!set_) cv_.Wait(&mu_);
  }
  // True when the event was set within `timeout`.
  template <typename Rep, typename Period>
  bool WaitFor(std::chrono::duration<Rep, Period> timeout) const {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
    base::MutexLock lock(&mu_);
    while (!set_) {
      if (!cv_.WaitUntil(&mu_, deadline)) break;
    }
    return set_;
  }

 private:
  mutable base::Mutex mu_;
  mutable base::CondVar cv_;
  bool set_ ABSL_GUARDED_BY(mu_) = false;
};

using EventPtr = std::shared_ptr<Event>;
inline EventPtr MakeEvent() { return std::make_shared<Event>(); }

}  // namespace rp::workers
