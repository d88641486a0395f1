#include "workers/io/mxfp4.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "workers/files/mxfp4_decode.h"

namespace rp::workers::io {

absl::StatusOr<at::Tensor> DequantizeMxfp4(const at::Tensor& blocks, const at::Tensor& scales, at::ScalarType dtype) {
  if (blocks.scalar_type() != at::kByte || scales.scalar_type() != at::kByte) {
    return absl::InvalidArgumentError("MXFP4: blocks and scales must be uint8 (U8)");
  }
  auto groups = files::CheckMxfp4Shapes(blocks.sizes().vec(), scales.sizes().vec());
  if (!groups.ok()) return groups.status();
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
    if (dtype == at::kFloat) files::DecodeMxfp4Groups(bp, sp, out.data_ptr<float>(), begin, end);
    if (dtype == at::kBFloat16) files::DecodeMxfp4Groups(bp, sp, out.data_ptr<c10::BFloat16>(), begin, end);
    if (dtype == at::kHalf) files::DecodeMxfp4Groups(bp, sp, out.data_ptr<c10::Half>(), begin, end);
  });
  return out;
}

}  // namespace rp::workers::io
