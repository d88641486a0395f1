// npy_bytes.h — a NumPy .npy file (version 1, C order) as bytes, for tests of the token-file
// reader: header with `descr` and `shape` (Python tuple text, e.g. "(300,)"), padded to 64 bytes
// as numpy writes it, followed by `payload`.
#pragma once

#include <string>

namespace rp::testing {

inline std::string NpyBytes(const std::string& descr, const std::string& shape, const std::string& payload) {
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out("\x93NUMPY\x01\x00", 8);
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + payload;
}

}  // namespace rp::testing
