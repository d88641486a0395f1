// libFuzzer target: MXFP4 blocks / scales (workers/files/mxfp4_decode.h). Input: one byte of rank
// (1..4), that many dimension bytes for the scales, a 16 or another last dimension byte for the
// blocks, then the bytes. Shapes are checked as the loader checks them; accepted pairs decode to
// ±E2M1 · 2^(scale − 127) (±inf past float's range) for every value.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "workers/files/mxfp4_decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const size_t rank = 1 + data[0] % 4;
  if (size < 2 + rank) return 0;
  std::vector<int64_t> scales, blocks;
  for (size_t i = 0; i < rank; ++i) scales.push_back(data[1 + i]);
  blocks = scales;
  blocks.push_back(data[1 + rank]);
  if (data[0] & 0x80) blocks.insert(blocks.begin(), 1);  // a rank mismatch now and then
  auto groups = rp::files::CheckMxfp4Shapes(blocks, scales);
  if (!groups.ok()) return 0;
  const uint8_t* bytes = data + 2 + rank;
  const size_t left = size - 2 - rank;
  const int64_t g = *groups;
  if (static_cast<uint64_t>(g) * 17 > left) return 0;
  const uint8_t* scale = bytes;
  const uint8_t* block = bytes + g;
  std::vector<float> out(static_cast<size_t>(g) * 32);
  rp::files::DecodeMxfp4Groups(block, scale, out.data(), 0, g);
  for (int64_t k = 0; k < g * 32; ++k) {
    const uint8_t nibble = (k % 2 == 0) ? (block[k / 2] & 0x0F) : (block[k / 2] >> 4);
    const double magnitude = std::ldexp(static_cast<double>(rp::files::kE2M1[nibble & 7]), scale[k / 32] - 127);
    const float v = out[static_cast<size_t>(k)];
    if (std::signbit(v) != ((nibble & 8) != 0)) std::abort();
    if (magnitude > 3.4028234663852886e38 ? !std::isinf(v) : static_cast<double>(std::fabs(v)) != magnitude) {
      std::abort();
    }
  }
  return 0;
}
