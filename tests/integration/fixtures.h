// fixtures.h — shared pieces of the daemon integration tests: a fixture owning a temp root and
// a DaemonProcess, a tiny job spec, token data, a WatchJob collector that waits on its own
// condition variable, a safetensors reader for exported files, and a metrics-text lookup.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "client/client.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/tiny_spec.h"
#include "workers/spec/model_config.h"

namespace rp::testing {

class DaemonTest : public ::testing::Test {
 public:
  static std::vector<int32_t> SomeTokens(int n, uint32_t seed) {
    std::mt19937 gen(seed);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(gen() % 256);
    return t;
  }

 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = (std::filesystem::temp_directory_path() /
             (std::string("rp_it_") + info->name() + "_" + std::to_string(getpid())))
                .string();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/data");
  }
  void TearDown() override {
    if (HasFailure()) std::fprintf(stderr, "---- daemon output ----\n%s\n", daemon_.Output().c_str());
    daemon_.Stop(9);
    std::filesystem::remove_all(root_);
  }
  bool StartDaemon(std::vector<std::string> extra = {},
                   const std::vector<std::pair<std::string, std::string>>& env = {}) {
    extra.insert(extra.end(), {"--allowed_root", root_ + "/data"});
    return daemon_.Start(root_ + "/state", extra, env);
  }
  // A uint16 .bin of n pseudo-random byte tokens inside the allowed root.
  std::string TokenFile(int n) {
    const std::string path = root_ + "/data/tokens-" + std::to_string(n) + ".bin";
    std::ofstream out(path, std::ios::binary);
    for (int32_t t : SomeTokens(n, 5)) {
      const uint16_t v = static_cast<uint16_t>(t);
      out.write(reinterpret_cast<const char*>(&v), 2);
    }
    return path;
  }
  // A validation token file of `n` tokens (the same format), <root>/data/valid.bin.
  std::string ValidationFile(int n, uint32_t seed = 11) {
    const std::string path = root_ + "/data/valid.bin";
    std::ofstream out(path, std::ios::binary);
    for (int32_t t : SomeTokens(n, seed)) {
      const uint16_t v = static_cast<uint16_t>(t);
      out.write(reinterpret_cast<const char*>(&v), 2);
    }
    return path;
  }
  static roundpipe::v1::JobSpec TinySpec() { return TinyJobSpec(); }
  // Waits until GetJob's record satisfies `pred` (polls), at most `limit`.
  template <typename Pred>
  static bool WaitForRecord(client::Client& c, const std::string& id, Pred pred, std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      auto rec = c.Get(id);
      if (rec.ok() && pred(*rec)) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }
  // TinySpec's model as the engine sees it (defaults as the daemon fills them).
  static spec::ModelConfig EngineModel() {
    spec::ModelConfig c;
    c.family = "llama";
    c.vocab = 256;
    c.hidden = 32;
    c.intermediate = 64;
    c.num_blocks = 2;
    c.num_heads = 2;
    c.num_kv_heads = 1;
    c.head_dim = 16;
    return c;
  }

  std::string root_;
  DaemonProcess daemon_;
};

// Collects a job's WatchJob stream on a thread; waits are notified by arriving events.
class Watcher {
 public:
  Watcher(client::Client& c, const std::string& id) {
    thread_ = std::thread([this, &c, id] {
      absl::Status st = c.Watch(
          id,
          [this](const roundpipe::v1::JobEvent& e) {
            std::lock_guard<std::mutex> lock(mu_);
            events_.push_back(e);
            cv_.notify_all();
          },
          &ctx_);
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      status_ = st;
      cv_.notify_all();
    });
  }
  ~Watcher() {
    ctx_.TryCancel();  // a job that never ends must not hold the test
    thread_.join();
  }
  bool WaitForState(roundpipe::v1::JobState s, std::chrono::seconds timeout = std::chrono::seconds(120)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return HasState(s) || finished_; }) && HasState(s);
  }
  bool WaitForSteps(int64_t n, std::chrono::seconds timeout = std::chrono::seconds(120)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return LastStep() >= n || finished_; }) && LastStep() >= n;
  }
  bool Finished(std::chrono::seconds timeout = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return finished_; }) && status_.ok();
  }
  std::vector<roundpipe::v1::JobEvent> Events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  std::vector<double> Losses() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<double> out;
    for (const auto& e : events_) {
      if (e.has_step()) out.push_back(e.step().loss());
    }
    return out;
  }
  std::vector<roundpipe::v1::JobState> States() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<roundpipe::v1::JobState> out;
    for (const auto& e : events_) {
      if (e.event_case() == roundpipe::v1::JobEvent::kState) out.push_back(e.state());
    }
    return out;
  }
  // The engine's time of the transition into `s` (nanoseconds since the epoch; max if never).
  int64_t TimeOf(roundpipe::v1::JobState s) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : events_) {
      if (e.event_case() == roundpipe::v1::JobEvent::kState && e.state() == s) {
        return e.time().seconds() * 1000000000 + e.time().nanos();
      }
    }
    return INT64_MAX;
  }

 private:
  bool HasState(roundpipe::v1::JobState s) const {
    for (const auto& e : events_) {
      if (e.event_case() == roundpipe::v1::JobEvent::kState && e.state() == s) return true;
    }
    return false;
  }
  int64_t LastStep() const {
    int64_t n = 0;
    for (const auto& e : events_) {
      if (e.has_step()) n = e.step().step();
    }
    return n;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<roundpipe::v1::JobEvent> events_;
  grpc::ClientContext ctx_;
  bool finished_ = false;
  absl::Status status_;
  std::thread thread_;
};

// A batch of the tiny model's shape (4 x 16 pseudo-random byte tokens); `job` names the stream's
// job on its first batch.
inline roundpipe::v1::Batch TinyBatch(const std::string& job, uint32_t seed, bool keep_open = false) {
  roundpipe::v1::Batch b;
  b.set_job_id(job);
  b.set_batch(4);
  b.set_sequence(16);
  b.set_keep_open(keep_open);
  for (int32_t t : DaemonTest::SomeTokens(64, seed)) b.add_tokens(t);
  return b;
}

// Reads an F32/BF16/F16 safetensors file (independently of the engine's writer) as fp32 tensors.
inline std::map<std::string, at::Tensor> ReadSafetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::map<std::string, at::Tensor> out;
  if (bytes.size() < 8) return out;
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  auto header = nlohmann::json::parse(bytes.substr(8, n));
  const size_t base = 8 + n;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string dt = v["dtype"];
    const at::ScalarType st = dt == "F32" ? at::kFloat : dt == "BF16" ? at::kBFloat16 : at::kHalf;
    std::vector<int64_t> shape = v["shape"];
    const size_t b = v["data_offsets"][0], e = v["data_offsets"][1];
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(st));
    if (t.nbytes() != e - b) continue;
    std::memcpy(t.data_ptr(), bytes.data() + base + b, e - b);
    out[name] = t.to(at::kFloat);
  }
  return out;
}

// The value of the sample `name` (exact, labels included) in Prometheus text; -1 if absent.
inline double MetricValue(const std::string& text, const std::string& name) {
  size_t at = 0;
  while ((at = text.find(name + " ", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + name.size() + 1));
    at += name.size();
  }
  return -1;
}

// Sends `signal` and waits at most `limit` for the daemon to exit (then SIGKILL); the seconds it
// took, or the limit.
inline double SecondsToStop(DaemonProcess& daemon, int signal, std::chrono::seconds limit) {
  const pid_t pid = daemon.pid();
  const auto start = std::chrono::steady_clock::now();
  auto stopped = std::async(std::launch::async, [&] { return daemon.Stop(signal); });
  if (stopped.wait_for(limit) == std::future_status::timeout) {
    kill(pid, SIGKILL);
    stopped.wait();
    return static_cast<double>(limit.count());
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace rp::testing
