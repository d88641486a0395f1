// layers.h — the model as pure functions of (weights, inputs): token embedding, decoder block
// (RMSNorm, GQA attention with RoPE incl. Llama-3 and YaRN scaling, Qwen3 q/k-norm, causal mask,
// SwiGLU MLP or experts, residuals; GPT-OSS's parts in gpt_oss.h) and the head (final RMSNorm + LM head + cross-entropy
// in token chunks, so the full-vocabulary logits never exist).
//
// Contract: stateless and thread-safe; weights are passed per call in LayerParams() order.
// Autograd is whatever the caller's GradMode says (forward stages run without it).
// Parameter names follow Hugging Face (model.layers.N.self_attn.q_proj.weight, ...).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "workers/spec/model_config.h"

namespace rp::workers::models {

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool is_norm = false;  // initialised to ones
  int lora = 0;          // 0: a base weight; 1: a LoRA A [r, in]; 2: a LoRA B [out, r] (zeros)
};

// The projections LoRA may target, in the order their adapters follow a block's base weights.
const std::vector<std::string>& LoraModules();

// LoRA on a sparse block's stacked experts, as PEFT's target_parameters (peft >= 0.17) lays it
// out: for target experts.gate_up_proj or experts.down_proj one A [r·E, in] whose rows are expert
// by expert (expert e: rows e·r .. e·r + r) and one B [out, r·E] whose columns are rank by rank
// (expert e: columns j·E + e). Expert e's map in -> out becomes W_e + (alpha/r)·B_e·A_e. Named as
// PEFT names them: with both targets the gate_up adapter is under "experts.base_layer." (PEFT
// wraps that parameter first), otherwise under "experts.".
struct ExpertLora {
  std::string target;       // experts.gate_up_proj or experts.down_proj
  std::string base;         // the stacked parameter it adapts
  std::string a, b;         // the adapters' names
  int64_t in = 0, out = 0;  // one expert's features
};
// The expert adapters of block `block` (0-based) in LayerParams order; empty for a dense block.
std::vector<ExpertLora> ExpertLoraTargets(const spec::ModelConfig& cfg, int block);
// Every expert's (alpha/r)·B_e·A_e in its base tensor's layout ([E, out, in]; GPT-OSS [E, in, out]).
at::Tensor ExpertLoraDelta(const spec::ModelConfig& cfg, const at::Tensor& a, const at::Tensor& b);

// Parameters of engine layer `layer` in the order the forward functions take them. With tied
// embeddings the head lists model.embed_tokens.weight (the same parameter as layer 0). With LoRA
// a block's adapters (A then B per targeted module, LoraModules() order, then ExpertLoraTargets)
// follow its base weights, named like PEFT's: model.layers.0.self_attn.q_proj.lora_A.weight.
std::vector<ParamSpec> LayerParams(const spec::ModelConfig& cfg, int layer);
// Every parameter of the model in engine order (layer by layer), a tied one once: what a
// HostModelStore holds, known without allocating it.
std::vector<ParamSpec> ModelParams(const spec::ModelConfig& cfg);

// Rotary tables for positions 0..seq-1: cos and sin of shape [seq, head_dim] (fp32).
struct Rope {
  at::Tensor cos, sin;
};
Rope MakeRope(const spec::ModelConfig& cfg, int64_t seq, c10::Device device);

// Where the tokens of a micro-batch sit and what they may see. From a Rope alone: every row at
// positions 0..s-1 under the causal mask. From per-token positions (packed documents): the
// rotary tables gathered at each token's position, and attention confined to the token's own
// document — a document starts wherever the position is 0.
struct TokenLayout {
  TokenLayout(Rope r) : rope(std::move(r)) {}  // NOLINT(google-explicit-constructor): the plain case
  Rope rope;                                   // cos/sin [s, d], or [b, 1, s, d] gathered per token
  at::Tensor attn_mask;                        // undefined: causal; else [b, 1, s, s] bool, true = may attend
};
// `table` must cover positions 0..s-1 (MakeRope(cfg, s)); `positions` [b, s] int64, each row
// 0 at its start and at every document start, else the previous position + 1 (checked by the
// caller: Controller::ValidateBatch).
TokenLayout DocumentLayout(const Rope& table, const at::Tensor& positions);

// tokens [b, s] int64 -> hidden [b, s, h] in the weight's dtype.
at::Tensor EmbeddingForward(const at::Tensor& weight, const at::Tensor& tokens);

// What a sparse block's router decided for T tokens, kept for recompute fidelity (ARCHITECTURE §10):
// the forward records it and the backward's recompute replays it instead of routing again, so
// the recompute can never pick other experts (bf16 ties, another device's kernels) and needs no
// host synchronisation to count tokens per expert.
struct RoutingDecision {
  at::Tensor experts;   // [T, k] int64 on the block's device, in top-k order
  at::Tensor counts;    // [E] int64 on the host: token-expert pairs per expert
  at::Tensor prob_sum;  // [E] fp32: the router's softmax summed over the T tokens, only when the
                        // model has an auxiliary loss (not packed; under autograd it carries the graph)
};
// Host form, for the activation store: int32 [E + T*k], the counts then the experts row-major.
at::Tensor PackRouting(const RoutingDecision& d);
// The inverse; both tensors on the host. Refuses (std::invalid_argument) a tensor whose size is
// not E + T*k for the given E and k, or whose counts do not add up to T*k.
RoutingDecision UnpackRouting(const at::Tensor& packed, int64_t num_experts, int64_t experts_per_token);

// Decoder block `block` (0-based: it decides dense or sparse, full or sliding attention):
// x [b, s, h] -> [b, s, h]; w in LayerParams(cfg, block + 1) order. A sparse block routes with
// `replay` when given (its experts on x's device), else live; `record`, when given, receives the
// routing used. Dense blocks ignore both.
at::Tensor BlockForward(const spec::ModelConfig& cfg, int block, const std::vector<at::Tensor>& w, const at::Tensor& x,
                        const TokenLayout& layout, const RoutingDecision* replay = nullptr,
                        RoutingDecision* record = nullptr);

// A sparse block's routing of x [.., h] (T tokens): per token the top-k experts [T, k] (int64)
// and their weights [T, k] (the router's dtype), as transformers' Qwen3MoeTopKRouter: softmax
// over the experts in fp32, top-k, renormalised when norm_topk_prob. With `replay` the experts
// are replay's and the weights are the same softmax gathered at them (bit-equal to top-k's
// values, with the same gradient); counts are replay's too.
struct MoeRouting {
  at::Tensor weights;
  at::Tensor experts;
  at::Tensor counts;  // [E] int64 on the host
  at::Tensor probs;   // [T, E] fp32: the router's softmax (with its graph under autograd)
};
MoeRouting RouteTokens(const spec::ModelConfig& cfg, const at::Tensor& router_weight, const at::Tensor& x,
                       const RoutingDecision* replay = nullptr);
// A sparse block's expert adapters (ExpertLoraTargets), undefined where not targeted.
struct ExpertAdapters {
  at::Tensor gate_up_a, gate_up_b, down_a, down_b;
};
// The experts' output for x [.., h] under `routing`: tokens grouped by expert (one gather, one
// grouped GEMM per stacked weight where the device runs it — else a GEMM pair per expert on its
// rows —, one weighted scatter-add), never a dense all-experts pass.
// gate_up [E, 2I, h] (gate rows first), down [E, h, I]; `lora` adds each expert's adapters.
// Whether the experts' products run as grouped GEMMs (at::_grouped_mm) on this device and dtype
// (probed once, forward and backward; expert_groups.h). Any thread; for reports and benchmarks.
bool GroupedExpertGemmRuns(const at::TensorOptions& options);
at::Tensor MoeExperts(const spec::ModelConfig& cfg, const at::Tensor& gate_up, const at::Tensor& down,
                      const at::Tensor& x, const MoeRouting& routing, const ExpertAdapters& lora = {});

// The final RMSNorm (differentiable), applied before the chunked head.
at::Tensor FinalNorm(const spec::ModelConfig& cfg, const at::Tensor& norm_weight, const at::Tensor& x);

// Cross-entropy of the LM head over `hn` [T, h] (the normed hidden states, no autograd) and
// `labels` [T] (int64, -100 = ignored), in chunks of `chunk` tokens. Returns the summed loss and
// the gradients of (sum of CE) * `scale` with respect to hn and the head weight [V, h]; logits
// exist one chunk at a time, in fp32.
struct HeadLossGrad {
  double loss_sum = 0;     // unscaled sum over non-ignored tokens
  int64_t tokens = 0;      // non-ignored tokens
  at::Tensor grad_hidden;  // [T, h], dtype of hn
  at::Tensor grad_weight;  // [V, h], fp32 (undefined when not asked for)
};
// `weight_grad` false (a frozen head, e.g. LoRA): the weight-gradient GEMM is skipped.
HeadLossGrad ChunkedHeadLossAndGrad(const at::Tensor& hn, const at::Tensor& weight, const at::Tensor& labels,
                                    double scale, int64_t chunk = 4096, bool weight_grad = true);

// The summed cross-entropy of the LM head over `hn` [T, h] and `labels` [T] in chunks, without
// any gradient (evaluation): the loss_sum and tokens of ChunkedHeadLossAndGrad, nothing else.
struct HeadLoss {
  double loss_sum = 0;
  int64_t tokens = 0;
};
HeadLoss ChunkedHeadLoss(const at::Tensor& hn, const at::Tensor& weight, const at::Tensor& labels,
                         int64_t chunk = 4096);

// Next-token labels for tokens [b, s]: labels[:, t] = tokens[:, t+1], the last position -100.
at::Tensor ShiftLabels(const at::Tensor& tokens);

inline constexpr int64_t kIgnoreIndex = -100;

}  // namespace rp::workers::models
