// tokenizer.h — a Hugging Face `tokenizer.json` of the byte-level BPE family (Llama-3, Qwen2 and
// Qwen3, GPT-OSS, GPT-2), loaded natively: added tokens matched first, then the normalizer (none,
// NFC, or a Sequence of them), the pre-tokenizer (Split / ByteLevel / Sequence), the BPE model,
// the post-processor for add_special_tokens (TemplateProcessing, ByteLevel, Sequence), and the
// ByteLevel decoder. Anything else in the file (other models, normalizers, pre-tokenizers, added
// tokens with lstrip/rstrip/single_word, BPE dropout or subword prefixes) is refused by name, so a
// job never trains on ids that differ from what `tokenizers` would give.
//
// Contract: FromJson parses and validates once (InvalidArgument naming the field; the file's
// nesting is bounded first, base::kMaxJsonDepth); the result is immutable and every method is
// const and safe from any number of threads. Encode never fails on any byte string: malformed
// UTF-8 is encoded byte for byte, like valid text; the bounded Encode fails only on its limits.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/text/work_limits.h"

namespace rp::workers::text {

class Tokenizer {
 public:
  static absl::StatusOr<Tokenizer> FromJson(std::string_view json);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // The ids of `text`. With `add_special_tokens`, the post-processor's template is applied (e.g.
  // Llama-3's <|begin_of_text|> before the text), as `tokenizers`' encode(text, True).
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = false) const;
  // The same ids, bounded: `limits` are checked between regex matches and between words. Fails
  // with Cancelled (stop raised), DeadlineExceeded (past the deadline) or ResourceExhausted (a
  // pre-tokenizer pattern ran past PCRE2's match limit, where the unbounded Encode leaves the
  // rest of that piece unsplit).
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special_tokens,
                                              const WorkLimits& limits) const;
  // The text of `ids` (UTF-8; a malformed byte sequence becomes U+FFFD), as `tokenizers`'
  // decode(ids, skip_special_tokens). Unknown ids are skipped.
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // One more than the largest id of the vocabulary and the added tokens.
  int32_t IdLimit() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rp::workers::text
