// checkpoint_meta.h — a checkpoint's meta.json as typed values: what the job continues from
// (CheckpointMeta) and what the reader checks (format, checksums, the frozen base's presence).
// No LibTorch: the meta.json fuzzer builds checkpoint_meta.cc alone.
//
// Contract: pure functions, any thread, never throw. A checkpoint directory is untrusted input (a
// client with an allowed root may plant one): every field is type- and range-checked, and damage
// is DataLoss naming the checkpoint directory.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::files {

struct CheckpointMeta {
  int64_t step = 0;              // optimizer steps taken
  int64_t batches_consumed = 0;  // data cursor: batches the job has taken from its input
  double loss_scale = 1;
  int64_t good_steps = 0;
  std::vector<int> forward;  // the partition in use (F_1..F_Sf, B_1, B_2..B_Sb)
  int fused = 0;
  std::vector<int> backward;
  std::string note;                 // free text from the caller (e.g. the job id)
  std::string optimizer = "adamw";  // the update rule the state belongs to: "adamw", "sgd", "lion", "adafactor"
  // Read only: the frozen base's fingerprint ("" when the job trains every parameter).
  std::string base_fingerprint;
  // The job's evaluations up to this point (absent: none yet), so a resumed job continues its
  // best eval loss, early-stopping count and kept best checkpoint.
  struct Eval {
    int64_t step = 0;  // the latest evaluation
    double loss = 0;
    int64_t tokens = 0;
    double best_loss = 0;
    int64_t best_step = 0;
    int without_improvement = 0;
    std::string best_checkpoint;
  };
  std::optional<Eval> eval;
};

// meta.json parsed: the meta and what only the reader needs.
struct CheckpointMetaFile {
  CheckpointMeta meta;
  bool has_base = false;   // something is frozen: base.json describes it (format 2)
  int64_t adamw_step = 0;  // the optimizer's own step count
  bool has_checksums = false;
  std::map<std::string, uint64_t> crc32;  // file name -> CRC-32 (entries of another type are absent)
};

// The files meta.json carries a checksum of: base.json only when something is frozen.
std::vector<const char*> CheckpointCheckedFiles(bool has_base);

// meta.json's text (at most 1 MiB is the reader's business): a JSON object nested at most 64
// levels, format "roundpipe-checkpoint-1" or "-2", a partition of layer counts in [0, 2^20],
// non-negative step and data cursor, a complete eval record when one is present.
absl::StatusOr<CheckpointMetaFile> ParseCheckpointMeta(const std::string& text, const std::string& dir);

}  // namespace rp::files
