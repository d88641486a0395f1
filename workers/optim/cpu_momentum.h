// cpu_momentum.h — the fused CPU kernels of the optimizers with one state buffer per parameter:
// SGD (momentum, dampening, Nesterov, L2 weight decay: torch.optim.SGD) and Lion (the sign of an
// interpolated momentum, decoupled weight decay: Chen et al. 2023, "Symbolic Discovery of
// Optimization Algorithms", Algorithm 2). One pass over (param, grad[, buffer]) that also writes
// the master copy, in slices on the optimizer's threads: AVX-512 or AVX2 (fused multiply-adds,
// the shared master stores) where the CPU has them (`path`: ResolveSimdPath), else a scalar loop.
//
// Contract: pure functions over raw buffers the caller owns (not overlapping, `n` elements
// each); thread-safe for distinct buffers.
#pragma once

#include <cstdint>

#include "workers/optim/cpu_adamw.h"
#include "workers/optim/fused_pass.h"
#include "workers/optim/optimizer_threads.h"

namespace rp::workers {

struct MomentumBuffers {
  float* param = nullptr;
  const float* grad = nullptr;
  float* buffer = nullptr;  // SGD: the momentum buffer (null: momentum 0); Lion: exp_avg
  void* master = nullptr;   // written when master_dtype != kNone
  MasterDtype master_dtype = MasterDtype::kNone;
};

struct SgdHyper {
  float lr = 1e-3f;
  float momentum = 0;
  float dampening = 0;
  float weight_decay = 0;  // L2: added to the gradient (torch.optim.SGD)
  bool nesterov = false;
  bool maximize = false;
  bool first_step = false;  // the buffer is set to the gradient (torch: a clone), not decayed
  float grad_scale = 1.0f;  // multiplies the gradient first (loss-scale removal x clipping)
};
void FusedSgd(const MomentumBuffers& b, int64_t n, const SgdHyper& h, SimdPath path = SimdPath::kAuto,
              OptimizerThreads* pool = nullptr);

struct LionHyper {
  float lr = 1e-4f;
  float beta1 = 0.9f;   // interpolation of the update direction
  float beta2 = 0.99f;  // decay of the momentum
  float weight_decay = 0;
  bool maximize = false;
  float grad_scale = 1.0f;
};
void FusedLion(const MomentumBuffers& b, int64_t n, const LionHyper& h, SimdPath path = SimdPath::kAuto,
               OptimizerThreads* pool = nullptr);

}  // namespace rp::workers
