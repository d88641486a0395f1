// stage_compute.h — the math of the three stage kinds for ONE micro-batch on a device:
// forward (no autograd, emits the stage output and the requested checkpoints), fused B_1
// (forward with autograd + chunked loss + backward, no recompute) and backward (recompute from
// the checkpoint with autograd, then backward with the upstream gradient); and for evaluation
// the loss stage that takes B_1's place (forward + chunked loss, no autograd).
//
// Contract: pure functions of (weights, inputs); weight gradients accumulate into the
// weights' .grad() (the caller uploads leaf tensors with requires_grad for fused/backward and
// downloads .grad() after the round). Safe to call concurrently on distinct weight tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <utility>
#include <vector>

#include "workers/models/layers.h"
#include "workers/router_aux.h"
#include "workers/spec/model_config.h"

namespace rp::workers {

// Weights of the stage's layers, layer by layer (LayerParams order); tied tensors are shared.
struct StageWeights {
  int first_layer = 0;
  std::vector<std::vector<at::Tensor>> layers;
};

// The routing of a stage's sparse blocks for one micro-batch, by engine layer (recompute
// fidelity: a forward stage records it, the backward stage that recomputes those layers replays it).
using RoutingTape = std::map<int, models::RoutingDecision>;

// Runs layers [first, first+n) on `in` (token ids when first == 0, else hidden states).
// `save_inputs_of` lists layers l in (first, first+n] whose input is also returned.
// Returns (layer, tensor) pairs: the requested checkpoints and (layer first+n, the output).
// `record`, when given, receives every sparse block's routing.
std::vector<std::pair<int, at::Tensor>> ForwardStage(const spec::ModelConfig& cfg, const StageWeights& w,
                                                     const models::TokenLayout& layout, const at::Tensor& in,
                                                     const std::vector<int>& save_inputs_of,
                                                     RoutingTape* record = nullptr);

// The router's auxiliary loss (router_aux.h) as one micro-batch's fused stage sees it: the
// stage tallies its sparse blocks, then adds the loss's gradient (× multiplier) to its backward.
struct RouterAux {
  RouterAuxTally* tally = nullptr;
  int microbatch = 0;
  double multiplier = 1;  // the gradient multiplier (dynamic fp16 loss scale), as for the CE
};

struct FusedResult {
  at::Tensor grad_input;  // undefined when the stage starts at layer 0
  double loss_sum = 0;    // unscaled CE sum
  int64_t tokens = 0;
  double aux_loss = 0;  // the micro-batch's coef / M · aux when `aux` was given
};
// B_1: layers [first, L) including the head, on `in` and `labels` [b, s].
FusedResult FusedStage(const spec::ModelConfig& cfg, const StageWeights& w, const models::TokenLayout& layout,
                       const at::Tensor& in, const at::Tensor& labels, double loss_scale, int64_t chunk_tokens,
                       const RouterAux* aux = nullptr);

// Evaluation (no autograd, no gradients): layers [first, L) including the head on `in` and
// `labels`; the unscaled CE sum and the tokens it counts.
models::HeadLoss EvalStage(const spec::ModelConfig& cfg, const StageWeights& w, const models::TokenLayout& layout,
                           const at::Tensor& in, const at::Tensor& labels, int64_t chunk_tokens);
// Generation (no autograd): layers [first, L) including the head on `in`, and only each row's
// last position through the head: [rows, vocab] logits in fp32.
at::Tensor LastLogitsStage(const spec::ModelConfig& cfg, const StageWeights& w, const models::TokenLayout& layout,
                           const at::Tensor& in);

// B_j in two steps, so that the recompute can run before the upstream gradient arrived: the
// recompute of layers [first, first+n) from the checkpoint `in` with autograd (the graph lives in
// the result), then the backward of that graph with `grad_out`, returning the gradient of the
// stage input (undefined when first == 0). The two may run on different threads. With `replay`
// every sparse block of the stage routes as recorded (it must hold each of them); without it
// they route live. `router_probs`: keep each sparse block's softmax sums (with their graph) for
// the auxiliary loss; `aux_weights` ([E], RouterAuxTally::GradWeights) then adds its gradient.
struct Recomputed {
  at::Tensor input;                   // the checkpoint as a leaf that requires grad (first > 0), else undefined
  at::Tensor output;                  // the stage output, carrying the graph
  std::vector<at::Tensor> prob_sums;  // per sparse block, when asked for
};
Recomputed RecomputeStage(const spec::ModelConfig& cfg, const StageWeights& w, const models::TokenLayout& layout,
                          const at::Tensor& in, const RoutingTape* replay = nullptr, bool router_probs = false);
at::Tensor BackwardFromRecompute(const Recomputed& r, const at::Tensor& grad_out, const at::Tensor& aux_weights = {});

// B_j in one call: RecomputeStage then BackwardFromRecompute.
at::Tensor BackwardStage(const spec::ModelConfig& cfg, const StageWeights& w, const models::TokenLayout& layout,
                         const at::Tensor& in, const at::Tensor& grad_out, const RoutingTape* replay = nullptr,
                         const at::Tensor& aux_weights = {});

}  // namespace rp::workers
