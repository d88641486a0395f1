// token_dataset_file.h — (runtime) the token dataset file: tokens with a loss mask and document
// boundaries, as `roundpipe_client.py prepare` writes it (chat data rendered with the model's chat
// template). A safetensors file (__metadata__ "format": "roundpipe.token_dataset.v1") with
//   input_ids         [N] int32 or int64: the packed tokens, documents back to back;
//   loss_mask         [N] uint8 / bool / int32, optional (default all 1): 1 = token i is trained
//                     as a target (predicted from the tokens before it), 0 = not;
//   document_offsets  [D+1] int64, optional: where each document starts, 0 first, N last.
//
// Contract: reads through the daemon's confinement; every failure names the file and the tensor.
// CheckTokenDatasetFile reads only the header (Submit); ReadTokenDatasetFile reads it all (the
// runner, when the job starts).
#pragma once

#include <atomic>
#include <string>

#include "absl/status/statusor.h"
#include "scheduler/runtime/token_dataset.h"

namespace rp::scheduler::runtime {

absl::Status CheckTokenDatasetFile(const std::string& path);
// `stop` (may be null), raised by another thread (cancel, pause, a drain), ends the read with
// Cancelled (checked every 2^20 tokens).
absl::StatusOr<PackedTokens> ReadTokenDatasetFile(const std::string& path, const std::atomic<bool>* stop = nullptr);

}  // namespace rp::scheduler::runtime
