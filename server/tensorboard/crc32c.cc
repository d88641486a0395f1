// CRC-32C, table-driven one byte at a time (records are small; speed is not the point here).
#include "server/tensorboard/crc32c.h"

#include <array>

namespace rp::tensorboard {
namespace {

constexpr uint32_t kReflectedPolynomial = 0x82F63B78u;  // Castagnoli, bit-reversed
constexpr uint32_t kMaskDelta = 0xa282ead8u;

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? (c >> 1) ^ kReflectedPolynomial : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

}  // namespace

uint32_t Crc32c(std::string_view data, uint32_t crc) {
  uint32_t c = ~crc;
  for (const char ch : data) c = kTable[(c ^ static_cast<uint8_t>(ch)) & 0xffu] ^ (c >> 8);
  return ~c;
}

uint32_t MaskCrc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

}  // namespace rp::tensorboard
