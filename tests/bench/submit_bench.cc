// submit_bench — SubmitJob latency and the daemon's RSS for a large job queued behind a running
// one (the real roundpiped, CPU backend): a Qwen3-1.7B LoRA job (the preset, rank 8, bf16 base)
// submitted --repeats times and cancelled while queued. Submit used to allocate, initialise and
// load the whole host model store on the RPC path; now it validates and returns.
//
//   build/tests/bench/submit_bench [--repeats 3] [--preset qwen3-1.7b]
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/tiny_spec.h"

ABSL_FLAG(int, repeats, 3, "submissions of the large job");
ABSL_FLAG(std::string, preset, "qwen3-1.7b", "model preset of the large job (LoRA rank 8 on it)");

namespace v1 = roundpipe::v1;

namespace {
double RssMiB(pid_t pid) { return static_cast<double>(rp::testing::ProcStatusField(pid, "VmRSS:")) / 1024; }
}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  rp::testing::DaemonProcess daemon;
  const std::string root = rp::testing::StartBenchDaemon("rp_submit", &daemon);
  if (root.empty()) return 1;
  auto c = daemon.Connect();
  auto running = c->Submit(rp::testing::TinyJobSpec());  // holds the workers: the big job queues
  if (!running.ok()) return 1;
  v1::Batch b;
  b.set_job_id(running->id());
  b.set_keep_open(true);
  b.set_batch(4);
  b.set_sequence(16);
  for (int t = 0; t < 64; ++t) b.add_tokens(t);
  if (!c->StreamBatches(running->id(), {b}).ok()) return 1;
  v1::JobSpec big;
  big.set_name("big");
  big.mutable_model()->set_preset(absl::GetFlag(FLAGS_preset));
  big.mutable_model()->mutable_lora()->set_rank(8);
  big.set_precision(v1::PRECISION_BF16);
  big.mutable_batching()->set_global_batch(2);
  big.mutable_batching()->set_sequence_length(256);
  std::printf("%-8s %14s %12s %12s\n", "submit", "latency ms", "RSS before", "RSS after");
  for (int i = 0; i < absl::GetFlag(FLAGS_repeats); ++i) {
    const double before = RssMiB(daemon.pid());
    const auto t0 = std::chrono::steady_clock::now();
    auto job = c->Submit(big);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double after = RssMiB(daemon.pid());
    if (!job.ok()) {
      std::fprintf(stderr, "submit: %s\n", job.status().ToString().c_str());
      return 1;
    }
    std::printf("%-8d %14.1f %10.0f MiB %8.0f MiB\n", i + 1, ms, before, after);
    std::fflush(stdout);
    (void)c->Cancel(job->id());
  }
  daemon.Stop(9);
  std::filesystem::remove_all(root);
  return 0;
}
