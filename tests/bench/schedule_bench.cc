// schedule_bench — two measurements on the CPU backend (a benchmark, not a test; prints tables):
//  (b) async vs sync iteration time with a deliberately slow optimizer (a sleep added to every
//      step), iterations pipelined the way a trainer does (submit k+1, then await k);
//  (c) the automatic partition for a skewed model (a heavy LM head) against a uniform partition
//      (equal layer counts per slot): predicted bubble (planner, measured layer times) and
//      measured bubble (timeline), side by side;
//  (d) recompute ahead of the gradient on and off (ControllerOptions::recompute_ahead), the same
//      skewed model and partition, sync and async: iteration time and measured bubble, the ratio
//      of the two in one run.
//   build/tests/bench/schedule_bench [iterations]
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "scheduler/planning/partition.h"
#include "scheduler/runtime/controller.h"
#include "workers/device/test_hooks.h"

namespace {

using rp::planning::OptimizerMode;
using rp::planning::Partition;
using rp::scheduler::Controller;
using rp::scheduler::ControllerOptions;
using rp::spec::ModelConfig;

rp::spec::ModelConfig Model(int64_t vocab) {
  rp::spec::ModelConfig c;
  c.vocab = vocab;
  c.hidden = 128;
  c.intermediate = 344;
  c.num_blocks = 6;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
  return c;
}

struct Run {
  double seconds_per_iteration = 0;
  double bubble = 0;
  double predicted = 0;
  std::string partition;
  std::optional<rp::planning::CostModel> measured;
};

Run Train(const rp::spec::ModelConfig& cfg, ControllerOptions o, int iterations, int workers) {
  rp::workers::Timeline tl;
  auto devs = *rp::workers::CreateDevices("cpu:" + std::to_string(workers), &tl);
  std::vector<rp::workers::Device*> raw;
  for (auto& d : devs) raw.push_back(d.get());
  rp::workers::HostModelStore store(cfg, at::kFloat, 1);
  auto c = Controller::Create(o, &store, raw, &tl);
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", std::string(c.status().message()).c_str());
    std::exit(1);
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int warmup = o.auto_partition ? o.profile_iterations + 2 : 2;
  Run r;
  std::vector<double> bubbles;
  std::chrono::steady_clock::time_point t0;
  int pending = -1;
  for (int k = 0; k < warmup + iterations; ++k) {
    if (k == warmup) t0 = std::chrono::steady_clock::now();
    at::Tensor t = at::randint(cfg.vocab, {8, 64}, gen, at::TensorOptions().dtype(at::kLong));
    auto it = (*c)->SubmitIteration(t);
    if (!it.ok()) std::abort();
    if (pending >= 0) {
      auto st = (*c)->AwaitIteration(pending);
      if (!st.ok()) std::abort();
      if (k > warmup) bubbles.push_back(st->bubble_ratio);
      r.partition = st->partition;
      r.predicted = st->predicted_bubble;
    }
    pending = *it;
  }
  auto st = (*c)->AwaitIteration(pending);
  if (!st.ok()) std::abort();
  bubbles.push_back(st->bubble_ratio);
  r.seconds_per_iteration = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iterations;
  std::sort(bubbles.begin(), bubbles.end());
  r.bubble = bubbles[bubbles.size() / 2];
  (void)(*c)->Flush();
  r.measured = (*c)->measured_costs();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 6;

  // (b) async vs sync with a slow optimizer.
  {
    const rp::spec::ModelConfig cfg = Model(2048);
    ControllerOptions o;
    o.partition = Partition{{3, 3}, 2, {2, 2, 2}};
    o.microbatches = 4;
    std::printf("(b) slow optimizer: %d blocks, hidden %lld, vocab %lld; batch 8 x 64; cpu:2; M=4; %s\n",
                cfg.num_blocks, static_cast<long long>(cfg.hidden), static_cast<long long>(cfg.vocab),
                o.partition.ToString().c_str());
    std::printf("%-16s %-10s %14s\n", "optimizer delay", "mode", "s / iteration");
    for (int delay_ms : {0, 150}) {
      const rp::workers::OpDelayHook hook = [delay_ms] {
        std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      };
      rp::workers::SetOptimizerDelayHook(delay_ms > 0 ? &hook : nullptr);
      for (OptimizerMode mode : {OptimizerMode::kSync, OptimizerMode::kAsync}) {
        o.mode = mode;
        Run r = Train(cfg, o, iterations, 2);
        std::printf("%13d ms %-10s %14.3f\n", delay_ms, rp::planning::OptimizerModeName(mode), r.seconds_per_iteration);
      }
      rp::workers::SetOptimizerDelayHook(nullptr);
    }
  }

  // (c) automatic vs uniform partition on a skewed model (sync mode: one iteration's bubble is
  // well defined; the planner's prediction models the same thing).
  {
    const rp::spec::ModelConfig cfg = Model(32000);  // the head dominates
    const int L = cfg.num_layers();
    ControllerOptions base;
    base.microbatches = 4;
    std::printf("\n(c) skewed model: %d layers, vocab %lld (heavy head); cpu:2; M=4; sync\n", L,
                static_cast<long long>(cfg.vocab));
    ControllerOptions au = base;
    au.auto_partition = true;
    au.partition_by_simulation = false;  // the paper's objective alone
    Run a = Train(cfg, au, iterations, 2);
    au.partition_by_simulation = true;  // the objective's best candidates, ranked by simulation
    Run as = Train(cfg, au, iterations, 2);
    ControllerOptions uni = base;
    uni.partition = Partition{{2, 2, 2}, 2, {2, 2, 2}};  // equal layer counts, head ignored
    Run u = Train(cfg, uni, iterations, 2);
    if (a.measured) {
      auto pu = rp::planning::EvaluatePartition({&*a.measured, 2, 4, 0}, uni.partition);
      if (pu.ok()) {
        u.predicted = pu->predicted_bubble;
      } else {
        std::fprintf(stderr, "uniform partition: %s\n", std::string(pu.status().message()).c_str());
      }
      std::printf("measured layer times (ms): embedding fwd %.2f, block fwd %.2f bwd %.2f, head fused %.2f\n",
                  a.measured->layers[0].fwd_s * 1e3, a.measured->layers[1].fwd_s * 1e3,
                  a.measured->layers[1].bwd_s * 1e3, a.measured->layers.back().fused_s * 1e3);
    }
    std::printf("%-10s %-34s %14s %18s %16s\n", "partition", "", "s / iteration", "predicted bubble",
                "measured bubble");
    for (const auto& [name, r] : {std::pair<const char*, Run&>{"uniform", u}, {"paper obj.", a}, {"simulated", as}}) {
      std::printf("%-10s %-34s %14.3f %17.1f%% %15.1f%%\n", name, r.partition.c_str(), r.seconds_per_iteration,
                  100 * r.predicted, 100 * r.bubble);
    }
  }

  // (d) recompute ahead of the gradient, on and off, interleaved runs (the machine is noisy).
  {
    const rp::spec::ModelConfig cfg = Model(32000);
    ControllerOptions o;
    o.partition = Partition{{2, 2, 2}, 2, {2, 2, 2}};
    o.microbatches = 4;
    std::printf("\n(d) recompute ahead: skewed model (vocab %lld); cpu:3; M=4; %s\n", static_cast<long long>(cfg.vocab),
                o.partition.ToString().c_str());
    std::printf("%-6s %-8s %16s %16s %14s %14s %10s\n", "mode", "", "s/it (ahead)", "s/it (after)", "bubble ahead",
                "bubble after", "speed-up");
    for (OptimizerMode mode : {OptimizerMode::kSync, OptimizerMode::kAsync}) {
      o.mode = mode;
      Run on, off;
      for (int rep = 0; rep < 2; ++rep) {  // alternate, keep the faster of each
        o.recompute_ahead = true;
        Run a = Train(cfg, o, iterations, 3);
        o.recompute_ahead = false;
        Run b = Train(cfg, o, iterations, 3);
        if (rep == 0 || a.seconds_per_iteration < on.seconds_per_iteration) on = a;
        if (rep == 0 || b.seconds_per_iteration < off.seconds_per_iteration) off = b;
      }
      std::printf("%-6s %-8s %16.3f %16.3f %13.1f%% %13.1f%% %9.2fx\n", rp::planning::OptimizerModeName(mode), "",
                  on.seconds_per_iteration, off.seconds_per_iteration, 100 * on.bubble, 100 * off.bubble,
                  off.seconds_per_iteration / on.seconds_per_iteration);
    }
  }
  return 0;
}
