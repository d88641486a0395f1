// bpe_model.h — a byte-pair-encoding model as Hugging Face `tokenizers` defines it (model type
// "BPE"): a vocabulary of token strings, and merges ranked by their order. A word (one
// pre-tokenizer piece, already in the byte-level alphabet) starts as its characters; the adjacent
// pair with the lowest-ranked merge is merged, leftmost first among equal ranks, until no pair has
// a merge. With `ignore_merges` (Llama-3), a word that is itself in the vocabulary is one token.
//
// Contract: built once (Create validates: every merge's parts and result are in the vocabulary),
// then immutable: Tokenize is const and safe from any number of threads. O(n log n) per word.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::workers::text {

class BpeModel {
 public:
  struct Options {
    bool ignore_merges = false;
    std::optional<std::string> unk_token;  // a character not in the vocabulary becomes this
    bool fuse_unk = false;                 // consecutive unknowns become one unk
  };

  // `vocab`: token -> id; `merges`: (left, right) in rank order. InvalidArgument names the first
  // merge whose parts or result are not in the vocabulary, or a duplicate id.
  static absl::StatusOr<BpeModel> Create(std::unordered_map<std::string, int32_t> vocab,
                                         const std::vector<std::pair<std::string, std::string>>& merges,
                                         Options options);

  // Appends the ids of `word` to `out`. A character outside the vocabulary becomes unk_token when
  // there is one and is dropped otherwise (as `tokenizers` does).
  void Tokenize(std::string_view word, std::vector<int32_t>* out) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // The token string of `id`, or empty when no token has it.
  std::string_view IdToToken(int32_t id) const;
  // One more than the largest id.
  int32_t IdLimit() const { return id_limit_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<int32_t, std::string> id_to_token_;
  int32_t id_limit_ = 0;
  std::unordered_map<uint64_t, Merge> merges_;
  Options options_;
  std::optional<int32_t> unk_id_;
};

}  // namespace rp::workers::text
