// safetensors_header.h — validation of a safetensors JSON header against the size of the data
// section that follows it: known dtypes, non-negative shapes without overflow, offsets inside the
// data and matching the shape, no overlapping tensors. No LibTorch (a fuzz target links it alone).
//
// Contract: a pure function, any thread; never throws.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::files {

struct HeaderEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  int element_bytes = 0;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets inside the data section
};

// `metadata`, when given, receives "__metadata__"'s string values (others are skipped).
absl::StatusOr<std::vector<HeaderEntry>> ParseSafetensorsHeader(const std::string& header, uint64_t data_bytes,
                                                                std::map<std::string, std::string>* metadata = nullptr);

}  // namespace rp::files
