// A job's TensorBoard log (event_log.h).
#include "server/tensorboard/event_log.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/tensorboard/record_file.h"
#include "server/tensorboard/summaries.h"

namespace rp::tensorboard {
namespace {

absl::Status Errno(const std::string& what) {
  const int e = errno;
  const std::string msg = absl::StrCat(what, ": ", std::strerror(e));
  if (e == ENOSPC || e == EDQUOT) return absl::ResourceExhaustedError(msg);
  if (e == EACCES || e == EPERM) return absl::PermissionDeniedError(msg);
  return absl::InternalError(msg);
}

// Writes all of `data` at the fd's offset; false with errno set on a failure or no progress.
bool WriteAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = EIO;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

// The names of the directory's entries that look like event files, sorted (TensorBoard's order).
std::vector<std::string> EventFileNames(int dir_fd) {
  std::vector<std::string> names;
  const int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return names;
  DIR* d = ::fdopendir(fd);
  if (d == nullptr) {
    ::close(fd);
    return names;
  }
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (absl::StrContains(name, "tfevents") && name[0] != '.') names.push_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// A record of a step that runs again after the resume, or of what runs again at its very step.
bool RunsAgain(const RecordInfo& r, const EventLog::Resume& resume) {
  if (r.step > resume.step) return true;
  if (r.step < resume.step) return false;
  for (const std::string& tag : r.tags) {
    for (const std::string& prefix : resume.redo_at_step) {
      if (absl::StartsWith(tag, prefix)) return true;
    }
  }
  return false;
}

}  // namespace

EventLog::EventLog(int dir_fd, std::string dir) : dir_fd_(dir_fd), dir_(std::move(dir)) {}

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

absl::StatusOr<std::unique_ptr<EventLog>> EventLog::Open(const std::string& dir, const Resume& resume) {
  if (::mkdir(dir.c_str(), 0750) != 0 && errno != EEXIST) return Errno(absl::StrCat("creating ", dir));
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dir_fd < 0) return Errno(absl::StrCat("opening ", dir, " (a directory, not a symlink)"));
  return OpenAt(dir_fd, dir, resume);
}

absl::StatusOr<std::unique_ptr<EventLog>> EventLog::OpenAt(int dir_fd, const std::string& dir, const Resume& resume) {
  std::unique_ptr<EventLog> log(new EventLog(dir_fd, dir));
  if (absl::Status st = log->TrimExisting(resume); !st.ok()) return st;
  if (absl::Status st = log->StartFile(); !st.ok()) return st;
  return log;
}

absl::Status EventLog::TrimExisting(const Resume& resume) {
  for (const std::string& name : EventFileNames(dir_fd_)) {
    if (absl::Status st = TrimFile(name, resume); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status EventLog::TrimFile(const std::string& name, const Resume& resume) {
  const std::string path = absl::StrCat(dir_, "/", name);
  const int fd = ::openat(dir_fd_, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    notes_.push_back(absl::StrCat("left ", path, " alone: ", std::strerror(errno)));
    return absl::OkStatus();
  }
  absl::Cleanup close_fd = [fd] { ::close(fd); };
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    notes_.push_back(absl::StrCat("left ", path, " alone: not a regular file"));
    return absl::OkStatus();
  }
  if (st.st_size > kMaxRewriteBytes) {
    notes_.push_back(absl::StrCat("left ", path, " alone: ", st.st_size, " bytes, over ", kMaxRewriteBytes,
                                  " (steps after ", resume.step, " in it may show twice)"));
    return absl::OkStatus();
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno(absl::StrCat("reading ", path));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  bytes.resize(got);
  const ParsedRecords parsed = ParseRecords(bytes);
  std::string kept;
  int64_t dropped = 0;
  for (const std::string& rec : parsed.records) {
    const RecordInfo info = DescribeRecord(rec);
    if (info.parsed && !info.header && !info.hparams && RunsAgain(info, resume)) {
      ++dropped;
      continue;
    }
    has_hparams_ = has_hparams_ || info.hparams;
    kept += FrameRecord(rec);
  }
  if (dropped == 0 && !parsed.damaged_tail) return absl::OkStatus();
  // Written beside it and renamed over it: a crash leaves the old file or the new one, whole.
  const std::string tmp = absl::StrCat(".", name, ".trim");
  (void)::unlinkat(dir_fd_, tmp.c_str(), 0);
  const int out = ::openat(dir_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
  if (out < 0) return Errno(absl::StrCat("rewriting ", path));
  const bool ok = WriteAll(out, kept) && ::fsync(out) == 0;
  const absl::Status failed = ok ? absl::OkStatus() : Errno(absl::StrCat("rewriting ", path));
  ::close(out);
  if (!ok || ::renameat(dir_fd_, tmp.c_str(), dir_fd_, name.c_str()) != 0) {
    const absl::Status st = ok ? Errno(absl::StrCat("replacing ", path)) : failed;
    (void)::unlinkat(dir_fd_, tmp.c_str(), 0);
    return st;
  }
  (void)::fsync(dir_fd_);
  dropped_ += dropped;
  if (parsed.damaged_tail) {
    notes_.push_back(absl::StrCat("cut a damaged last record off ", path, " (",
                                  static_cast<int64_t>(bytes.size()) - parsed.intact_bytes, " bytes)"));
  }
  return absl::OkStatus();
}

absl::Status EventLog::StartFile() {
  char host[256] = {};
  if (::gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') std::strcpy(host, "localhost");
  for (char& c : host) {
    if (c == '/') c = '_';
  }
  const double now = static_cast<double>(std::time(nullptr));
  // TensorBoard reads a directory's files in name order: the time first, then a counter, so that a
  // file opened within the same second as an earlier one (another process's too) sorts after it.
  const std::string prefix = absl::StrCat("events.out.tfevents.", static_cast<int64_t>(now), ".");
  std::string latest_this_second;
  for (const std::string& name : EventFileNames(dir_fd_)) {
    if (absl::StartsWith(name, prefix)) latest_this_second = std::max(latest_this_second, name);
  }
  for (int n = 0; n < 1000; ++n) {
    const std::string name = absl::StrCat(prefix, host, ".", ::getpid(), ".", n);
    if (name <= latest_this_second) continue;
    fd_ = ::openat(dir_fd_, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_APPEND | O_CLOEXEC, 0640);
    if (fd_ < 0 && errno == EEXIST) continue;
    if (fd_ < 0) return Errno(absl::StrCat("creating an event file in ", dir_));
    path_ = absl::StrCat(dir_, "/", name);
    return Append(FrameRecord(FileVersionEvent(now)));
  }
  return absl::AlreadyExistsError(absl::StrCat("no free event file name in ", dir_));
}

absl::Status EventLog::Append(const std::string& records) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(dir_, ": the event log is closed"));
  if (WriteAll(fd_, records)) {
    size_ += static_cast<int64_t>(records.size());
    return absl::OkStatus();
  }
  absl::Status st = Errno(absl::StrCat("writing ", path_));
  // A part of a record would make every later one unreadable: cut back to the last whole one.
  if (::ftruncate(fd_, size_) != 0) {
    ::close(fd_);
    fd_ = -1;
  }
  return st;
}

absl::Status EventLog::AddScalars(int64_t step, const Scalars& scalars, double wall_time) {
  return Append(FrameRecord(ScalarsEvent(step, scalars, wall_time)));
}

absl::Status EventLog::AddText(int64_t step, const std::string& tag, const std::string& markdown, double wall_time) {
  return Append(FrameRecord(TextEvent(step, tag, markdown, wall_time)));
}

absl::Status EventLog::AddHParams(const std::vector<std::pair<std::string, HParam>>& hparams, const std::string& group,
                                  double wall_time) {
  if (has_hparams_) return absl::OkStatus();
  absl::Status st = Append(FrameRecord(HParamsEvent(hparams, group, wall_time)));
  has_hparams_ = st.ok();
  return st;
}

}  // namespace rp::tensorboard
