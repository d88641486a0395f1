// output_claim.h — each job owns its output directory (checkpoints, exports): a claim file
// `<output_dir>/.roundpipe-job` holds the owner's token (job id and creation time, unique even if
// a damaged job store made ids restart). A second job naming the same directory is refused, so
// jobs can never return, resume from or prune each other's checkpoints.
//
// Contract: pure functions over files (through workers/io/confined_fs: beneath the daemon's
// roots at use), any thread. The claim is created with O_EXCL: two racing claimers cannot both win.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "roundpipe/v1/jobs.pb.h"

namespace rp::server {

inline constexpr char kOutputClaimFile[] = ".roundpipe-job";

// "<id> <created seconds>.<nanos>".
std::string OwnerToken(const roundpipe::v1::Job& record);

// OK when `dir` is now claimed by `owner` (created, or already its own); FailedPrecondition naming
// the other owner when it belongs to another job; the file system's error otherwise.
absl::Status ClaimOutputDir(const std::string& dir, const std::string& owner);

}  // namespace rp::server
