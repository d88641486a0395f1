// store_bench — the host model store of a full fine-tuning job with its optimizer state kept per
// parameter (each moment its own allocation, made at the first step) against the layer slab
// (host_model_store.h: fp32 copy, gradient and the reserved moments of a layer in one
// allocation). Both variants alternate round by round in one run; medians. A benchmark (a
// printed table), not a test.
//
//   build/tests/bench/store_bench [rounds=5] [blocks=8] [threads=2]
//
// The model: hidden 1024, intermediate 2816, 8 query / 4 KV heads of 128, vocab 8192 (about
// 12 M parameters per block), bf16 masters, AdamW. Rows per variant:
//   build       the store constructed and initialised (random weights)
//   first step  AdamW's first step over every parameter (moments allocated or carved, zeroed)
//   step        a later step (median over the steps of all rounds)
//   MiB         the store's bytes and the optimizer state's (HostBytes + StateBytes; a slab's
//               alignment padding included)
// and the number of host allocations holding fp32 copies, gradients and moments.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "workers/optim/adamw.h"
#include "workers/store/host_model_store.h"

namespace {

using rp::workers::AdamW;
using rp::workers::AdamWOptions;
using rp::workers::HostModelStore;
using rp::workers::StateReserve;

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Variant {
  const char* name;
  bool slab_state;
  std::vector<double> build, first, step, rss;  // rss: MiB held
  int64_t allocations = 0;
};

void RunOnce(const rp::spec::ModelConfig& cfg, const AdamWOptions& o, int steps, Variant& v) {
  auto t0 = std::chrono::steady_clock::now();
  auto store = std::make_unique<HostModelStore>(cfg, at::kBFloat16, 1, 0.02, rp::workers::FrozenInit::kRandom,
                                                v.slab_state ? rp::workers::StateBytesPerElement(o) : StateReserve{});
  v.build.push_back(Seconds(t0));
  for (int i = 0; i < store->num_params(); ++i) store->param(i).grad.fill_(1e-3f * static_cast<float>(i % 7 + 1));
  AdamW adamw(o);
  t0 = std::chrono::steady_clock::now();
  adamw.StepAll(*store, o.lr, 1.0);
  v.first.push_back(Seconds(t0));
  for (int s = 0; s < steps; ++s) {
    t0 = std::chrono::steady_clock::now();
    adamw.StepAll(*store, o.lr, 1.0);
    v.step.push_back(Seconds(t0));
  }
  int64_t bytes = store->HostBytes() + adamw.StateBytes();
  if (v.slab_state)
    bytes += store->SlabBytes() - [&] {  // the padding: slabs minus what they hold
      int64_t held = 0;
      for (int i = 0; i < store->num_params(); ++i) held += 8 * store->param(i).fp32.numel();
      return held + adamw.StateBytes();
    }();
  v.rss.push_back(static_cast<double>(bytes) / (1 << 20));
  // fp32 copies and gradients, then moments: in the slabs, or two per parameter apart from them.
  v.allocations = v.slab_state ? store->num_slabs() : store->num_slabs() + 2 * store->num_params();
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 5;
  rp::spec::ModelConfig cfg;
  cfg.vocab = 8192;
  cfg.hidden = 1024;
  cfg.intermediate = 2816;
  cfg.num_blocks = argc > 2 ? std::atoi(argv[2]) : 8;
  cfg.num_heads = 8;
  cfg.num_kv_heads = 4;
  cfg.head_dim = 128;
  AdamWOptions o;
  o.threads = argc > 3 ? std::atoi(argv[3]) : 2;
  int64_t params = 0;
  {
    HostModelStore probe(cfg, at::kBFloat16, 1);
    for (int i = 0; i < probe.num_params(); ++i) params += probe.param(i).fp32.numel();
  }
  Variant variants[] = {{"moments per parameter", false, {}, {}, {}, {}}, {"layer slab", true, {}, {}, {}, {}}};
  for (int r = 0; r < rounds; ++r) {
    for (Variant& v : variants) RunOnce(cfg, o, 3, v);
  }
  std::printf("Host model store, %d blocks, %.1f M parameters, AdamW on %d thread(s), median of %d rounds\n",
              cfg.num_blocks, static_cast<double>(params) / 1e6, o.threads, rounds);
  std::printf("%-24s %10s %14s %9s %10s %12s\n", "variant", "build ms", "first step ms", "step ms", "MiB",
              "allocations");
  for (const Variant& v : variants) {
    std::printf("%-24s %10.1f %14.1f %9.1f %10.0f %12lld\n", v.name, Median(v.build) * 1e3, Median(v.first) * 1e3,
                Median(v.step) * 1e3, Median(v.rss), static_cast<long long>(v.allocations));
  }
  std::printf("layer slab / per parameter: first step %.2fx, step %.2fx\n",
              Median(variants[1].first) / Median(variants[0].first),
              Median(variants[1].step) / Median(variants[0].step));
  return 0;
}
