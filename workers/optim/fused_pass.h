// fused_pass.h — what every fused CPU optimizer kernel shares: the master dtype a pass writes
// beside the fp32 parameter (P_cp fused into the step), the scalar master store (round to
// nearest even, as the store's own RefreshMaster), and the slicing of one pass over the
// optimizer's threads.
//
// Contract: header-only helpers for the kernels in workers/optim (cpu_adamw, cpu_momentum);
// pure over the caller's buffers.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <functional>

#include "workers/optim/optimizer_threads.h"

namespace rp::workers {

enum class MasterDtype { kNone, kFloat32, kBFloat16, kFloat16 };

inline void StoreMaster(void* master, MasterDtype dtype, int64_t i, float p) {
  switch (dtype) {
    case MasterDtype::kFloat32:
      static_cast<float*>(master)[i] = p;
      break;
    case MasterDtype::kBFloat16:
      static_cast<c10::BFloat16*>(master)[i] = c10::BFloat16(p);  // round to nearest even
      break;
    case MasterDtype::kFloat16:
      static_cast<c10::Half*>(master)[i] = c10::Half(p);
      break;
    case MasterDtype::kNone:
      break;
  }
}

// A pass over n elements: on the caller alone when short (or without a pool), else in balanced
// slices of at least 16 Ki elements, rounded to 64 so every slice but the last is
// vector-aligned.
inline void RunSliced(int64_t n, OptimizerThreads* pool, const std::function<void(int64_t, int64_t)>& range) {
  constexpr int64_t kMinPerThread = 1 << 14;
  if (pool == nullptr || n < 2 * kMinPerThread) {
    range(0, n);
    return;
  }
  pool->ParallelFor(n, 64, n / kMinPerThread, range);
}

}  // namespace rp::workers
