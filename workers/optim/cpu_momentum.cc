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

// The same 8 elements at a time (AVX2), for hosts without AVX-512.
__attribute__((target("avx2,fma,f16c"))) void SgdRangeAvx2(const MomentumBuffers& b, int64_t begin, int64_t end,
                                                           const SgdHyper& h) {
  const __m256 gs = _mm256_set1_ps(h.maximize ? -h.grad_scale : h.grad_scale);
  const __m256 wd = _mm256_set1_ps(h.weight_decay), mom = _mm256_set1_ps(h.momentum);
  const __m256 keep = _mm256_set1_ps(1.0f - h.dampening), neg_lr = _mm256_set1_ps(-h.lr);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 p = _mm256_loadu_ps(b.param + i);
    __m256 d = _mm256_mul_ps(_mm256_loadu_ps(b.grad + i), gs);
    if (h.weight_decay != 0) d = _mm256_fmadd_ps(wd, p, d);
    if (b.buffer != nullptr) {
      const __m256 m = h.first_step ? d : _mm256_fmadd_ps(mom, _mm256_loadu_ps(b.buffer + i), _mm256_mul_ps(keep, d));
      _mm256_storeu_ps(b.buffer + i, m);
      d = h.nesterov ? _mm256_fmadd_ps(mom, m, d) : m;
    }
    const __m256 np = _mm256_fmadd_ps(neg_lr, d, p);
    _mm256_storeu_ps(b.param + i, np);
    StoreMaster8(b.master, b.master_dtype, i, np);
  }
  SgdRange(b, i, end, h);
}

__attribute__((target("avx2,fma,f16c"))) void LionRangeAvx2(const MomentumBuffers& b, int64_t begin, int64_t end,
                                                            const LionHyper& h) {
  const __m256 gs = _mm256_set1_ps(h.maximize ? -h.grad_scale : h.grad_scale);
  const __m256 b1 = _mm256_set1_ps(h.beta1), one_m_b1 = _mm256_set1_ps(1.0f - h.beta1);
  const __m256 b2 = _mm256_set1_ps(h.beta2), one_m_b2 = _mm256_set1_ps(1.0f - h.beta2);
  const __m256 decay = _mm256_set1_ps(1.0f - h.lr * h.weight_decay), neg_lr = _mm256_set1_ps(-h.lr);
  const __m256 zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f), minus_one = _mm256_set1_ps(-1.0f);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(b.grad + i), gs);
    const __m256 m = _mm256_loadu_ps(b.buffer + i);
    const __m256 c = _mm256_fmadd_ps(b1, m, _mm256_mul_ps(one_m_b1, g));
    __m256 sign = _mm256_blendv_ps(zero, one, _mm256_cmp_ps(c, zero, _CMP_GT_OQ));
    sign = _mm256_blendv_ps(sign, minus_one, _mm256_cmp_ps(c, zero, _CMP_LT_OQ));
    sign = _mm256_blendv_ps(sign, c, _mm256_cmp_ps(c, c, _CMP_UNORD_Q));  // NaN stays NaN
    const __m256 p = _mm256_fmadd_ps(neg_lr, sign, _mm256_mul_ps(_mm256_loadu_ps(b.param + i), decay));
    _mm256_storeu_ps(b.buffer + i, _mm256_fmadd_ps(b2, m, _mm256_mul_ps(one_m_b2, g)));
    _mm256_storeu_ps(b.param + i, p);
    StoreMaster8(b.master, b.master_dtype, i, p);
  }
  LionRange(b, i, end, h);
}

}  // namespace

void FusedSgd(const MomentumBuffers& b, int64_t n, const SgdHyper& h, SimdPath path, OptimizerThreads* pool) {
  if (n <= 0) return;
  const SimdPath simd = ResolveSimdPath(path);
  RunSliced(n, pool, [&](int64_t begin, int64_t end) {
    if (simd == SimdPath::kAvx512) {
      SgdRangeAvx512(b, begin, end, h);
    } else if (simd == SimdPath::kAvx2) {
      SgdRangeAvx2(b, begin, end, h);
    } else {
      SgdRange(b, begin, end, h);
    }
  });
}

void FusedLion(const MomentumBuffers& b, int64_t n, const LionHyper& h, SimdPath path, OptimizerThreads* pool) {
  if (n <= 0) return;
  const SimdPath simd = ResolveSimdPath(path);
  RunSliced(n, pool, [&](int64_t begin, int64_t end) {
    if (simd == SimdPath::kAvx512) {
      LionRangeAvx512(b, begin, end, h);
    } else if (simd == SimdPath::kAvx2) {
      LionRangeAvx2(b, begin, end, h);
    } else {
      LionRange(b, begin, end, h);
    }
  });
}

}  // namespace rp::workers
