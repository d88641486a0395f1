// safetensors_writer.h — writes the safetensors format (an 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets}} plus optional "__metadata__", then the raw
// little-endian tensor bytes) one tensor at a time, so a caller never holds a second full copy.
//
// Contract: single-threaded use of one writer; the file is fsynced by Finish(). Tensors must be
// added in the order they were declared.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace rp::workers::io {

struct TensorDecl {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
};

// "F32", "BF16", "F16", ... (InvalidArgument for dtypes safetensors cannot store).
absl::Status SafetensorsDtypeName(at::ScalarType t, std::string* out);
int64_t NumBytes(const TensorDecl& d);

class SafetensorsWriter {
 public:
  ~SafetensorsWriter();
  // Declares every tensor up front (the header comes first in the file).
  absl::Status Open(const std::string& path, const std::vector<TensorDecl>& tensors,
                    const std::map<std::string, std::string>& metadata = {});
  // The next declared tensor's values (converted to its declared dtype, made contiguous).
  absl::Status Add(const at::Tensor& t);
  // Checks every tensor was written, flushes and fsyncs.
  absl::Status Finish();

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
  std::vector<TensorDecl> decls_;
  size_t next_ = 0;
};

}  // namespace rp::workers::io
