// model_config.h — the one description of a decoder-only LLM that every room reads: the planner
// and the simulator (sizes, parameter counts), the preset registry (scheduler/planning/presets.h),
// the daemon's job specs, config.json parsing and export, and the data plane that builds and
// trains the layers. Families: Llama-3 / Qwen3 dense, Qwen3-MoE (qwen3 with experts: sparse
// blocks, a top-k router over SwiGLU experts) and GPT-OSS (family "gpt_oss": attention sinks,
// sliding-window blocks, a biased router, clamped-SwiGLU experts); LoRA on chosen projections.
//
// Contract: plain value types, no I/O, no LibTorch, no allocation beyond std::string/vector;
// thread-safe to read from any thread. Validate() gives a clear InvalidArgument naming the field
// for a shape the engine cannot run, and bounds every size far above any published decoder so
// products of sizes from untrusted files never overflow. Parameter counts here are the only
// arithmetic ones; tests hold them equal to the engine's parameter layout
// (workers/models/layers.h ModelParams). Engine layer indices: 0 = token embedding, 1..num_blocks =
// decoder blocks, num_blocks + 1 = final RMSNorm + LM head + loss.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace rp::spec {

// Rope scaling, as transformers' rope_type "llama3" or "yarn"; factor 0 = none.
struct RopeScaling {
  double factor = 0;
  double low_freq_factor = 1;  // llama3: the band between low and high frequencies is interpolated
  double high_freq_factor = 4;
  int64_t original_max_position = 8192;
  bool yarn = false;      // YaRN (_compute_yarn_parameters): a linear ramp between the dimensions that
  double beta_fast = 32;  // make beta_fast and beta_slow rotations over original_max_position
  double beta_slow = 1;
  bool truncate = true;         // the ramp's ends rounded to whole dimensions
  double attention_factor = 1;  // cos and sin scaled by it (config.json's, else 0.1 ln(factor) + 1)
};

// LoRA fine-tuning (PEFT's LoRA): y = x W^T + (alpha / rank) (x A^T) B^T on `targets` among q_proj
// k_proj v_proj o_proj gate_proj up_proj down_proj, and experts.gate_up_proj experts.down_proj (a
// sparse block's stacked experts, PEFT's target_parameters: one adapter per expert, see
// workers/models/layers.h ExpertLoraTargets); the base stays frozen (master copy only), only
// A and B train. rank 0 = full fine-tuning (the targets are then ignored).
struct LoraSpec {
  int rank = 0;
  double alpha = 16;
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
  bool Targets(std::string_view module) const;
};

struct ModelConfig {
  std::string name;              // a preset's name, or what the job or config.json called it
  std::string family = "llama";  // "llama", "qwen3" (per-head q/k RMSNorm; with experts Qwen3-MoE) or "gpt_oss"
  int num_blocks = 0;            // decoder blocks (the partitioner also sees embedding + head)
  int64_t hidden = 0;            // model width h
  int64_t intermediate = 0;      // dense MLP width (0 when every block is sparse)
  int num_heads = 0;
  int num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  bool tied_embeddings = false;
  bool qk_norm = false;  // Qwen3: RMSNorm over each head's q and k
  double rope_theta = 10000;
  double rms_eps = 1e-6;
  RopeScaling rope_scaling;
  LoraSpec lora;  // rank > 0: adapters train, the base stays frozen
  // Mixture of experts (Qwen3-MoE, transformers' Qwen3MoeSparseMoeBlock); 0 experts = dense. A
  // sparse block routes each token to `experts_per_token` of `num_experts` SwiGLU experts of
  // width `expert_intermediate` (softmax over experts in fp32, top-k, renormalised when
  // norm_topk_prob); block i (0-based) is sparse unless listed in mlp_only_layers or
  // (i + 1) % decoder_sparse_step != 0, and dense blocks use `intermediate`.
  int num_experts = 0;
  int experts_per_token = 0;
  int64_t expert_intermediate = 0;
  bool norm_topk_prob = true;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  // The router's auxiliary load-balancing loss (transformers' load_balancing_loss_func over all
  // sparse blocks of a micro-batch, times this coefficient, added to the loss with its
  // gradient); 0 = off.
  double router_aux_loss_coef = 0;
  // GPT-OSS (transformers' GptOssForCausalLM): q/k/v/o biases when attention_bias; a learned sink
  // logit per head in every attention softmax; blocks listed in sliding_layers (0-based) attend
  // to the last `sliding_window` positions only (0 = full causal attention everywhere). Every
  // block is sparse: a biased router (top-k on the logits, softmax over the k selected) over
  // experts with biases whose gate and up columns interleave (x·W layout: gate_up [E, h, 2I],
  // down [E, I, h]), and the clamped SwiGLU (clamp(up, ±limit) + 1) · g·sigmoid(alpha·g) with
  // g = min(gate, limit).
  bool attention_bias = false;
  int64_t sliding_window = 0;
  std::vector<int> sliding_layers;
  double swiglu_alpha = 1.702;
  double swiglu_limit = 7.0;

  // InvalidArgument naming the field when the engine cannot run this shape (see the contract).
  absl::Status Validate() const;
  bool is_moe() const { return num_experts > 0; }
  bool gpt_oss() const { return family == "gpt_oss"; }
  bool SlidingBlock(int block) const;
  int num_layers() const { return num_blocks + 2; }  // embedding, blocks, head
  int head_layer() const { return num_blocks + 1; }
  // Base parameters of one decoder block (a sparse one in an MoE model) / of block `block`
  // (0-based: dense or sparse) / of the embedding / of the LM head (+ final norm).
  int64_t BlockParams() const;
  int64_t BlockParams(int block) const;
  int64_t DenseBlockParams() const;  // a block with the dense MLP (`intermediate` wide)
  bool SparseBlock(int block) const;
  int SparseBlockCount() const;  // without visiting every block (sizes come from clients)
  int64_t EmbeddingParams() const { return vocab * hidden; }
  int64_t HeadParams() const { return (tied_embeddings ? 0 : vocab * hidden) + hidden; }
  int64_t TotalParams() const;  // base parameters (tied embedding once), adapters excluded
  // Trainable LoRA parameters of one block on its projections (0 without LoRA) / of block
  // `block`, a sparse one's expert adapters included (experts.* targets: r·E·(in + out) each) /
  // of the whole model.
  int64_t BlockLoraParams() const;
  int64_t BlockLoraParams(int block) const;
  int64_t LoraParams() const;
  // One expert's (in, out) features for each targeted stacked expert tensor.
  std::vector<std::pair<int64_t, int64_t>> ExpertLoraShapes() const;
  // Parameters of engine layer l (0 = embedding, 1..num_blocks, head) including its adapters.
  int64_t LayerParams(int l) const;
};

}  // namespace rp::spec
