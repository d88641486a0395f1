#include "workers/device/device_health.h"

#include <utility>
#include <vector>

namespace rp::workers {

absl::Status DeviceHealth::why() const {
  base::MutexLock lock(&mu_);
  return why_;
}

bool DeviceHealth::MarkLost(absl::Status why) {
  std::vector<std::function<void()>> calls;
  {
    base::MutexLock lock(&mu_);
    if (lost_.load(std::memory_order_relaxed)) return false;
    why_ = why.ok() ? absl::UnavailableError("device lost") : std::move(why);
    losses_.fetch_add(1, std::memory_order_acq_rel);
    lost_.store(true, std::memory_order_release);
    for (const auto& [id, fn] : listeners_) calls.push_back(fn);
  }
  base::MutexLock calling(&call_mu_);
  for (const auto& fn : calls) fn();
  return true;
}

void DeviceHealth::Restore() {
  base::MutexLock lock(&mu_);
  why_ = absl::OkStatus();
  lost_.store(false, std::memory_order_release);
}

int DeviceHealth::AddListener(std::function<void()> on_lost) {
  base::MutexLock lock(&mu_);
  const int id = next_listener_++;
  listeners_.emplace(id, std::move(on_lost));
  return id;
}

void DeviceHealth::RemoveListener(int id) {
  {
    base::MutexLock lock(&mu_);
    listeners_.erase(id);
  }
  base::MutexLock calling(&call_mu_);  // a call that copied it before the erase has returned
}

}  // namespace rp::workers
