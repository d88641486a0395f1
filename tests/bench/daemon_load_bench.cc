// daemon_load_bench — many concurrent clients streaming batches into the real roundpiped (CPU
// backend) for a while. Prints accepted batches/s, the p50/p99 latency of a StreamBatches write
// (backpressure included) and of a unary GetJob issued alongside, and the daemon's RSS before and
// after (it must not grow with the number of batches).
//
//   build/tests/bench/daemon_load_bench [--clients 32] [--seconds 60]
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/daemon_process.h"
#include "tests/support/tiny_spec.h"

ABSL_FLAG(int, clients, 32, "concurrent streaming clients");
ABSL_FLAG(int, seconds, 60, "how long they stream");

namespace v1 = roundpipe::v1;
using Clock = std::chrono::steady_clock;

namespace {

int64_t RssKiB(pid_t pid) { return rp::testing::ProcStatusField(pid, "VmRSS:"); }

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int clients = absl::GetFlag(FLAGS_clients), seconds = absl::GetFlag(FLAGS_seconds);
  rp::testing::DaemonProcess daemon;
  const std::string root = rp::testing::StartBenchDaemon("rp_load", &daemon);
  if (root.empty()) return 1;
  auto c = daemon.Connect();
  v1::JobSpec spec = rp::testing::TinyJobSpec();
  spec.set_name("load");
  spec.mutable_optimizer()->set_mode(v1::OPTIMIZER_MODE_ASYNC);
  spec.mutable_batching()->set_global_batch(2);
  spec.mutable_batching()->set_sequence_length(32);
  auto job = c->Submit(spec);
  if (!job.ok()) {
    std::fprintf(stderr, "submit: %s\n", job.status().ToString().c_str());
    return 1;
  }
  const int64_t rss_before = RssKiB(daemon.pid());

  std::atomic<bool> stop{false};
  std::atomic<int64_t> accepted{0};
  std::vector<std::vector<double>> write_ms(static_cast<size_t>(clients));
  std::vector<double> unary_ms;
  std::vector<std::thread> threads;
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(static_cast<size_t>(clients));
  for (auto& ctx : contexts) ctx = std::make_unique<grpc::ClientContext>();
  const auto until = Clock::now() + std::chrono::seconds(seconds);
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      auto stub = v1::JobService::NewStub(grpc::CreateChannel(daemon.address(), grpc::InsecureChannelCredentials()));
      grpc::ClientContext& ctx = *contexts[static_cast<size_t>(i)];
      v1::StreamSummary summary;
      auto writer = stub->StreamBatches(&ctx, &summary);
      std::mt19937 gen(static_cast<uint32_t>(i));
      for (int64_t n = 0; Clock::now() < until; ++n) {
        v1::Batch b;
        if (n == 0) {
          b.set_job_id(job->id());
          b.set_keep_open(true);
        }
        b.set_batch(2);
        b.set_sequence(32);
        for (int t = 0; t < 64; ++t) b.add_tokens(static_cast<int32_t>(gen() % 256));
        const auto t0 = Clock::now();
        if (!writer->Write(b)) break;
        write_ms[static_cast<size_t>(i)].push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      // Whatever gRPC still buffers is abandoned: the clients disconnect (the daemon must cope).
      ctx.TryCancel();
      (void)writer->Finish();
    });
  }
  std::vector<int64_t> rss_samples;  // every ~5 s: growth shows as a trend, warm-up does not
  std::thread prober([&] {           // unary latency while the streams run
    auto next_rss = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < until) {
      if (Clock::now() >= next_rss) {
        rss_samples.push_back(RssKiB(daemon.pid()));
        next_rss += std::chrono::seconds(5);
      }
      const auto t0 = Clock::now();
      (void)c->Get(job->id());
      unary_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  // Disconnect every client at the deadline (a blocked Write returns once its call is cancelled).
  std::this_thread::sleep_until(until);
  for (auto& ctx : contexts) ctx->TryCancel();
  for (auto& t : threads) t.join();
  prober.join();
  stop = true;
  auto mid = c->Get(job->id());
  accepted = mid.ok() ? mid->progress().step() : -1;  // every accepted batch is one trained step
  const int64_t rss_after = RssKiB(daemon.pid());
  std::vector<double> all;
  for (auto& v : write_ms) all.insert(all.end(), v.begin(), v.end());
  auto got = c->Get(job->id());
  (void)c->Cancel(job->id());

  std::printf("daemon_load_bench: %d clients streaming for %d s into one job (CPU backend, cpu:2)\n", clients, seconds);
  std::printf("| metric | value |\n|---|---|\n");
  std::printf("| batches trained in the window | %lld |\n", static_cast<long long>(accepted.load()));
  std::printf("| accepted batches/s | %.1f |\n", static_cast<double>(accepted.load()) / seconds);
  std::printf("| writes completed by clients | %zu |\n", all.size());
  std::printf("| job state after the clients left | %s |\n", got.ok() ? v1::JobState_Name(got->state()).c_str() : "?");
  std::printf("| stream write latency p50 / p99 (ms) | %.2f / %.2f |\n", Percentile(all, 0.5), Percentile(all, 0.99));
  std::printf("| GetJob latency p50 / p99 (ms) | %.2f / %.2f |\n", Percentile(unary_ms, 0.5),
              Percentile(unary_ms, 0.99));
  std::printf("| daemon RSS before / after (MiB) | %.1f / %.1f |\n", static_cast<double>(rss_before) / 1024,
              static_cast<double>(rss_after) / 1024);
  std::printf("| daemon RSS every 5 s under load (MiB) |");
  for (int64_t r : rss_samples) std::printf(" %.0f", static_cast<double>(r) / 1024);
  std::printf(" |\n");
  daemon.Stop();
  std::filesystem::remove_all(root);
  return 0;
}
