// token_dataset.h — (runtime) a server-side token file (flat little-endian uint16 / uint32 ".bin", or a
// 1-d/2-d ".npy" of uint16/uint32/int32/int64) cut into training batches: windows of
// sequence_length + 1 tokens with stride sequence_length (every token is a target once),
// global_batch windows per batch, the last partial batch of an epoch dropped.
//
// Contract: the file is memory-mapped read-only for the dataset's lifetime; Batch() is const and
// thread-safe. The cursor (epoch, batch index) lives with the caller, so a job can persist it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler/engine_types.h"

namespace rp::scheduler::runtime {

using TokenFileFormat = TokenFileSource::Format;

class TokenDataset {
 public:
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Open(const std::string& path, TokenFileFormat format,
                                                            int64_t global_batch, int64_t sequence_length);
  ~TokenDataset();
  int64_t num_tokens() const { return num_tokens_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // tokens and labels, each [global_batch, sequence_length] int64 (labels = tokens shifted by
  // one within each window).
  std::pair<at::Tensor, at::Tensor> Batch(int64_t index) const;

 private:
  TokenDataset() = default;
  int64_t TokenAt(int64_t i) const;

  const unsigned char* map_ = nullptr;
  size_t map_size_ = 0;
  const unsigned char* data_ = nullptr;
  int element_bytes_ = 2;
  bool is_signed_ = false;
  int64_t num_tokens_ = 0;
  int64_t global_batch_ = 0, sequence_length_ = 0, batches_per_epoch_ = 0;
};

}  // namespace rp::scheduler::runtime
