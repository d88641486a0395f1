// checkpoint_bench — how long a training checkpoint stalls a running async job (CPU backend).
// A job trains continuously; after a warm-up one Checkpoint() is requested. Prints the median
// gap between consecutive iteration completions, the gap across the checkpoint (stall = that gap
// minus the median), the Checkpoint() call latency and the bytes written. With --lora_rank the
// job is a LoRA job: its checkpoint holds the adapters alone (plus base.json), and the table
// compares it with the whole model in fp32, which format 1 wrote.
//
//   build/tests/bench/checkpoint_bench [--hidden 256] [--blocks 8] [--vocab 4096] [--lora_rank 0]
#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "scheduler/engine.h"
#include "tests/support/engine_values.h"

ABSL_FLAG(int, hidden, 256, "model width");
ABSL_FLAG(int, blocks, 8, "decoder blocks");
ABSL_FLAG(int, vocab, 4096, "vocabulary");
ABSL_FLAG(int, lora_rank, 0, "LoRA rank (0: full fine-tuning)");

using namespace std::chrono_literals;
using rp::scheduler::JobEvent;

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string root = std::filesystem::temp_directory_path() / ("rp_ckpt_bench_" + std::to_string(getpid()));
  rp::scheduler::JobSpec spec;
  auto& m = spec.model;
  m.family = "llama";
  m.vocab = absl::GetFlag(FLAGS_vocab);
  m.hidden = absl::GetFlag(FLAGS_hidden);
  m.intermediate = m.hidden * 8 / 3;
  m.num_blocks = absl::GetFlag(FLAGS_blocks);
  m.num_heads = 4;
  m.num_kv_heads = 2;
  m.head_dim = m.hidden / 4;
  m.lora.rank = absl::GetFlag(FLAGS_lora_rank);
  m.lora.targets = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  spec.precision = rp::scheduler::Precision::kBFloat16;
  spec.optimizer_mode = rp::planning::OptimizerMode::kAsync;
  spec.checkpoint_root = root;
  spec.max_queued_batches = 4;
  auto engine = rp::scheduler::Engine::Create({"cpu:2"});
  auto id = (*engine)->Submit(spec);
  if (!id.ok()) {
    std::fprintf(stderr, "%s\n", id.status().ToString().c_str());
    return 1;
  }
  const int total = 24, checkpoint_after = 12;
  std::thread feeder([&] {
    for (int i = 0; i < total; ++i) {
      at::Tensor t = at::randint(m.vocab, {4, 64}, at::TensorOptions().dtype(at::kLong));
      (void)(*engine)->FeedBatch(*id, rp::testing::ToBatch(t), 10min);
    }
    (void)(*engine)->CloseInput(*id);
  });
  std::vector<std::chrono::system_clock::time_point> done;
  double call_s = 0;
  int64_t ckpt_step = -1;
  while (static_cast<int>(done.size()) < total) {
    auto ev = (*engine)->AwaitEvents(*id, 100ms);
    for (const auto& e : *ev) {
      if (e.kind == JobEvent::Kind::kIteration) done.push_back(e.time);
    }
    if (static_cast<int>(done.size()) >= checkpoint_after && ckpt_step < 0) {
      const auto t0 = std::chrono::steady_clock::now();
      auto info = (*engine)->Checkpoint(*id, "bench");
      call_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ckpt_step = info.ok() ? info->step : -2;
    }
  }
  feeder.join();
  // The job writes its final checkpoint after its last iteration: let it end before measuring.
  for (int i = 0; i < 600; ++i) {
    auto st = (*engine)->State(*id);
    if (!st.ok() || rp::scheduler::IsTerminal(*st)) break;
    (void)(*engine)->AwaitEvents(*id, 100ms);
  }
  std::vector<double> gaps;
  for (size_t i = 1; i < done.size(); ++i) gaps.push_back(std::chrono::duration<double>(done[i] - done[i - 1]).count());
  std::vector<double> sorted = gaps;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  // done[k-1] is step k; the completion right after the checkpoint's step carries the stall.
  double across = 0;
  if (ckpt_step > 0 && static_cast<size_t>(ckpt_step) <= gaps.size()) across = gaps[static_cast<size_t>(ckpt_step) - 1];
  // The requested checkpoint's files (the job's final checkpoint lies beside it).
  const std::string dir = root + "/step-" + std::to_string(ckpt_step);
  auto size_of = [&](const char* f) {
    std::error_code ec;
    const auto n = std::filesystem::file_size(dir + "/" + f, ec);
    return ec ? int64_t{0} : static_cast<int64_t>(n);
  };
  const int64_t bytes =
      size_of("weights.safetensors") + size_of("optimizer.safetensors") + size_of("base.json") + size_of("meta.json");
  int64_t params = 0;
  auto shapes = (*engine)->ParameterShapes(*id);
  for (const auto& [n, s] : *shapes) {
    int64_t k = 1;
    for (int64_t d : s) k *= d;
    params += k;
  }
  std::printf("checkpoint_bench: async job, %lld parameters (bf16 master), LoRA rank %d, cpu:2, batches 4 x 64\n",
              static_cast<long long>(params), m.lora.rank);
  std::printf("| metric | value |\n|---|---|\n");
  std::printf("| median iteration gap (s) | %.3f |\n", median);
  std::printf("| gap across the checkpoint at step %lld (s) | %.3f |\n", static_cast<long long>(ckpt_step), across);
  std::printf("| stall (gap - median) (s) | %.3f |\n", across - median);
  std::printf("| Checkpoint() call latency (s) | %.3f |\n", call_s);
  const double mib = 1 << 20;
  std::printf("| bytes written (MiB) | %.2f |\n", static_cast<double>(bytes) / mib);
  std::printf("| of which weights / optimizer / base.json (MiB) | %.2f / %.2f / %.3f |\n",
              static_cast<double>(size_of("weights.safetensors")) / mib,
              static_cast<double>(size_of("optimizer.safetensors")) / mib,
              static_cast<double>(size_of("base.json")) / mib);
  if (m.lora.rank > 0) {  // format 1 wrote every parameter in fp32 beside the same optimizer file
    const int64_t v1 = params * 4 + size_of("optimizer.safetensors");
    std::printf("| format 1 (whole model in fp32) would have written (MiB) | %.2f (%.0fx) |\n",
                static_cast<double>(v1) / mib, static_cast<double>(v1) / static_cast<double>(bytes));
  }
  std::filesystem::remove_all(root);
  return 0;
}
