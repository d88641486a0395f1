// event.h — a one-shot host event: Set() once, any number of threads Wait() for it.
//
// Contract: thread-safe. The engine's cross-worker and worker<->optimizer dependencies are
// point-to-point Events (DESIGN §3), never global barriers. Set() is idempotent. On GPU a CUDA
// event is paired with one of these as its "recorded" flag, so nothing waits on a CUDA event
// before it is recorded.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace rp::workers {

class Event {
 public:
  void Set() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      set_ = true;
    }
    cv_.notify_all();
  }
  bool IsSet() const {
    std::lock_guard<std::mutex> lock(mu_);
    return set_;
  }
  void Wait() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return set_; });
  }
  // True when the event was set within `timeout`.
  template <typename Rep, typename Period>
  bool WaitFor(std::chrono::duration<Rep, Period> timeout) const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return set_; });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool set_ = false;
};

using EventPtr = std::shared_ptr<Event>;
inline EventPtr MakeEvent() { return std::make_shared<Event>(); }

}  // namespace rp::workers
