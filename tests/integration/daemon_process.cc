#include "tests/integration/daemon_process.h"

#include "tests/support/http_get.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#ifndef RP_ROUNDPIPED
#error "RP_ROUNDPIPED must name the daemon binary"
#endif

namespace rp::testing {

DaemonProcess::~DaemonProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_fd_ >= 0) close(out_fd_);
}

bool DaemonProcess::Start(const std::string& state_dir, const std::vector<std::string>& extra,
                          const std::vector<std::pair<std::string, std::string>>& env) {
  std::vector<std::string> args = {RP_ROUNDPIPED, "--state_dir", state_dir};
  auto has = [&](const std::string& flag) {
    return std::any_of(extra.begin(), extra.end(), [&](const std::string& a) { return a.rfind(flag, 0) == 0; });
  };
  if (!has("--listen")) args.insert(args.end(), {"--listen", "127.0.0.1:0"});
  if (!has("--metrics_address")) args.insert(args.end(), {"--metrics_address", "127.0.0.1:0"});
  if (!has("--devices")) args.insert(args.end(), {"--devices", "cpu:2", "--log_level", "debug"});
  args.insert(args.end(), extra.begin(), extra.end());
  if (out_fd_ >= 0) close(out_fd_);
  out_fd_ = -1;
  output_.clear();  // a restarted daemon prints its own serving line
  int fds[2];
  if (pipe(fds) != 0) return false;
  pid_ = fork();
  if (pid_ == 0) {
    for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::perror("execv roundpiped");
    _exit(127);
  }
  close(fds[1]);
  out_fd_ = fds[0];
  // Read until the serving line (or EOF / 120 s without output).
  const std::string marker = "roundpiped: serving grpc=";
  for (;;) {
    size_t at = output_.find(marker);
    if (at != std::string::npos && output_.find('\n', at) != std::string::npos) {
      const std::string line = output_.substr(at, output_.find('\n', at) - at);
      const size_t g = line.find("grpc=") + 5;
      address_ = line.substr(g, line.find_first_of(", ", g) - g);
      const size_t m = line.find("metrics=") + 8;
      metrics_ = line.substr(m, line.find(' ', m) - m);
      return true;
    }
    pollfd p{out_fd_, POLLIN, 0};
    if (poll(&p, 1, 120000) <= 0) return false;
    char buf[4096];
    const ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n <= 0) return false;  // the daemon exited
    output_.append(buf, static_cast<size_t>(n));
  }
}

std::string DaemonProcess::Output() {
  if (out_fd_ >= 0) {
    int flags = fcntl(out_fd_, F_GETFL);
    fcntl(out_fd_, F_SETFL, flags | O_NONBLOCK);
    char buf[4096];
    ssize_t n;
    while ((n = read(out_fd_, buf, sizeof(buf))) > 0) output_.append(buf, static_cast<size_t>(n));
    fcntl(out_fd_, F_SETFL, flags);
  }
  return output_;
}

int DaemonProcess::Stop(int signal_number) {
  if (pid_ <= 0) return -1;
  kill(pid_, signal_number);
  // Collect output while waiting, so a chatty daemon never blocks on a full pipe.
  char buf[4096];
  ssize_t n;
  while ((n = read(out_fd_, buf, sizeof(buf))) > 0) output_.append(buf, static_cast<size_t>(n));
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::unique_ptr<client::Client> DaemonProcess::Connect(const std::string& token) const {
  client::ClientOptions o;
  o.address = address_;
  o.token = token;
  auto c = client::Client::Connect(o);
  return c.ok() ? std::move(*c) : nullptr;
}

int64_t ProcStatusField(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  }
  return -1;
}

std::string HttpGet(const std::string& host_port, const std::string& path) {
  const std::string out = HttpGetResponse(std::stoi(host_port.substr(host_port.rfind(':') + 1)), path);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

std::string StartBenchDaemon(const std::string& prefix, DaemonProcess* daemon, const std::vector<std::string>& extra) {
  const std::string root = std::filesystem::temp_directory_path() / (prefix + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(root);
  std::filesystem::create_directories(root + "/data");
  std::vector<std::string> args = {"--allowed_root", root + "/data", "--log_level", "warn"};
  args.insert(args.end(), extra.begin(), extra.end());
  if (!daemon->Start(root + "/state", args)) {
    std::fprintf(stderr, "daemon did not start:\n%s\n", daemon->Output().c_str());
    return "";
  }
  return root;
}

}  // namespace rp::testing
