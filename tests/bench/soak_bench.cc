// soak_bench — one real roundpiped (CPU backend) under churn: --cycles submit/cancel cycles of
// the tiny streamed job (each one streams a batch first, so it really runs), --complete short
// jobs run to completion, and --watchers clients that keep opening and dropping WatchJob streams
// on recent jobs the whole time. Prints the daemon's RSS and thread count when warm and after
// each phase: a daemon that keeps per-job state after a job ends grows here.
//
//   build/tests/bench/soak_bench [--cycles 1000] [--complete 200] [--watchers 64]
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/tiny_spec.h"

ABSL_FLAG(int, cycles, 1000, "submit/cancel cycles");
ABSL_FLAG(int, complete, 200, "short jobs run to completion");
ABSL_FLAG(int, watchers, 64, "clients churning WatchJob streams meanwhile");

namespace v1 = roundpipe::v1;

namespace {

v1::Batch OneBatch(const std::string& job, bool keep_open, uint32_t seed) {
  v1::Batch b;
  b.set_job_id(job);
  b.set_keep_open(keep_open);
  b.set_batch(4);
  b.set_sequence(16);
  std::mt19937 gen(seed);
  for (int t = 0; t < 64; ++t) b.add_tokens(static_cast<int32_t>(gen() % 256));
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  rp::testing::DaemonProcess daemon;
  const std::string root = rp::testing::StartBenchDaemon("rp_soak", &daemon);
  if (root.empty()) return 1;
  auto c = daemon.Connect();
  const v1::JobSpec spec = rp::testing::TinyJobSpec();
  std::mutex ids_mu;
  std::vector<std::string> ids;
  auto cycle = [&](bool complete, uint32_t seed) -> bool {
    auto job = c->Submit(spec);
    if (!job.ok()) {
      std::fprintf(stderr, "submit: %s\n", job.status().ToString().c_str());
      return false;
    }
    {
      std::lock_guard<std::mutex> lock(ids_mu);
      ids.push_back(job->id());
    }
    if (!c->StreamBatches(job->id(), {OneBatch(job->id(), /*keep_open=*/!complete, seed)}).ok()) return false;
    if (!complete) return c->Cancel(job->id()).ok();
    for (;;) {  // until it ends
      auto j = c->Get(job->id());
      if (!j.ok()) return false;
      if (j->state() == v1::JOB_STATE_SUCCEEDED) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  };
  std::printf("%-28s %10s %8s\n", "phase", "RSS MiB", "threads");
  auto row = [&](const char* phase) {
    std::printf("%-28s %10.1f %8lld\n", phase,
                static_cast<double>(rp::testing::ProcStatusField(daemon.pid(), "VmRSS:")) / 1024,
                static_cast<long long>(rp::testing::ProcStatusField(daemon.pid(), "Threads:")));
    std::fflush(stdout);
  };
  row("started");
  for (int i = 0; i < 20; ++i) {
    if (!cycle(i % 2 == 0, static_cast<uint32_t>(i))) return 1;
  }
  row("warm (20 jobs)");

  std::atomic<bool> stop{false};
  std::atomic<int64_t> watches{0};
  std::vector<std::thread> watchers;
  for (int w = 0; w < absl::GetFlag(FLAGS_watchers); ++w) {
    watchers.emplace_back([&, w] {
      auto stub = v1::JobService::NewStub(grpc::CreateChannel(daemon.address(), grpc::InsecureChannelCredentials()));
      std::mt19937 gen(static_cast<uint32_t>(w));
      while (!stop.load()) {
        std::string id;
        {
          std::lock_guard<std::mutex> lock(ids_mu);
          id = ids[ids.size() - 1 - gen() % std::min<size_t>(ids.size(), 8)];
        }
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(50 + gen() % 200));
        v1::WatchJobRequest req;
        req.set_job_id(id);
        auto reader = stub->WatchJob(&ctx, req);
        v1::JobEvent e;
        while (reader->Read(&e)) {
        }
        (void)reader->Finish();
        ++watches;
      }
    });
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int cycles = absl::GetFlag(FLAGS_cycles);
  for (int i = 0; i < cycles; ++i) {
    if (!cycle(false, static_cast<uint32_t>(1000 + i))) return 1;
    if ((i + 1) % 250 == 0) {
      const std::string label = std::to_string(i + 1) + " submit/cancel";
      row(label.c_str());
    }
  }
  const double cancel_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int complete = absl::GetFlag(FLAGS_complete);
  for (int i = 0; i < complete; ++i) {
    if (!cycle(true, static_cast<uint32_t>(5000 + i))) return 1;
  }
  const std::string label = std::to_string(complete) + " jobs to completion";
  row(label.c_str());
  stop = true;
  for (auto& t : watchers) t.join();
  row("watchers gone");
  std::printf("%d submit/cancel cycles in %.1f s (%.1f ms each), %lld watch streams opened and dropped\n", cycles,
              cancel_s, 1000 * cancel_s / std::max(cycles, 1), static_cast<long long>(watches.load()));
  daemon.Stop(15);
  std::filesystem::remove_all(root);
  return 0;
}
