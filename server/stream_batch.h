// stream_batch.h — a client's streamed batch (the proto) turned into the engine's Batch for a job
// of a given shape: the one place the server checks a batch. It checks what only the job's shape
// decides (rows x columns, the token count, the loss mask's length); token ranges and the
// micro-batch split are the engine's to check, once, when it queues the batch. The token ids are
// copied once, here; a loss mask becomes the engine's ignore labels.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "roundpipe/v1/jobs.pb.h"
#include "scheduler/engine_types.h"

namespace rp::server {

// InvalidArgument naming what to fix when the batch does not fit a job of
// `global_batch` x `sequence_length`.
absl::StatusOr<scheduler::Batch> ToEngineBatch(const roundpipe::v1::Batch& batch, int64_t global_batch,
                                               int64_t sequence_length);

}  // namespace rp::server
