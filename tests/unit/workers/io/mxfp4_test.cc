// MXFP4 dequantisation against transformers' convert_moe_packed_tensors (mxfp4_reference.py):
// random blocks and scales, every scale from 0 to 255's ends included, equal bit for bit in
// bfloat16, float32 and float16 (inf where an exponent of 128 overflows, 0 where the value is 0);
// and what is not
// an MXFP4 pair is refused naming the shapes.
#include "workers/io/mxfp4.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tests/support/run_command.h"
#include "workers/io/safetensors_reader.h"

namespace rp::workers::io {
namespace {

at::Tensor Bits(const at::Tensor& t) { return t.view(t.element_size() == 4 ? at::kInt : at::kShort); }

TEST(Mxfp4, DequantisationEqualsTransformersBitForBit) {
  const std::string file =
      (std::filesystem::temp_directory_path() / ("rp_mxfp4_" + std::to_string(getpid()) + ".safetensors")).string();
  std::string log;
  ASSERT_EQ(rp::testing::RunCommand(std::string(RP_VENV_PYTHON) + " " RP_TEST_DIR "/mxfp4_reference.py " + file, &log),
            0)
      << "the oracle mxfp4_reference.py (transformers) failed: " << log;
  auto ref = SafetensorsFile::Open(file);
  ASSERT_TRUE(ref.ok()) << ref.status();
  const at::Tensor blocks = *(*ref)->Read("blocks", at::kByte), scales = *(*ref)->Read("scales", at::kByte);
  int specials = 0;
  for (const auto& [name, dtype] : {std::pair{"bf16", at::kBFloat16}, {"f32", at::kFloat}, {"f16", at::kHalf}}) {
    SCOPED_TRACE(name);
    const at::Tensor want = *(*ref)->Read(name, dtype);
    auto got = DequantizeMxfp4(blocks, scales, dtype);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->sizes(), (std::vector<int64_t>{3, 5, 128}));
    const at::Tensor laid_out = got->transpose(1, 2).contiguous();  // transformers' layout
    EXPECT_TRUE(at::equal(Bits(laid_out), Bits(want)))
        << (Bits(laid_out) != Bits(want)).sum().item<int64_t>() << " elements differ";
    specials += laid_out.isinf().sum().item<int>();
  }
  EXPECT_GT(specials, 0);  // the edge scales were exercised
  std::filesystem::remove(file);
}

TEST(Mxfp4, WhatIsNotAnMxfp4PairIsRefused) {
  const at::Tensor blocks = at::zeros({2, 3, 16}, at::kByte), scales = at::zeros({2, 3}, at::kByte);
  EXPECT_TRUE(DequantizeMxfp4(blocks, scales, at::kFloat).ok());
  auto bad = DequantizeMxfp4(at::zeros({2, 3, 15}, at::kByte), scales, at::kFloat);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("blocks [2, 3, 15] must be scales [2, 3]"), std::string::npos) << bad.status();
  EXPECT_FALSE(DequantizeMxfp4(blocks, at::zeros({2, 4}, at::kByte), at::kFloat).ok());
  EXPECT_FALSE(DequantizeMxfp4(blocks.to(at::kInt), scales, at::kFloat).ok());
  EXPECT_FALSE(DequantizeMxfp4(blocks, scales, at::kDouble).ok());
  // One byte by hand: 0x7A = 6 (high) and -1 (low), scale 2^1.
  at::Tensor one = at::zeros({1, 16}, at::kByte), two = at::full({1}, 128, at::kByte);
  one[0][0] = 0x7A;
  const at::Tensor v = *DequantizeMxfp4(one, two, at::kFloat);
  EXPECT_EQ(v[0].item<float>(), -2.0f);
  EXPECT_EQ(v[1].item<float>(), 12.0f);
}

}  // namespace
}  // namespace rp::workers::io
