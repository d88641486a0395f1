// tensor_batch.h — (runtime) a batch as the controller takes it, and the one way a facade
// `Batch` (plain int32 buffers, engine_types.h) becomes one: validated once against the job's
// model, then converted.
//
// Contract: pure functions; any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "scheduler/engine_types.h"

namespace rp::scheduler::runtime {

struct TensorBatch {
  at::Tensor tokens;                 // [rows, cols] int64
  std::optional<at::Tensor> labels;  // the same shape; absent: next-token labels
  // The same shape: token positions of packed documents (Controller::SubmitIteration); absent:
  // 0..cols-1 in every row.
  std::optional<at::Tensor> positions;
  // Checked whole before it was queued (a streamed batch: ValidateBatch at the feed): the
  // controller does not scan it again.
  bool validated = false;
};

// Shape, divisibility by `microbatches`, id ranges against `vocab` and at least one labelled
// token: everything the controller would check, so a streamed batch is validated once, before it
// is queued, and never dropped after. InvalidArgument naming the first offending value.
absl::Status ValidateBatch(const Batch& b, int64_t vocab, int microbatches);

// `b` as int64 tensors (call after ValidateBatch).
TensorBatch ToTensors(const Batch& b);

}  // namespace rp::scheduler::runtime
