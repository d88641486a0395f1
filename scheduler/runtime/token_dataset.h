// token_dataset.h — (runtime) a token stream cut into training batches: a server-side token file
// (flat little-endian uint16 / uint32 ".bin", or a 1-d/2-d ".npy" of uint16/uint32/int32/int64,
// memory-mapped) or a packed stream with a loss mask (a JSONL dataset, jsonl_documents.h).
// Windows of sequence_length + 1 tokens with stride sequence_length (every token is a target
// once; a masked target becomes the ignore label), global_batch windows per batch, the last
// partial batch of an epoch dropped; optionally in a seeded order, a fresh one each epoch.
//
// Contract: Batch() is const and thread-safe, and a pure function of the batch index (the window
// order included): the cursor lives with the caller, so a job can persist and resume it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/engine_types.h"

namespace rp::scheduler::runtime {

using TokenFileFormat = TokenFileSource::Format;

// A token stream held in memory with its loss mask (JSONL datasets, token dataset files).
struct PackedTokens {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;  // trained[i]: token i is a training target (1) or masked (0)
  int64_t documents = 0;
  std::vector<int64_t> document_starts;  // where each non-empty document starts, rising (0 first)
};

class TokenDataset {
 public:
  // A token file (format kBinUint16 / kBinUint32 / kNpy / kAuto by name).
  static absl::StatusOr<std::unique_ptr<TokenDataset>> Open(const std::string& path, TokenFileFormat format,
                                                            int64_t global_batch, int64_t sequence_length);
  // A packed stream: `trained[i]` says whether token i is a target. `what` names it in errors.
  static absl::StatusOr<std::unique_ptr<TokenDataset>> FromPacked(std::vector<int32_t> tokens,
                                                                  std::vector<uint8_t> trained, int64_t global_batch,
                                                                  int64_t sequence_length, const std::string& what);
  // Document-masked packing (a packed stream's `document_starts`, rising): every window restarts
  // its positions at each document start (and at its own start), attention stays inside a
  // document (Positions), and the target that would cross into the next document is not trained.
  void MaskDocuments(std::vector<int64_t> document_starts) {
    document_starts_ = std::move(document_starts);
    mask_documents_ = true;
  }
  bool masks_documents() const { return mask_documents_; }
  // One node's share of every batch (data parallelism): Batch() and Positions() return rows
  // [rank * B / size, (rank + 1) * B / size) of the whole batch of B = global_batch windows
  // (InvalidArgument unless size divides B). The batches and their order stay the file's.
  absl::Status TakeShare(int rank, int size);
  int64_t rows() const { return rows_; }
  // Windows in a seeded order, a fresh permutation per epoch (default: file order).
  void Shuffle(uint64_t seed) {
    shuffle_ = true;
    seed_ = seed;
  }
  ~TokenDataset();
  int64_t num_tokens() const { return num_tokens_; }
  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  // The window batch `index` takes in row `row` (its first token is window * sequence_length).
  int64_t WindowOf(int64_t index, int64_t row) const;
  // tokens and labels, each [rows(), sequence_length] int64 (labels = tokens shifted by one
  // within each window); rows() = global_batch unless TakeShare.
  std::pair<at::Tensor, at::Tensor> Batch(int64_t index) const;
  // Document-masked datasets: the positions of Batch(index)'s tokens ([rows(),
  // sequence_length] int64, 0 at each row's start and at every document start); else undefined.
  at::Tensor Positions(int64_t index) const;

 private:
  TokenDataset() = default;
  int64_t TokenAt(int64_t i) const;
  absl::Status SetShape(int64_t global_batch, int64_t sequence_length, const std::string& what);

  const unsigned char* map_ = nullptr;
  size_t map_size_ = 0;
  const unsigned char* data_ = nullptr;
  int element_bytes_ = 2;
  bool is_signed_ = false;
  int64_t num_tokens_ = 0;
  int64_t global_batch_ = 0, sequence_length_ = 0, batches_per_epoch_ = 0;
  int64_t first_row_ = 0, rows_ = 0;  // the rows of each batch Batch() returns (TakeShare)
  std::vector<int32_t> packed_;       // FromPacked: the tokens (element_bytes_ == 0)
  std::vector<uint8_t> trained_;      // FromPacked: the loss mask
  bool shuffle_ = false;
  uint64_t seed_ = 0;
  bool mask_documents_ = false;
  std::vector<int64_t> document_starts_;
  bool StartsDocument(int64_t i) const;
};

}  // namespace rp::scheduler::runtime
