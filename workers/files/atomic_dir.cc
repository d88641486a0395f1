#include "workers/files/atomic_dir.h"

#include <filesystem>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "workers/files/confined_fs.h"

namespace rp::files {

namespace fs = std::filesystem;

bool IsAtomicDirTemporary(const std::string& name) {
  return name.size() > 1 && name[0] == '.' && absl::StrContains(name, ".tmp-");
}

int RemoveTornTemporaries(const std::string& target_in) {
  const fs::path target = fs::path(target_in).lexically_normal();
  const std::string prefix = absl::StrCat(".", target.filename().string(), ".tmp-");
  int removed = 0;
  if (auto names = ListDir(target.parent_path().string()); names.ok()) {
    for (const std::string& n : *names) {
      if (absl::StartsWith(n, prefix) && RemoveTree((target.parent_path() / n).string()).ok()) ++removed;
    }
  }
  return removed;
}

absl::StatusOr<AtomicDir> AtomicDir::Begin(const std::string& target_in) {
  const fs::path target = fs::path(target_in).lexically_normal();
  const std::string name = target.filename().string();
  if (name.empty() || name == "." || name == "..") {
    return absl::InvalidArgumentError(absl::StrCat("'", target_in, "': not a directory name"));
  }
  const fs::path parent = target.parent_path();
  if (absl::Status st = MakeDirs(parent.string()); !st.ok()) return st;
  if (KindOf(target.string()) != FileKind::kMissing) {
    return absl::AlreadyExistsError(absl::StrCat("'", target.string(), "' already exists"));
  }
  // Torn temporaries of this very target (a crash mid-write) go first.
  (void)RemoveTornTemporaries(target.string());
  const std::string prefix = absl::StrCat(".", name, ".tmp-");
  const fs::path tmp = parent / absl::StrFormat("%s%08x", prefix, std::random_device{}());
  if (absl::Status st = MakeDir(tmp.string()); !st.ok()) return st;
  return AtomicDir(target.string(), tmp.string());
}

AtomicDir::AtomicDir(AtomicDir&& o) noexcept
    : target_(std::move(o.target_)), tmp_(std::move(o.tmp_)), committed_(o.committed_) {
  o.committed_ = true;  // the moved-from one owns nothing
}

AtomicDir::~AtomicDir() {
  if (!committed_) (void)RemoveTree(tmp_);
}

std::string AtomicDir::PathOf(const std::string& name) const { return (fs::path(tmp_) / name).string(); }

absl::Status AtomicDir::WriteFile(const std::string& name, const std::string& text) {
  return WriteNewFile(PathOf(name), text);
}

absl::Status AtomicDir::Commit() {
  if (auto names = ListDir(tmp_); names.ok()) {
    for (const std::string& n : *names) SyncPath(PathOf(n));
  }
  SyncPath(tmp_);
  if (absl::Status st = RenameNoReplace(tmp_, target_); !st.ok()) return st;
  committed_ = true;
  SyncPath(fs::path(target_).parent_path().string());
  return absl::OkStatus();
}

}  // namespace rp::files
