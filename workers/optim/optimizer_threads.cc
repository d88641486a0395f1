#include "workers/optim/optimizer_threads.h"

#include <sched.h>

#include <algorithm>

#include "workers/base/check.h"

namespace rp::workers {

OptimizerThreads::OptimizerThreads(int threads, bool pin_helpers) {
  for (int i = 0; i + 1 < std::max(1, threads); ++i) {
    helpers_.emplace_back([this, i, pin_helpers] {
      if (pin_helpers) PinToNthAllowedCpu(i + 1);
      HelperLoop(i);
    });
  }
}

void OptimizerThreads::PinToNthAllowedCpu(int n) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0 || CPU_COUNT(&allowed) == 0) return;
  const int k = n % CPU_COUNT(&allowed);
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != k) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    (void)sched_setaffinity(0, sizeof(one), &one);  // best effort: unpinned still works
    return;
  }
}

OptimizerThreads::~OptimizerThreads() {
  {
    base::MutexLock lock(&mu_);
    stop_ = true;
  }
  work_cv_.SignalAll();
  for (std::thread& t : helpers_) t.join();
}

int OptimizerThreads::DefaultSize(bool overlaps_compute, int device_workers) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return overlaps_compute ? std::max(1, cores - std::max(0, device_workers)) : cores;
}

void OptimizerThreads::HelperLoop(int index) {
  int64_t seen = 0;
  for (;;) {
    std::pair<int64_t, int64_t> slice{0, 0};
    const std::function<void(int64_t, int64_t)>* fn = nullptr;
    {
      base::MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      if (static_cast<size_t>(index) + 1 < slices_.size()) slice = slices_[static_cast<size_t>(index) + 1];
      fn = fn_;
    }
    if (slice.first < slice.second) (*fn)(slice.first, slice.second);
    base::MutexLock lock(&mu_);
    if (--pending_ == 0) done_cv_.SignalAll();
  }
}

void OptimizerThreads::ParallelFor(int64_t n, int64_t align, int64_t max_slices,
                                   const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t slices = std::max<int64_t>(1, std::min<int64_t>(size(), max_slices));
  if (slices == 1) {
    fn(0, n);
    return;
  }
  const int64_t a = std::max<int64_t>(1, align);
  const int64_t chunk = ((n + slices - 1) / slices + a - 1) / a * a;
  std::pair<int64_t, int64_t> mine;
  {
    base::MutexLock lock(&mu_);
    RP_CHECK(pending_ == 0) << "OptimizerThreads::ParallelFor called while a pass is running";
    slices_.clear();
    for (int64_t s = 0; s < slices; ++s) slices_.emplace_back(std::min(n, s * chunk), std::min(n, (s + 1) * chunk));
    fn_ = &fn;
    pending_ = static_cast<int>(helpers_.size());
    ++generation_;
    mine = slices_[0];
  }
  work_cv_.SignalAll();
  fn(mine.first, mine.second);
  base::MutexLock lock(&mu_);
  while (pending_ > 0) done_cv_.Wait(&mu_);
  fn_ = nullptr;
}

}  // namespace rp::workers
