// optimizer_threads.h — the optimizer's own threads for its element-wise passes (the fused
// AdamW step): a fixed pool, apart from ATen's intra-op pool that the device workers' stage
// math uses, so an asynchronous optimizer step never queues behind (or steals) compute threads.
//
// Contract: ParallelFor is called by one thread at a time (the optimizer's); the pool's helper
// threads live as long as the object. Size 1 runs everything on the caller.
#pragma once

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "workers/base/mutex.h"

namespace rp::workers {

class OptimizerThreads {
 public:
  // `threads` >= 1 (counting the caller); values below 1 count as 1. `pin_helpers`: helper i
  // runs only on CPU i+1 of the process's affinity set (wrapping), leaving the first to the
  // caller; off by default, since measured it does not help (docs/ENGINE.md, adamw_bench).
  explicit OptimizerThreads(int threads, bool pin_helpers = false);
  ~OptimizerThreads();
  OptimizerThreads(const OptimizerThreads&) = delete;
  OptimizerThreads& operator=(const OptimizerThreads&) = delete;

  int size() const { return static_cast<int>(helpers_.size()) + 1; }

  // fn(begin, end) over [0, n) in at most min(size(), max_slices) contiguous slices whose
  // boundaries are multiples of `align` elements (vector-aligned slices); the caller runs the
  // first. Returns when every slice is done. An exception in a slice is a broken invariant (the
  // kernels do not throw).
  void ParallelFor(int64_t n, int64_t align, int64_t max_slices, const std::function<void(int64_t, int64_t)>& fn);

  // The default size: every core when the optimizer runs alone (sync: after the iteration),
  // else the cores left after one per device worker (async: beside the stage math), at least 1.
  static int DefaultSize(bool overlaps_compute, int device_workers);

 private:
  void HelperLoop(int index);
  static void PinToNthAllowedCpu(int n);

  base::Mutex mu_;
  base::CondVar work_cv_, done_cv_;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;  // helpers still running the current generation
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The current job: helper i runs slice i + 1 of `slices_` (set under mu_ before a generation).
  const std::function<void(int64_t, int64_t)>* fn_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<std::pair<int64_t, int64_t>> slices_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> helpers_;
};

}  // namespace rp::workers
