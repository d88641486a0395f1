#include "workers/optim/cpu_momentum.h"

#include <cmath>

namespace rp::workers {
namespace {

void SgdRange(const MomentumBuffers& b, int64_t begin, int64_t end, const SgdHyper& h) {
  float* __restrict__ param = b.param;
  const float* __restrict__ grad = b.grad;
  float* __restrict__ buf = b.buffer;
  const float gs = h.maximize ? -h.grad_scale : h.grad_scale;
  const float keep = 1.0f - h.dampening;
  for (int64_t i = begin; i < end; ++i) {
    float d = grad[i] * gs;
    if (h.weight_decay != 0) d = d + h.weight_decay * param[i];
    if (buf != nullptr) {
      const float m = h.first_step ? d : h.momentum * buf[i] + keep * d;
      buf[i] = m;
      d = h.nesterov ? d + h.momentum * m : m;
    }
    const float p = param[i] - h.lr * d;
    param[i] = p;
    StoreMaster(b.master, b.master_dtype, i, p);
  }
}

void LionRange(const MomentumBuffers& b, int64_t begin, int64_t end, const LionHyper& h) {
  float* __restrict__ param = b.param;
  const float* __restrict__ grad = b.grad;
  float* __restrict__ m = b.buffer;
  const float gs = h.maximize ? -h.grad_scale : h.grad_scale;
  const float decay = 1.0f - h.lr * h.weight_decay;
  for (int64_t i = begin; i < end; ++i) {
    const float g = grad[i] * gs;
    const float c = h.beta1 * m[i] + (1.0f - h.beta1) * g;
    const float sign = c > 0 ? 1.0f : c < 0 ? -1.0f : (std::isnan(c) ? c : 0.0f);
    const float p = param[i] * decay - h.lr * sign;
    m[i] = h.beta2 * m[i] + (1.0f - h.beta2) * g;
    param[i] = p;
    StoreMaster(b.master, b.master_dtype, i, p);
  }
}

}  // namespace

void FusedSgd(const MomentumBuffers& b, int64_t n, const SgdHyper& h, OptimizerThreads* pool) {
  if (n <= 0) return;
  RunSliced(n, pool, [&](int64_t begin, int64_t end) { SgdRange(b, begin, end, h); });
}

void FusedLion(const MomentumBuffers& b, int64_t n, const LionHyper& h, OptimizerThreads* pool) {
  if (n <= 0) return;
  RunSliced(n, pool, [&](int64_t begin, int64_t end) { LionRange(b, begin, end, h); });
}

}  // namespace rp::workers
