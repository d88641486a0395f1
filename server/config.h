// config.h — the daemon's configuration: a DaemonConfig (proto/roundpipe/v1/config.proto) read
// from a JSON file by protobuf's JSON parser, defaults filled in, and checked.
//
// Contract: pure functions (they read the files the config names), any thread.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "roundpipe/v1/config.pb.h"

namespace rp::server {

// Parses a JSON file (unknown fields are an error, naming the field).
absl::StatusOr<roundpipe::v1::DaemonConfig> LoadConfigFile(const std::string& path);
// Fills unset fields with the documented defaults.
void ApplyDefaults(roundpipe::v1::DaemonConfig* config);
// Every problem in one message: addresses, access control (non-loopback needs TLS or tokens
// unless allow_insecure_remote), readable TLS/token files, existing allowed roots, limits.
absl::Status ValidateConfig(const roundpipe::v1::DaemonConfig& config);

// "127.0.0.1:N", "[::1]:N", "localhost:N" and "unix:..." are local; anything else is not.
bool IsLocalListenAddress(const std::string& address);
// The tokens of `token_files` (first line of each, trimmed).
absl::StatusOr<std::vector<std::string>> ReadTokenFiles(const roundpipe::v1::DaemonConfig& config);
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

}  // namespace rp::server
