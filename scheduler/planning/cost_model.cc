#include "scheduler/planning/cost_model.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace rp::planning {

int64_t CostModel::ForwardMemory(int layer) const {
  const LayerCost& c = layers.at(static_cast<size_t>(layer));
  // No autograd in a forward stage: weights, plus the layer's transient working set, bounded by
  // the boundary activation in and out and the fixed buffers.
  return c.param_bytes + c.fixed_work_bytes + 2 * boundary_bytes_per_token * tokens_per_microbatch;
}

int64_t CostModel::BackwardMemory(int layer) const {
  const LayerCost& c = layers.at(static_cast<size_t>(layer));
  return c.param_bytes + c.trainable_bytes + c.fixed_work_bytes + c.act_bytes_per_token * tokens_per_microbatch;
}

namespace {

absl::Status ValidateAnalyticInputs(const spec::ModelConfig& m, const DeviceProfile& d, const AnalyticOptions& opt) {
  if (m.num_blocks <= 0 || m.hidden <= 0 || m.vocab <= 0 || m.num_heads <= 0 || m.num_kv_heads <= 0 ||
      m.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("model '", m.name,
                                                   "': blocks, hidden, vocab, heads, kv heads and "
                                                   "head_dim must be positive"));
  }
  if (!m.is_moe() && m.intermediate <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("model '", m.name, "': dense model needs intermediate > 0"));
  }
  if (m.is_moe() && (m.experts_per_token <= 0 || m.experts_per_token > m.num_experts || m.expert_intermediate <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("model '", m.name,
                                                   "': MoE needs 0 < experts_per_token <= experts "
                                                   "and expert_intermediate > 0"));
  }
  if (d.peak_matmul_flops <= 0 || d.memory_bandwidth <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", d.name, "': peak FLOP/s and bandwidth must be positive"));
  }
  if (opt.micro_batch_size <= 0 || opt.sequence_length <= 0) {
    return absl::InvalidArgumentError("micro-batch size and sequence length must be positive");
  }
  if (!(opt.matmul_efficiency > 0) || !(opt.attention_efficiency > 0) || !(opt.expert_half_rows >= 0) ||
      !(opt.layer_overhead_bytes_per_token >= 0) || !(opt.backward_overhead_factor >= 0) ||
      !(opt.sink_backward_score_passes >= 0)) {
    return absl::InvalidArgumentError(
        "analytic options: efficiencies must be positive; expert rows, overheads and score passes not negative");
  }
  return absl::OkStatus();
}

// The quantities every layer's estimate uses: the micro-batch's size, the model's widths, and
// the device's effective rates.
struct AnalyticTerms {
  AnalyticTerms(const spec::ModelConfig& m, const DeviceProfile& d, const AnalyticOptions& opt)
      : tokens(static_cast<double>(opt.micro_batch_size * opt.sequence_length)),
        s(static_cast<double>(opt.sequence_length)),
        h(static_cast<double>(m.hidden)),
        q(static_cast<double>(m.num_heads) * static_cast<double>(m.head_dim)),
        kv(static_cast<double>(m.num_kv_heads) * static_cast<double>(m.head_dim)),
        mm_rate(d.peak_matmul_flops * opt.matmul_efficiency),
        attn_rate(d.peak_matmul_flops * opt.attention_efficiency),
        bw(d.memory_bandwidth),
        db(opt.dtype_bytes),
        lora(m.lora.rank > 0),
        bwd_mm(lora ? 1.0 : 2.0),
        overhead(tokens * opt.layer_overhead_bytes_per_token / bw),
        bwd_overhead(overhead * opt.backward_overhead_factor) {}
  const double tokens, s, h, q, kv;
  const double mm_rate, attn_rate, bw, db;
  const bool lora;
  const double bwd_mm;                  // backward matmul factor: dgrad + wgrad, or dgrad only for a frozen base
  const double overhead, bwd_overhead;  // per-layer overhead in a forward / a backward
};

// Embedding: a gather (memory-bound) forward; a scatter-add of the gradient backward.
LayerCost EmbeddingCost(const spec::ModelConfig& m, const AnalyticOptions& opt, const AnalyticTerms& t) {
  LayerCost c;
  c.kind = LayerKind::kEmbedding;
  const double traffic = t.tokens * t.h * t.db * 2;
  c.fwd_s = traffic / t.bw;
  const double bwd = 2 * traffic / t.bw;
  c.bwd_s = c.fwd_s + bwd;
  c.fused_s = c.fwd_s + bwd;
  c.param_bytes = m.EmbeddingParams() * opt.dtype_bytes;
  c.trainable_bytes = t.lora ? 0 : m.EmbeddingParams() * opt.grad_bytes;
  c.act_bytes_per_token = 8;  // token ids
  return c;
}

// The MLP of a block: FLOPs, the rate they run at, and the width of its activations per token.
struct MlpTerms {
  double flops, rate, act_width;
};

MlpTerms BlockMlp(const spec::ModelConfig& m, const AnalyticOptions& opt, const AnalyticTerms& t) {
  if (!m.is_moe()) {
    const double i = static_cast<double>(m.intermediate);
    return {t.tokens * 3 * 2 * t.h * i, t.mm_rate, 3 * i};
  }
  // Router GEMM plus k experts' gate, up and down per token, in per-expert GEMMs whose rows are
  // the tokens routed to each expert (on average tokens x k / E).
  const double ie = static_cast<double>(m.expert_intermediate);
  const double rows = t.tokens * m.experts_per_token / m.num_experts;
  const double efficiency = rows / (rows + opt.expert_half_rows);
  return {t.tokens * (2 * t.h * m.num_experts + m.experts_per_token * 3 * 2 * t.h * ie), t.mm_rate * efficiency,
          m.experts_per_token * (3 * ie + t.h)};
}

LayerCost BlockCost(const spec::ModelConfig& m, const AnalyticOptions& opt, const AnalyticTerms& t, int b) {
  LayerCost c;
  c.kind = LayerKind::kBlock;
  const double h = t.h, q = t.q, kv = t.kv, tokens = t.tokens;
  // Average causal context per query: half the sequence, or the window. Attention with sinks
  // runs a masked kernel over every key, window or not.
  const bool sinks = m.gpt_oss();
  const double ctx = sinks               ? t.s
                     : m.SlidingBlock(b) ? std::min(t.s / 2, static_cast<double>(m.sliding_window))
                                         : t.s / 2;
  const double proj_flops = tokens * 2 * (h * q + 2 * h * kv + q * h);
  const double attn_flops = tokens * 2 * 2 * ctx * q;
  const MlpTerms mlp = BlockMlp(m, opt, t);
  double lora_flops = t.lora ? tokens * 2 * static_cast<double>(m.BlockLoraParams()) : 0.0;
  if (t.lora && m.SparseBlock(b)) {  // expert adapters: only the k routed experts' run per token
    for (const auto& [in, out] : m.ExpertLoraShapes())
      lora_flops += tokens * 2 * m.experts_per_token * m.lora.rank * (in + out);
  }
  // Elementwise traffic: norms, rope, residuals, activation function (about 12 reads/writes of
  // an h-wide row and 3 of the MLP width per token), plus reading the block's weights once.
  const double ew_bytes =
      tokens * t.db *
      (12 * h + (m.is_moe() ? m.experts_per_token * 3.0 * m.expert_intermediate : 3.0 * m.intermediate));
  const double weight_bytes = static_cast<double>(m.BlockParams()) * t.db;
  // The backward of attention with sinks passes over the materialised fp32 score matrix.
  const double sequences = tokens / t.s;
  const double score_bytes = sinks ? opt.sink_backward_score_passes * sequences * m.num_heads * t.s * t.s * 4 : 0.0;
  const double fwd = proj_flops / t.mm_rate + attn_flops / t.attn_rate + mlp.flops / mlp.rate + lora_flops / t.mm_rate +
                     ew_bytes / t.bw + weight_bytes / t.bw + t.overhead;
  const double bwd = t.bwd_mm * proj_flops / t.mm_rate + 2.5 * attn_flops / t.attn_rate +
                     t.bwd_mm * mlp.flops / mlp.rate + 2 * lora_flops / t.mm_rate + 2 * ew_bytes / t.bw +
                     weight_bytes / t.bw + score_bytes / t.bw + t.bwd_overhead;
  c.fwd_s = fwd;
  c.bwd_s = fwd + bwd;
  c.fused_s = fwd + bwd;
  c.param_bytes = m.BlockParams() * opt.dtype_bytes;
  c.trainable_bytes = (t.lora ? m.BlockLoraParams(b) : m.BlockParams()) * opt.grad_bytes;
  // Saved for backward: norm in/out, q/k/v, attention output (+ softmax stats), o-proj input,
  // MLP intermediates.
  c.act_bytes_per_token = static_cast<int64_t>(t.db * (6 * h + 2 * q + 2 * kv + mlp.act_width));
  // A sparse block's backward also holds the forward's routing, replayed (int64 experts per token).
  if (m.SparseBlock(b)) c.act_bytes_per_token += 8 * m.experts_per_token;
  return c;
}

LayerCost HeadCost(const spec::ModelConfig& m, const AnalyticOptions& opt, const AnalyticTerms& t) {
  LayerCost c;
  c.kind = LayerKind::kHead;
  const double v = static_cast<double>(m.vocab);
  const double flops = t.tokens * 2 * t.h * v;
  // The GEMMs alone: the authors' head runs at the matmul rate with no room left for logits
  // traffic or a per-layer overhead (Qwen3-1.7B: 5.1 TFLOP in 22.1 ms), the loss chunk's
  // softmax hiding under the next chunk's GEMM. Backward: dgrad (+ wgrad unless the head is frozen); the loss gradient
  // is formed inside the forward chunk loop, so fused and recompute costs coincide.
  const double fwd = flops / t.mm_rate;
  const double bwd = (t.lora ? 1.0 : 2.0) * flops / t.mm_rate;
  c.fwd_s = fwd;
  c.bwd_s = fwd + bwd;
  c.fused_s = fwd + bwd;
  c.param_bytes = (m.vocab * m.hidden + m.hidden) * opt.dtype_bytes;  // tied: the embedding again
  c.trainable_bytes = t.lora ? 0 : m.HeadParams() * opt.grad_bytes;
  c.act_bytes_per_token = static_cast<int64_t>(2 * t.h * t.db);
  c.fixed_work_bytes = static_cast<int64_t>(opt.loss_chunk_tokens) * m.vocab * 4 * 2;
  return c;
}

}  // namespace

absl::StatusOr<CostModel> AnalyticCostModel(const spec::ModelConfig& m, const DeviceProfile& d,
                                            const AnalyticOptions& opt) {
  if (absl::Status st = ValidateAnalyticInputs(m, d, opt); !st.ok()) return st;
  const AnalyticTerms t(m, d, opt);
  CostModel cm;
  cm.tokens_per_microbatch = static_cast<int64_t>(t.tokens);
  cm.boundary_bytes_per_token = static_cast<int64_t>(t.h * t.db);
  cm.layers.push_back(EmbeddingCost(m, opt, t));
  for (int b = 0; b < m.num_blocks; ++b) cm.layers.push_back(BlockCost(m, opt, t, b));
  cm.layers.push_back(HeadCost(m, opt, t));
  return cm;
}

CostModel SyntheticCostModel(int num_layers, double head_to_block_ratio) {
  CostModel cm;
  for (int l = 0; l < num_layers; ++l) {
    LayerCost c;
    double f = 1e-3;
    c.kind = LayerKind::kBlock;
    if (l == 0) {
      c.kind = LayerKind::kEmbedding;
      f = 0.05e-3;
    } else if (l == num_layers - 1) {
      c.kind = LayerKind::kHead;
      f = head_to_block_ratio * 1e-3;
    }
    c.fwd_s = f;
    c.bwd_s = 3 * f;
    c.fused_s = 3 * f;
    c.param_bytes = 400 << 20;
    c.trainable_bytes = 800 << 20;
    cm.layers.push_back(c);
  }
  return cm;
}

MeasuredProfile::MeasuredProfile(int num_layers, double alpha, int skip_first)
    : num_layers_(num_layers), alpha_(alpha), skip_first_(skip_first), ema_(static_cast<size_t>(num_layers) * 3) {}

void MeasuredProfile::Record(int layer, Kind kind, double seconds) {
  if (layer < 0 || layer >= num_layers_ || !(seconds >= 0) || !std::isfinite(seconds)) return;
  Ema& e = Get(layer, kind);
  if (++e.seen <= skip_first_) return;
  e.value = alpha_ * e.value + (1 - alpha_) * seconds;
  e.weight = alpha_ * e.weight + (1 - alpha_);
  ++e.used;
}

int MeasuredProfile::Samples(int layer, Kind kind) const { return Get(layer, kind).used; }

std::optional<double> MeasuredProfile::Estimate(int layer, Kind kind) const {
  const Ema& e = Get(layer, kind);
  if (e.used == 0) return std::nullopt;
  return e.value / e.weight;
}

bool MeasuredProfile::Complete() const {
  for (int l = 0; l < num_layers_; ++l) {
    // A layer measured only inside the fused stage (the head) needs no separate forward time:
    // it never runs in a forward stage.
    const bool fused = Estimate(l, Kind::kFused).has_value();
    if (!Estimate(l, Kind::kForward) && !fused) return false;
    if (!Estimate(l, Kind::kBackward) && !fused) return false;
  }
  return true;
}

CostModel MeasuredProfile::Apply(const CostModel& base) const {
  CostModel out = base;
  const int n = std::min(num_layers_, base.num_layers());
  for (int l = 0; l < n; ++l) {
    LayerCost& c = out.layers[static_cast<size_t>(l)];
    auto f = Estimate(l, Kind::kForward);
    auto b = Estimate(l, Kind::kBackward);
    auto u = Estimate(l, Kind::kFused);
    if (f) c.fwd_s = *f;
    if (b) c.bwd_s = *b;
    if (u) c.fused_s = *u;
    if (b && !u) c.fused_s = *b;
    if (u && !b) c.bwd_s = *u;
  }
  return out;
}

}  // namespace rp::planning
