// token_dataset_layout.h — the rules a token dataset file (format "roundpipe.token_dataset.v1",
// safetensors) must follow, on plain values: which tensors, dtypes and shapes, token ids in
// [0, 2^31), document offsets rising from 0 to the token count. No LibTorch: the reader
// (token_dataset_file.cc) maps its tensors onto these values, and the token-dataset fuzzer maps
// raw safetensors bytes onto them.
//
// Contract: pure functions, any thread, never throw; errors are InvalidArgument naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::scheduler::runtime {

inline constexpr const char* kTokenDatasetFormat = "roundpipe.token_dataset.v1";

enum class TokenElement { kOther, kInt32, kInt64, kUInt8, kBool, kInt16 };
struct TokenTensor {
  TokenElement element = TokenElement::kOther;
  std::vector<int64_t> shape;
};

// The number of tokens, or what is wrong. `format`: __metadata__'s "format" (null: absent);
// `ids` must be present; `mask` and `offsets` are optional.
absl::StatusOr<int64_t> CheckTokenDatasetLayout(const std::string& path, const std::string* format,
                                                const TokenTensor* ids, const TokenTensor* mask,
                                                const TokenTensor* offsets);

// input_ids[first + i] for i < n, widened to int64 in the file's dtype: every one in [0, 2^31).
absl::Status CheckTokenIds(const std::string& path, const int64_t* ids, int64_t n, int64_t first);

// document_offsets (k entries) rising from 0 to `tokens`: where non-empty documents start.
absl::StatusOr<std::vector<int64_t>> DocumentStarts(const std::string& path, const int64_t* offsets, int64_t k,
                                                    int64_t tokens);

}  // namespace rp::scheduler::runtime
