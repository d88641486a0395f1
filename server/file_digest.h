// file_digest.h — the SHA-256 of a server-side file's content (a cluster job's data file, which
// every node must hold byte for byte: its coordinator sends its digest with every node it starts).
//
// Contract: a pure function of the file (any thread). Only a regular file is read (a FIFO, a
// device or a directory is refused without blocking); `stop` (optional) is polled between chunks
// and ends the read with CANCELLED.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace rp::server {

// Lower-case hex. NotFound / PermissionDenied / InvalidArgument (not a regular file) naming the
// path; Cancelled when `stop` turned true.
absl::StatusOr<std::string> Sha256OfFile(const std::string& path, const std::function<bool()>& stop = {});

}  // namespace rp::server
