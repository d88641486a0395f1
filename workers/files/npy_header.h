// npy_header.h — validation of a NumPy .npy header (versions 1-3) against the size of the file it
// starts: magic, header length, a dict with 'descr', 'fortran_order' and 'shape', a token dtype
// (little-endian or byte-order-free uint16/uint32/int32/int64), and a shape whose element count
// and byte size fit in int64 and in the file. No LibTorch (a fuzz target links it alone).
//
// Contract: a pure function, any thread; never throws, never reads past `size` bytes of `data`.
// Every failure is InvalidArgument naming what is wrong.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"

namespace rp::files {

struct NpyLayout {
  size_t data_offset = 0;  // first payload byte
  int element_bytes = 0;   // 2, 4 or 8
  bool is_signed = false;
  int64_t count = 0;  // elements (product of the shape)
};

absl::StatusOr<NpyLayout> ParseNpyHeader(const unsigned char* data, size_t size);

}  // namespace rp::files
