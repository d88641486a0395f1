// confined_fs.h — every file the data plane opens, creates, renames or deletes on a client's
// behalf goes through here, so that path confinement is enforced by the kernel at the moment of
// use, not checked once when a job is submitted (a symlink swapped in afterwards cannot lead
// outside). No LibTorch (the parser fuzzers link it).
//
// Confinement is process-wide: ConfineTo(roots) — called once by the daemon before it serves —
// opens each root as a directory handle; from then on a path must be absolute and lie lexically
// beneath one of the roots, and it is resolved by openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
// relative to that handle: symlinks that stay beneath the root work (Hugging Face cache
// snapshots are symlinks into blobs/), symlinks or ".." that lead out fail with
// PermissionDenied. Kernels without openat2 (< 5.6) get a component-by-component O_NOFOLLOW
// walk, which refuses every symlink. Without ConfineTo (tests, tools) paths are used as given.
//
// Reads never block and never read without bound: OpenForRead / ReadSmallFile open with
// O_NONBLOCK and accept regular files only (a FIFO, a device or a directory is
// InvalidArgument), ReadSmallFile caps the size. Deletion never follows a symlink: RemoveTree
// removes a symlink itself, never what it points to.
//
// Contract: thread-safe; ConfineTo must happen before any other thread uses these functions.
// Errors: NotFound (missing), PermissionDenied (outside the roots, or the kernel refused),
// InvalidArgument (not a regular file, too large), Internal (other I/O errors, with errno text).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::files {

// An owned file descriptor (closed on destruction).
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

// Confines every later call to `roots` (each canonicalised and opened now). InvalidArgument if a
// root is not a directory. Calling it again replaces the roots.
absl::Status ConfineTo(const std::vector<std::string>& roots);
bool Confined();

// open(2) with `flags` (O_CLOEXEC added), resolved beneath the roots.
absl::StatusOr<UniqueFd> OpenConfined(const std::string& path, int flags, mode_t mode = 0);
// A regular file for reading (O_NONBLOCK; FIFOs, devices, directories refused); its size in *size.
absl::StatusOr<UniqueFd> OpenForRead(const std::string& path, uint64_t* size);
// The whole of a regular file of at most `max_bytes`.
absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes);
// A new file (O_EXCL: never replaces or follows anything that exists) with `text`, fsynced.
absl::Status WriteNewFile(const std::string& path, const std::string& text);
// mkdir -p, each level created beneath the roots.
absl::Status MakeDirs(const std::string& path);
// One new directory; AlreadyExists if something exists there.
absl::Status MakeDir(const std::string& path);
// rename(2) within the roots; FailedPrecondition (naming both) when `to` exists.
absl::Status RenameNoReplace(const std::string& from, const std::string& to);
// rm -rf that never follows symlinks (a symlink is removed, not its target). OK if absent.
absl::Status RemoveTree(const std::string& path);
// Names in a directory (not "." / ".."), unsorted.
absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path);
enum class FileKind { kMissing, kFile, kDirectory, kSymlink, kOther };
// What is at `path` itself (a symlink is reported as one, not followed).
FileKind KindOf(const std::string& path);
// fsync of a file or directory (best effort).
void SyncPath(const std::string& path);

// Tests only: behave as on a kernel without openat2 (the O_NOFOLLOW walk) or back.
void UseOpenat2ForTest(bool use);

}  // namespace rp::files
