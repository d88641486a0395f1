#include "workers/optim/cpu_momentum.h"

#include <cmath>

#include "workers/optim/cpu_adamw.h"
#include "workers/optim/simd_master.h"

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

// The same arithmetic 16 elements at a time (fused multiply-adds: within an ulp of the scalar
// loop), the scalar loop for the tail.
__attribute__((target("avx512f,avx512bw,avx2,fma,f16c"))) void SgdRangeAvx512(const MomentumBuffers& b, int64_t begin,
                                                                              int64_t end, const SgdHyper& h) {
  const __m512 gs = _mm512_set1_ps(h.maximize ? -h.grad_scale : h.grad_scale);
  const __m512 wd = _mm512_set1_ps(h.weight_decay), mom = _mm512_set1_ps(h.momentum);
  const __m512 keep = _mm512_set1_ps(1.0f - h.dampening), neg_lr = _mm512_set1_ps(-h.lr);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 p = _mm512_loadu_ps(b.param + i);
    __m512 d = _mm512_mul_ps(_mm512_loadu_ps(b.grad + i), gs);
    if (h.weight_decay != 0) d = _mm512_fmadd_ps(wd, p, d);
    if (b.buffer != nullptr) {
      const __m512 m = h.first_step ? d : _mm512_fmadd_ps(mom, _mm512_loadu_ps(b.buffer + i), _mm512_mul_ps(keep, d));
      _mm512_storeu_ps(b.buffer + i, m);
      d = h.nesterov ? _mm512_fmadd_ps(mom, m, d) : m;
    }
    const __m512 np = _mm512_fmadd_ps(neg_lr, d, p);
    _mm512_storeu_ps(b.param + i, np);
    StoreMaster16(b.master, b.master_dtype, i, np, /*stream=*/false);
  }
  SgdRange(b, i, end, h);
}

__attribute__((target("avx512f,avx512bw,avx2,fma,f16c"))) void LionRangeAvx512(const MomentumBuffers& b, int64_t begin,
                                                                               int64_t end, const LionHyper& h) {
  const __m512 gs = _mm512_set1_ps(h.maximize ? -h.grad_scale : h.grad_scale);
  const __m512 b1 = _mm512_set1_ps(h.beta1), one_m_b1 = _mm512_set1_ps(1.0f - h.beta1);
  const __m512 b2 = _mm512_set1_ps(h.beta2), one_m_b2 = _mm512_set1_ps(1.0f - h.beta2);
  const __m512 decay = _mm512_set1_ps(1.0f - h.lr * h.weight_decay), neg_lr = _mm512_set1_ps(-h.lr);
  const __m512 zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f), minus_one = _mm512_set1_ps(-1.0f);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(b.grad + i), gs);
    const __m512 m = _mm512_loadu_ps(b.buffer + i);
    const __m512 c = _mm512_fmadd_ps(b1, m, _mm512_mul_ps(one_m_b1, g));
    __m512 sign = _mm512_mask_mov_ps(zero, _mm512_cmp_ps_mask(c, zero, _CMP_GT_OQ), one);
    sign = _mm512_mask_mov_ps(sign, _mm512_cmp_ps_mask(c, zero, _CMP_LT_OQ), minus_one);
    sign = _mm512_mask_mov_ps(sign, _mm512_cmp_ps_mask(c, c, _CMP_UNORD_Q), c);  // NaN stays NaN
    const __m512 p = _mm512_fmadd_ps(neg_lr, sign, _mm512_mul_ps(_mm512_loadu_ps(b.param + i), decay));
    _mm512_storeu_ps(b.buffer + i, _mm512_fmadd_ps(b2, m, _mm512_mul_ps(one_m_b2, g)));
    _mm512_storeu_ps(b.param + i, p);
    StoreMaster16(b.master, b.master_dtype, i, p, /*stream=*/false);
  }
  LionRange(b, i, end, h);
}

}  // namespace

void FusedSgd(const MomentumBuffers& b, int64_t n, const SgdHyper& h, OptimizerThreads* pool) {
  if (n <= 0) return;
  const bool avx512 = SimdPathSupported(SimdPath::kAvx512);
  RunSliced(n, pool, [&](int64_t begin, int64_t end) {
    avx512 ? SgdRangeAvx512(b, begin, end, h) : SgdRange(b, begin, end, h);
  });
}

void FusedLion(const MomentumBuffers& b, int64_t n, const LionHyper& h, OptimizerThreads* pool) {
  if (n <= 0) return;
  const bool avx512 = SimdPathSupported(SimdPath::kAvx512);
  RunSliced(n, pool, [&](int64_t begin, int64_t end) {
    avx512 ? LionRangeAvx512(b, begin, end, h) : LionRange(b, begin, end, h);
  });
}

}  // namespace rp::workers
