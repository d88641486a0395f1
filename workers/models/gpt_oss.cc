#include "workers/models/gpt_oss.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "workers/models/block_parts.h"
#include "workers/models/expert_groups.h"

namespace rp::workers::models {

at::Tensor SinkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& sinks,
                         const at::Tensor& mask) {
  // The sink as one more key, first in line, that every query sees: queries get a column of ones,
  // real keys a column of zeros and the sink key zeros with sink/scale in that column, so its
  // score is exactly the sink logit; its value is zero. Seven more zero columns keep the head
  // width a multiple of 8 for the fused kernels; the output's extra columns are dropped.
  const int64_t b = q.size(0), heads = q.size(1), s = q.size(2), d = q.size(3), keys = k.size(2);
  constexpr int64_t kPad = 8;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const at::TensorOptions o = q.options();
  const at::Tensor q_aug = at::cat({q, at::ones({b, heads, s, 1}, o), at::zeros({b, heads, s, kPad - 1}, o)}, -1);
  const at::Tensor sink_key =
      at::cat({at::zeros({b, heads, 1, d}, o),
               (sinks / scale).to(q.scalar_type()).view({1, heads, 1, 1}).expand({b, heads, 1, 1}),
               at::zeros({b, heads, 1, kPad - 1}, o)},
              -1);
  const at::Tensor k_aug = at::cat({sink_key, at::cat({k, at::zeros({b, heads, keys, kPad}, o)}, -1)}, 2);
  const at::Tensor v_aug =
      at::cat({at::zeros({b, heads, 1, d + kPad}, o), at::cat({v, at::zeros({b, heads, keys, kPad}, o)}, -1)}, 2);
  std::vector<int64_t> sink_col = mask.sizes().vec();
  sink_col.back() = 1;
  const at::Tensor mask_aug = at::cat({at::ones(sink_col, mask.options()), mask}, -1);
  return at::scaled_dot_product_attention(q_aug, k_aug, v_aug, mask_aug, 0.0, /*is_causal=*/false, scale)
      .narrow(-1, 0, d);
}

MoeRouting GptOssRoute(const spec::ModelConfig& c, const at::Tensor& weight, const at::Tensor& bias,
                       const at::Tensor& x, const RoutingDecision* replay) {
  const at::Tensor logits = at::linear(x.reshape({-1, x.size(-1)}), weight, bias);  // [T, E]
  MoeRouting r;
  const at::Tensor top = parts::SelectExperts(c, logits, replay, r);
  r.weights = at::softmax(top, -1);
  if (c.router_aux_loss_coef > 0) r.probs = at::softmax(logits, -1, at::kFloat);
  return r;
}

at::Tensor GptOssExperts(const spec::ModelConfig& c, const GptOssExpertWeights& w, const at::Tensor& x,
                         const MoeRouting& routing, const ExpertAdapters& lora) {
  // x·W stacked weights: one grouped product each; biases per row by its expert.
  const parts::ExpertGroups g = parts::GroupByExpert(x, routing, c.num_experts, c.experts_per_token);
  const parts::ExpertAdapterViews lgu = parts::PerExpert(lora.gate_up_a, lora.gate_up_b, c.num_experts);
  const parts::ExpertAdapterViews ldn = parts::PerExpert(lora.down_a, lora.down_b, c.num_experts);
  const double alpha = c.swiglu_alpha, limit = c.swiglu_limit;
  at::Tensor g_u = parts::GroupedProduct(g, g.rows, w.gate_up);
  if (at::Tensor d = parts::GroupedAdapterTerm(c, lgu, g, g.rows); d.defined()) g_u = g_u + d;
  g_u = g_u + w.gate_up_bias.index_select(0, g.expert_of);
  const at::Tensor gate = g_u.slice(-1, 0, std::nullopt, 2).clamp_max(limit);
  const at::Tensor up = g_u.slice(-1, 1, std::nullopt, 2).clamp(-limit, limit);
  const at::Tensor act = (up + 1) * (gate * at::sigmoid(gate * alpha));
  at::Tensor out = parts::GroupedProduct(g, act, w.down);
  if (at::Tensor d = parts::GroupedAdapterTerm(c, ldn, g, act); d.defined()) out = out + d;
  out = out + w.down_bias.index_select(0, g.expert_of);
  return parts::CombineGroups(g, out, x);
}

}  // namespace rp::workers::models
