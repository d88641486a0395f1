#include "workers/optim/cpu_adamw.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "workers/base/check.h"
#include "workers/optim/simd_master.h"

namespace rp::workers {
namespace {

// Passes at least this long write the bf16 master with streaming stores (8 MiB of master: well
// past a core's L2 and a share of L3).
constexpr int64_t kStreamingMasterMin = int64_t{4} << 20;

// Per-call constants shared by every path.
struct Consts {
  float decay;     // 1 - lr * wd
  float one_m_b1;  // 1 - beta1
  float b2, one_m_b2;
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^t)
  float step_size;     // lr / (1 - beta1^t)
  float eps, gscale;
};

Consts MakeConsts(const AdamWHyper& h) {
  const double bc1 = 1 - std::pow(static_cast<double>(h.beta1), static_cast<double>(h.step));
  const double bc2 = 1 - std::pow(static_cast<double>(h.beta2), static_cast<double>(h.step));
  return {1.0f - h.lr * h.weight_decay,
          1.0f - h.beta1,
          h.beta2,
          1.0f - h.beta2,
          static_cast<float>(1.0 / std::sqrt(bc2)),
          static_cast<float>(h.lr / bc1),
          h.eps,
          h.maximize ? -h.grad_scale : h.grad_scale};
}

void ScalarRange(const AdamWBuffers& b, int64_t begin, int64_t end, const Consts& c, bool amsgrad) {
  for (int64_t i = begin; i < end; ++i) {
    const float g = b.grad[i] * c.gscale;
    float p = b.param[i] * c.decay;
    float m = b.exp_avg[i];
    m = m + c.one_m_b1 * (g - m);
    const float v = c.b2 * b.exp_avg_sq[i] + c.one_m_b2 * g * g;
    float vu = v;
    if (amsgrad) {
      vu = std::max(b.max_exp_avg_sq[i], v);
      b.max_exp_avg_sq[i] = vu;
    }
    const float denom = std::sqrt(vu) * c.inv_sqrt_bc2 + c.eps;
    p = p - c.step_size * (m / denom);
    b.exp_avg[i] = m;
    b.exp_avg_sq[i] = v;
    b.param[i] = p;
    StoreMaster(b.master, b.master_dtype, i, p);
  }
}

__attribute__((target("avx2,fma,f16c"))) void Avx2Range(const AdamWBuffers& b, int64_t begin, int64_t end,
                                                        const Consts& c, bool amsgrad) {
  const __m256 decay = _mm256_set1_ps(c.decay), omb1 = _mm256_set1_ps(c.one_m_b1), b2 = _mm256_set1_ps(c.b2),
               omb2 = _mm256_set1_ps(c.one_m_b2), isb = _mm256_set1_ps(c.inv_sqrt_bc2),
               ss = _mm256_set1_ps(c.step_size), eps = _mm256_set1_ps(c.eps), gs = _mm256_set1_ps(c.gscale);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(b.grad + i), gs);
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(b.param + i), decay);
    __m256 m = _mm256_loadu_ps(b.exp_avg + i);
    m = _mm256_fmadd_ps(omb1, _mm256_sub_ps(g, m), m);
    const __m256 v = _mm256_fmadd_ps(omb2, _mm256_mul_ps(g, g), _mm256_mul_ps(b2, _mm256_loadu_ps(b.exp_avg_sq + i)));
    __m256 vu = v;
    if (amsgrad) {
      vu = _mm256_max_ps(_mm256_loadu_ps(b.max_exp_avg_sq + i), v);
      _mm256_storeu_ps(b.max_exp_avg_sq + i, vu);
    }
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(vu), isb, eps);
    p = _mm256_fnmadd_ps(ss, _mm256_div_ps(m, denom), p);
    _mm256_storeu_ps(b.exp_avg + i, m);
    _mm256_storeu_ps(b.exp_avg_sq + i, v);
    _mm256_storeu_ps(b.param + i, p);
    StoreMaster8(b.master, b.master_dtype, i, p);
  }
  ScalarRange(b, i, end, c, amsgrad);  // the tail
}

// kStream: the bf16 master is written with non-temporal stores where its address allows (32-byte
// aligned 16-element groups), cached stores elsewhere.
template <bool kStream>
__attribute__((target("avx512f,avx512bw,avx2,fma,f16c"))) void Avx512Range(const AdamWBuffers& b, int64_t begin,
                                                                           int64_t end, const Consts& c, bool amsgrad) {
  const __m512 decay = _mm512_set1_ps(c.decay), omb1 = _mm512_set1_ps(c.one_m_b1), b2 = _mm512_set1_ps(c.b2),
               omb2 = _mm512_set1_ps(c.one_m_b2), isb = _mm512_set1_ps(c.inv_sqrt_bc2),
               ss = _mm512_set1_ps(c.step_size), eps = _mm512_set1_ps(c.eps), gs = _mm512_set1_ps(c.gscale);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(b.grad + i), gs);
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(b.param + i), decay);
    __m512 m = _mm512_loadu_ps(b.exp_avg + i);
    m = _mm512_fmadd_ps(omb1, _mm512_sub_ps(g, m), m);
    const __m512 v = _mm512_fmadd_ps(omb2, _mm512_mul_ps(g, g), _mm512_mul_ps(b2, _mm512_loadu_ps(b.exp_avg_sq + i)));
    __m512 vu = v;
    if (amsgrad) {
      vu = _mm512_max_ps(_mm512_loadu_ps(b.max_exp_avg_sq + i), v);
      _mm512_storeu_ps(b.max_exp_avg_sq + i, vu);
    }
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vu), isb, eps);
    p = _mm512_fnmadd_ps(ss, _mm512_div_ps(m, denom), p);
    _mm512_storeu_ps(b.exp_avg + i, m);
    _mm512_storeu_ps(b.exp_avg_sq + i, v);
    _mm512_storeu_ps(b.param + i, p);
    StoreMaster16(b.master, b.master_dtype, i, p, kStream);
  }
  if (kStream) _mm_sfence();  // this thread's streaming stores are visible before the pass ends
  ScalarRange(b, i, end, c, amsgrad);
}

// --- bf16 moments -----------------------------------------------------------------------

inline uint32_t Mix32(uint32_t x) {  // a 32-bit integer hash (bijective, well mixed)
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

uint32_t RoundingKey(uint64_t seed, int64_t step, int stream) {
  const uint32_t k = static_cast<uint32_t>(seed) ^ (static_cast<uint32_t>(seed >> 32) * 0x9e3779b9u) ^
                     (static_cast<uint32_t>(step) * 0x85ebca77u) ^ (static_cast<uint32_t>(stream + 1) * 0xc2b2ae3du);
  return Mix32(k);
}

inline float Bf16BitsToFloat(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t RoundWithBits(float x, uint32_t bits) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7fc0u);  // NaN
  return static_cast<uint16_t>((u + (bits & 0xffffu)) >> 16);
}

void ScalarRangeBf16(const AdamWBf16MomentBuffers& b, int64_t begin, int64_t end, const Consts& c, uint32_t key_m,
                     uint32_t key_v) {
  for (int64_t i = begin; i < end; ++i) {
    const float g = b.grad[i] * c.gscale;
    float p = b.param[i] * c.decay;
    float m = Bf16BitsToFloat(b.exp_avg[i]);
    m = m + c.one_m_b1 * (g - m);
    const float v = c.b2 * Bf16BitsToFloat(b.exp_avg_sq[i]) + c.one_m_b2 * g * g;
    const float denom = std::sqrt(v) * c.inv_sqrt_bc2 + c.eps;
    p = p - c.step_size * (m / denom);
    const uint32_t idx = static_cast<uint32_t>(i);
    b.exp_avg[i] = RoundWithBits(m, Mix32(idx ^ key_m));
    b.exp_avg_sq[i] = RoundWithBits(v, Mix32(idx ^ key_v));
    b.param[i] = p;
    StoreMaster(b.master, b.master_dtype, i, p);
  }
}

__attribute__((target("avx512f,avx512bw"))) inline __m512i Mix32x16(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x7feb352du)));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

// 16 floats to bf16 bits with the given rounding bits (RoundWithBits, lane by lane).
__attribute__((target("avx512f,avx512bw"))) inline __m256i RoundWithBitsx16(__m512 x, __m512i bits) {
  const __m512i u = _mm512_castps_si512(x);
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_and_si512(bits, _mm512_set1_epi32(0xffff))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512i qnan =
      _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x8000)), _mm512_set1_epi32(0x7fc0));
  r = _mm512_mask_blend_epi32(nan, r, qnan);
  return _mm512_cvtepi32_epi16(r);
}

__attribute__((target("avx512f,avx512bw"))) inline __m512 LoadBf16x16(const uint16_t* p) {
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

__attribute__((target("avx512f,avx512bw,avx2,fma,f16c"))) void Avx512RangeBf16(const AdamWBf16MomentBuffers& b,
                                                                               int64_t begin, int64_t end,
                                                                               const Consts& c, uint32_t key_m,
                                                                               uint32_t key_v) {
  const __m512 decay = _mm512_set1_ps(c.decay), omb1 = _mm512_set1_ps(c.one_m_b1), b2 = _mm512_set1_ps(c.b2),
               omb2 = _mm512_set1_ps(c.one_m_b2), isb = _mm512_set1_ps(c.inv_sqrt_bc2),
               ss = _mm512_set1_ps(c.step_size), eps = _mm512_set1_ps(c.eps), gs = _mm512_set1_ps(c.gscale);
  const __m512i km = _mm512_set1_epi32(static_cast<int>(key_m)), kv = _mm512_set1_epi32(static_cast<int>(key_v));
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m512 g = _mm512_mul_ps(_mm512_loadu_ps(b.grad + i), gs);
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(b.param + i), decay);
    __m512 m = LoadBf16x16(b.exp_avg + i);
    m = _mm512_fmadd_ps(omb1, _mm512_sub_ps(g, m), m);
    const __m512 v = _mm512_fmadd_ps(omb2, _mm512_mul_ps(g, g), _mm512_mul_ps(b2, LoadBf16x16(b.exp_avg_sq + i)));
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(v), isb, eps);
    p = _mm512_fnmadd_ps(ss, _mm512_div_ps(m, denom), p);
    const __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int>(static_cast<uint32_t>(i))), iota);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.exp_avg + i),
                        RoundWithBitsx16(m, Mix32x16(_mm512_xor_si512(idx, km))));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.exp_avg_sq + i),
                        RoundWithBitsx16(v, Mix32x16(_mm512_xor_si512(idx, kv))));
    _mm512_storeu_ps(b.param + i, p);
    StoreMaster16(b.master, b.master_dtype, i, p, /*stream=*/false);
  }
  ScalarRangeBf16(b, i, end, c, key_m, key_v);
}

__attribute__((target("avx2"))) inline __m256i Mix32x8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x7feb352du)));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(static_cast<int>(0x846ca68bu)));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

// 8 floats to bf16 bits with the given rounding bits (RoundWithBits, lane by lane).
__attribute__((target("avx2"))) inline __m128i RoundWithBitsx8(__m256 x, __m256i bits) {
  const __m256i u = _mm256_castps_si256(x);
  __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_and_si256(bits, _mm256_set1_epi32(0xffff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  const __m256i qnan =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000)), _mm256_set1_epi32(0x7fc0));
  r = _mm256_blendv_epi8(r, qnan, nan);
  // Every lane is in [0, 0xffff]: the unsigned-saturating pack keeps it exactly.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

__attribute__((target("avx2"))) inline __m256 LoadBf16x8(const uint16_t* p) {
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// The AVX2 twin of Avx512RangeBf16: 8 elements at a time, the same rounding bits per element.
__attribute__((target("avx2,fma,f16c"))) void Avx2RangeBf16(const AdamWBf16MomentBuffers& b, int64_t begin, int64_t end,
                                                            const Consts& c, uint32_t key_m, uint32_t key_v) {
  const __m256 decay = _mm256_set1_ps(c.decay), omb1 = _mm256_set1_ps(c.one_m_b1), b2 = _mm256_set1_ps(c.b2),
               omb2 = _mm256_set1_ps(c.one_m_b2), isb = _mm256_set1_ps(c.inv_sqrt_bc2),
               ss = _mm256_set1_ps(c.step_size), eps = _mm256_set1_ps(c.eps), gs = _mm256_set1_ps(c.gscale);
  const __m256i km = _mm256_set1_epi32(static_cast<int>(key_m)), kv = _mm256_set1_epi32(static_cast<int>(key_v));
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(b.grad + i), gs);
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(b.param + i), decay);
    __m256 m = LoadBf16x8(b.exp_avg + i);
    m = _mm256_fmadd_ps(omb1, _mm256_sub_ps(g, m), m);
    const __m256 v = _mm256_fmadd_ps(omb2, _mm256_mul_ps(g, g), _mm256_mul_ps(b2, LoadBf16x8(b.exp_avg_sq + i)));
    const __m256 denom = _mm256_fmadd_ps(_mm256_sqrt_ps(v), isb, eps);
    p = _mm256_fnmadd_ps(ss, _mm256_div_ps(m, denom), p);
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(static_cast<uint32_t>(i))), iota);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b.exp_avg + i), RoundWithBitsx8(m, Mix32x8(_mm256_xor_si256(idx, km))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b.exp_avg_sq + i),
                     RoundWithBitsx8(v, Mix32x8(_mm256_xor_si256(idx, kv))));
    _mm256_storeu_ps(b.param + i, p);
    StoreMaster8(b.master, b.master_dtype, i, p);
  }
  ScalarRangeBf16(b, i, end, c, key_m, key_v);
}

// F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not know "f16c").
bool HasF16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

}  // namespace

SimdPath ResolveSimdPath(SimdPath path) {
  if (path == SimdPath::kScalar) return path;
  if (path != SimdPath::kAvx2 && SimdPathSupported(SimdPath::kAvx512)) return SimdPath::kAvx512;
  return SimdPathSupported(SimdPath::kAvx2) ? SimdPath::kAvx2 : SimdPath::kScalar;
}

bool SimdPathSupported(SimdPath p) {
  __builtin_cpu_init();
  switch (p) {
    case SimdPath::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
    case SimdPath::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && HasF16c();
    case SimdPath::kScalar:
    case SimdPath::kAuto:
      return true;
  }
  return false;
}

std::string BestSimdPathName() {
  switch (ResolveSimdPath(SimdPath::kAuto)) {
    case SimdPath::kAvx512:
      return "avx512";
    case SimdPath::kAvx2:
      return "avx2";
    default:
      return "scalar";
  }
}

void FusedAdamW(const AdamWBuffers& b, int64_t n, const AdamWHyper& h, SimdPath path, OptimizerThreads* pool) {
  if (n <= 0) return;
  const Consts c = MakeConsts(h);
  const SimdPath use = ResolveSimdPath(path);
  // Streaming (non-temporal) master stores once a pass is far larger than the caches: the
  // master is written only, so a cached store would first read every line (2 B/param more
  // traffic); a small tensor's master stays cached for the upload that follows.
  const bool stream = n >= kStreamingMasterMin && b.master_dtype == MasterDtype::kBFloat16;
  const std::function<void(int64_t, int64_t)> range = [&](int64_t begin, int64_t end) {
    switch (use) {
      case SimdPath::kAvx512:
        if (stream) {
          Avx512Range<true>(b, begin, end, c, h.amsgrad);
        } else {
          Avx512Range<false>(b, begin, end, c, h.amsgrad);
        }
        break;
      case SimdPath::kAvx2:
        Avx2Range(b, begin, end, c, h.amsgrad);
        break;
      default:
        ScalarRange(b, begin, end, c, h.amsgrad);
    }
  };
  RunSliced(n, pool, range);
}

uint32_t StochasticRoundingBits(uint64_t seed, int64_t step, int64_t index, int stream) {
  return Mix32(static_cast<uint32_t>(index) ^ RoundingKey(seed, step, stream));
}

uint16_t StochasticRoundBf16(float x, uint32_t bits) { return RoundWithBits(x, bits); }

void FusedAdamWBf16Moments(const AdamWBf16MomentBuffers& b, int64_t n, const AdamWHyper& h, uint64_t seed,
                           SimdPath path, OptimizerThreads* pool) {
  RP_CHECK(!h.amsgrad) << "AdamW with bf16 moments has no amsgrad";
  if (n <= 0) return;
  const Consts c = MakeConsts(h);
  const uint32_t key_m = RoundingKey(seed, h.step, 0), key_v = RoundingKey(seed, h.step, 1);
  const SimdPath use = ResolveSimdPath(path);
  const std::function<void(int64_t, int64_t)> range = [&](int64_t begin, int64_t end) {
    switch (use) {
      case SimdPath::kAvx512:
        Avx512RangeBf16(b, begin, end, c, key_m, key_v);
        break;
      case SimdPath::kAvx2:
        Avx2RangeBf16(b, begin, end, c, key_m, key_v);
        break;
      default:
        ScalarRangeBf16(b, begin, end, c, key_m, key_v);
    }
  };
  RunSliced(n, pool, range);
}

}  // namespace rp::workers
