// transformer_config.h — the Llama-3 / Qwen3 decoder family as the engine runs it: dense, or
// Qwen3-MoE (experts > 0: sparse blocks with a top-k router over SwiGLU experts).
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

struct RopeScaling {
  double factor = 0;  // 0 = no scaling; > 0: Llama-3 style ("rope_type": "llama3")
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_position = 8192;
};

// LoRA fine-tuning (PEFT's LoRA): y = x W^T + (alpha / rank) (x A^T) B^T on the target
// projections; the base stays frozen (master copy only), only A and B train.
struct LoraConfig {
  int rank = 0;  // 0 = full fine-tuning
  double alpha = 16;
  std::vector<std::string> targets;  // among q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
  bool Targets(const std::string& module) const;
};

struct TransformerConfig {
  std::string family = "llama";  // "llama" or "qwen3" (per-head q/k RMSNorm)
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

  bool is_moe() const { return num_experts > 0; }
  bool SparseBlock(int block) const;  // `block` 0-based
  int num_layers() const { return num_blocks + 2; }
  int head_layer() const { return num_blocks + 1; }
  absl::Status Validate() const;
};

}  // namespace rp::workers::models
