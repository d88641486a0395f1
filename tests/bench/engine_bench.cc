// engine_bench — the CPU backend's overhead: RoundPipe with 1 worker against a plain LibTorch
// step that does the same work (same partition, same recompute, same chunked loss) on one
// thread with no streams, stores or copies; plus tokens/s for N = 1 and 2 workers and a plain
// autograd step without recompute for context. A benchmark, not a test: prints a table.
//   build/tests/bench/engine_bench [iterations]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "scheduler/runtime/controller.h"
#include "tests/support/reference_model.h"
#include "workers/models/layers.h"
#include "workers/stage_compute.h"

namespace {

const at::Tensor* raw_tokens = nullptr;
using rp::planning::Partition;
using rp::spec::ModelConfig;

rp::spec::ModelConfig BenchModel() {
  rp::spec::ModelConfig c;
  c.family = "llama";
  c.vocab = 8192;
  c.hidden = 256;
  c.intermediate = 688;
  c.num_blocks = 6;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 32;
  return c;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The same stage math as the engine (forward stages without autograd, fused B_1, recompute +
// backward stages), on one thread, micro-batch by micro-batch, weights used in place.
void PlainRecomputeStep(const rp::spec::ModelConfig& cfg, rp::workers::HostModelStore& store, const Partition& p,
                        const at::Tensor& tokens, int M, rp::workers::AdamW& adamw) {
  const int L = cfg.num_layers();
  auto weights = [&](int first, int n) {
    rp::workers::StageWeights w;
    w.first_layer = first;
    for (int l = first; l < first + n; ++l) {
      std::vector<at::Tensor> lw;
      for (int id : store.layer_params(l)) lw.push_back(store.param(id).fp32);
      w.layers.push_back(lw);
    }
    return w;
  };
  for (int i = 0; i < store.num_params(); ++i) store.param(i).fp32.requires_grad_(true);
  at::Tensor labels = rp::workers::models::ShiftLabels(tokens);
  const double scale = 1.0 / labels.ne(-100).sum().item<double>();
  auto rope = rp::workers::models::MakeRope(cfg, tokens.size(1), c10::Device(c10::kCPU));
  const int64_t per = tokens.size(0) / M;
  std::vector<int> bwd_starts;
  int top = L - p.fused;
  for (int n : p.backward) bwd_starts.push_back(top -= n);
  for (int m = 0; m < M; ++m) {
    std::map<int, at::Tensor> inputs;  // layer -> input
    inputs[0] = tokens.narrow(0, m * per, per);
    int first = 0;
    for (int n : p.forward) {
      auto out = rp::workers::ForwardStage(cfg, weights(first, n), rope, inputs[first], bwd_starts);
      for (auto& [l, t] : out) inputs[l] = t;
      first += n;
    }
    auto fr = rp::workers::FusedStage(cfg, weights(L - p.fused, p.fused), rope, inputs[L - p.fused],
                                      labels.narrow(0, m * per, per), scale, 4096);
    at::Tensor g = fr.grad_input;
    top = L - p.fused;
    for (int n : p.backward) {
      top -= n;
      g = rp::workers::BackwardStage(cfg, weights(top, n), rope, inputs[top], g);
    }
  }
  for (int i = 0; i < store.num_params(); ++i) {
    auto& t = store.param(i).fp32;
    if (t.grad().defined()) {
      store.param(i).grad.copy_(t.grad());
      t.mutable_grad() = at::Tensor();
    }
    t.requires_grad_(false);
  }
  (void)adamw.Step(store, 1e-4);  // the same optimizer code as the engine
  store.ZeroGrads();
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 7;
  const rp::spec::ModelConfig cfg = BenchModel();
  const int64_t B = 8, S = 256;
  const int M = 4;
  const Partition p{{3, 3}, 2, {2, 2, 2}};  // 8 layers, S = 5 slots
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  at::Tensor tokens = at::randint(cfg.vocab, {B, S}, gen, at::TensorOptions().dtype(at::kLong));
  raw_tokens = &tokens;
  const double tokens_per_step = static_cast<double>(B * S);
  std::printf(
      "model: llama-style, %d blocks, hidden %lld, vocab %lld; batch %lld x %lld tokens, M=%d, partition %s; "
      "ATen threads %d; %d interleaved rounds after 2 warm-up rounds (medians)\n",
      cfg.num_blocks, static_cast<long long>(cfg.hidden), static_cast<long long>(cfg.vocab), static_cast<long long>(B),
      static_cast<long long>(S), M, p.ToString().c_str(), at::get_num_threads(), rounds);

  // Every contender runs once per round, in turn, so machine noise hits them alike.
  struct Contender {
    std::string name;
    std::function<double()> step;  // returns the bubble ratio (or 0)
    std::vector<double> times;
    double bubble = 0;
    std::map<std::string, double> streams;
  };
  std::vector<Contender> cs;

  rp::workers::HostModelStore plain_store(cfg, at::kFloat, 3);
  rp::workers::AdamW plain_adamw({});
  cs.push_back({"plain, same recompute + same AdamW", [&] {
                  PlainRecomputeStep(cfg, plain_store, p, tokens, M, plain_adamw);
                  return 0.0;
                }});
  rp::workers::HostModelStore ref_init(cfg, at::kFloat, 3);
  rp::testing::ReferenceModel ref(ref_init, {});
  cs.push_back({"plain autograd, no recompute", [&] {
                  ref.Step(tokens);
                  return 0.0;
                }});
  struct EngineSetup {
    rp::workers::Timeline tl;
    std::vector<std::unique_ptr<rp::workers::Device>> devs;
    std::unique_ptr<rp::workers::HostModelStore> store;
    std::unique_ptr<rp::scheduler::Controller> c;
  };
  std::vector<std::unique_ptr<EngineSetup>> engines;
  for (int N : {1, 2}) {
    auto e = std::make_unique<EngineSetup>();
    e->devs = *rp::workers::CreateDevices("cpu:" + std::to_string(N), &e->tl);
    std::vector<rp::workers::Device*> raw;
    for (auto& d : e->devs) raw.push_back(d.get());
    e->store = std::make_unique<rp::workers::HostModelStore>(cfg, at::kFloat, 3);
    rp::scheduler::ControllerOptions o;
    o.partition = p;
    o.microbatches = M;
    auto c = rp::scheduler::Controller::Create(o, e->store.get(), raw, &e->tl);
    if (!c.ok()) {
      std::fprintf(stderr, "%s\n", std::string(c.status().message()).c_str());
      return 1;
    }
    e->c = std::move(*c);
    EngineSetup* raw_e = e.get();
    cs.push_back({"RoundPipe cpu:" + std::to_string(N), [raw_e] {
                    raw_e->tl.Clear();
                    auto st = raw_e->c->RunIteration(*raw_tokens);
                    if (!st.ok()) std::abort();
                    return st->bubble_ratio;
                  }});
    engines.push_back(std::move(e));
  }
  for (int r = 0; r < rounds + 2; ++r) {
    for (Contender& c : cs) {
      const auto t0 = std::chrono::steady_clock::now();
      c.bubble = c.step();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r >= 2) c.times.push_back(s);
    }
  }
  const double base = Median(cs[0].times);
  std::printf("\n%-40s %10s %12s %10s %8s\n", "step", "median s", "tokens/s", "vs plain", "bubble");
  for (Contender& c : cs) {
    const double t = Median(c.times);
    std::printf("%-40s %10.4f %12.0f %9.2fx %7.0f%%\n", c.name.c_str(), t, tokens_per_step / t, t / base,
                100 * c.bubble);
  }
  for (auto& e : engines) {
    std::map<std::string, double> per_stream;
    for (const auto& en : e->tl.Entries()) per_stream[en.stream] += en.end_s - en.start_s;
    std::printf("cpu:%zu busy seconds per stream kind (last iteration, summed over workers):", e->devs.size());
    for (const auto& [k, v] : per_stream) std::printf(" %s %.3f", k.c_str(), v);
    std::printf("\n");
  }
  return 0;
}
