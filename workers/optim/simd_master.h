// simd_master.h — the master stores the fused optimizer kernels share: 16 fp32 values (AVX-512)
// or 8 (AVX2) written as the master copy (fp32, bf16 round-to-nearest-even as the scalar
// StoreMaster, fp16), the 16-wide one optionally with streaming stores.
//
// Contract: header-only, for the kernels in workers/optim; call the 16-wide functions only on a
// CPU with AVX-512, the 8-wide ones only with AVX2 (SimdPathSupported).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "workers/optim/fused_pass.h"

namespace rp::workers {

// bf16 round-to-nearest-even of 8 floats (NaN stays NaN).
__attribute__((target("avx2,fma"))) inline __m128i Bf16x8(__m256 x) {
  __m256i u = _mm256_castps_si256(x);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(u, _mm256_set1_epi32(0x400000)), nan);
  r = _mm256_srli_epi32(r, 16);
  __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
  return _mm_packus_epi32(lo, hi);
}

// Writes 8 master values from `p` at element i.
__attribute__((target("avx2,fma,f16c"))) inline void StoreMaster8(void* master, MasterDtype dtype, int64_t i,
                                                                  __m256 p) {
  switch (dtype) {
    case MasterDtype::kFloat32:
      _mm256_storeu_ps(static_cast<float*>(master) + i, p);
      break;
    case MasterDtype::kBFloat16:
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(master) + i), Bf16x8(p));
      break;
    case MasterDtype::kFloat16:
      _mm_storeu_si128(reinterpret_cast<__m128i*>(static_cast<uint16_t*>(master) + i),
                       _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    case MasterDtype::kNone:
      break;
  }
}

// bf16 round-to-nearest-even of 16 floats (NaN stays NaN), the same rounding as Bf16x8.
__attribute__((target("avx512f,avx512bw"))) inline __m256i Bf16x16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(u, _mm512_set1_epi32(0x400000)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

// Writes 16 master values from `p` at element i; with `stream`, a bf16 master goes out with
// non-temporal stores where the address is 32-byte aligned.
__attribute__((target("avx512f,avx512bw,avx2,fma,f16c"))) inline void StoreMaster16(void* master, MasterDtype dtype,
                                                                                    int64_t i, __m512 p, bool stream) {
  switch (dtype) {
    case MasterDtype::kFloat32:
      _mm512_storeu_ps(static_cast<float*>(master) + i, p);
      break;
    case MasterDtype::kBFloat16: {
      uint16_t* out = static_cast<uint16_t*>(master) + i;
      const __m256i bf = Bf16x16(p);
      if (stream && (reinterpret_cast<uintptr_t>(out) & 31) == 0) {
        _mm256_stream_si256(reinterpret_cast<__m256i*>(out), bf);
      } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), bf);
      }
      break;
    }
    case MasterDtype::kFloat16:
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(master) + i),
                          _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      break;
    case MasterDtype::kNone:
      break;
  }
}

}  // namespace rp::workers
