// expert_groups.h — the token-expert pairs of a sparse block grouped by expert, and the experts'
// matrix products over those groups: one grouped GEMM per stacked weight (at::_grouped_mm) where
// the device, dtype and sizes allow it, else one GEMM per routed expert. Internal to
// workers/models (layers.cc, gpt_oss.cc build their expert FFNs from it).
//
// Contract: stateless apart from a process-wide cache of which (device, dtype) pairs run the
// grouped op (probed once, forward and backward, on first use; thread-safe); autograd is the
// caller's GradMode. A grouped product that the op refuses at run time is retried per expert and
// its (device, dtype) is not tried again.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "workers/models/block_parts.h"
#include "workers/models/layers.h"

namespace rp::workers::models::parts {

// The pairs p = token·k + choice sorted by expert, then choice, then token (the order
// transformers' per-expert loops visit them in), with their rows gathered once.
struct ExpertGroups {
  at::Tensor flat;              // x as [T, h]
  at::Tensor rows;              // [P, h]: row i is token token_of[i]'s input
  at::Tensor token_of;          // [P] int64
  at::Tensor expert_of;         // [P] int64: each row's expert (for per-expert biases)
  at::Tensor weights;           // [P]: the routing weight of each pair
  at::Tensor offsets;           // [E] int32 on x's device: where each expert's group ends
  std::vector<int64_t> counts;  // [E] on the host: each expert's rows
};
ExpertGroups GroupByExpert(const at::Tensor& x, const MoeRouting& routing, int64_t num_experts,
                           int64_t experts_per_token);

// y [P, out], the rows' outputs in group order, weighted and summed back per token: shaped as x.
at::Tensor CombineGroups(const ExpertGroups& g, const at::Tensor& y, const at::Tensor& x);

// in [P, a] (group order) times each group's expert matrix: w [E, a, b] (x·W layout, any strides:
// a transposed view of a stacked x·Wᵀ weight serves) -> [P, b]. Grouped where usable.
at::Tensor GroupedProduct(const ExpertGroups& g, const at::Tensor& in, const at::Tensor& w);

// The expert adapters' term (alpha/r)·(x·A_eᵀ)·B_eᵀ of every row, or undefined without adapters
// (per expert: an adapter's rank is usually too narrow for the grouped op's 16-byte strides).
at::Tensor GroupedAdapterTerm(const spec::ModelConfig& cfg, const ExpertAdapterViews& v, const ExpertGroups& g,
                              const at::Tensor& in);

// Whether the grouped op runs for `in`'s device and dtype with these widths (16-byte strides).
bool GroupedProductUsable(const at::Tensor& in, int64_t a, int64_t b);

}  // namespace rp::workers::models::parts
