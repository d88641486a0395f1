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

std::vector<ParamSpec> ModelParams(const TransformerConfig& cfg) {
  std::vector<ParamSpec> out;
  for (int l = 0; l < cfg.num_layers(); ++l) {
    for (ParamSpec& p : LayerParams(cfg, l)) {
      if (std::none_of(out.begin(), out.end(), [&](const ParamSpec& o) { return o.name == p.name; })) {
        out.push_back(std::move(p));
      }
    }
  }
  return out;
}

namespace {

// A block's attention weights, in the order BlockForward takes them.
void AttentionParams(const TransformerConfig& c, const std::string& p, std::vector<ParamSpec>* out) {
  const int64_t h = c.hidden, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  out->push_back({p + "input_layernorm.weight", {h}, true});
  const std::pair<const char*, std::vector<int64_t>> projections[] = {
      {"q_proj", {q, h}}, {"k_proj", {kv, h}}, {"v_proj", {kv, h}}, {"o_proj", {h, q}}};
  for (const auto& [name, shape] : projections) {
    out->push_back({p + "self_attn." + name + ".weight", shape});
    if (c.attention_bias) out->push_back({p + "self_attn." + name + ".bias", {shape[0]}});
  }
  if (c.qk_norm) {
    out->push_back({p + "self_attn.q_norm.weight", {c.head_dim}, true});
    out->push_back({p + "self_attn.k_norm.weight", {c.head_dim}, true});
  }
  if (c.gpt_oss()) out->push_back({p + "self_attn.sinks", {c.num_heads}});
  out->push_back({p + "post_attention_layernorm.weight", {h}, true});
}

// A block's MLP: dense, Qwen3-MoE's stacked experts (transformers >= 5's layout) or GPT-OSS's.
void MlpParams(const TransformerConfig& c, int block, const std::string& p, std::vector<ParamSpec>* out) {
  const int64_t h = c.hidden, e = c.num_experts, i = c.expert_intermediate;
  if (c.gpt_oss()) {
    out->push_back({p + "mlp.router.weight", {e, h}});
    out->push_back({p + "mlp.router.bias", {e}});
    out->push_back({p + "mlp.experts.gate_up_proj", {e, h, 2 * i}});
    out->push_back({p + "mlp.experts.gate_up_proj_bias", {e, 2 * i}});
    out->push_back({p + "mlp.experts.down_proj", {e, i, h}});
    out->push_back({p + "mlp.experts.down_proj_bias", {e, h}});
  } else if (c.SparseBlock(block)) {
    out->push_back({p + "mlp.gate.weight", {e, h}});
    out->push_back({p + "mlp.experts.gate_up_proj", {e, 2 * i, h}});
    out->push_back({p + "mlp.experts.down_proj", {e, h, i}});
  } else {
    out->push_back({p + "mlp.gate_proj.weight", {c.intermediate, h}});
    out->push_back({p + "mlp.up_proj.weight", {c.intermediate, h}});
    out->push_back({p + "mlp.down_proj.weight", {h, c.intermediate}});
  }
}

}  // namespace

std::vector<ParamSpec> LayerParams(const TransformerConfig& c, int layer) {
  const int64_t h = c.hidden;
  if (layer == 0) return {{"model.embed_tokens.weight", {c.vocab, h}}};
  if (layer == c.head_layer()) {
    return {{"model.norm.weight", {h}, true},
            {c.tied_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", {c.vocab, h}}};
  }
  const std::string p = absl::StrCat("model.layers.", layer - 1, ".");
  std::vector<ParamSpec> out;
  AttentionParams(c, p, &out);
  MlpParams(c, layer - 1, p, &out);
  if (c.lora.rank > 0) {
    const int64_t r = c.lora.rank;
    for (const std::string& m : LoraModules()) {
      if (!c.lora.Targets(m)) continue;
      const bool mlp = m == "gate_proj" || m == "up_proj" || m == "down_proj";
      const std::string base = p + (mlp ? "mlp." : "self_attn.") + m;
      const auto& w =
          *std::find_if(out.begin(), out.end(), [&](const ParamSpec& ps) { return ps.name == base + ".weight"; });
      const int64_t out_f = w.shape[0], in_f = w.shape[1];
      out.push_back({base + ".lora_A.weight", {r, in_f}, false, 1});
      out.push_back({base + ".lora_B.weight", {out_f, r}, false, 2});
    }
    for (const ExpertLora& t : ExpertLoraTargets(c, layer - 1)) {
      out.push_back({t.a, {r * c.num_experts, t.in}, false, 1});
      out.push_back({t.b, {t.out, r * c.num_experts}, false, 2});
    }
  }
  return out;
}

std::vector<ExpertLora> ExpertLoraTargets(const TransformerConfig& c, int block) {
  std::vector<ExpertLora> out;
  if (c.lora.rank <= 0 || !c.SparseBlock(block)) return out;
  const bool gate_up = c.lora.Targets("experts.gate_up_proj"), down = c.lora.Targets("experts.down_proj");
  const std::string p = absl::StrCat("model.layers.", block, ".mlp.experts.");
  const int64_t h = c.hidden, i = c.expert_intermediate;
  if (gate_up) {
    const std::string stem = p + (down ? "base_layer." : "");
    out.push_back(
        {"experts.gate_up_proj", p + "gate_up_proj", stem + "lora_A.weight", stem + "lora_B.weight", h, 2 * i});
  }
  if (down) out.push_back({"experts.down_proj", p + "down_proj", p + "lora_A.weight", p + "lora_B.weight", i, h});
  return out;
}

at::Tensor ExpertLoraDelta(const TransformerConfig& c, const at::Tensor& a, const at::Tensor& b) {
  const int64_t e = c.num_experts, r = c.lora.rank;
  const at::Tensor a3 = a.view({e, r, a.size(1)});                     // [E, r, in]
  const at::Tensor b3 = b.view({b.size(0), r, e}).permute({2, 0, 1});  // [E, out, r]
  const at::Tensor delta = at::bmm(b3, a3) * (c.lora.alpha / r);       // [E, out, in]
  return c.gpt_oss() ? delta.transpose(1, 2).contiguous() : delta;
}

const std::vector<std::string>& LoraModules() {
  static const std::vector<std::string> kModules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};
  return kModules;
}

namespace {

// Llama-3: long wavelengths are divided by `factor`, short ones kept, the band between
// interpolated smoothly.
at::Tensor Llama3Frequencies(const RopeScaling& rs, const at::Tensor& inv_freq) {
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
at::Tensor YarnFrequencies(const RopeScaling& rs, double theta, int64_t dim, const at::Tensor& inv_freq) {
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

Rope MakeRope(const TransformerConfig& c, int64_t seq, c10::Device device) {
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor inv_freq =
      1.0 / at::pow(c.rope_theta, at::arange(0, c.head_dim, 2, f64) / static_cast<double>(c.head_dim));
  const RopeScaling& rs = c.rope_scaling;
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

at::Tensor SelectExperts(const TransformerConfig& c, const at::Tensor& scores, const RoutingDecision* replay,
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

at::Tensor AdapterTerm(const TransformerConfig& c, const ExpertAdapterViews& v, int64_t expert, const at::Tensor& xe) {
  if (v.a.empty()) return {};
  const size_t e = static_cast<size_t>(expert);
  return at::linear(at::linear(xe, v.a[e]), v.b[e]) * (c.lora.alpha / c.lora.rank);
}

}  // namespace parts

MoeRouting RouteTokens(const TransformerConfig& c, const at::Tensor& router_weight, const at::Tensor& x,
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

at::Tensor MoeExperts(const TransformerConfig& c, const at::Tensor& gate_up, const at::Tensor& down,
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

BlockWeights SplitBlockWeights(const TransformerConfig& c, int block, const std::vector<at::Tensor>& w) {
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
at::Tensor BlockAttention(const TransformerConfig& c, int block, const BlockWeights& bw, const at::Tensor& hn,
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

at::Tensor BlockForward(const TransformerConfig& c, int block, const std::vector<at::Tensor>& w, const at::Tensor& x,
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

at::Tensor FinalNorm(const TransformerConfig& c, const at::Tensor& norm_weight, const at::Tensor& x) {
  return parts::RmsNorm(x, norm_weight, c.rms_eps, /*scale_in_fp32=*/c.gpt_oss());
}

namespace {

// One chunk of the head: tokens [start, start+n) of `hn` against the head weight `wf`. On a GPU
// with a bf16/fp16 model the head GEMMs run in the model's dtype on tensor cores (fp32
// accumulation inside cuBLAS), with logits, softmax and the loss in fp32 — the head of a
// 150k-vocabulary model is the largest GEMM of the network. On the CPU backend (and for fp32
// models) everything stays fp32, as the tests' references do.
struct HeadChunk {
  at::Tensor hidden;  // [n, h] in the GEMM dtype
  at::Tensor logits;  // [n, V] fp32, the only full-width tensor
  at::Tensor lse;     // [n]
  at::Tensor safe;    // labels with ignored ones replaced by 0
  at::Tensor valid;   // fp32 0/1
};
bool LowPrecisionHead(const at::Tensor& hn, const at::Tensor& weight) {
  return hn.is_cuda() && weight.scalar_type() != at::kFloat;
}
HeadChunk Chunk(const at::Tensor& hn, const at::Tensor& wf, const at::Tensor& labels, int64_t start, int64_t n,
                bool low_precision) {
  HeadChunk c;
  c.hidden = hn.narrow(0, start, n).to(low_precision ? wf.scalar_type() : at::kFloat);
  const at::Tensor lc = labels.narrow(0, start, n);
  const at::Tensor valid = lc.ne(kIgnoreIndex);
  c.safe = at::where(valid, lc, at::zeros_like(lc));
  c.valid = valid.to(at::kFloat);
  c.logits = at::matmul(c.hidden, wf.t()).to(at::kFloat);
  c.lse = at::logsumexp(c.logits, 1);
  return c;
}
at::Tensor ChunkLoss(const HeadChunk& c) {  // sum of CE over the valid rows
  return ((c.lse - c.logits.gather(1, c.safe.unsqueeze(1)).squeeze(1)) * c.valid).sum();
}

}  // namespace

HeadLossGrad ChunkedHeadLossAndGrad(const at::Tensor& hn, const at::Tensor& weight, const at::Tensor& labels,
                                    double scale, int64_t chunk, bool weight_grad) {
  HeadLossGrad r;
  const int64_t T = hn.size(0);
  r.grad_hidden = at::zeros_like(hn);
  if (weight_grad) r.grad_weight = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
  const bool low_precision = LowPrecisionHead(hn, weight);
  const at::Tensor wf = low_precision ? weight : weight.to(at::kFloat);
  for (int64_t start = 0; start < T; start += chunk) {
    const int64_t n = std::min(chunk, T - start);
    const HeadChunk c = Chunk(hn, wf, labels, start, n, low_precision);
    r.loss_sum += ChunkLoss(c).item<double>();
    r.tokens += static_cast<int64_t>(c.valid.sum().item<double>());
    // d(sum CE)/d logits = softmax - onehot, zero for ignored rows; times `scale`.
    at::Tensor g = at::exp(c.logits - c.lse.unsqueeze(1));
    g.scatter_add_(1, c.safe.unsqueeze(1), -at::ones({n, 1}, g.options()));
    g.mul_((c.valid * scale).unsqueeze(1));
    if (low_precision) g = g.to(weight.scalar_type());
    r.grad_hidden.narrow(0, start, n).copy_(at::matmul(g, wf));
    if (weight_grad) r.grad_weight.add_(at::matmul(g.t(), c.hidden));
  }
  return r;
}

HeadLoss ChunkedHeadLoss(const at::Tensor& hn, const at::Tensor& weight, const at::Tensor& labels, int64_t chunk) {
  HeadLoss r;
  const int64_t T = hn.size(0);
  const bool low_precision = LowPrecisionHead(hn, weight);
  const at::Tensor wf = low_precision ? weight : weight.to(at::kFloat);
  at::Tensor sum = at::zeros({}, hn.options().dtype(at::kDouble));
  at::Tensor count = at::zeros({}, hn.options().dtype(at::kDouble));
  for (int64_t start = 0; start < T; start += chunk) {
    const HeadChunk c = Chunk(hn, wf, labels, start, std::min(chunk, T - start), low_precision);
    sum.add_(ChunkLoss(c).to(at::kDouble));
    count.add_(c.valid.sum().to(at::kDouble));
  }
  // One host synchronisation per call, not one per chunk.
  r.loss_sum = sum.item<double>();
  r.tokens = static_cast<int64_t>(count.item<double>());
  return r;
}

at::Tensor ShiftLabels(const at::Tensor& tokens) {
  at::Tensor labels = at::full_like(tokens, kIgnoreIndex);
  const int64_t s = tokens.size(1);
  if (s > 1) labels.narrow(1, 0, s - 1).copy_(tokens.narrow(1, 1, s - 1));
  return labels;
}

}  // namespace rp::workers::models
