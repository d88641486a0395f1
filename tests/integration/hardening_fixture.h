// hardening_fixture.h — the attack tests' fixture (hardening_files_test.cc,
// hardening_faults_test.cc): a daemon whose allowed root has a sentinel tree beside it
// (`Outside`, fingerprinted, checked after every test), streamed batches and crafted .npy files.
// Test-only.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include "absl/strings/str_cat.h"
#include "tests/integration/fixtures.h"
#include "tests/support/npy_bytes.h"

namespace rp::testing {

namespace fs = std::filesystem;
namespace v1 = roundpipe::v1;

using absl::StatusCode;

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A file tree outside the allowed root, fingerprinted so a test can prove it was not touched.
class Outside {
 public:
  explicit Outside(const std::string& dir) : dir_(dir) {
    fs::create_directories(dir_ + "/ckpts/step-101");
    fs::create_directories(dir_ + "/ckpts/step-102");
    std::ofstream(dir_ + "/secret.txt") << "TOPSECRET-do-not-read-me-0123456789\n";
    std::ofstream(dir_ + "/ckpts/step-101/meta.json") << R"({"format": "roundpipe-checkpoint-1"})";
    std::ofstream(dir_ + "/ckpts/step-102/meta.json") << R"({"format": "roundpipe-checkpoint-1"})";
    before_ = Listing();
  }
  std::string Listing() const {
    std::string out;
    std::vector<std::string> names;
    for (const auto& e : fs::recursive_directory_iterator(dir_)) names.push_back(e.path().string());
    std::sort(names.begin(), names.end());
    for (const auto& n : names) out += n + (fs::is_regular_file(n) ? " " + Slurp(n) : "") + "\n";
    return out;
  }
  bool Untouched() const { return Listing() == before_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_, before_;
};

inline std::vector<v1::Batch> Batches(const std::string& job, int n) {
  std::vector<v1::Batch> out;
  for (int i = 0; i < n; ++i) out.push_back(TinyBatch(i == 0 ? job : "", static_cast<uint32_t>(100 + i)));
  return out;
}

// A .npy of uint16 tokens below 256 (valid for the tiny model) whatever its header claims.
inline std::string Npy(const std::string& descr, const std::string& shape, size_t payload_bytes) {
  std::string payload;
  for (size_t i = 0; i < payload_bytes; ++i) payload += static_cast<char>(i % 2 ? 0 : (i / 2) % 200);
  return NpyBytes(descr, shape, payload);
}

class HardeningTest : public DaemonTest {
 protected:
  void SetUp() override {
    DaemonTest::SetUp();
    outside_ = std::make_unique<Outside>(root_ + "/outside");
  }
  void TearDown() override {
    if (outside_) {
      EXPECT_TRUE(outside_->Untouched()) << "files outside the allowed root changed";
    }
    DaemonTest::TearDown();
  }
  // Submits a tiny job (cancelled when `cancel`), then stops the daemon with `signal`; the id.
  std::string SubmitOneThenStop(bool cancel, int signal) {
    auto c = daemon_.Connect();
    auto a = c->Submit(TinySpec());
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return "";
    if (cancel) {
      EXPECT_TRUE(c->Cancel(a->id()).ok());
    }
    EXPECT_EQ(daemon_.Stop(signal), signal == 15 ? 0 : -1);
    return a->id();
  }
  // A Hugging Face directory of the tiny model, made by the daemon itself (train 1 step, export).
  std::string BaseModel(client::Client& c, const std::string& name = "base") {
    v1::JobSpec spec = TinySpec();
    spec.set_output_dir(root_ + "/data/" + name + "-job");
    auto job = c.Submit(spec);
    EXPECT_TRUE(job.ok()) << job.status();
    Watcher w(c, job->id());
    EXPECT_TRUE(c.StreamBatches(job->id(), Batches(job->id(), 1)).ok());
    EXPECT_TRUE(w.WaitForState(v1::JOB_STATE_SUCCEEDED));
    auto dir = c.Export(job->id(), root_ + "/data/" + name);
    EXPECT_TRUE(dir.ok()) << dir.status();
    return dir.ok() ? *dir : "";
  }
  static v1::JobSpec HfSpec(const std::string& dir) {
    v1::JobSpec spec = TinySpec();
    spec.mutable_model()->Clear();
    spec.mutable_model()->set_hf_dir(dir);
    return spec;
  }
  std::unique_ptr<Outside> outside_;
};

}  // namespace rp::testing
