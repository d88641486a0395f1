// mxfp4.h — MXFP4 (OCP microscaling FP4) tensors as GPT-OSS checkpoints store their experts:
// `*_blocks` uint8 [..., R, G, 16] (two E2M1 values per byte, the low nibble first) and
// `*_scales` uint8 [..., R, G] (one E8M0 exponent per 32 values, biased by 127). Dequantised
// value j of group g of row r: ldexp(E2M1(nibble), scale − 127), exact in fp32 (or ±inf past its
// range; 0 stays 0) and rounded once to the target dtype — the values transformers'
// convert_moe_packed_tensors produces for that dtype, bit for bit.
//
// Contract: pure; any thread (the work is split over ATen's intra-op threads).
#pragma once

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"

namespace rp::workers::io {

// -> [..., R, G * 32] in `dtype` (float, bfloat16 or half). InvalidArgument naming the mismatch
// when the shapes or dtypes are not an MXFP4 pair (transformers' own layout transposes the last
// two dimensions after this; the caller lays the result out as its parameter needs).
absl::StatusOr<at::Tensor> DequantizeMxfp4(const at::Tensor& blocks, const at::Tensor& scales, at::ScalarType dtype);

}  // namespace rp::workers::io
