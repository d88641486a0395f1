// mxfp4_decode.h — the MXFP4 decoder on plain bytes (see mxfp4.h for the format): the shape rule
// of a blocks / scales pair and the group decoder, templated on the output element. No LibTorch:
// mxfp4.cc runs it over tensors, the MXFP4 fuzzer over raw bytes.
//
// Contract: pure; DecodeMxfp4Groups reads blocks[16·begin, 16·end) and scales[begin, end) and
// writes out[32·begin, 32·end); callers check the shapes (CheckMxfp4Shapes) first.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::files {

// The number of 32-value groups (the scales' element count) when `blocks` is `scales` plus a
// last dimension of 16 bytes and every count fits in int64 after ×32; InvalidArgument otherwise.
absl::StatusOr<int64_t> CheckMxfp4Shapes(const std::vector<int64_t>& blocks, const std::vector<int64_t>& scales);

// E2M1: sign, two exponent bits, one mantissa bit (no infinities, no NaN).
inline constexpr std::array<float, 16> kE2M1 = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                                -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

template <typename Out>
void DecodeMxfp4Groups(const uint8_t* blocks, const uint8_t* scales, Out* out, int64_t begin, int64_t end) {
  for (int64_t g = begin; g < end; ++g) {  // one 32-value group per scale
    // ldexp, not a multiply by 2^e: 2^128 is not a float, while 0.5 · 2^128 is (and 0 stays 0).
    const int e = static_cast<int>(scales[g]) - 127;
    const uint8_t* in = blocks + g * 16;
    Out* o = out + g * 32;
    for (int b = 0; b < 16; ++b) {
      o[2 * b] = static_cast<Out>(std::ldexp(kE2M1[in[b] & 0x0F], e));
      o[2 * b + 1] = static_cast<Out>(std::ldexp(kE2M1[in[b] >> 4], e));
    }
  }
}

}  // namespace rp::files
