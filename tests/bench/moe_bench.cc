// moe_bench — a Qwen3-MoE block on the CPU backend beside a dense block of the same active
// FLOPs, and the grouped expert computation beside a per-token loop. A benchmark (a printed
// table), not a test.
//
//   build/tests/bench/moe_bench [tokens=1024] [threads=2]
//
// Rows (median of 5, interleaved):
//   MoE block     forward (no autograd, as a forward stage), then the recompute forward with
//                 autograd and the backward (as a backward stage): hidden 512, 32 experts of
//                 width 256, top-4
//   dense block   the same, with one SwiGLU MLP of width 4 x 256 = 1024 (the same active FLOPs)
//   grouped       MoeExperts alone (one gather, one grouped GEMM per stacked weight —
//                 at::_grouped_mm — one scatter-add), forward; and the same with one GEMM pair
//                 per routed expert (the path where the grouped op cannot run)
//   per-token     the same output token by token, expert by expert (what grouping avoids)
//   replayed      the MoE block again, its recompute replaying the forward's routing (packed to
//                 the host form and back, as between the stages) instead of routing again
//   MoE block, one GEMM per expert  the first row with the grouped op switched off
//   GPT-OSS       a GPT-OSS block of the same sizes (replaying its routing): attention with sinks
//                 over a 128-token window (one fused attention call), q/k/v/o, router and expert
//                 biases, the clamped SwiGLU on interleaved gate/up columns
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "workers/models/layers.h"
#include "workers/models/test_hooks.h"

namespace {

using rp::spec::ModelConfig;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<at::Tensor> Weights(const rp::spec::ModelConfig& c) {
  std::vector<at::Tensor> w;
  for (const auto& p : rp::workers::models::LayerParams(c, 1)) {
    w.push_back(p.is_norm ? at::ones(p.shape) : at::randn(p.shape) * 0.02);
  }
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 1024;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 2;
  at::set_num_threads(threads);
  at::manual_seed(0);
  rp::spec::ModelConfig moe;
  moe.family = "qwen3";
  moe.qk_norm = true;
  moe.vocab = 1000;
  moe.hidden = 512;
  moe.intermediate = 1024;
  moe.num_blocks = 1;
  moe.num_heads = 8;
  moe.num_kv_heads = 4;
  moe.head_dim = 64;
  moe.num_experts = 32;
  moe.experts_per_token = 4;
  moe.expert_intermediate = 256;
  rp::spec::ModelConfig gpt = moe;
  gpt.family = "gpt_oss";
  gpt.qk_norm = false;
  gpt.attention_bias = true;
  gpt.sliding_window = 128;
  gpt.sliding_layers = {0};
  rp::spec::ModelConfig dense = moe;
  dense.num_experts = 0;
  dense.experts_per_token = 0;
  dense.expert_intermediate = 0;
  dense.intermediate = moe.experts_per_token * moe.expert_intermediate;
  const std::vector<at::Tensor> wm = Weights(moe), wd = Weights(dense), wg = Weights(gpt);
  const at::Tensor x = at::randn({1, tokens, moe.hidden});
  const at::Tensor dy = at::randn({1, tokens, moe.hidden});
  const auto rope = rp::workers::models::MakeRope(moe, tokens, at::kCPU);
  // replay: the forward records its routing (and packs it for the host, as a forward stage
  // does) and the recompute replays it instead of routing again (recompute fidelity).
  auto stage = [&](const rp::spec::ModelConfig& c, const std::vector<at::Tensor>& w, bool replay) {
    rp::workers::models::RoutingDecision d;
    {
      at::NoGradGuard no_grad;
      (void)rp::workers::models::BlockForward(c, 0, w, x, rope, nullptr, replay ? &d : nullptr);  // forward stage
      if (replay)
        d = rp::workers::models::UnpackRouting(rp::workers::models::PackRouting(d), c.num_experts, c.experts_per_token);
    }
    std::vector<at::Tensor> p;
    for (const at::Tensor& t : w) p.push_back(t.detach().requires_grad_(true));
    at::Tensor xi = x.detach().requires_grad_(true);
    at::Tensor y = rp::workers::models::BlockForward(c, 0, p, xi, rope, replay ? &d : nullptr);  // recompute
    y.backward(dy);
  };
  // The sparse MLP alone: its router and experts on normed-like inputs.
  const at::Tensor router = wm[wm.size() - 3], gate_up = wm[wm.size() - 2], down = wm[wm.size() - 1];
  const at::Tensor hx = at::randn({tokens, moe.hidden});
  at::Tensor grouped_out, loop_out;
  auto grouped = [&] {
    at::NoGradGuard no_grad;
    grouped_out =
        rp::workers::models::MoeExperts(moe, gate_up, down, hx, rp::workers::models::RouteTokens(moe, router, hx));
  };
  auto per_expert = [&] {
    rp::workers::models::SetGroupedExpertGemmForTest(false);
    grouped();
    rp::workers::models::SetGroupedExpertGemmForTest(true);
  };
  auto per_token = [&] {
    at::NoGradGuard no_grad;
    const auto r = rp::workers::models::RouteTokens(moe, router, hx);
    loop_out = at::zeros_like(hx);
    const auto e = r.experts.accessor<int64_t, 2>();
    for (int64_t t = 0; t < tokens; ++t) {
      const at::Tensor row = hx.narrow(0, t, 1);
      for (int64_t j = 0; j < moe.experts_per_token; ++j) {
        const int64_t ex = e[t][j];
        const auto g_u = at::linear(row, gate_up[ex]).chunk(2, -1);
        loop_out.narrow(0, t, 1).add_(at::linear(at::silu(g_u[0]) * g_u[1], down[ex]) * r.weights[t][j]);
      }
    }
  };
  struct Row {
    std::string name;
    std::function<void()> fn;
    std::vector<double> t;
  };
  std::vector<Row> rows = {{"MoE block fwd + recompute + bwd", [&] { stage(moe, wm, false); }, {}},
                           {"dense block, same active FLOPs", [&] { stage(dense, wd, false); }, {}},
                           {"grouped sparse MLP (forward)", grouped, {}},
                           {"per-token loop (forward)", per_token, {}},
                           {"MoE block, recompute replays routing", [&] { stage(moe, wm, true); }, {}},
                           {"GPT-OSS block, same sizes (replays)", [&] { stage(gpt, wg, true); }, {}},
                           {"sparse MLP, one GEMM per expert", per_expert, {}},
                           {"MoE block, one GEMM per expert",
                            [&] {
                              rp::workers::models::SetGroupedExpertGemmForTest(false);
                              stage(moe, wm, false);
                              rp::workers::models::SetGroupedExpertGemmForTest(true);
                            },
                            {}}};
  for (int r = 0; r < 6; ++r) {
    for (Row& row : rows) {
      const auto t0 = std::chrono::steady_clock::now();
      row.fn();
      if (r > 0) row.t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  const double diff = (grouped_out - loop_out).abs().max().item<double>();
  std::printf(
      "Qwen3-MoE block on the CPU backend: %lld tokens, hidden %lld, %d experts of width %lld, top-%d, "
      "%d thread(s); median of 5\n",
      static_cast<long long>(tokens), static_cast<long long>(moe.hidden), moe.num_experts,
      static_cast<long long>(moe.expert_intermediate), moe.experts_per_token, threads);
  std::printf("%-36s %10s\n", "", "ms");
  for (const Row& row : rows) std::printf("%-36s %10.1f\n", row.name.c_str(), Median(row.t) * 1e3);
  std::printf("MoE / dense block: %.2fx; per-token loop / grouped: %.1fx (outputs differ by at most %.2g)\n",
              Median(rows[0].t) / Median(rows[1].t), Median(rows[3].t) / Median(rows[2].t), diff);
  std::printf("MoE block with the routing replayed / routed again: %.2fx\n", Median(rows[4].t) / Median(rows[0].t));
  std::printf("GPT-OSS block / Qwen3-MoE block (both replaying): %.2fx\n", Median(rows[5].t) / Median(rows[4].t));
  std::printf("one GEMM per expert / grouped GEMMs: sparse MLP %.2fx, MoE block %.2fx\n",
              Median(rows[6].t) / Median(rows[2].t), Median(rows[7].t) / Median(rows[0].t));
  return 0;
}
