// gpu_bench — the CUDA backend on one GPU (issue: Qwen3-1.7B-shaped model, random weights,
// full fine-tuning, bf16 masters, sequence 2048). A benchmark, not a test: prints a table.
// Measured in one run, side by side:
//   * a large bf16 GEMM's TFLOP/s (the card's practical peak, our denominator);
//   * the engine: tokens/s, hardware FLOP utilisation counting the recompute (as a share of
//     that GEMM peak), bubble ratio, the share of wall time each copy stream is busy, peak
//     GPU memory;
//   * the same partition with weights kept resident on the GPU (DeviceOptions::
//     keep_weights_resident: no weight uploads) — the ratio is what transfers cost;
//   * optionally the longest sequence that trains at micro-batch 1 (--max_seq list).
// On a machine without a GPU it runs the same code on the CPU backend with --model=qwen3-tiny (a
// check of the bench itself; the numbers then mean nothing).
//   build/tests/bench/gpu_bench --devices=cuda:0 --iterations=4 --json=$OUT/bench.json
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "scheduler/engine.h"
#include "scheduler/planning/presets.h"
#include "scheduler/runtime/controller.h"
#include "scheduler/runtime/engine_impl.h"
#include "scheduler/runtime/model_adapter.h"
#include "workers/device/device.h"
#include "workers/models/layers.h"

ABSL_FLAG(std::string, devices, "cuda:0", "device spec (cuda:0, cuda:0,0, cpu:1 ...)");
ABSL_FLAG(std::string, model, "qwen3-1.7b", "model preset (workers/models/presets.h), e.g. qwen3-1.7b or qwen3-tiny");
ABSL_FLAG(int64_t, seq, 2048, "sequence length");
ABSL_FLAG(int64_t, sequences_per_microbatch, 1, "sequences per micro-batch");
ABSL_FLAG(int, microbatches, 16, "micro-batches per iteration (M)");
ABSL_FLAG(int, warmup, 3, "iterations not measured (includes the 2 profiling iterations)");
ABSL_FLAG(int, iterations, 4, "measured iterations");
ABSL_FLAG(std::string, mode, "async", "optimizer mode: async or sync");
ABSL_FLAG(bool, resident, true, "also run with weights kept resident (transfer overlap)");
ABSL_FLAG(std::string, max_seq, "", "comma-separated sequence lengths to try at micro-batch 1, ascending");
ABSL_FLAG(double, max_seq_seconds, 400,
          "seconds since the program started after which no further max-sequence try may end (predicted)");
ABSL_FLAG(double, stage_memory_gib, 0,
          "per-stage GPU memory cap for the automatic partition (0 = the engine default: 90 % of the card / 2)");
ABSL_FLAG(std::string, json, "", "also write the results as JSON here");
ABSL_FLAG(int, blocks, 0,
          "decoder blocks (0 = the preset's): a model of the preset's shape, shorter (e.g. gpt-oss-20b with 4 of its "
          "24 blocks fits a host of 128 GiB)");
ABSL_FLAG(int, lora_rank, 0, "LoRA rank on q/k/v/o (0 = full fine-tuning); the base stays frozen in bf16");

namespace {

using rp::planning::Partition;
using rp::spec::ModelConfig;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

bool IsCuda(const std::string& devices) { return devices.rfind("cuda", 0) == 0; }

void Sync(bool cuda) {
  if (cuda) (void)cudaDeviceSynchronize();
}

// A large GEMM's throughput in the model's dtype: the practical peak our utilisation divides by.
double GemmTflops(bool cuda) {
  const int64_t n = cuda ? 8192 : 1024;
  const auto opts = cuda ? at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA) : at::TensorOptions();
  at::Tensor a = at::randn({n, n}, opts), b = at::randn({n, n}, opts);
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    Sync(cuda);
    const auto t0 = Clock::now();
    at::Tensor c = at::mm(a, b);
    Sync(cuda);
    if (i >= 3) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * n * n * n / Median(t) / 1e12;
}

// Hardware FLOPs of one iteration: forward, backward (2x forward; 1x with LoRA, whose frozen base
// needs no weight gradients) and the recompute of every layer outside the fused stage B_1; causal
// attention counted at half the square (a sliding block: its window); a sparse block counts its
// router and its k active experts; the LM head computed once forward and twice backward.
// (FlashAttention's own backward recompute is not counted: the figure is conservative.)
double IterationFlops(const ModelConfig& c, const Partition& p, int64_t tokens, int64_t seq) {
  const double q = static_cast<double>(c.num_heads * c.head_dim), kv = static_cast<double>(c.num_kv_heads * c.head_dim);
  const double h = static_cast<double>(c.hidden), s = static_cast<double>(seq);
  auto block_fwd = [&](int b) {
    const double mlp = c.SparseBlock(b) ? h * c.num_experts +
                                              3.0 * h * static_cast<double>(c.expert_intermediate) * c.experts_per_token
                                        : 3.0 * h * static_cast<double>(c.intermediate);
    const double ctx = c.SlidingBlock(b) ? std::min(s / 2, static_cast<double>(c.sliding_window)) : s / 2;
    return 2.0 * (h * (q + 2 * kv) + q * h + mlp) + 4.0 * ctx * q;
  };
  const double head_fwd = 2.0 * h * static_cast<double>(c.vocab);
  const int L = c.num_layers();
  const int fused_first = L - p.fused;
  const int backward = c.lora.rank > 0 ? 1 : 2;
  double per_token = 0;
  for (int l = 1; l < L; ++l) {
    const double fwd = l == L - 1 ? head_fwd : block_fwd(l - 1);
    per_token += fwd * (1 + backward + (l >= fused_first ? 0 : 1));
  }
  return per_token * static_cast<double>(tokens);
}

struct RunResult {
  bool ok = false;
  std::string error;
  Partition partition;
  double iteration_s = 0, tokens_per_s = 0, bubble = 0, optimizer_s = 0;
  std::map<std::string, double> stream_busy;  // share of the measured window
  int64_t gpu_peak = 0, pinned = 0;
  double loss_first = 0, loss_last = 0;
};

// `store` is shared by the runs (initialising 2 B parameters takes a while; the weights are random
// anyway); its masters were moved into pinned memory by the first run's devices.
RunResult Run(rp::workers::HostModelStore& store, const std::string& devices, bool resident,
              std::optional<Partition> fixed, int64_t seq, int64_t seqs_per_mb, int M, int warmup, int iterations,
              rp::planning::OptimizerMode mode) {
  RunResult r;
  rp::workers::Timeline tl;
  rp::workers::DeviceOptions dopt;
  dopt.keep_weights_resident = resident;
  auto devs = rp::workers::CreateDevices(devices, &tl, dopt);
  if (!devs.ok()) {
    r.error = std::string(devs.status().message());
    return r;
  }
  std::vector<rp::workers::Device*> raw;
  for (auto& d : *devs) raw.push_back(d.get());
  const ModelConfig& cfg = store.config();
  if (raw[0]->torch_device().is_cuda() && !store.param(0).master.is_pinned()) {
    store.RelocateMasters([d = raw[0]](at::IntArrayRef s, at::ScalarType t) { return d->EmptyHost(s, t); });
  }
  rp::scheduler::ControllerOptions o;
  o.microbatches = M;
  o.mode = mode;
  o.adamw.lr = 1e-4;
  if (fixed) {
    o.partition = *fixed;
  } else {
    o.auto_partition = true;
    o.profile_iterations = 2;
    const double gib = absl::GetFlag(FLAGS_stage_memory_gib);
    o.stage_memory_cap = gib > 0 ? static_cast<int64_t>(gib * (1 << 30)) : rp::scheduler::DefaultStageMemoryCap(raw);
  }
  auto c = rp::scheduler::Controller::Create(o, &store, raw, &tl);
  if (!c.ok()) {
    r.error = std::string(c.status().message());
    return r;
  }
  auto& ctl = **c;
  const int64_t B = seqs_per_mb * M;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  std::vector<at::Tensor> batches;
  for (int i = 0; i < 4; ++i)
    batches.push_back(at::randint(cfg.vocab, {B, seq}, gen, at::TensorOptions().dtype(at::kLong)));
  const int total = warmup + iterations;
  std::vector<int> submitted;
  std::vector<double> done_at, bubbles, opt_s;
  double window_start = 0;
  // Two iterations in flight (async): submit i, then await i - 1.
  auto await = [&](int k) {
    auto st = ctl.AwaitIteration(submitted[static_cast<size_t>(k)]);
    if (!st.ok()) {
      r.error = std::string(st.status().message());
      return false;
    }
    done_at.push_back(tl.Now());
    if (k == 0) r.loss_first = st->loss;
    r.loss_last = st->loss;
    if (k == warmup - 1) {
      window_start = tl.Now();
      for (auto* d : raw) d->ResetPeakMemory();
    }
    if (k >= warmup) {
      bubbles.push_back(st->bubble_ratio);
      opt_s.push_back(st->optimizer_seconds);
    }
    return true;
  };
  for (int i = 0; i < total; ++i) {
    auto it = ctl.SubmitIteration(batches[static_cast<size_t>(i) % batches.size()]);
    if (!it.ok()) {
      r.error = std::string(it.status().message());
      return r;
    }
    submitted.push_back(*it);
    if (i >= 1 && !await(i - 1)) return r;
  }
  if (!await(total - 1)) return r;
  if (auto f = ctl.Flush(); !f.ok()) {
    r.error = std::string(f.message());
    return r;
  }
  const double window = done_at.back() - window_start;
  r.ok = true;
  r.partition = ctl.partition();
  r.iteration_s = window / iterations;
  r.tokens_per_s = static_cast<double>(B * seq) * iterations / window;
  r.bubble = Median(bubbles);
  r.optimizer_s = Median(opt_s);
  for (const auto& e : tl.EntriesEndingSince(window_start)) {
    if (e.worker != 0 || e.start_s < window_start) continue;
    r.stream_busy[e.stream] += (e.end_s - e.start_s) / window;
  }
  const auto mem = raw[0]->Memory();
  r.gpu_peak = mem.device_peak_bytes;
  r.pinned = mem.pinned_reserved_bytes;
  return r;
}

// Micro-batch 1 at long sequences: forward stages of 4 layers, B_1 = last block + head, one
// block per backward stage (the smallest recompute working set).
Partition LongSequencePartition(const ModelConfig& cfg) {
  Partition p;
  const int L = cfg.num_layers();
  p.fused = 2;
  for (int left = L - p.fused; left > 0; left -= 4) p.forward.push_back(std::min(4, left));
  for (int l = 0; l < L - p.fused; ++l) p.backward.push_back(1);
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const auto program_start = Clock::now();
  absl::ParseCommandLine(argc, argv);
  const std::string devices = absl::GetFlag(FLAGS_devices);
  const bool cuda = IsCuda(devices);
  auto planned = rp::planning::ModelPreset(absl::GetFlag(FLAGS_model));
  if (planned.ok() && absl::GetFlag(FLAGS_blocks) > 0) {
    planned->num_blocks = absl::GetFlag(FLAGS_blocks);
    std::erase_if(planned->sliding_layers, [&](int b) { return b >= planned->num_blocks; });
  }
  if (planned.ok()) {
    planned->lora = {};
    planned->lora.rank = absl::GetFlag(FLAGS_lora_rank);
  }
  const absl::Status valid = planned.ok() ? planned->Validate() : planned.status();
  if (!valid.ok()) {
    std::fprintf(stderr, "gpu_bench: --model: %s\n", std::string(valid.message()).c_str());
    return 2;
  }
  const ModelConfig cfg = *planned;
  const int64_t seq = absl::GetFlag(FLAGS_seq);
  const int M = absl::GetFlag(FLAGS_microbatches);
  const auto mode =
      absl::GetFlag(FLAGS_mode) == "sync" ? rp::planning::OptimizerMode::kSync : rp::planning::OptimizerMode::kAsync;
  if (cuda && rp::workers::VisibleCudaDevices() == 0) {
    std::fprintf(stderr,
                 "gpu_bench: --devices=%s but no CUDA GPU is visible (try --devices=cpu:1 --model=qwen3-tiny)\n",
                 devices.c_str());
    return 2;
  }
  if (cuda) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      std::printf("GPU: %s, %.1f GiB, %d SMs\n", prop.name, prop.totalGlobalMem / double(1 << 30),
                  prop.multiProcessorCount);
    }
  }
  std::printf("model %s%s: %d blocks, hidden %ld, vocab %ld; seq %ld x %ld per micro-batch, M = %d, %s, bf16\n",
              absl::GetFlag(FLAGS_model).c_str(),
              cfg.lora.rank > 0 ? absl::StrCat(" (LoRA r=", cfg.lora.rank, " on q/k/v/o)").c_str() : "", cfg.num_blocks,
              static_cast<long>(cfg.hidden), static_cast<long>(cfg.vocab), static_cast<long>(seq),
              static_cast<long>(absl::GetFlag(FLAGS_sequences_per_microbatch)), M, absl::GetFlag(FLAGS_mode).c_str());
  std::fflush(stdout);
  if (cfg.num_experts > 0) {
    const auto on = at::TensorOptions().dtype(at::kBFloat16).device(cuda ? at::Device(at::kCUDA, 0) : at::kCPU);
    std::printf("expert products: %s\n", rp::workers::models::GroupedExpertGemmRuns(on)
                                             ? "grouped GEMMs (at::_grouped_mm, bf16)"
                                             : "one GEMM per expert (the grouped op does not run here)");
  }
  const double peak = GemmTflops(cuda);
  std::printf("bf16 GEMM %s: %.1f TFLOP/s (median of 10)\n", cuda ? "8192^3" : "1024^3 (fp32, cpu)", peak);
  std::fflush(stdout);

  const int64_t spm = absl::GetFlag(FLAGS_sequences_per_microbatch);
  const auto init_start = Clock::now();
  rp::workers::HostModelStore store(cfg, at::kBFloat16, 5);
  std::printf("host model store: %.1f s to initialise\n",
              std::chrono::duration<double>(Clock::now() - init_start).count());
  RunResult moving = Run(store, devices, false, std::nullopt, seq, spm, M, absl::GetFlag(FLAGS_warmup),
                         absl::GetFlag(FLAGS_iterations), mode);
  if (!moving.ok) {
    std::fprintf(stderr, "engine run failed: %s\n", moving.error.c_str());
    return 1;
  }
  RunResult resident;
  if (absl::GetFlag(FLAGS_resident)) {
    resident = Run(store, devices, true, moving.partition, seq, spm, M, 2, absl::GetFlag(FLAGS_iterations), mode);
    if (!resident.ok) std::fprintf(stderr, "resident run failed: %s\n", resident.error.c_str());
  }

  // The main table first (flushed), so a run cut short during the max-sequence search keeps it.
  const int64_t tokens_per_iter = spm * M * seq;
  const double flops = IterationFlops(cfg, moving.partition, tokens_per_iter, seq);
  const double achieved = flops / moving.iteration_s / 1e12;
  std::printf("\n%-44s %s\n", "partition (measured, automatic)", moving.partition.ToString().c_str());
  std::printf("%-44s %12.0f\n", "tokens/s (weights streamed from host)", moving.tokens_per_s);
  std::printf("%-44s %12.3f\n", "iteration s", moving.iteration_s);
  std::printf("%-44s %11.1f%%  (%.1f of %.1f TFLOP/s)\n", "HFU incl. recompute vs bf16 GEMM", 100 * achieved / peak,
              achieved, peak);
  std::printf("%-44s %11.1f%%\n", "bubble ratio (median)", 100 * moving.bubble);
  std::printf("%-44s %12.3f\n", "optimizer step s (median, CPU)", moving.optimizer_s);
  for (const auto& [stream, share] : moving.stream_busy) {
    std::printf("%-44s %11.1f%%\n", ("busy share, worker 0 " + stream).c_str(), 100 * share);
  }
  std::printf("%-44s %9ld MiB\n", "GPU peak allocated (card)", static_cast<long>(moving.gpu_peak >> 20));
  std::printf("%-44s %9ld MiB\n", "pinned host reserved", static_cast<long>(moving.pinned >> 20));
  if (resident.ok) {
    std::printf("%-44s %12.0f\n", "tokens/s (weights resident, same partition)", resident.tokens_per_s);
    std::printf("%-44s %12.3f\n", "transfer overlap: resident / streamed time",
                resident.iteration_s / moving.iteration_s);
  }
  std::printf("loss first/last iteration: %.4f / %.4f\n", moving.loss_first, moving.loss_last);
  std::fflush(stdout);
  int64_t max_ok = 0;
  auto write_json = [&] {
    const std::string path = absl::GetFlag(FLAGS_json);
    if (path.empty()) return;
    std::ofstream out(path);
    out << "{\"gemm_tflops\": " << peak << ", \"tokens_per_s\": " << moving.tokens_per_s
        << ", \"iteration_s\": " << moving.iteration_s << ", \"hfu\": " << achieved / peak
        << ", \"bubble\": " << moving.bubble << ", \"resident_tokens_per_s\": " << resident.tokens_per_s
        << ", \"partition\": \"" << moving.partition.ToString() << "\", \"max_seq_ok\": " << max_ok
        << ", \"gpu_peak_bytes\": " << moving.gpu_peak << "}\n";
  };
  write_json();

  // Max sequence length at micro-batch 1: lengths in ascending order; a length is not started
  // when the previous try's time, scaled by (length ratio)^1.5, would pass the deadline
  // (--max_seq_seconds from the start of the program).
  const double deadline = absl::GetFlag(FLAGS_max_seq_seconds);
  int64_t prev_len = 0;
  double prev_secs = 0;
  bool any = false;
  for (absl::string_view sv : absl::StrSplit(absl::GetFlag(FLAGS_max_seq), ',', absl::SkipEmpty())) {
    int64_t len = 0;
    if (!absl::SimpleAtoi(sv, &len)) continue;
    any = true;
    const double now = std::chrono::duration<double>(Clock::now() - program_start).count();
    const double predicted = prev_len > 0 ? prev_secs * std::pow(static_cast<double>(len) / prev_len, 1.5) : 0;
    if (now + predicted > deadline) {
      std::printf("max seq try %-32ld not tried (predicted %.0f s, %.0f s left)\n", static_cast<long>(len), predicted,
                  deadline - now);
      std::fflush(stdout);
      break;
    }
    const auto t0 = Clock::now();
    RunResult r =
        Run(store, devices, false, LongSequencePartition(cfg), len, 1, 1, 0, 1, rp::planning::OptimizerMode::kSync);
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r.ok) {
      max_ok = std::max(max_ok, len);
      std::printf("max seq try %-32ld ok: %ld tokens/s, GPU peak %ld MiB, %.0f s\n", static_cast<long>(len),
                  static_cast<long>(r.tokens_per_s), static_cast<long>(r.gpu_peak >> 20), secs);
      prev_len = len;
      prev_secs = secs;
      write_json();
    } else {
      std::printf("max seq try %-32ld failed: %s\n", static_cast<long>(len), r.error.substr(0, 200).c_str());
      std::fflush(stdout);
      break;
    }
    std::fflush(stdout);
  }
  if (any) std::printf("%-44s %12ld\n", "longest sequence trained (micro-batch 1)", static_cast<long>(max_ok));
  return 0;
}
