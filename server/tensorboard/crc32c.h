// crc32c.h — CRC-32C (the Castagnoli polynomial), the checksum of TensorBoard's record files, and
// the masked form those files store (a checksum of data that itself holds checksums must not be
// a plain CRC of it).
//
// Contract: pure functions, any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace rp::tensorboard {

// CRC-32C of `data`, continuing from `crc` (the CRC of the bytes before it; 0 to start).
uint32_t Crc32c(std::string_view data, uint32_t crc = 0);

// The stored form: the CRC rotated right by 15 bits plus a constant.
uint32_t MaskCrc(uint32_t crc);

}  // namespace rp::tensorboard
