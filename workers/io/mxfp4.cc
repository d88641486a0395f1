#include "workers/io/mxfp4.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <array>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rp::workers::io {
namespace {

// E2M1: sign, two exponent bits, one mantissa bit (no infinities, no NaN).
constexpr std::array<float, 16> kE2M1 = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                         -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

template <typename Out>
void DequantizeRows(const uint8_t* blocks, const uint8_t* scales, Out* out, int64_t begin, int64_t end) {
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

}  // namespace

absl::StatusOr<at::Tensor> DequantizeMxfp4(const at::Tensor& blocks, const at::Tensor& scales, at::ScalarType dtype) {
  if (blocks.scalar_type() != at::kByte || scales.scalar_type() != at::kByte) {
    return absl::InvalidArgumentError("MXFP4: blocks and scales must be uint8 (U8)");
  }
  if (blocks.dim() < 2 || blocks.size(-1) != 16 || scales.dim() != blocks.dim() - 1 ||
      scales.sizes() != blocks.sizes().slice(0, blocks.dim() - 1)) {
    return absl::InvalidArgumentError(absl::StrCat("MXFP4: blocks [", absl::StrJoin(blocks.sizes(), ", "),
                                                   "] must be scales [", absl::StrJoin(scales.sizes(), ", "),
                                                   "] plus a last dimension of 16 bytes"));
  }
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf) {
    return absl::InvalidArgumentError("MXFP4: dequantises to float32, bfloat16 or float16 only");
  }
  std::vector<int64_t> shape(scales.sizes().begin(), scales.sizes().end());
  shape.back() *= 32;
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  const at::Tensor b = blocks.contiguous(), s = scales.contiguous();
  const uint8_t* bp = b.data_ptr<uint8_t>();
  const uint8_t* sp = s.data_ptr<uint8_t>();
  at::parallel_for(0, s.numel(), 4096, [&](int64_t begin, int64_t end) {
    if (dtype == at::kFloat) DequantizeRows(bp, sp, out.data_ptr<float>(), begin, end);
    if (dtype == at::kBFloat16) DequantizeRows(bp, sp, out.data_ptr<c10::BFloat16>(), begin, end);
    if (dtype == at::kHalf) DequantizeRows(bp, sp, out.data_ptr<c10::Half>(), begin, end);
  });
  return out;
}

}  // namespace rp::workers::io
