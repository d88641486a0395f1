// transformer_config.h — the decoder families the engine runs: Llama-3 / Qwen3 dense, Qwen3-MoE
// (experts > 0: sparse blocks with a top-k router over SwiGLU experts) and GPT-OSS (family
// "gpt_oss": attention sinks, sliding-window blocks, a biased router, clamped-SwiGLU experts).
//
// Contract: a plain value type; Validate() gives a clear error for impossible shapes.
// Engine layer indices: 0 = token embedding, 1..num_blocks = decoder blocks,
// num_blocks+1 = final RMSNorm + LM head + loss.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace rp::workers::models {

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

// LoRA fine-tuning (PEFT's LoRA): y = x W^T + (alpha / rank) (x A^T) B^T on the target
// projections; the base stays frozen (master copy only), only A and B train.
struct LoraConfig {
  int rank = 0;  // 0 = full fine-tuning
  double alpha = 16;
  // Among q_proj k_proj v_proj o_proj gate_proj up_proj down_proj (modules), and on a sparse
  // block's stacked experts experts.gate_up_proj, experts.down_proj (PEFT's target_parameters:
  // one adapter per expert, see layers.h ExpertLoraTargets).
  std::vector<std::string> targets;
  bool Targets(const std::string& module) const;
};

struct TransformerConfig {
  std::string family = "llama";  // "llama", "qwen3" (per-head q/k RMSNorm) or "gpt_oss"
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t intermediate = 0;
  int num_blocks = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int64_t head_dim = 0;
  double rope_theta = 10000;
  double rms_eps = 1e-6;
  bool qk_norm = false;  // Qwen3
  bool tied_embeddings = false;
  RopeScaling rope_scaling;
  LoraConfig lora;
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
  // to the last `sliding_window` positions only. Every block is sparse: a biased router (top-k
  // on the logits, softmax over the k selected) over experts with biases whose gate and up
  // columns interleave (x·W layout: gate_up [E, h, 2I], down [E, I, h]), and the clamped SwiGLU
  // (clamp(up, ±limit) + 1) · g·sigmoid(alpha·g) with g = min(gate, limit).
  bool attention_bias = false;
  int64_t sliding_window = 0;
  std::vector<int> sliding_layers;
  double swiglu_alpha = 1.702;
  double swiglu_limit = 7.0;

  bool gpt_oss() const { return family == "gpt_oss"; }
  bool SlidingBlock(int block) const;  // `block` 0-based
  bool is_moe() const { return num_experts > 0; }
  bool SparseBlock(int block) const;  // `block` 0-based
  int num_layers() const { return num_blocks + 2; }
  int head_layer() const { return num_blocks + 1; }
  absl::Status Validate() const;

 private:
  absl::Status ValidateGptOss() const;
};

}  // namespace rp::workers::models
