// safetensors_reader.h — reads the safetensors format: an 8-byte little-endian header length, a
// JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {...}}, then the
// tensor bytes. The file is memory-mapped; every header field is validated before any byte is
// touched (size limits, known dtypes, non-negative shapes, offsets inside the data and matching
// the shape, no overlaps), so a corrupt or hostile file gives a clear error, never a crash.
//
// Contract: an open file is immutable; Read() is const and thread-safe. The mapping is private
// and copy-on-write: a write through a View() copies the page it touches (the file never
// changes, nothing faults). files::ParseSafetensorsHeader is a pure function (the fuzz target).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/files/safetensors_header.h"

namespace rp::workers::io {

struct TensorInfo {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets inside the data section
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* Find(const std::string& name) const;
  // "__metadata__"'s string entries (e.g. "format").
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A copy of tensor `name` converted to `dtype` (the mapping is only read, never aliased).
  absl::StatusOr<at::Tensor> Read(const std::string& name, at::ScalarType dtype) const;
  // Tensor `name` in its file dtype aliasing the mapping (no copy: its pages are the file's,
  // which the kernel may drop and read again), keeping `file` mapped while the tensor lives.
  // NotFound when absent; FailedPrecondition when its bytes are not aligned for the dtype (read
  // a copy instead).
  static absl::StatusOr<at::Tensor> View(const std::shared_ptr<const SafetensorsFile>& file, const std::string& name);
  const std::string& path() const { return path_; }
  // The whole mapping (header included): what a device registers for DMA at once.
  void* mapping() const { return const_cast<unsigned char*>(map_); }
  int64_t mapping_bytes() const { return static_cast<int64_t>(size_); }

 private:
  SafetensorsFile() = default;
  std::string path_;
  const unsigned char* map_ = nullptr;
  size_t size_ = 0;
  const unsigned char* data_ = nullptr;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace rp::workers::io
