// paths.h — confines every path a client names (model dir, dataset, output or export dir) to the
// daemon's configured roots. Symlinks and ".." are resolved before the check, so neither can
// lead outside; a path that does not exist yet (an output dir) is checked through its nearest
// existing ancestor.
//
// Contract: pure functions over the file system, any thread.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::server {

// The canonical absolute form of `path` if it lies inside one of `roots` (themselves
// canonicalised); PermissionDenied (saying which roots are allowed) otherwise. `what` names the
// field in messages, e.g. "data.token_file.path".
absl::StatusOr<std::string> ResolveInsideRoots(const std::string& path, const std::vector<std::string>& roots,
                                               const std::string& what);

}  // namespace rp::server
