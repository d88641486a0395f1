#include "server/stream_batch.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace rp::server {

absl::StatusOr<scheduler::Batch> ToEngineBatch(const roundpipe::v1::Batch& b, int64_t global_batch,
                                               int64_t sequence_length) {
  if (b.batch() != global_batch || b.sequence() != sequence_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch: shape ", b.batch(), " x ", b.sequence(),
        " does not match the job's global_batch x sequence_length = ", global_batch, " x ", sequence_length));
  }
  const int64_t n = global_batch * sequence_length;
  if (b.tokens_size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("batch: ", b.tokens_size(), " token ids for a ", b.batch(), " x ",
                                                   b.sequence(), " batch (expected ", n, ")"));
  }
  if (b.loss_mask_size() != 0 && b.loss_mask_size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch: loss_mask has ", b.loss_mask_size(), " entries, expected 0 or ", n));
  }
  scheduler::Batch batch;
  batch.rows = b.batch();
  batch.cols = b.sequence();
  batch.tokens.assign(b.tokens().begin(), b.tokens().end());
  if (b.loss_mask_size() > 0) {
    const std::vector<bool> mask(b.loss_mask().begin(), b.loss_mask().end());
    batch.labels = scheduler::ShiftedLabels(batch.rows, batch.cols, batch.tokens, mask);
  }
  return batch;
}

}  // namespace rp::server
