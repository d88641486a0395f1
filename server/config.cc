#include "server/config.h"

#include <google/protobuf/util/json_util.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "server/cluster.h"

namespace rp::server {

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read '", path, "'"));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<roundpipe::v1::DaemonConfig> LoadConfigFile(const std::string& path) {
  auto text = ReadWholeFile(path);
  if (!text.ok()) return text.status();
  roundpipe::v1::DaemonConfig config;
  auto st = google::protobuf::util::JsonStringToMessage(*text, &config);
  if (!st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("config ", path, ": ", std::string(st.message())));
  }
  return config;
}

void ApplyDefaults(roundpipe::v1::DaemonConfig* c) {
  if (c->state_dir().empty()) c->set_state_dir("/var/lib/roundpipe");
  if (c->listen().empty()) {
    c->add_listen(absl::StrCat("unix:", c->state_dir(), "/roundpiped.sock"));
    c->add_listen("127.0.0.1:50151");
  }
  if (c->devices().empty()) c->set_devices("auto");
  if (c->max_message_bytes() == 0) c->set_max_message_bytes(int64_t{64} << 20);
  if (c->max_queued_batches() == 0) c->set_max_queued_batches(8);
  if (c->drain_deadline_seconds() == 0) c->set_drain_deadline_seconds(120);
  if (c->max_running_jobs() == 0) c->set_max_running_jobs(1);
  if (c->log_level().empty()) c->set_log_level("info");
  ApplyClusterDefaults(c);
  // gRPC resolves "localhost" to both 127.0.0.1 and ::1 and cannot bind port 0 on both at once:
  // listen on the IPv4 loopback, which every client resolving "localhost" reaches.
  for (int i = 0; i < c->listen_size(); ++i) {
    if (absl::StartsWith(c->listen(i), "localhost:")) {
      c->set_listen(i, absl::StrCat("127.0.0.1:", c->listen(i).substr(std::string("localhost:").size())));
    }
  }
}

bool IsLocalListenAddress(const std::string& a) {
  if (absl::StartsWith(a, "unix:")) return true;
  for (const char* host : {"127.0.0.1:", "[::1]:", "localhost:"}) {
    if (absl::StartsWith(a, host)) return true;
  }
  return false;
}

absl::StatusOr<std::vector<std::string>> ReadTokenFiles(const roundpipe::v1::DaemonConfig& c) {
  std::vector<std::string> tokens;
  for (const std::string& f : c.token_files()) {
    auto text = ReadWholeFile(f);
    if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("token_files: ", text.status().message()));
    std::string first = text->substr(0, text->find('\n'));
    std::string tok(absl::StripAsciiWhitespace(first));
    if (tok.size() < 16) {
      return absl::InvalidArgumentError(
          absl::StrCat("token_files: '", f, "' holds no token of at least 16 characters"));
    }
    tokens.push_back(tok);
  }
  return tokens;
}

absl::Status ValidateConfig(const roundpipe::v1::DaemonConfig& c) {
  std::vector<std::string> problems;
  const bool secured = !c.tls().cert_file().empty() || c.token_files_size() > 0;
  for (const std::string& a : c.listen()) {
    if (absl::StartsWith(a, "unix:")) {
      if (a.size() <= 5) problems.push_back(absl::StrCat("listen '", a, "': empty unix socket path"));
      continue;
    }
    const size_t colon = a.rfind(':');
    int port = -1;
    if (colon == std::string::npos || !absl::SimpleAtoi(a.substr(colon + 1), &port) || port < 0 || port > 65535) {
      problems.push_back(absl::StrCat("listen '", a, "': expected host:port (port 0 = any free port) or unix:PATH"));
      continue;
    }
    if (!IsLocalListenAddress(a) && !secured && !c.allow_insecure_remote()) {
      problems.push_back(absl::StrCat("listen '", a,
                                      "': not a loopback address; configure tls and/or token_files, or set "
                                      "allow_insecure_remote: true"));
    }
  }
  if (!c.metrics_address().empty()) {
    const size_t colon = c.metrics_address().rfind(':');
    int port = -1;
    if (colon == std::string::npos || !absl::SimpleAtoi(c.metrics_address().substr(colon + 1), &port) || port < 0 ||
        port > 65535) {
      problems.push_back(absl::StrCat("metrics_address '", c.metrics_address(), "': expected host:port"));
    } else if (!IsLocalListenAddress(c.metrics_address()) && !c.allow_insecure_remote()) {
      // /metrics has no authentication: exposing it beyond loopback is an explicit choice.
      problems.push_back(absl::StrCat("metrics_address '", c.metrics_address(),
                                      "': not a loopback address (the metrics endpoint has no authentication); set "
                                      "allow_insecure_remote: true to expose it"));
    }
  }
  if (!c.tls().cert_file().empty() || !c.tls().key_file().empty()) {
    for (const std::string& f : {c.tls().cert_file(), c.tls().key_file()}) {
      if (f.empty() || !ReadWholeFile(f).ok()) problems.push_back(absl::StrCat("tls: cannot read '", f, "'"));
    }
  }
  if (!c.tls().client_ca_file().empty() && !ReadWholeFile(c.tls().client_ca_file()).ok()) {
    problems.push_back(absl::StrCat("tls.client_ca_file: cannot read '", c.tls().client_ca_file(), "'"));
  }
  if (auto t = ReadTokenFiles(c); !t.ok()) problems.push_back(std::string(t.status().message()));
  for (const std::string& r : c.allowed_roots()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(r, ec))
      problems.push_back(absl::StrCat("allowed_roots: '", r, "' is not a directory"));
  }
  if (c.max_message_bytes() < 1024 || c.max_message_bytes() > (int64_t{1} << 31) - 1) {
    problems.push_back("max_message_bytes must lie in [1024, 2147483647] (gRPC's limit is a 32-bit int)");
  }
  if (c.max_queued_batches() < 1) problems.push_back("max_queued_batches must be >= 1");
  if (c.drain_deadline_seconds() < 1) problems.push_back("drain_deadline_seconds must be >= 1");
  if (c.max_running_jobs() < 1 || c.max_running_jobs() > 64) {
    problems.push_back(absl::StrCat("max_running_jobs must lie in [1, 64] (got ", c.max_running_jobs(), ")"));
  }
  if (c.host_memory_limit_bytes() < 0) {
    problems.push_back(absl::StrCat("host_memory_limit_bytes must be 0 (no limit) or positive (got ",
                                    c.host_memory_limit_bytes(), ")"));
  }
  const std::string& lv = c.log_level();
  if (lv != "trace" && lv != "debug" && lv != "info" && lv != "warn" && lv != "error") {
    problems.push_back(absl::StrCat("log_level '", lv, "': expected trace, debug, info, warn or error"));
  }
  if (absl::StartsWith(c.devices(), "paced:")) {
    // The paced backend moves no data and trains nothing: its figures are schedule timings.
    problems.push_back(absl::StrCat("devices '", c.devices(),
                                    "': paced workers are a benchmark backend (no data, no training), never a "
                                    "daemon's; run tests/bench/paced_bench (docs/ENGINE.md) to time schedules"));
  } else if (c.devices() != "auto" && !absl::StartsWith(c.devices(), "cpu:") &&
             !absl::StartsWith(c.devices(), "cuda")) {
    problems.push_back(absl::StrCat("devices '", c.devices(), "': expected auto, cpu:N or cuda[:i,j,...]"));
  }
  CheckClusterConfig(c, &problems);
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("invalid config: ", absl::StrJoin(problems, "; ")));
}

}  // namespace rp::server
