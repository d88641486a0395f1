// job_files.h — the files of jobs that the daemon handles without running them, behind the
// engine facade: where files may live (confinement), a Hugging Face model's config, the
// checkpoints under a job's root, export from a checkpoint (a job of an earlier daemon run),
// and each job's claim on its output directory.
//
// Contract: free functions, any thread. Every path is opened beneath the confined roots at the
// moment of use (workers/files/confined_fs: no symlink escapes, no FIFOs) once ConfineFileAccess
// ran; errors name the file and what is wrong with it.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scheduler/engine_types.h"

namespace rp::scheduler {

// From now on (process-wide, once) every file the engine and these functions touch must lie
// beneath one of `roots` (directories that exist). InvalidArgument for a root that is not one.
absl::Status ConfineFileAccess(const std::vector<std::string>& roots);

// A model directory's config.json as the planner's model description. InvalidArgument naming
// the field for anything the engine cannot run or a malformed file.
absl::StatusOr<spec::ModelConfig> ReadHfModelConfig(const std::string& dir);

// Checkpoints ("step-<N>" with a readable meta.json) under `root`, newest first; `skipped`
// (optional) collects "<dir>: why" for damaged ones.
std::vector<CheckpointInfo> ListJobCheckpoints(const std::string& root, std::vector<std::string>* skipped = nullptr);

// Writes the weights of checkpoint `checkpoint_dir` (of the job `job`) to `out_dir` in `kind`'s
// format; returns the bytes written. A LoRA checkpoint holds the adapters alone: the base comes
// from the job's model.hf_dir (or its seeded initialisation), checked against the checkpoint's
// record (DataLoss naming the tensor when the files changed since).
absl::StatusOr<int64_t> ExportCheckpoint(const std::string& checkpoint_dir, const JobSpec& job,
                                         const std::string& out_dir, ExportKind kind, const StopCheck& stop = {});

// Host bytes job `job` will allocate for its model state once it runs (planning::HostStateBytes
// of its layout; a LoRA base from model files in the job's dtype is mapped, not counted). Reads
// the model directory's headers; their errors name the file.
absl::StatusOr<int64_t> PredictHostStateBytes(const JobSpec& job);

// Host bytes the tokenizer.json parses running now (a JSONL job's admission or start) may still
// take at their peak; host-memory admission counts them as taken.
int64_t TokenizerParseBytesInFlight();

// Each job owns its output directory (checkpoints, exports): a claim file
// `<dir>/.roundpipe-job` holds the owner's token. OK when `dir` is now claimed by `owner`
// (created with O_EXCL, or already its own); FailedPrecondition naming the other owner when it
// belongs to another job; the file system's error otherwise. Release removes the claim.
inline constexpr char kOutputClaimFile[] = ".roundpipe-job";
absl::Status ClaimOutputDir(const std::string& dir, const std::string& owner);
void ReleaseOutputDir(const std::string& dir);

// The directory `dir` (created with its missing parents when `create`) opened beneath the confined
// roots, as a descriptor the caller owns and closes: files made with *at() calls relative to it
// stay where it is even if a path component is swapped for a symlink later, and a symlink that
// leads outside the roots now is refused (PermissionDenied). For the daemon's own files in a
// job's output dir (its TensorBoard log).
absl::StatusOr<int> OpenConfinedDirectory(const std::string& dir, bool create);

// Removes what a crash left of an unfinished write of directory `target` (a checkpoint's or an
// export's hidden temporary sibling); how many were removed. Confined like every other access.
int RemoveTornWrite(const std::string& target);

}  // namespace rp::scheduler
