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

double ComputeGate::used_seconds(int lane) const {
  base::MutexLock lock(&mu_);
  return share_.used_seconds(lane);
}

void ComputeGate::GrantLocked() {
  if (busy_) return;
  if (reserved_) {
    const bool back = share_.waiting(*reserved_);
    if (!back && std::chrono::steady_clock::now() < reserved_until_) return;  // held a moment longer
    reserved_.reset();
  }
  if (std::optional<int> next = share_.Next()) {
    busy_ = true;
    granted_ = next;
    cv_.SignalAll();
  }
}

void ComputeGate::Run(int lane, const std::function<void()>& fn, const std::function<bool()>& more_queued) {
  {
    base::MutexLock lock(&mu_);
    share_.Wait(lane);
    GrantLocked();
    while (granted_ != lane) {
      if (reserved_) {
        if (!cv_.WaitUntil(&mu_, reserved_until_)) GrantLocked();  // the held moment passed
      } else {
        cv_.Wait(&mu_);
      }
    }
    granted_.reset();
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto release = [&] {
    const auto t1 = std::chrono::steady_clock::now();
    const bool more = more_queued && more_queued();
    base::MutexLock lock(&mu_);
    share_.Charge(lane, std::chrono::duration<double>(t1 - t0).count());
    busy_ = false;
    if (more && share_.WouldLead(lane)) {
      reserved_ = lane;
      reserved_until_ = t1 + std::min<std::chrono::steady_clock::duration>(kAnticipation, (t1 - t0) / 4);
    }
    GrantLocked();
    cv_.SignalAll();  // waiters re-check (a hold to time, or the grant above)
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
