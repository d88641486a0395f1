#include "scheduler/runtime/model_config_adapter.h"

#include "absl/strings/str_cat.h"

namespace rp::scheduler::runtime {

absl::StatusOr<workers::models::TransformerConfig> ToTransformerConfig(const planning::ModelConfig& m) {
  if (m.family != "llama" && m.family != "qwen3" && m.family != "qwen3_moe" && m.family != "gpt_oss") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model family '", m.family, "': the engine trains the llama, qwen3, qwen3_moe and gpt_oss families"));
  }
  if ((m.family == "qwen3_moe" || m.family == "gpt_oss") && !m.is_moe()) {
    return absl::InvalidArgumentError(absl::StrCat("model: the ", m.family, " family needs experts (num_experts > 0)"));
  }
  workers::models::TransformerConfig c;
  c.family = m.family == "qwen3_moe" ? "qwen3" : m.family;
  c.num_experts = m.num_experts;
  c.experts_per_token = m.active_experts;
  c.expert_intermediate = m.expert_intermediate;
  c.norm_topk_prob = m.norm_topk_prob;
  c.decoder_sparse_step = m.decoder_sparse_step;
  c.mlp_only_layers = m.mlp_only_layers;
  c.router_aux_loss_coef = m.router_aux_loss_coef;
  c.attention_bias = m.attention_bias;
  c.sliding_window = m.sliding_window;
  c.sliding_layers = m.sliding_layers;
  c.swiglu_alpha = m.swiglu_alpha;
  c.swiglu_limit = m.swiglu_limit;
  c.vocab = m.vocab;
  c.hidden = m.hidden;
  // A model whose every block is sparse has no dense MLP width (the 235B preset says 0); the
  // engine's config wants one, and no block uses it.
  c.intermediate = m.intermediate > 0 || m.SparseBlockCount() < m.num_blocks ? m.intermediate : m.expert_intermediate;
  c.num_blocks = m.num_blocks;
  c.num_heads = m.num_heads;
  c.num_kv_heads = m.num_kv_heads;
  c.head_dim = m.head_dim;
  c.rope_theta = m.rope_theta;
  c.rms_eps = m.rms_eps;
  c.qk_norm = m.qk_norm;
  c.tied_embeddings = m.tied_embeddings;
  const planning::RopeScalingSpec& r = m.rope_scaling;
  c.rope_scaling = {r.factor,    r.low_freq_factor, r.high_freq_factor, r.original_max_position, r.yarn,
                    r.beta_fast, r.beta_slow,       r.truncate,         r.attention_factor};
  c.lora.rank = m.lora.rank;
  c.lora.alpha = m.lora.alpha;
  if (m.lora.rank > 0) c.lora.targets = m.lora.targets;
  if (absl::Status st = c.Validate(); !st.ok()) return st;
  return c;
}

planning::ModelConfig FromTransformerConfig(const workers::models::TransformerConfig& c) {
  planning::ModelConfig m;
  m.name = c.family;
  m.family = c.is_moe() && !c.gpt_oss() ? "qwen3_moe" : c.family;
  m.num_experts = c.num_experts;
  m.active_experts = c.experts_per_token;
  m.expert_intermediate = c.expert_intermediate;
  m.norm_topk_prob = c.norm_topk_prob;
  m.decoder_sparse_step = c.decoder_sparse_step;
  m.mlp_only_layers = c.mlp_only_layers;
  m.router_aux_loss_coef = c.router_aux_loss_coef;
  m.attention_bias = c.attention_bias;
  m.sliding_window = c.sliding_window;
  m.sliding_layers = c.sliding_layers;
  m.swiglu_alpha = c.swiglu_alpha;
  m.swiglu_limit = c.swiglu_limit;
  m.vocab = c.vocab;
  m.hidden = c.hidden;
  m.intermediate = c.intermediate;
  m.num_blocks = c.num_blocks;
  m.num_heads = c.num_heads;
  m.num_kv_heads = c.num_kv_heads;
  m.head_dim = c.head_dim;
  m.rope_theta = c.rope_theta;
  m.rms_eps = c.rms_eps;
  m.qk_norm = c.qk_norm;
  m.tied_embeddings = c.tied_embeddings;
  const workers::models::RopeScaling& r = c.rope_scaling;
  m.rope_scaling = {r.factor,    r.low_freq_factor, r.high_freq_factor, r.original_max_position, r.yarn,
                    r.beta_fast, r.beta_slow,       r.truncate,         r.attention_factor};
  m.lora.rank = c.lora.rank;
  m.lora.alpha = c.lora.alpha;
  if (c.lora.rank > 0) m.lora.targets = c.lora.targets;
  return m;
}

}  // namespace rp::scheduler::runtime
