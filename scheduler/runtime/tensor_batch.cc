#include "scheduler/runtime/tensor_batch.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace rp::scheduler::runtime {

absl::Status ValidateBatch(const Batch& b, int64_t vocab, int microbatches) {
  if (b.rows <= 0 || b.cols <= 0) return absl::InvalidArgumentError("batch: empty batch");
  if (b.rows > (int64_t{1} << 20) || b.cols > (int64_t{1} << 20) || b.rows * b.cols > (int64_t{1} << 28)) {
    return absl::InvalidArgumentError("batch: larger than 2^28 tokens");
  }
  const size_t n = static_cast<size_t>(b.rows * b.cols);
  if (b.tokens.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: ", b.tokens.size(), " token ids for a ", b.rows, " x ", b.cols, " batch"));
  }
  if (!b.labels.empty() && b.labels.size() != n) {
    return absl::InvalidArgumentError("batch: labels must have the shape of tokens");
  }
  if (b.rows % microbatches != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: ", b.rows, " sequences cannot be split into ", microbatches, " equal micro-batches"));
  }
  for (size_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || b.tokens[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("batch: token id ", b.tokens[i], " at position ", i,
                                                     " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  bool labelled = b.labels.empty() && b.cols > 1;  // without labels: the next token of each
  for (size_t i = 0; i < b.labels.size(); ++i) {
    const int32_t l = b.labels[i];
    if (l != Batch::kIgnoreLabel && (l < 0 || l >= vocab)) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch: label ", l, " at position ", i, " must be -100 or lie in [0, ", vocab, ")"));
    }
    labelled = labelled || l != Batch::kIgnoreLabel;
  }
  // The controller would drop such a batch after it was queued (a step cannot divide by zero
  // labelled tokens): refused here, while its sender still waits for the answer.
  if (!labelled) {
    return absl::InvalidArgumentError(
        "batch: no token has a label to train on (every label is -100, or sequences of one token)");
  }
  return absl::OkStatus();
}

TensorBatch ToTensors(const Batch& b) {
  TensorBatch t;
  t.tokens = at::empty({b.rows, b.cols}, at::kLong);
  std::copy(b.tokens.begin(), b.tokens.end(), t.tokens.data_ptr<int64_t>());
  if (!b.labels.empty()) {
    at::Tensor l = at::empty({b.rows, b.cols}, at::kLong);
    std::copy(b.labels.begin(), b.labels.end(), l.data_ptr<int64_t>());
    t.labels = l;
  }
  return t;
}

}  // namespace rp::scheduler::runtime
