// checkpoint.h — training checkpoints: everything needed to continue a job exactly — the fp32
// weights of every trained parameter, the AdamW step count and moments, the loss-scaler state,
// the step (LR-schedule position), the data cursor and the partition — as two safetensors files
// plus meta.json with a CRC-32 of each file. Parameters the job does not train (a LoRA job's
// base) are not stored: base.json records them (frozen_base.h) and a resume checks that the job
// loaded that very base. Written into a temporary sibling directory, fsynced, then renamed, so a
// checkpoint directory is either complete or absent; a torn or altered one fails its checksum.
//
// Format: "roundpipe-checkpoint-2" (base.json when something is frozen). Version 1 (every
// parameter in weights.safetensors, frozen ones too) is still read.
//
// Contract: pure functions over files. Write reads the store and the state (take them at a
// flush point); Read writes the store's fp32 and master copies and fills `adamw`.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/files/checkpoint_meta.h"
#include "workers/io/frozen_base.h"
#include "workers/optim/adamw.h"

namespace rp::workers {
class HostModelStore;
}

namespace rp::workers::io {

// `base`: the store's frozen base as DescribeFrozenBase gives it, if the caller keeps it (it does
// not change while a job runs); null to compute it here (one read of every frozen byte).
absl::Status WriteCheckpoint(const std::string& dir, const HostModelStore& store, const AdamWState& adamw,
                             const files::CheckpointMeta& meta, const FrozenBase* base = nullptr);
// DataLoss when a file is missing, torn or fails its checksum; InvalidArgument when the
// checkpoint's parameters are not the store's; FailedPrecondition when the store's frozen base is
// not the one the checkpoint was trained on (nothing frozen is overwritten). `base`, if given,
// receives the store's frozen base (computed here to compare it).
absl::StatusOr<files::CheckpointMeta> ReadCheckpoint(const std::string& dir, HostModelStore* store, AdamWState* adamw,
                                                     FrozenBase* base = nullptr);

// base.json of a checkpoint (empty when it has none: nothing was frozen, or format 1). Verifies
// the checkpoint's checksums first.
absl::StatusOr<FrozenBase> ReadCheckpointBase(const std::string& dir);

// meta.json of a checkpoint whose files pass their checksums (reads the files, loads nothing).
absl::StatusOr<files::CheckpointMeta> VerifyCheckpoint(const std::string& dir);

// meta.json alone (no checksum verification: ReadCheckpoint does that).
absl::StatusOr<files::CheckpointMeta> ReadCheckpointMeta(const std::string& dir);

// Complete checkpoints ("step-<N>" directories with a meta.json) under `parent`, newest first.
std::vector<std::string> ListCheckpoints(const std::string& parent);

}  // namespace rp::workers::io
