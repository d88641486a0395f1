// block_parts.h — pieces every family's decoder block is built from (layers.cc, gpt_oss.cc):
// RMSNorm, rotary embedding, grouped-query key/value repetition, the attention mask of a block,
// the router's expert selection and expert adapters' views (the expert grouping itself:
// expert_groups.h). Internal to workers/models: users call layers.h.
//
// Contract: stateless and thread-safe; autograd is whatever the caller's GradMode says.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "workers/models/layers.h"

namespace rp::workers::models::parts {

// Normalised in fp32, then scaled: in x's dtype (Llama, Qwen3) or, with `scale_in_fp32`, in
// fp32 and cast after (GPT-OSS keeps its norms in fp32).
at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& w, double eps, bool scale_in_fp32 = false);

// x [b, heads, s, d]; the rope's cos/sin [s, d] or [b, 1, s, d] (fp32).
at::Tensor ApplyRope(const at::Tensor& x, const Rope& rope);

// [b, kv_heads, s, d] -> [b, kv_heads * rep, s, d], each head repeated in place.
at::Tensor RepeatKv(const at::Tensor& x, int64_t rep);

// What a query of a sequence of `s` tokens may attend to: bool, true = may attend; the layout's
// document mask or the causal mask, narrowed to the last `window` positions when window > 0.
// Shape [s, s] or [b, 1, s, s] on `device`.
at::Tensor AttendMask(const TokenLayout& layout, int64_t s, int64_t window, c10::Device device);

// A router's choice from its scores [T, E] (the softmax, or GPT-OSS's logits): the top-k experts
// (through the test hook when one is set, test_hooks.h), or replay's; fills r.experts and
// r.counts and returns the scores at the chosen experts [T, k], with their gradient.
at::Tensor SelectExperts(const spec::ModelConfig& cfg, const at::Tensor& scores, const RoutingDecision* replay,
                         MoeRouting& r);

// One expert's view of a stacked expert adapter (ExpertLoraTargets): A_e [r, in], B_e [out, r]
// for every expert, or empty lists when `a` is undefined.
struct ExpertAdapterViews {
  std::vector<at::Tensor> a, b;
};
ExpertAdapterViews PerExpert(const at::Tensor& a, const at::Tensor& b, int64_t num_experts);
// xe·W_eᵀ's adapter term (alpha/r)·(xe·A_eᵀ)·B_eᵀ for expert e, or undefined without one.
at::Tensor AdapterTerm(const spec::ModelConfig& cfg, const ExpertAdapterViews& v, int64_t expert, const at::Tensor& xe);

}  // namespace rp::workers::models::parts
