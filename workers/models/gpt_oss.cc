#include "workers/models/gpt_oss.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "workers/models/block_parts.h"

namespace rp::workers::models {

at::Tensor SinkAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& sinks,
                         const at::Tensor& mask) {
  const int64_t b = q.size(0), heads = q.size(1), s = q.size(2), keys = k.size(2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).to(at::kFloat) * scale;
  scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  const at::Tensor sink = sinks.to(at::kFloat).view({1, heads, 1, 1}).expand({b, heads, s, 1});
  const at::Tensor probs = at::softmax(at::cat({scores, sink}, -1), -1);
  return at::matmul(probs.narrow(-1, 0, keys).to(v.scalar_type()), v);
}

MoeRouting GptOssRoute(const TransformerConfig& c, const at::Tensor& weight, const at::Tensor& bias,
                       const at::Tensor& x, const RoutingDecision* replay) {
  const at::Tensor logits = at::linear(x.reshape({-1, x.size(-1)}), weight, bias);  // [T, E]
  MoeRouting r;
  at::Tensor top;
  if (replay) {
    r.experts = replay->experts;
    r.counts = replay->counts;
    top = logits.gather(-1, r.experts);
  } else {
    std::tie(top, r.experts) = at::topk(logits, c.experts_per_token, -1);
    r.counts = at::bincount(r.experts.reshape({-1}), {}, c.num_experts).cpu();
  }
  r.weights = at::softmax(top, -1);
  if (c.router_aux_loss_coef > 0) r.probs = at::softmax(logits, -1, at::kFloat);
  return r;
}

at::Tensor GptOssExperts(const TransformerConfig& c, const GptOssExpertWeights& w, const at::Tensor& x,
                         const MoeRouting& routing) {
  // One unbind per tensor for all experts (see MoeExperts).
  const std::vector<at::Tensor> gu = w.gate_up.unbind(0), gub = w.gate_up_bias.unbind(0), dn = w.down.unbind(0),
                                dnb = w.down_bias.unbind(0);
  const double alpha = c.swiglu_alpha, limit = c.swiglu_limit;
  return parts::GroupedExperts(x, routing, c.num_experts, c.experts_per_token, [&](int64_t e, const at::Tensor& xe) {
    const size_t i = static_cast<size_t>(e);
    const at::Tensor g_u = at::matmul(xe, gu[i]) + gub[i];
    const at::Tensor gate = g_u.slice(-1, 0, std::nullopt, 2).clamp_max(limit);
    const at::Tensor up = g_u.slice(-1, 1, std::nullopt, 2).clamp(-limit, limit);
    return at::matmul((up + 1) * (gate * at::sigmoid(gate * alpha)), dn[i]) + dnb[i];
  });
}

}  // namespace rp::workers::models
