#include "workers/models/layers.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "workers/models/block_parts.h"
#include "workers/models/expert_groups.h"
#include "workers/models/gpt_oss.h"
#include "workers/models/test_hooks.h"

namespace rp::workers::models {

namespace {

// Llama-3: long wavelengths are divided by `factor`, short ones kept, the band between
// interpolated smoothly.
at::Tensor Llama3Frequencies(const spec::RopeScaling& rs, const at::Tensor& inv_freq) {
  const double old_len = static_cast<double>(rs.original_max_position);
  const double low_wavelen = old_len / rs.low_freq_factor;
  const double high_wavelen = old_len / rs.high_freq_factor;
  at::Tensor wavelen = 2 * M_PI / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / rs.factor, inv_freq);
  at::Tensor smooth = (old_len / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / rs.factor + smooth * scaled;
  at::Tensor medium = at::logical_not(wavelen < high_wavelen).logical_and(at::logical_not(wavelen > low_wavelen));
  return at::where(medium, smoothed, scaled);
}

// YaRN: dimensions that turn more than beta_fast times over the original context keep their
// frequency, those turning fewer than beta_slow times are divided by `factor`, and a linear ramp
// blends the dimensions between.
at::Tensor YarnFrequencies(const spec::RopeScaling& rs, double theta, int64_t dim, const at::Tensor& inv_freq) {
  const double old_len = static_cast<double>(rs.original_max_position);
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) * std::log(old_len / (rotations * 2 * M_PI)) / (2 * std::log(theta));
  };
  double low = correction_dim(rs.beta_fast), high = correction_dim(rs.beta_slow);
  if (rs.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  const at::Tensor ramp = ((at::arange(dim / 2, inv_freq.options()) - low) / (high - low)).clamp(0, 1);
  const at::Tensor keep = 1 - ramp;  // the share of the unscaled frequency
  return inv_freq / rs.factor * (1 - keep) + inv_freq * keep;
}

}  // namespace

Rope MakeRope(const spec::ModelConfig& c, int64_t seq, c10::Device device) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor inv_freq =
      1.0 / at::pow(c.rope_theta, at::arange(0, c.head_dim, 2, f64) / static_cast<double>(c.head_dim));
  const spec::RopeScaling& rs = c.rope_scaling;
  double scale = 1;
  if (rs.factor > 0 && rs.yarn) {
    inv_freq = YarnFrequencies(rs, c.rope_theta, c.head_dim, inv_freq);
    scale = rs.attention_factor;
  } else if (rs.factor > 0) {
    inv_freq = Llama3Frequencies(rs, inv_freq);
  }
  at::Tensor pos = at::arange(seq, f64);
  at::Tensor freqs = at::outer(pos, inv_freq);
  at::Tensor emb = at::cat({freqs, freqs}, -1);
  return {(emb.cos() * scale).to(device, at::kFloat), (emb.sin() * scale).to(device, at::kFloat)};
}

TokenLayout DocumentLayout(const Rope& table, const at::Tensor& positions) {
  const int64_t b = positions.size(0), s = positions.size(1);
  const at::Tensor flat = positions.reshape({-1});
  Rope rope{table.cos.index_select(0, flat).view({b, 1, s, -1}), table.sin.index_select(0, flat).view({b, 1, s, -1})};
  // Document number of every token (a new one wherever the position is 0); a token sees the
  // earlier tokens of its own document only.
  const at::Tensor doc = positions.eq(0).cumsum(1);
  const at::Tensor same = doc.unsqueeze(2).eq(doc.unsqueeze(1));  // [b, s(query), s(key)]
  const at::Tensor causal = at::ones({s, s}, positions.options().dtype(at::kBool)).tril();
  TokenLayout layout(std::move(rope));
  layout.attn_mask = same.logical_and(causal).unsqueeze(1);
  return layout;
}

namespace parts {

namespace {
at::Tensor RotateHalf(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}
}  // namespace

at::Tensor ApplyRope(const at::Tensor& x, const Rope& rope) {
  const at::Tensor cos = rope.cos.to(x.scalar_type());
  const at::Tensor sin = rope.sin.to(x.scalar_type());
  return x * cos + RotateHalf(x) * sin;
}

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, bool scale_in_fp32) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor y = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  if (scale_in_fp32) return (w.to(at::kFloat) * y).to(x.scalar_type());
  return w * y.to(x.scalar_type());
}

at::Tensor RepeatKv(const at::Tensor& x, int64_t rep) { return rep == 1 ? x : x.repeat_interleave(rep, 1); }

at::Tensor AttendMask(const TokenLayout& layout, int64_t s, int64_t window, c10::Device device) {
  at::Tensor mask = layout.attn_mask.defined()
                        ? layout.attn_mask
                        : at::ones({s, s}, at::TensorOptions().dtype(at::kBool).device(device)).tril();
  if (window > 0) {  // key j is visible from query i when i - window < j (transformers' sliding overlay)
    const at::Tensor band = at::ones({s, s}, at::TensorOptions().dtype(at::kBool).device(device)).triu(1 - window);
    mask = mask.logical_and(band);
  }
  return mask;
}

at::Tensor SelectExperts(const spec::ModelConfig& c, const at::Tensor& scores, const RoutingDecision* replay,
                         MoeRouting& r) {
  if (replay) {
    r.experts = replay->experts;
    r.counts = replay->counts;
    return scores.gather(-1, r.experts);
  }
  at::Tensor top;
  const RouterSelectionHook* hook = RouterSelectionHookSlot().load(std::memory_order_relaxed);
  if (hook) {
    r.experts = std::get<1>(at::topk((*hook)(scores.detach()), c.experts_per_token, -1));
    top = scores.gather(-1, r.experts);
  } else {
    std::tie(top, r.experts) = at::topk(scores, c.experts_per_token, -1);
  }
  r.counts = at::bincount(r.experts.reshape({-1}), {}, c.num_experts).cpu();
  return top;
}

ExpertAdapterViews PerExpert(const at::Tensor& a, const at::Tensor& b, int64_t num_experts) {
  if (!a.defined()) return {};
  const int64_t r = a.size(0) / num_experts;
  return {a.view({num_experts, r, a.size(1)}).unbind(0), b.view({b.size(0), r, num_experts}).unbind(2)};
}

at::Tensor AdapterTerm(const spec::ModelConfig& c, const ExpertAdapterViews& v, int64_t expert, const at::Tensor& xe) {
  if (v.a.empty()) return {};
  const size_t e = static_cast<size_t>(expert);
  return at::linear(at::linear(xe, v.a[e]), v.b[e]) * (c.lora.alpha / c.lora.rank);
}

}  // namespace parts

MoeRouting RouteTokens(const spec::ModelConfig& c, const at::Tensor& router_weight, const at::Tensor& x,
                       const RoutingDecision* replay) {
  const at::Tensor flat = x.reshape({-1, x.size(-1)});
  const at::Tensor logits = at::linear(flat, router_weight);  // [T, E]
  const at::Tensor probs = at::softmax(logits, -1, at::kFloat);
  MoeRouting r;
  r.probs = probs;
  at::Tensor top_w = parts::SelectExperts(c, probs, replay, r);
  if (c.norm_topk_prob) top_w = top_w / top_w.sum(-1, /*keepdim=*/true);
  r.weights = top_w.to(logits.scalar_type());
  return r;
}

at::Tensor PackRouting(const RoutingDecision& d) {
  return at::cat({d.counts.to(at::kInt), d.experts.reshape({-1}).to(at::kCPU, at::kInt)});
}

RoutingDecision UnpackRouting(const at::Tensor& packed, int64_t num_experts, int64_t experts_per_token) {
  const int64_t pairs = packed.numel() - num_experts;
  if (packed.dim() != 1 || packed.scalar_type() != at::kInt || pairs < 0 || pairs % experts_per_token != 0) {
    throw std::invalid_argument(absl::StrCat("a routing record of ", packed.numel(), " elements is not ", num_experts,
                                             " counts plus ", experts_per_token, " experts per token"));
  }
  RoutingDecision d;
  d.counts = packed.narrow(0, 0, num_experts).to(at::kLong);
  d.experts = packed.narrow(0, num_experts, pairs).to(at::kLong).view({-1, experts_per_token});
  if (d.counts.sum().item<int64_t>() != pairs) {
    throw std::invalid_argument("a routing record's expert counts do not add up to its token-expert pairs");
  }
  return d;
}

at::Tensor MoeExperts(const spec::ModelConfig& c, const at::Tensor& gate_up, const at::Tensor& down,
                      const at::Tensor& x, const MoeRouting& routing, const ExpertAdapters& lora) {
  // Stacked x·Wᵀ weights, read as x·W through transposed views: one grouped product each.
  const parts::ExpertGroups g = parts::GroupByExpert(x, routing, c.num_experts, c.experts_per_token);
  const parts::ExpertAdapterViews lgu = parts::PerExpert(lora.gate_up_a, lora.gate_up_b, c.num_experts);
  const parts::ExpertAdapterViews ldn = parts::PerExpert(lora.down_a, lora.down_b, c.num_experts);
  at::Tensor y = parts::GroupedProduct(g, g.rows, gate_up.transpose(1, 2));
  if (at::Tensor d = parts::GroupedAdapterTerm(c, lgu, g, g.rows); d.defined()) y = y + d;
  const std::vector<at::Tensor> g_u = y.chunk(2, -1);
  const at::Tensor act = at::silu(g_u[0]) * g_u[1];
  at::Tensor out = parts::GroupedProduct(g, act, down.transpose(1, 2));
  if (at::Tensor d = parts::GroupedAdapterTerm(c, ldn, g, act); d.defined()) out = out + d;
  return parts::CombineGroups(g, out, x);
}

at::Tensor EmbeddingForward(const at::Tensor& weight, const at::Tensor& tokens) {
  return at::embedding(weight, tokens);
}

namespace {

// A block's weights by role, from BlockForward's `w` (LayerParams order).
struct BlockWeights {
  at::Tensor in_norm, post_norm, q_norm, k_norm, sinks;
  at::Tensor proj[4], bias[4];  // q, k, v, o (biases undefined without attention_bias)
  // Dense: gate, up, down. Qwen3-MoE: router, gate_up, down. GPT-OSS: router weight and bias,
  // gate_up and its bias, down and its bias.
  std::vector<at::Tensor> mlp;
  std::map<std::string, std::pair<at::Tensor, at::Tensor>> adapters;  // LoRA A, B by module
  ExpertAdapters experts;                                             // LoRA on the stacked experts
};

BlockWeights SplitBlockWeights(const spec::ModelConfig& c, int block, const std::vector<at::Tensor>& w) {
  BlockWeights bw;
  size_t i = 0;
  bw.in_norm = w[i++];
  for (int p = 0; p < 4; ++p) {
    bw.proj[p] = w[i++];
    if (c.attention_bias) bw.bias[p] = w[i++];
  }
  if (c.qk_norm) {
    bw.q_norm = w[i++];
    bw.k_norm = w[i++];
  }
  if (c.gpt_oss()) bw.sinks = w[i++];
  bw.post_norm = w[i++];
  const size_t mlp = c.gpt_oss() ? 6 : 3;
  bw.mlp.assign(w.begin() + static_cast<std::ptrdiff_t>(i), w.begin() + static_cast<std::ptrdiff_t>(i + mlp));
  i += mlp;
  for (const std::string& m : LoraModules()) {
    if (!c.lora.Targets(m)) continue;
    bw.adapters[m] = {w[i], w[i + 1]};
    i += 2;
  }
  for (const ExpertLora& t : ExpertLoraTargets(c, block)) {
    if (t.target == "experts.gate_up_proj") {
      bw.experts.gate_up_a = w[i];
      bw.experts.gate_up_b = w[i + 1];
    } else {
      bw.experts.down_a = w[i];
      bw.experts.down_b = w[i + 1];
    }
    i += 2;
  }
  return bw;
}

// The block's attention output (before o_proj) for the normed input hn [b, s, h].
at::Tensor BlockAttention(const spec::ModelConfig& c, int block, const BlockWeights& bw, const at::Tensor& hn,
                          const TokenLayout& layout,
                          const std::function<at::Tensor(const at::Tensor&, int, const char*)>& linear) {
  const int64_t b = hn.size(0), s = hn.size(1), d = c.head_dim;
  at::Tensor q = linear(hn, 0, "q_proj").view({b, s, c.num_heads, d});
  at::Tensor k = linear(hn, 1, "k_proj").view({b, s, c.num_kv_heads, d});
  at::Tensor v = linear(hn, 2, "v_proj").view({b, s, c.num_kv_heads, d});
  if (c.qk_norm) {
    q = parts::RmsNorm(q, bw.q_norm, c.rms_eps);
    k = parts::RmsNorm(k, bw.k_norm, c.rms_eps);
  }
  q = parts::ApplyRope(q.transpose(1, 2), layout.rope);
  k = parts::RepeatKv(parts::ApplyRope(k.transpose(1, 2), layout.rope), c.num_heads / c.num_kv_heads);
  v = parts::RepeatKv(v.transpose(1, 2), c.num_heads / c.num_kv_heads);
  at::Tensor a;
  if (c.gpt_oss()) {
    const int64_t window = c.SlidingBlock(block) ? c.sliding_window : 0;
    a = SinkAttention(q, k, v, bw.sinks, parts::AttendMask(layout, s, window, hn.device()));
  } else if (layout.attn_mask.defined()) {
    a = at::scaled_dot_product_attention(q, k, v, layout.attn_mask, 0.0, /*is_causal=*/false);
  } else {
    a = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  }
  return a.transpose(1, 2).reshape({b, s, c.num_heads * d});
}

}  // namespace

at::Tensor BlockForward(const spec::ModelConfig& c, int block, const std::vector<at::Tensor>& w, const at::Tensor& x,
                        const TokenLayout& layout, const RoutingDecision* replay, RoutingDecision* record) {
  const BlockWeights bw = SplitBlockWeights(c, block, w);
  const double lora_scale = c.lora.rank > 0 ? c.lora.alpha / c.lora.rank : 0.0;
  // A projection with its LoRA adapter, when the module has one.
  auto adapted = [&](const at::Tensor& in, const at::Tensor& weight, const at::Tensor& bias, const char* module) {
    at::Tensor y = at::linear(in, weight, bias);
    auto it = bw.adapters.find(module);
    if (it != bw.adapters.end()) y = y + at::linear(at::linear(in, it->second.first), it->second.second) * lora_scale;
    return y;
  };
  auto linear = [&](const at::Tensor& in, int p, const char* module) {
    return adapted(in, bw.proj[p], bw.bias[p], module);
  };
  const bool fp32_norms = c.gpt_oss();
  at::Tensor hn = parts::RmsNorm(x, bw.in_norm, c.rms_eps, fp32_norms);
  at::Tensor h1 = x + linear(BlockAttention(c, block, bw, hn, layout, linear), 3, "o_proj");
  at::Tensor hn2 = parts::RmsNorm(h1, bw.post_norm, c.rms_eps, fp32_norms);
  const std::vector<at::Tensor>& m = bw.mlp;
  if (c.SparseBlock(block)) {
    const MoeRouting routing =
        c.gpt_oss() ? GptOssRoute(c, m[0], m[1], hn2, replay) : RouteTokens(c, m[0], hn2, replay);
    if (record) {
      *record = {routing.experts, routing.counts,
                 c.router_aux_loss_coef > 0 ? routing.probs.sum(0) : at::Tensor()};  // the aux loss's only input
    }
    if (c.gpt_oss()) {
      return h1 + GptOssExperts(c, GptOssExpertWeights{m[2], m[3], m[4], m[5]}, hn2, routing, bw.experts);
    }
    return h1 + MoeExperts(c, m[1], m[2], hn2, routing, bw.experts);
  }
  const at::Tensor gate = adapted(hn2, m[0], {}, "gate_proj"), up = adapted(hn2, m[1], {}, "up_proj");
  return h1 + adapted(at::silu(gate) * up, m[2], {}, "down_proj");
}

at::Tensor FinalNorm(const spec::ModelConfig& c, const at::Tensor& norm_weight, const at::Tensor& x) {
  return parts::RmsNorm(x, norm_weight, c.rms_eps, /*scale_in_fp32=*/c.gpt_oss());
}

}  // namespace rp::workers::models
