#include "workers/files/confined_fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rp::files {

namespace fs = std::filesystem;

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

struct Root {
  std::string path;  // canonical, no trailing separator (except "/")
  int fd = -1;       // O_PATH | O_DIRECTORY
};

// Set once before other threads run (contract); read without a lock afterwards.
std::vector<Root>& Roots() {
  static auto* roots = new std::vector<Root>();
  return *roots;
}

std::atomic<int> g_openat2{1};  // 1: try openat2; 0: the kernel lacks it (ENOSYS)

absl::Status ErrnoStatus(int err, const std::string& what) {
  const std::string text = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(text);
    case EXDEV:
    case ELOOP:
      return absl::PermissionDeniedError(
          absl::StrCat(what, ": resolves outside the allowed roots (through a symlink or '..')"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(text);
    case EEXIST:
    case ENOTEMPTY:
      return absl::AlreadyExistsError(text);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(text);
    case ENXIO:
    case EISDIR:
      return absl::InvalidArgumentError(text);
    default:
      return absl::InternalError(text);
  }
}

bool LexicallyBeneath(const fs::path& p, const fs::path& root, fs::path* rel) {
  auto pi = p.begin();
  for (auto ri = root.begin(); ri != root.end(); ++ri, ++pi) {
    if (ri->empty()) continue;
    if (pi == p.end() || *pi != *ri) return false;
  }
  fs::path r;
  for (; pi != p.end(); ++pi) {
    if (!pi->empty()) r /= *pi;
  }
  *rel = r.empty() ? fs::path(".") : r;
  return true;
}

// The root holding `path` and the path relative to it; PermissionDenied if none does.
absl::Status Locate(const std::string& path, const Root** root, std::string* rel) {
  const fs::path p = fs::path(path).lexically_normal();
  if (!p.is_absolute()) return absl::PermissionDeniedError(absl::StrCat("'", path, "': not an absolute path"));
  for (const Root& r : Roots()) {
    fs::path relative;
    if (LexicallyBeneath(p, r.path, &relative)) {
      *root = &r;
      *rel = relative.string();
      return absl::OkStatus();
    }
  }
  std::vector<std::string> names;
  for (const Root& r : Roots()) names.push_back(r.path);
  return absl::PermissionDeniedError(
      absl::StrCat("'", path, "' is outside the allowed roots [", absl::StrJoin(names, ", "), "]"));
}

// After a failed openat(dir, name, O_NOFOLLOW ...): a symlink in the way reads as ELOOP (an
// O_DIRECTORY open of a link says ENOTDIR), so escapes are PermissionDenied, not NotFound.
void ExplainNoFollow(int dir, const char* name) {
  const int err = errno;
  struct stat st {};
  if ((err == ENOTDIR || err == ELOOP) && ::fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
    errno = ELOOP;
    return;
  }
  errno = err;
}

// Kernels without openat2: one component at a time, no symlink at all.
int WalkOpen(int root_fd, const std::string& rel, int flags, mode_t mode) {
  const fs::path r(rel);
  std::vector<std::string> parts;
  for (const auto& c : r) {
    if (!c.empty() && c != ".") parts.push_back(c.string());
  }
  if (parts.empty()) return ::openat(root_fd, ".", flags | O_CLOEXEC, mode);
  int dir = ::dup(root_fd);
  if (dir < 0) return -1;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] == "..") {
      ::close(dir);
      errno = EXDEV;
      return -1;
    }
    const int next = ::openat(dir, parts[i].c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (next < 0) ExplainNoFollow(dir, parts[i].c_str());
    const int err = errno;
    ::close(dir);
    if (next < 0) {
      errno = err;
      return -1;
    }
    dir = next;
  }
  if (parts.back() == "..") {
    ::close(dir);
    errno = EXDEV;
    return -1;
  }
  const int fd = ::openat(dir, parts.back().c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) ExplainNoFollow(dir, parts.back().c_str());
  const int err = errno;
  ::close(dir);
  errno = err;
  return fd;
}

// {parent directory handle, leaf name} of `path`.
absl::StatusOr<std::pair<UniqueFd, std::string>> Parent(const std::string& path) {
  const fs::path p = fs::path(path).lexically_normal();
  const std::string leaf = p.filename().string();
  if (leaf.empty() || leaf == "." || leaf == "..") {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "': no file name"));
  }
  auto dir = OpenConfined(p.parent_path().string(), O_PATH | O_DIRECTORY);
  if (!dir.ok()) return dir.status();
  return std::make_pair(std::move(*dir), leaf);
}

absl::Status RemoveAt(int dir_fd, const std::string& name, const std::string& shown, int depth) {
  if (depth > 256) return absl::FailedPreconditionError(absl::StrCat("remove ", shown, ": nested too deeply"));
  struct stat st {};
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    return errno == ENOENT ? absl::OkStatus() : ErrnoStatus(errno, absl::StrCat("remove ", shown));
  }
  if (S_ISDIR(st.st_mode)) {
    const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("remove ", shown));
    DIR* d = ::fdopendir(fd);  // owns fd
    if (!d) {
      ::close(fd);
      return ErrnoStatus(errno, absl::StrCat("remove ", shown));
    }
    std::vector<std::string> names;
    while (dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
    }
    absl::Status status;
    for (const std::string& n : names) {
      status.Update(RemoveAt(::dirfd(d), n, absl::StrCat(shown, "/", n), depth + 1));
    }
    ::closedir(d);
    if (!status.ok()) return status;
    if (::unlinkat(dir_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
      return ErrnoStatus(errno, absl::StrCat("remove ", shown));
    }
    return absl::OkStatus();
  }
  if (::unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) {
    return ErrnoStatus(errno, absl::StrCat("remove ", shown));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ConfineTo(const std::vector<std::string>& roots) {
  std::vector<Root> opened;
  for (const std::string& r : roots) {
    std::error_code ec;
    const fs::path canon = fs::canonical(r, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("root '", r, "': ", ec.message()));
    const int fd = ::open(canon.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("root '", r, "'"));
    opened.push_back({canon.string(), fd});
  }
  for (Root& old : Roots()) ::close(old.fd);
  Roots() = std::move(opened);
  return absl::OkStatus();
}

bool Confined() { return !Roots().empty(); }

absl::StatusOr<UniqueFd> OpenConfined(const std::string& path, int flags, mode_t mode) {
  if (!(flags & O_CREAT)) mode = 0;
  if (!Confined()) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("'", path, "'"));
    return UniqueFd(fd);
  }
  const Root* root = nullptr;
  std::string rel;
  if (absl::Status st = Locate(path, &root, &rel); !st.ok()) return st;
  int fd = -1;
  if (g_openat2.load(std::memory_order_relaxed)) {
    open_how how{};
    how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
    how.mode = mode;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    fd = static_cast<int>(::syscall(SYS_openat2, root->fd, rel.c_str(), &how, sizeof(how)));
    if (fd < 0 && errno == ENOSYS) g_openat2.store(0);
  }
  if (!g_openat2.load(std::memory_order_relaxed)) fd = WalkOpen(root->fd, rel, flags, mode);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("'", path, "'"));
  return UniqueFd(fd);
}

absl::StatusOr<UniqueFd> OpenForRead(const std::string& path, uint64_t* size) {
  auto fd = OpenConfined(path, O_RDONLY | O_NONBLOCK);
  if (!fd.ok()) return fd.status();
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("'", path, "'"));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  // Back to blocking reads: the file is regular, O_NONBLOCK only kept the open from hanging.
  ::fcntl(fd->get(), F_SETFL, ::fcntl(fd->get(), F_GETFL) & ~O_NONBLOCK);
  if (size) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  uint64_t size = 0;
  auto fd = OpenForRead(path, &size);
  if (!fd.ok()) return fd.status();
  if (size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is larger than ", max_bytes, " bytes"));
  }
  std::string out;
  out.resize(static_cast<size_t>(size) + 1);
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd->get(), out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, absl::StrCat("read '", path, "'"));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes) return absl::InvalidArgumentError(absl::StrCat("'", path, "' grew while being read"));
  out.resize(got);
  return out;
}

absl::Status WriteNewFile(const std::string& path, const std::string& text) {
  auto fd = OpenConfined(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (!fd.ok()) return fd.status();
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd->get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, absl::StrCat("write '", path, "'"));
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd->get()) != 0) return ErrnoStatus(errno, absl::StrCat("fsync '", path, "'"));
  return absl::OkStatus();
}

absl::Status MakeDir(const std::string& path) {
  auto parent = Parent(path);
  if (!parent.ok()) return parent.status();
  if (::mkdirat(parent->first.get(), parent->second.c_str(), 0755) != 0) {
    return ErrnoStatus(errno, absl::StrCat("mkdir '", path, "'"));
  }
  return absl::OkStatus();
}

absl::Status MakeDirs(const std::string& path) {
  const fs::path p = fs::path(path).lexically_normal();
  fs::path start("/");
  if (Confined()) {
    const Root* root = nullptr;
    std::string rel;
    if (absl::Status st = Locate(p.string(), &root, &rel); !st.ok()) return st;
    start = root->path;
  }
  fs::path rel;
  if (!LexicallyBeneath(p, start, &rel)) return absl::InvalidArgumentError(absl::StrCat("'", path, "': bad path"));
  fs::path at = start;
  for (const auto& c : rel) {
    if (c.empty() || c == ".") continue;
    at /= c;
    switch (KindOf(at.string())) {
      case FileKind::kDirectory:
        continue;
      case FileKind::kMissing: {
        absl::Status st = MakeDir(at.string());
        if (st.ok() || (absl::IsAlreadyExists(st) && KindOf(at.string()) == FileKind::kDirectory)) continue;
        return st;
      }
      case FileKind::kSymlink: {  // fine if it resolves to a directory beneath the root
        auto fd = OpenConfined(at.string(), O_PATH | O_DIRECTORY);
        if (fd.ok()) continue;
        return fd.status();
      }
      default:
        return absl::FailedPreconditionError(absl::StrCat("'", at.string(), "' exists and is not a directory"));
    }
  }
  return absl::OkStatus();
}

absl::Status RenameNoReplace(const std::string& from, const std::string& to) {
  auto a = Parent(from);
  if (!a.ok()) return a.status();
  auto b = Parent(to);
  if (!b.ok()) return b.status();
  if (::renameat2(a->first.get(), a->second.c_str(), b->first.get(), b->second.c_str(), RENAME_NOREPLACE) == 0) {
    return absl::OkStatus();
  }
  if (errno == EINVAL) {  // a file system without RENAME_NOREPLACE
    struct stat st {};
    if (::fstatat(b->first.get(), b->second.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0)
      errno = EEXIST;
    else if (::renameat(a->first.get(), a->second.c_str(), b->first.get(), b->second.c_str()) == 0)
      return absl::OkStatus();
  }
  if (errno == EEXIST || errno == ENOTEMPTY) {
    return absl::FailedPreconditionError(absl::StrCat("rename '", from, "' to '", to, "': the target exists"));
  }
  return ErrnoStatus(errno, absl::StrCat("rename '", from, "' to '", to, "'"));
}

absl::Status RemoveTree(const std::string& path) {
  auto parent = Parent(path);
  if (!parent.ok()) return absl::IsNotFound(parent.status()) ? absl::OkStatus() : parent.status();
  return RemoveAt(parent->first.get(), parent->second, path, 0);
}

absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) {
  auto fd = OpenConfined(path, O_RDONLY | O_DIRECTORY);
  if (!fd.ok()) return fd.status();
  DIR* d = ::fdopendir(fd->get());
  if (!d) return ErrnoStatus(errno, absl::StrCat("list '", path, "'"));
  fd->release();  // owned by d now
  std::vector<std::string> names;
  while (dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) names.emplace_back(e->d_name);
  }
  ::closedir(d);
  return names;
}

FileKind KindOf(const std::string& path) {
  auto fd = OpenConfined(path, O_PATH | O_NOFOLLOW);
  if (!fd.ok()) return absl::IsNotFound(fd.status()) ? FileKind::kMissing : FileKind::kOther;
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) return FileKind::kOther;
  if (S_ISLNK(st.st_mode)) return FileKind::kSymlink;
  if (S_ISDIR(st.st_mode)) return FileKind::kDirectory;
  if (S_ISREG(st.st_mode)) return FileKind::kFile;
  return FileKind::kOther;
}

void UseOpenat2ForTest(bool use) { g_openat2.store(use ? 1 : 0); }

void SyncPath(const std::string& path) {
  auto fd = OpenConfined(path, O_RDONLY | O_NONBLOCK);
  if (fd.ok()) (void)::fsync(fd->get());
}

}  // namespace rp::files
