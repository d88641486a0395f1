#include "workers/device/compute_gate.h"

#include <chrono>

namespace rp::workers {

int ComputeGate::AddLane(double weight) {
  base::MutexLock lock(&mu_);
  return share_.AddLane(weight);
}

void ComputeGate::RemoveLane(int lane) {
  base::MutexLock lock(&mu_);
  share_.RemoveLane(lane);
}

double ComputeGate::virtual_time(int lane) const {
  base::MutexLock lock(&mu_);
  return share_.virtual_time(lane);
}

void ComputeGate::GrantLocked() {
  if (busy_) return;
  if (std::optional<int> next = share_.Next()) {
    busy_ = true;
    granted_ = next;
    cv_.SignalAll();
  }
}

void ComputeGate::Run(int lane, const std::function<void()>& fn) {
  {
    base::MutexLock lock(&mu_);
    share_.Wait(lane);
    GrantLocked();
    while (granted_ != lane) cv_.Wait(&mu_);
    granted_.reset();
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto release = [&] {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    base::MutexLock lock(&mu_);
    share_.Charge(lane, s);
    busy_ = false;
    GrantLocked();
  };
  try {
    fn();
  } catch (...) {
    release();
    throw;
  }
  release();
}

}  // namespace rp::workers
