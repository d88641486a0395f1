// dataset_soak_bench — one real roundpiped (CPU backend) running --jobs short jobs on a JSONL
// dataset (the daemon tokenizes it at every start) and then --jobs on a token dataset file of the
// same tokens, one after another. Prints the daemon's RSS after every job and the growth per
// ended job over the second half of each run: a daemon that keeps an ended job's tokens grows by
// the dataset with every job here (goal: flat once warm).
//
//   build/tests/bench/dataset_soak_bench [--jobs 8] [--mib 16]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/tiny_spec.h"

ABSL_FLAG(int, jobs, 8, "jobs of each kind, one after another");
ABSL_FLAG(int, mib, 16, "MiB of JSONL text (one token per byte: the tokenizer has no merges)");

namespace v1 = roundpipe::v1;

namespace {

// A byte-alphabet BPE tokenizer without merges or pre-tokenizer: one token per character.
void WriteTokenizer(const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream f(dir + "/tokenizer.json");
  f << "{\"model\": {\"type\": \"BPE\", \"vocab\": {";
  for (char c = 'a'; c <= 'z'; ++c) f << "\"" << c << "\": " << (c - 'a') << ", ";
  f << "\" \": 26}, \"merges\": []}}";
}

// `records` lines of ~4 KB of words; the same text as token ids for the token dataset.
std::vector<int32_t> WriteJsonl(const std::string& path, int64_t bytes) {
  std::ofstream f(path);
  std::vector<int32_t> ids;
  std::string line;
  for (int i = 0; line.size() < 4000; ++i) line += std::string(1, static_cast<char>('a' + i % 26)) + "bcd ";
  for (int64_t written = 0; written < bytes; written += static_cast<int64_t>(line.size())) {
    f << "{\"text\": \"" << line << "\"}\n";
    for (char c : line) ids.push_back(c == ' ' ? 26 : c - 'a');
  }
  return ids;
}

// A token dataset file (safetensors, int32 input_ids, the format metadata), written by hand.
void WriteTokenDataset(const std::string& path, const std::vector<int32_t>& ids) {
  const uint64_t n = ids.size(), bytes = n * 4;
  std::string header =
      "{\"__metadata__\": {\"format\": \"roundpipe.token_dataset.v1\"}, \"input_ids\": "
      "{\"dtype\": \"I32\", \"shape\": [" +
      std::to_string(n) + "], \"data_offsets\": [0, " + std::to_string(bytes) + "]}}";
  while (header.size() % 8 != 0) header += ' ';
  std::ofstream f(path, std::ios::binary);
  const uint64_t len = header.size();
  f.write(reinterpret_cast<const char*>(&len), 8);
  f << header;
  f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(bytes));
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  rp::testing::DaemonProcess daemon;
  const std::string root = rp::testing::StartBenchDaemon("rp_dataset_soak", &daemon);
  if (root.empty()) return 1;
  auto c = daemon.Connect();
  const std::string dir = root + "/data/ds";
  WriteTokenizer(dir);
  const std::vector<int32_t> ids = WriteJsonl(dir + "/train.jsonl", int64_t{absl::GetFlag(FLAGS_mib)} << 20);
  WriteTokenDataset(dir + "/train.safetensors", ids);
  std::printf("dataset: %.1f M tokens (%.0f MiB packed with the loss mask)\n", static_cast<double>(ids.size()) / 1e6,
              static_cast<double>(ids.size()) * 5 / (1 << 20));
  auto rss_mib = [&] { return static_cast<double>(rp::testing::ProcStatusField(daemon.pid(), "VmRSS:")) / 1024; };
  std::printf("%-16s %5s %10s %10s\n", "kind", "job", "RSS MiB", "+MiB");
  const int jobs = absl::GetFlag(FLAGS_jobs);
  for (const char* kind : {"jsonl", "token_dataset"}) {
    std::vector<double> rss;
    for (int j = 0; j < jobs; ++j) {
      v1::JobSpec spec = rp::testing::TinyJobSpec();
      spec.set_max_steps(1);
      auto* tf = spec.mutable_data()->mutable_token_file();
      tf->set_path(dir + (std::strcmp(kind, "jsonl") == 0 ? "/train.jsonl" : "/train.safetensors"));
      if (std::strcmp(kind, "jsonl") == 0) tf->set_tokenizer_dir(dir);
      auto job = c->Submit(spec);
      if (!job.ok()) {
        std::fprintf(stderr, "submit: %s\n", job.status().ToString().c_str());
        return 1;
      }
      for (;;) {
        auto rec = c->Get(job->id());
        if (!rec.ok()) return 1;
        if (rec->state() == v1::JOB_STATE_SUCCEEDED) break;
        if (rec->state() == v1::JOB_STATE_FAILED) {
          std::fprintf(stderr, "job failed: %s\n", rec->error().c_str());
          return 1;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      rss.push_back(rss_mib());
      std::printf("%-16s %5d %10.1f %10.1f\n", kind, j + 1, rss.back(), j == 0 ? 0.0 : rss[j] - rss[j - 1]);
      std::fflush(stdout);
    }
    const int half = jobs / 2;
    std::printf("%-16s RSS per ended job over jobs %d-%d: %+.2f MiB\n", kind, half + 1, jobs,
                (rss.back() - rss[static_cast<size_t>(half) - 1]) / std::max(jobs - half, 1));
  }
  daemon.Stop(15);
  std::filesystem::remove_all(root);
  return 0;
}
