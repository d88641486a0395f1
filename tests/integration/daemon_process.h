// daemon_process.h — runs the real roundpiped binary for integration tests: 127.0.0.1 port 0
// for gRPC and metrics, a throw-away state dir, and the addresses read from the daemon's
// "serving" line on its stdout (a blocking read: the test waits on the daemon's own
// notification, never on a sleep loop).
//
// Contract: one test thread owns a DaemonProcess; the destructor kills a daemon still running.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "tests/support/run_command.h"  // RunCommand

namespace rp::testing {

class DaemonProcess {
 public:
  ~DaemonProcess();
  // Starts roundpiped with `args` (added to --state_dir/--listen/--metrics_address defaults
  // unless `args` names them) and waits until it serves. Fails the test on error.
  bool Start(const std::string& state_dir, const std::vector<std::string>& args,
             const std::vector<std::pair<std::string, std::string>>& env = {});
  // SIGTERM (drain) and wait; returns the exit status (-1 when killed by a signal).
  int Stop(int signal_number = 15);
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  const std::string& metrics_address() const { return metrics_; }
  std::unique_ptr<client::Client> Connect(const std::string& token = "") const;
  // Everything the daemon printed to stdout/stderr so far (for failure messages).
  std::string Output();

 private:
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string address_, metrics_, output_;
};

// For the benchmarks: a fresh <tmp>/<prefix>_<pid> with an allowed data/ root, and `daemon`
// started on it (quiet logs, extra flags appended). Returns the root, or "" after printing the
// daemon's output when it did not start.
std::string StartBenchDaemon(const std::string& prefix, DaemonProcess* daemon,
                             const std::vector<std::string>& extra = {});

// A numeric field of /proc/<pid>/status (e.g. "VmRSS:" in KiB, "Threads:"); -1 if absent.
int64_t ProcStatusField(pid_t pid, const std::string& key);

// A plain HTTP/1.0 GET on loopback; returns the body ("" on failure).
std::string HttpGet(const std::string& host_port, const std::string& path);

}  // namespace rp::testing
