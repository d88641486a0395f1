#include "workers/stage_compute.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <stdexcept>

#include "absl/strings/str_cat.h"

namespace rp::workers {
namespace {

// What RunLayers keeps or replays besides the output.
struct LayerIo {
  const std::vector<int>* save = nullptr;  // layers whose input is kept
  std::vector<std::pair<int, at::Tensor>>* saved = nullptr;
  RoutingTape* record = nullptr;        // sparse blocks' routing, recorded
  const RoutingTape* replay = nullptr;  // or replayed
};

const models::RoutingDecision* Replayed(const RoutingTape* replay, int layer) {
  if (!replay) return nullptr;
  auto it = replay->find(layer);
  return it == replay->end() ? nullptr : &it->second;
}

// Layers [first, first+n) excluding the head; `x` may need grad.
at::Tensor RunLayers(const spec::ModelConfig& cfg, const StageWeights& w, const models::TokenLayout& layout,
                     at::Tensor x, int first, int n, const LayerIo& io = {}) {
  for (int l = first; l < first + n; ++l) {
    if (io.save && l > first && std::find(io.save->begin(), io.save->end(), l) != io.save->end()) {
      io.saved->push_back({l, x});
    }
    const std::vector<at::Tensor>& lw = w.layers[static_cast<size_t>(l - w.first_layer)];
    if (l == 0) {
      x = models::EmbeddingForward(lw[0], x);
    } else {
      const bool sparse = cfg.num_experts > 0 && cfg.SparseBlock(l - 1);
      if (sparse && io.replay && !Replayed(io.replay, l)) {
        throw std::logic_error(absl::StrCat("no recorded routing for sparse layer ", l));
      }
      models::RoutingDecision* record = sparse && io.record ? &(*io.record)[l] : nullptr;
      x = models::BlockForward(cfg, l - 1, lw, x, layout, Replayed(io.replay, l), record);
    }
  }
  return x;
}

// Backpropagates `root` with `grad`, plus the auxiliary loss term Σ_blocks Σ_e prob_sum·weights
// when weights are given. Either part may carry no graph.
void BackwardWithAux(const at::Tensor& root, const at::Tensor& grad, const std::vector<at::Tensor>& prob_sums,
                     const at::Tensor& weights) {
  at::Tensor total;
  if (weights.defined()) {
    for (const at::Tensor& p : prob_sums) {
      if (p.requires_grad()) total = total.defined() ? total + (p * weights).sum() : (p * weights).sum();
    }
  }
  if (!total.defined()) {
    if (root.requires_grad()) root.backward(grad.to(root.scalar_type()));
    return;
  }
  if (root.requires_grad()) total = total + (root * grad.to(root.scalar_type())).sum().to(at::kFloat);
  total.backward();
}

void AddGrad(const at::Tensor& param, const at::Tensor& g) {
  at::Tensor gg = g.to(param.scalar_type());
  if (param.grad().defined()) {
    param.mutable_grad().add_(gg);
  } else {
    param.mutable_grad() = gg;
  }
}

}  // namespace

std::vector<std::pair<int, at::Tensor>> ForwardStage(const spec::ModelConfig& cfg, const StageWeights& w,
                                                     const models::TokenLayout& layout, const at::Tensor& in,
                                                     const std::vector<int>& save_inputs_of, RoutingTape* record) {
  at::NoGradGuard no_grad;
  std::vector<std::pair<int, at::Tensor>> out;
  const int n = static_cast<int>(w.layers.size());
  at::Tensor y = RunLayers(cfg, w, layout, in, w.first_layer, n, {&save_inputs_of, &out, record, nullptr});
  out.push_back({w.first_layer + n, y});
  return out;
}

FusedResult FusedStage(const spec::ModelConfig& cfg, const StageWeights& w, const models::TokenLayout& layout,
                       const at::Tensor& in, const at::Tensor& labels, double loss_scale, int64_t chunk_tokens,
                       const RouterAux* aux) {
  at::AutoGradMode grad_on(true);
  const int first = w.first_layer;
  const int n_blocks = static_cast<int>(w.layers.size()) - 1;  // the last layer is the head
  at::Tensor x = in;
  if (first > 0) x = in.detach().requires_grad_(true);
  RoutingTape routing;
  at::Tensor h = RunLayers(cfg, w, layout, x, first, n_blocks, {nullptr, nullptr, aux ? &routing : nullptr, nullptr});
  FusedResult r;
  // The auxiliary loss: this stage's sparse blocks complete the micro-batch's tally.
  std::vector<at::Tensor> prob_sums;
  at::Tensor aux_weights;
  if (aux) {
    for (const auto& [layer, d] : routing) {
      aux->tally->Add(aux->microbatch, d.counts, d.prob_sum, d.experts.size(0));
      prob_sums.push_back(d.prob_sum);
    }
    r.aux_loss = aux->tally->Loss(aux->microbatch);
    aux_weights = aux->tally->GradWeights(aux->microbatch, h.device(), aux->multiplier);
  }
  const std::vector<at::Tensor>& head = w.layers.back();
  at::Tensor hn = models::FinalNorm(cfg, head[0], h);
  const int64_t hidden = hn.size(-1);
  at::Tensor flat = hn.reshape({-1, hidden});
  models::HeadLossGrad lg =
      models::ChunkedHeadLossAndGrad(flat.detach(), head[1].detach(), labels.reshape({-1}), loss_scale, chunk_tokens,
                                     /*weight_grad=*/head[1].requires_grad());
  // Backpropagate through the final norm and the blocks (no graph: a frozen base and no adapter
  // here); the head weight's gradient was formed chunk by chunk and is added by hand.
  BackwardWithAux(flat, lg.grad_hidden, prob_sums, aux_weights);
  if (head[1].requires_grad()) AddGrad(head[1], lg.grad_weight);
  r.loss_sum = lg.loss_sum;
  r.tokens = lg.tokens;
  if (first > 0) r.grad_input = x.grad();
  return r;
}

models::HeadLoss EvalStage(const spec::ModelConfig& cfg, const StageWeights& w, const models::TokenLayout& layout,
                           const at::Tensor& in, const at::Tensor& labels, int64_t chunk_tokens) {
  at::NoGradGuard no_grad;
  const int n_blocks = static_cast<int>(w.layers.size()) - 1;  // the last layer is the head
  at::Tensor h = RunLayers(cfg, w, layout, in, w.first_layer, n_blocks);
  const std::vector<at::Tensor>& head = w.layers.back();
  at::Tensor hn = models::FinalNorm(cfg, head[0], h);
  return models::ChunkedHeadLoss(hn.reshape({-1, hn.size(-1)}), head[1], labels.reshape({-1}), chunk_tokens);
}

at::Tensor LastLogitsStage(const spec::ModelConfig& cfg, const StageWeights& w, const models::TokenLayout& layout,
                           const at::Tensor& in) {
  at::NoGradGuard no_grad;
  const int n_blocks = static_cast<int>(w.layers.size()) - 1;  // the last layer is the head
  at::Tensor h = RunLayers(cfg, w, layout, in, w.first_layer, n_blocks);
  const std::vector<at::Tensor>& head = w.layers.back();
  at::Tensor hn = models::FinalNorm(cfg, head[0], h.select(1, h.size(1) - 1));
  return at::matmul(hn, head[1].t()).to(at::kFloat);
}

Recomputed RecomputeStage(const spec::ModelConfig& cfg, const StageWeights& w, const models::TokenLayout& layout,
                          const at::Tensor& in, const RoutingTape* replay, bool router_probs) {
  at::AutoGradMode grad_on(true);
  const int first = w.first_layer;
  Recomputed r;
  at::Tensor x = in;
  if (first > 0) {
    x = in.detach().requires_grad_(true);
    r.input = x;
  }
  RoutingTape routing;
  r.output = RunLayers(cfg, w, layout, x, first, static_cast<int>(w.layers.size()),
                       {nullptr, nullptr, router_probs ? &routing : nullptr, replay});
  for (const auto& [layer, d] : routing) r.prob_sums.push_back(d.prob_sum);
  return r;
}

at::Tensor BackwardFromRecompute(const Recomputed& r, const at::Tensor& grad_out, const at::Tensor& aux_weights) {
  BackwardWithAux(r.output, grad_out, r.prob_sums, aux_weights);
  return r.input.defined() ? r.input.grad() : at::Tensor();
}

at::Tensor BackwardStage(const spec::ModelConfig& cfg, const StageWeights& w, const models::TokenLayout& layout,
                         const at::Tensor& in, const at::Tensor& grad_out, const RoutingTape* replay,
                         const at::Tensor& aux_weights) {
  return BackwardFromRecompute(RecomputeStage(cfg, w, layout, in, replay, aux_weights.defined()), grad_out,
                               aux_weights);
}

}  // namespace rp::workers
