#include "workers/models/layers.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "workers/models/gpt_oss.h"

namespace rp::workers::models {
namespace {

// The chunked head against plain autograd over full logits (at::cross_entropy_loss).
TEST(ChunkedHead, LossAndGradientsEqualFullLogitsAutograd) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  const int64_t T = 23, H = 16, V = 37;
  at::Tensor hn = at::randn({T, H}, gen, at::kFloat);
  at::Tensor w = at::randn({V, H}, gen, at::kFloat) * 0.3;
  at::Tensor labels = at::randint(V, {T}, gen, at::TensorOptions().dtype(at::kLong));
  labels.index_put_({at::arange(0, T, 4)}, kIgnoreIndex);  // some ignored positions
  const double n_valid = labels.ne(kIgnoreIndex).sum().item<double>();
  const double scale = 1.0 / (n_valid + 5);  // as if the global batch had more tokens

  at::Tensor hr = hn.clone().set_requires_grad(true), wr = w.clone().set_requires_grad(true);
  at::Tensor loss_sum = at::cross_entropy_loss(at::matmul(hr, wr.t()), labels, {}, at::Reduction::Sum, kIgnoreIndex);
  (loss_sum * scale).backward();

  for (int64_t chunk : {int64_t{1}, int64_t{4}, int64_t{7}, T, int64_t{1000}}) {
    HeadLossGrad got = ChunkedHeadLossAndGrad(hn, w, labels, scale, chunk);
    EXPECT_NEAR(got.loss_sum, loss_sum.item<double>(), 1e-4) << chunk;
    EXPECT_EQ(got.tokens, static_cast<int64_t>(n_valid));
    EXPECT_TRUE(at::allclose(got.grad_hidden, hr.grad(), 1e-5, 1e-6)) << chunk;
    EXPECT_TRUE(at::allclose(got.grad_weight, wr.grad(), 1e-5, 1e-6)) << chunk;
  }
  // A frozen head: same loss and input gradient, no weight gradient formed.
  HeadLossGrad frozen = ChunkedHeadLossAndGrad(hn, w, labels, scale, 7, /*weight_grad=*/false);
  EXPECT_NEAR(frozen.loss_sum, loss_sum.item<double>(), 1e-4);
  EXPECT_TRUE(at::allclose(frozen.grad_hidden, hr.grad(), 1e-5, 1e-6));
  EXPECT_FALSE(frozen.grad_weight.defined());
}

// Llama-3 rope scaling, checked per frequency against the published rule.
TEST(Rope, Llama3ScalingBands) {
  spec::ModelConfig c;
  c.head_dim = 64;
  c.rope_theta = 500000;
  c.rope_scaling = {8.0, 1.0, 4.0, 8192};
  const int64_t P = 1999;  // a late position: angle errors grow with the position
  Rope r = MakeRope(c, P + 1, c10::Device(c10::kCPU));
  Rope plain = MakeRope(spec::ModelConfig{.head_dim = 64, .rope_theta = 500000}, P + 1, c10::Device(c10::kCPU));
  ASSERT_EQ(r.cos.sizes(), (at::IntArrayRef{P + 1, 64}));
  for (int i = 0; i < 32; ++i) {
    const double inv = 1.0 / std::pow(500000.0, 2.0 * i / 64);
    const double wavelen = 2 * M_PI / inv;
    double want;
    if (wavelen < 8192 / 4.0) {
      want = inv;  // high frequency: unchanged
    } else if (wavelen > 8192 / 1.0) {
      want = inv / 8;  // low frequency: divided by the factor
    } else {
      const double smooth = (8192 / wavelen - 1) / (4 - 1);
      want = (1 - smooth) * inv / 8 + smooth * inv;
    }
    // Angle at position P = P * inv_freq; both halves repeat the same frequencies.
    EXPECT_NEAR(r.cos[P][i].item<double>(), std::cos(P * want), 1e-6) << i;
    EXPECT_NEAR(r.sin[P][i + 32].item<double>(), std::sin(P * want), 1e-6) << i;
    EXPECT_NEAR(plain.cos[P][i].item<double>(), std::cos(P * inv), 1e-6) << i;
  }
  EXPECT_TRUE(at::allclose(r.cos[0], at::ones({64})));
}

TEST(Layers, ParamSpecsAndShapes) {
  spec::ModelConfig c;
  c.family = "qwen3";
  c.vocab = 10;
  c.hidden = 8;
  c.intermediate = 12;
  c.num_blocks = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.qk_norm = true;
  c.tied_embeddings = true;
  ASSERT_TRUE(c.Validate().ok());
  auto block = LayerParams(c, 1);
  EXPECT_EQ(block.size(), 11u);
  EXPECT_EQ(block[0].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(block[5].name, "model.layers.0.self_attn.q_norm.weight");
  auto head = LayerParams(c, 3);
  EXPECT_EQ(head[1].name, "model.embed_tokens.weight");  // tied
  c.tied_embeddings = false;
  EXPECT_EQ(LayerParams(c, 3)[1].name, "lm_head.weight");
  c.num_kv_heads = 3;
  EXPECT_FALSE(c.Validate().ok());
  c.num_kv_heads = 1;
  c.family = "gpt2";
  EXPECT_FALSE(c.Validate().ok());
}

TEST(Layers, ShiftLabels) {
  at::Tensor t = at::arange(6, at::kLong).reshape({2, 3});
  at::Tensor l = ShiftLabels(t);
  EXPECT_TRUE(at::equal(l, at::tensor({1, 2, -100, 4, 5, -100}, at::kLong).reshape({2, 3})));
}

// A routing record survives its host form bit for bit, a replay gives top-k's own weights and
// gradients, and a damaged record is refused rather than replayed.
TEST(MoeRouting, ReplayEqualsLiveRoutingAndDamagedRecordsAreRefused) {
  spec::ModelConfig c;
  c.num_experts = 5;
  c.experts_per_token = 2;
  c.norm_topk_prob = true;
  at::manual_seed(3);
  const at::Tensor x = at::randn({2, 7, 8});
  const at::Tensor w = at::randn({5, 8}).requires_grad_(true);
  const MoeRouting live = RouteTokens(c, w, x);
  const RoutingDecision unpacked = UnpackRouting(PackRouting({live.experts, live.counts}), 5, 2);
  EXPECT_TRUE(at::equal(unpacked.experts, live.experts));
  EXPECT_TRUE(at::equal(unpacked.counts, live.counts));
  EXPECT_EQ(live.counts.sum().item<int64_t>(), 28);
  const MoeRouting replayed = RouteTokens(c, w, x, &unpacked);
  EXPECT_TRUE(at::equal(replayed.weights, live.weights));
  const at::Tensor probe = at::randn({14, 2});
  (live.weights * probe).sum().backward();
  const at::Tensor g_live = w.grad().clone();
  w.mutable_grad().zero_();
  (replayed.weights * probe).sum().backward();
  const at::Tensor g_replay = w.grad().clone();
  EXPECT_TRUE(at::equal(g_live, g_replay));
  const at::Tensor packed = PackRouting({live.experts, live.counts});
  EXPECT_THROW(UnpackRouting(packed.narrow(0, 0, 20), 5, 2), std::invalid_argument);  // 15 pairs: odd
  at::Tensor bad_counts = packed.clone();
  bad_counts[0] += 1;
  EXPECT_THROW(UnpackRouting(bad_counts, 5, 2), std::invalid_argument);
  EXPECT_THROW(UnpackRouting(packed.to(at::kLong), 5, 2), std::invalid_argument);
}

}  // namespace
}  // namespace rp::workers::models

namespace rp::workers::models {
namespace {

// GPT-OSS's attention as transformers' eager path writes it: scores, the mask, the sink logit
// appended, one softmax, the sink's column dropped.
at::Tensor EagerSinkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& sinks,
                              const at::Tensor& mask) {
  const int64_t b = q.size(0), heads = q.size(1), s = q.size(2);
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(3)));
  scores = scores.masked_fill(mask.logical_not(), -1e30);
  const at::Tensor p = at::softmax(at::cat({scores, sinks.view({1, heads, 1, 1}).expand({b, heads, s, 1})}, -1), -1);
  return at::matmul(p.narrow(-1, 0, k.size(2)), v);
}

// SinkAttention (one fused attention with the sink as an extra key) equals the eager formula in
// its output and in the gradients of q, k, v and the sinks, under a sliding-window causal mask
// and under per-row document masks.
TEST(GptOss, SinkAttentionEqualsTheEagerFormulaWithItsGradients) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(17);
  const int64_t b = 2, heads = 3, s = 11, d = 8;
  const at::Tensor q0 = at::randn({b, heads, s, d}, gen) * 2, k0 = at::randn({b, heads, s, d}, gen) * 2;
  const at::Tensor v0 = at::randn({b, heads, s, d}, gen), sinks0 = at::randn({heads}, gen) * 2;
  const at::Tensor dy = at::randn({b, heads, s, d}, gen);
  const at::Tensor causal = at::ones({s, s}, at::kBool).tril();
  const at::Tensor window = causal.logical_and(at::ones({s, s}, at::kBool).triu(-3));  // 4 positions
  at::Tensor positions = at::cat({at::arange(5, at::kLong), at::arange(6, at::kLong)}).repeat({b, 1});
  positions[1] = at::arange(s, at::kLong);
  const Rope none{at::zeros({s, d}), at::ones({s, d})};
  const at::Tensor documents = DocumentLayout(none, positions).attn_mask;
  for (const at::Tensor& mask : {causal, window, documents}) {
    std::vector<at::Tensor> got, want;
    for (bool eager : {false, true}) {
      at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true);
      at::Tensor v = v0.clone().requires_grad_(true), sinks = sinks0.clone().requires_grad_(true);
      at::Tensor y = eager ? EagerSinkAttention(q, k, v, sinks, mask) : SinkAttention(q, k, v, sinks, mask);
      y.backward(dy);
      (eager ? want : got) = {y, q.grad(), k.grad(), v.grad(), sinks.grad()};
    }
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(at::allclose(got[i], want[i], 1e-5, 1e-5))
          << "output/q/k/v/sinks " << i << " max diff " << (got[i] - want[i]).abs().max().item<double>();
    }
  }
}

}  // namespace
}  // namespace rp::workers::models

#include "workers/models/expert_groups.h"
#include "workers/models/test_hooks.h"

namespace rp::workers::models {
namespace {

// The outputs and every gradient of one sparse block's experts (Qwen3-MoE or GPT-OSS, with
// expert adapters), with grouped products on or off.
std::vector<at::Tensor> ExpertsAndGrads(bool gpt_oss, bool grouped, at::ScalarType dtype, int64_t width) {
  SetGroupedExpertGemmForTest(grouped);
  spec::ModelConfig c;
  c.num_experts = 5;
  c.experts_per_token = 2;
  c.lora.rank = 2;
  c.lora.alpha = 4;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(23);
  const auto o = at::TensorOptions().dtype(dtype);
  auto leaf = [&](std::vector<int64_t> shape) {
    return (at::randn(shape, gen, at::kFloat) * 0.3).to(dtype).requires_grad_(true);
  };
  const int64_t h = 16, E = c.num_experts, r = c.lora.rank;
  const at::Tensor x = leaf({2, 9, h});
  const at::Tensor router = leaf({E, h});
  MoeRouting routing = RouteTokens(c, router, x);
  // Expert 3 gets no rows: an empty group among the others.
  std::vector<at::Tensor> leaves = {x};
  ExpertAdapters lora{leaf({r * E, h}), leaf({2 * width, r * E}), leaf({r * E, width}), leaf({h, r * E})};
  at::Tensor y;
  if (gpt_oss) {
    GptOssExpertWeights w{leaf({E, h, 2 * width}), leaf({E, 2 * width}), leaf({E, width, h}), leaf({E, h})};
    y = GptOssExperts(c, w, x, routing, lora);
    leaves.insert(leaves.end(), {w.gate_up, w.gate_up_bias, w.down, w.down_bias});
  } else {
    const at::Tensor gate_up = leaf({E, 2 * width, h}), down = leaf({E, h, width});
    y = MoeExperts(c, gate_up, down, x, routing, lora);
    leaves.insert(leaves.end(), {gate_up, down});
  }
  leaves.insert(leaves.end(), {lora.gate_up_a, lora.gate_up_b, lora.down_a, lora.down_b});
  y.backward(at::randn(y.sizes(), gen, at::kFloat).to(o.dtype()));
  std::vector<at::Tensor> out = {y.detach()};
  for (const at::Tensor& l : leaves) out.push_back(l.grad());
  SetGroupedExpertGemmForTest(true);
  return out;
}

// The grouped expert products (at::_grouped_mm, one per stacked weight) equal one GEMM per routed
// expert in the output and in the gradients of the input, the stacked weights, the biases and
// the expert adapters, for both families, fp32 and bf16. Widths whose rows are not 16-byte
// multiples take the per-expert path (the op's stride rule).
TEST(MoeExperts, GroupedProductsEqualOneGemmPerExpertWithEveryGradient) {
  ASSERT_TRUE(parts::GroupedProductUsable(at::zeros({4, 16}), 16, 32)) << "the grouped op must run on the CPU";
  EXPECT_FALSE(parts::GroupedProductUsable(at::zeros({4, 16}), 16, 6));  // 24-byte rows
  for (bool gpt_oss : {false, true}) {
    for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
      for (int64_t width : {int64_t{8}, int64_t{6}}) {
        SCOPED_TRACE(::testing::Message() << (gpt_oss ? "gpt-oss " : "qwen3-moe ") << dtype << " width " << width);
        const std::vector<at::Tensor> grouped = ExpertsAndGrads(gpt_oss, true, dtype, width);
        const std::vector<at::Tensor> loop = ExpertsAndGrads(gpt_oss, false, dtype, width);
        ASSERT_EQ(grouped.size(), loop.size());
        const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
        for (size_t i = 0; i < grouped.size(); ++i) {
          ASSERT_TRUE(grouped[i].defined() && loop[i].defined()) << i;
          EXPECT_TRUE(at::allclose(grouped[i].to(at::kFloat), loop[i].to(at::kFloat), tol, tol))
              << "tensor " << i << " differs by " << (grouped[i] - loop[i]).abs().max().item<double>();
        }
      }
    }
  }
}

}  // namespace
}  // namespace rp::workers::models
