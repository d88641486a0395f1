// atomic_dir.h — the one way the data plane writes a directory that must be complete or absent
// (checkpoints, Hugging Face exports): files go into a hidden temporary sibling
// `.<name>.tmp-<random>`, are fsynced, and the directory is renamed into place without replacing
// anything (a target that appears meanwhile is an error, never overwritten). Every operation goes
// through confined_fs, so it stays beneath the daemon's roots at the moment of use. Torn
// temporaries of the same target left by a crash are removed when the next write begins.
//
// Contract: one writer per target at a time (jobs own their output directories). Not thread-safe
// per instance. Errors name the path; ENOSPC is ResourceExhausted.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace rp::files {

class AtomicDir {
 public:
  // Creates the parents of `target` and the temporary directory. AlreadyExists if `target` exists;
  // FailedPrecondition if a parent is a file.
  static absl::StatusOr<AtomicDir> Begin(const std::string& target);
  AtomicDir(AtomicDir&& o) noexcept;
  AtomicDir& operator=(AtomicDir&&) = delete;
  ~AtomicDir();  // removes the temporary directory unless committed

  // Where to create `name` inside the temporary directory.
  std::string PathOf(const std::string& name) const;
  absl::Status WriteFile(const std::string& name, const std::string& text);
  // fsyncs the files named so far by the caller's writers (through SyncPath) and the directory,
  // renames it to the target, fsyncs the parent.
  absl::Status Commit();
  const std::string& target() const { return target_; }

 private:
  AtomicDir(std::string target, std::string tmp) : target_(std::move(target)), tmp_(std::move(tmp)) {}
  std::string target_, tmp_;
  bool committed_ = false;
};

// True for the names AtomicDir uses for its temporaries (".<x>.tmp-<hex>").
bool IsAtomicDirTemporary(const std::string& name);

// Removes the temporaries of `target` that a crash left beside it (confined: never through a
// symlink); how many. A missing parent is none.
int RemoveTornTemporaries(const std::string& target);

}  // namespace rp::files
