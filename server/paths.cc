#include "server/paths.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rp::server {
namespace fs = std::filesystem;

namespace {

// Canonical form of an existing prefix of `p` plus the (normalised) remainder.
absl::StatusOr<fs::path> Canonical(const fs::path& p) {
  std::error_code ec;
  fs::path abs = fs::absolute(p, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("bad path '", p.string(), "'"));
  fs::path existing = abs;
  fs::path rest;
  while (!existing.empty() && !fs::exists(existing, ec)) {
    rest = existing.filename() / rest;
    if (existing == existing.parent_path()) break;
    existing = existing.parent_path();
  }
  fs::path canon = fs::canonical(existing, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat("cannot resolve '", p.string(), "': ", ec.message()));
  for (const auto& part : rest) {
    if (part == "..") return absl::PermissionDeniedError("'..' after a path component that does not exist");
    if (part != "." && !part.empty()) canon /= part;
  }
  return canon;
}

bool IsInside(const fs::path& p, const fs::path& root) {
  auto pi = p.begin();
  for (auto ri = root.begin(); ri != root.end(); ++ri, ++pi) {
    if (ri->empty()) continue;  // trailing separator
    if (pi == p.end() || *pi != *ri) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ResolveInsideRoots(const std::string& path, const std::vector<std::string>& roots,
                                               const std::string& what) {
  if (path.empty()) return absl::InvalidArgumentError(absl::StrCat(what, ": empty path"));
  if (roots.empty()) {
    return absl::PermissionDeniedError(
        absl::StrCat(what, ": the daemon has no allowed_roots configured, so it accepts no paths"));
  }
  auto p = Canonical(path);
  if (!p.ok()) return absl::Status(p.status().code(), absl::StrCat(what, ": ", p.status().message()));
  for (const std::string& r : roots) {
    auto root = Canonical(r);
    if (root.ok() && IsInside(*p, *root)) return p->string();
  }
  return absl::PermissionDeniedError(absl::StrCat(what, ": '", path, "' resolves to '", p->string(),
                                                  "', outside the allowed roots [", absl::StrJoin(roots, ", "), "]"));
}

}  // namespace rp::server
