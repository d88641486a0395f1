#include "workers/models/expert_groups.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <map>
#include <tuple>
#include <utility>

#include "workers/base/mutex.h"
#include "workers/models/test_hooks.h"

namespace rp::workers::models::parts {
namespace {

// (device type, device index, dtype) -> whether the grouped op runs there.
using ProbeKey = std::tuple<int, int, int>;
ProbeKey KeyOf(const at::Tensor& t) {
  return {static_cast<int>(t.device().type()), static_cast<int>(t.device().index()), static_cast<int>(t.scalar_type())};
}
base::Mutex& ProbeMutex() {
  static base::Mutex mu;
  return mu;
}
std::map<ProbeKey, bool>& Probed() {
  static std::map<ProbeKey, bool> probed;
  return probed;
}

// Two groups (one empty) in both weight layouts, forward and backward, on t's device and dtype.
bool Probe(const at::Tensor& t) {
  try {
    at::AutoGradMode grad(true);
    const auto o = t.options();
    const at::Tensor x = at::randn({24, 16}, o).requires_grad_(true);
    const at::Tensor w = at::randn({3, 16, 32}, o).requires_grad_(true);
    const at::Tensor wt = at::randn({3, 32, 16}, o).requires_grad_(true);
    const at::Tensor offs = at::tensor({8, 8, 24}, at::TensorOptions().dtype(at::kInt)).to(t.device());
    const at::Tensor y = at::_grouped_mm(x, w, offs) + at::_grouped_mm(x, wt.transpose(1, 2), offs);
    y.backward(at::ones_like(y));
    const at::Tensor want = at::matmul(x.detach().narrow(0, 8, 16), w.detach()[2] + wt.detach()[2].t());
    return at::allclose(y.detach().narrow(0, 8, 16).to(at::kFloat), want.to(at::kFloat), 0.05, 0.05) &&
           x.grad().defined() && w.grad().defined() && wt.grad().defined();
  } catch (const c10::Error&) {
    return false;
  }
}

bool DeviceRunsGroupedOp(const at::Tensor& t) {
  const ProbeKey key = KeyOf(t);
  {
    base::MutexLock lock(&ProbeMutex());
    if (auto it = Probed().find(key); it != Probed().end()) return it->second;
  }
  const bool ok = Probe(t);
  base::MutexLock lock(&ProbeMutex());
  Probed().emplace(key, ok);
  return ok;
}

void MarkUnusable(const at::Tensor& t, const char* why) {
  base::MutexLock lock(&ProbeMutex());
  if (Probed()[KeyOf(t)]) std::fprintf(stderr, "grouped expert GEMM off for this device and dtype: %s\n", why);
  Probed()[KeyOf(t)] = false;
}

// Per expert: in's group times its matrix, concatenated in group order.
at::Tensor PerExpertProduct(const ExpertGroups& g, const at::Tensor& in, const at::Tensor& w) {
  const std::vector<at::Tensor> ws = w.unbind(0);  // one unbind: no full-size zero gradient per expert
  std::vector<at::Tensor> outs;
  int64_t start = 0;
  for (size_t e = 0; e < g.counts.size(); ++e) {
    if (g.counts[e] == 0) continue;
    outs.push_back(at::matmul(in.narrow(0, start, g.counts[e]), ws[e]));
    start += g.counts[e];
  }
  return at::cat(outs, 0);
}

}  // namespace

ExpertGroups GroupByExpert(const at::Tensor& x, const MoeRouting& routing, int64_t num_experts,
                           int64_t experts_per_token) {
  ExpertGroups g;
  const int64_t h = x.size(-1), k = experts_per_token;
  g.flat = x.reshape({-1, h});
  const at::Tensor pair_expert = routing.experts.reshape({-1});
  const int64_t T = g.flat.size(0);
  const at::Tensor pair = at::arange(T * k, pair_expert.options());
  const at::Tensor key = pair_expert * (k * T) + at::remainder(pair, k) * T + at::div(pair, k, "floor");
  const at::Tensor order = at::argsort(key, /*stable=*/true, 0);
  g.token_of = at::div(order, k, "floor");
  g.expert_of = pair_expert.index_select(0, order);
  g.rows = g.flat.index_select(0, g.token_of);
  g.weights = routing.weights.reshape({-1}).index_select(0, order);
  const at::Tensor counts = routing.counts.to(at::kCPU, at::kLong).contiguous();
  g.counts.assign(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + num_experts);
  g.offsets = at::cumsum(counts, 0).to(at::kInt).to(x.device());
  return g;
}

at::Tensor CombineGroups(const ExpertGroups& g, const at::Tensor& y, const at::Tensor& x) {
  const at::Tensor weighted = y * g.weights.unsqueeze(1);
  return at::zeros_like(g.flat).index_add(0, g.token_of, weighted.to(g.flat.scalar_type())).view(x.sizes());
}

bool GroupedProductUsable(const at::Tensor& in, int64_t a, int64_t b) {
  if (!GroupedExpertGemmSlot().load(std::memory_order_relaxed)) return false;
  if (in.scalar_type() != at::kFloat && in.scalar_type() != at::kBFloat16) return false;
  const int64_t elem = static_cast<int64_t>(in.element_size());
  if ((a * elem) % 16 != 0 || (b * elem) % 16 != 0) return false;
  return DeviceRunsGroupedOp(in);
}

at::Tensor GroupedProduct(const ExpertGroups& g, const at::Tensor& in, const at::Tensor& w) {
  if (in.size(0) == 0) return at::zeros({0, w.size(2)}, in.options());
  const at::Tensor x = in.is_contiguous() ? in : in.contiguous();
  if (GroupedProductUsable(x, w.size(1), w.size(2))) {
    try {
      return at::_grouped_mm(x, w, g.offsets);
    } catch (const c10::Error& e) {
      MarkUnusable(x, e.what_without_backtrace());
    }
  }
  return PerExpertProduct(g, x, w);
}

at::Tensor GroupedAdapterTerm(const spec::ModelConfig& c, const ExpertAdapterViews& v, const ExpertGroups& g,
                              const at::Tensor& in) {
  if (v.a.empty()) return {};
  std::vector<at::Tensor> outs;
  int64_t start = 0;
  for (size_t e = 0; e < g.counts.size(); ++e) {
    if (g.counts[e] == 0) continue;
    outs.push_back(AdapterTerm(c, v, static_cast<int64_t>(e), in.narrow(0, start, g.counts[e])));
    start += g.counts[e];
  }
  return at::cat(outs, 0);
}

}  // namespace rp::workers::models::parts

namespace rp::workers::models {

bool GroupedExpertGemmRuns(const at::TensorOptions& options) {
  return parts::GroupedProductUsable(at::empty({1, 16}, options), 16, 16);
}

}  // namespace rp::workers::models
