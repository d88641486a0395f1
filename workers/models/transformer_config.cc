#include "workers/models/transformer_config.h"

#include <algorithm>
#include <cmath>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace rp::workers::models {

absl::Status TransformerConfig::Validate() const {
  if (family != "llama" && family != "qwen3" && family != "gpt_oss") {
    return absl::InvalidArgumentError(absl::StrCat("model family '", family, "': expected llama, qwen3 or gpt_oss"));
  }
  if (vocab <= 0 || hidden <= 0 || intermediate <= 0 || num_blocks <= 0 || num_heads <= 0 || num_kv_heads <= 0 ||
      head_dim <= 0) {
    return absl::InvalidArgumentError(
        "model: vocab, hidden, intermediate, blocks, heads, kv heads and head_dim must be "
        "positive");
  }
  // Upper bounds far above any published decoder (Llama-3.1-405B: vocab 128256, hidden 16384,
  // intermediate 53248, 126 blocks, 128 heads): sizes from untrusted files stay far from overflow
  // in every product the engine and the planner form.
  struct Bound {
    const char* field;
    int64_t value, max;
  };
  for (const Bound& b : {Bound{"vocab", vocab, int64_t{1} << 24}, Bound{"hidden", hidden, int64_t{1} << 16},
                         Bound{"intermediate", intermediate, int64_t{1} << 20}, Bound{"num_blocks", num_blocks, 1024},
                         Bound{"num_heads", num_heads, 1024}, Bound{"num_kv_heads", num_kv_heads, 1024},
                         Bound{"head_dim", head_dim, 4096}}) {
    if (b.value > b.max) {
      return absl::InvalidArgumentError(absl::StrCat("model: ", b.field, " ", b.value, " is above the limit ", b.max));
    }
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: heads (", num_heads, ") must be a multiple of kv heads (", num_kv_heads, ")"));
  }
  if (head_dim % 2 != 0) return absl::InvalidArgumentError("model: head_dim must be even (rotary embedding)");
  if (lora.rank < 0 || (lora.rank > 0 && !(lora.alpha > 0 && std::isfinite(lora.alpha)))) {
    return absl::InvalidArgumentError("model: lora rank must be >= 0 and alpha a finite number > 0");
  }
  if (lora.rank > hidden) {
    return absl::InvalidArgumentError(absl::StrCat("model: lora rank ", lora.rank, " is above hidden (", hidden, ")"));
  }
  if (lora.rank > 0 && lora.targets.empty()) return absl::InvalidArgumentError("model: lora needs target modules");
  for (const std::string& t : lora.targets) {
    static const char* kModules[] = {"q_proj",           "k_proj",  "v_proj",    "o_proj",
                                     "gate_proj",        "up_proj", "down_proj", "experts.gate_up_proj",
                                     "experts.down_proj"};
    if (std::find(std::begin(kModules), std::end(kModules), t) == std::end(kModules)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: lora target '", t,
                       "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, "
                       "experts.gate_up_proj, experts.down_proj"));
    }
    if (lora.rank > 0 && t.rfind("experts.", 0) == 0 && num_experts == 0) {
      return absl::InvalidArgumentError(absl::StrCat("model: lora target '", t, "' needs a model with experts"));
    }
  }
  if (num_experts != 0 || experts_per_token != 0 || expert_intermediate != 0) {
    if (num_experts < 1 || num_experts > 4096) {
      return absl::InvalidArgumentError(absl::StrCat("model: num_experts ", num_experts, " must lie in 1..4096"));
    }
    if (experts_per_token < 1 || experts_per_token > num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("model: experts_per_token (num_experts_per_tok) ",
                                                     experts_per_token, " must lie in 1..", num_experts,
                                                     " (num_experts)"));
    }
    if (expert_intermediate < 1 || expert_intermediate > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError("model: expert_intermediate (moe_intermediate_size) must lie in 1..2^20");
    }
    if (decoder_sparse_step < 1 || decoder_sparse_step > num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: decoder_sparse_step ", decoder_sparse_step, " must lie in 1..", num_blocks));
    }
    for (int b : mlp_only_layers) {
      if (b < 0 || b >= num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("model: mlp_only_layers names block ", b, "; the model has blocks 0..", num_blocks - 1));
      }
    }
    if (family == "llama") return absl::InvalidArgumentError("model: experts need the qwen3 or gpt_oss family");
    for (const std::string& t : lora.targets) {
      if (lora.rank > 0 && (t == "gate_proj" || t == "up_proj" || t == "down_proj")) {
        return absl::InvalidArgumentError(
            absl::StrCat("model: lora target '", t,
                         "' on a mixture-of-experts model: target the experts as experts.gate_up_proj / "
                         "experts.down_proj (PEFT's target_parameters), or the attention projections"));
      }
    }
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError("model: rope_theta must be a finite number > 0");
  }
  if (!(rms_eps > 0) || !(rms_eps < 1)) return absl::InvalidArgumentError("model: rms_eps must lie in (0, 1)");
  if (absl::Status st = ValidateGptOss(); !st.ok()) return st;
  if (rope_scaling.factor != 0 && rope_scaling.yarn) {
    const RopeScaling& r = rope_scaling;
    for (double v : {r.factor, r.beta_fast, r.beta_slow, r.attention_factor}) {
      if (!(v > 0) || !std::isfinite(v)) {
        return absl::InvalidArgumentError(
            "model: yarn rope scaling needs finite factor, beta_fast, beta_slow and "
            "attention_factor > 0");
      }
    }
    if (r.original_max_position <= 0 || r.original_max_position > (int64_t{1} << 24)) {
      return absl::InvalidArgumentError("model: yarn rope scaling needs original_max_position in [1, 2^24]");
    }
  } else if (rope_scaling.factor != 0) {
    const RopeScaling& r = rope_scaling;
    if (!(r.factor > 0) || !std::isfinite(r.factor) || !(r.low_freq_factor > 0) || !std::isfinite(r.low_freq_factor) ||
        !(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor) ||
        r.original_max_position <= 0 || r.original_max_position > (int64_t{1} << 24)) {
      return absl::InvalidArgumentError(
          "model: rope scaling needs finite factor > 0, 0 < low_freq_factor < high_freq_factor and "
          "original_max_position in [1, 2^24]");
    }
  }
  if (!(router_aux_loss_coef >= 0) || !std::isfinite(router_aux_loss_coef) ||
      (router_aux_loss_coef > 0 && num_experts == 0)) {
    return absl::InvalidArgumentError(absl::StrCat("model: router_aux_loss_coef ", router_aux_loss_coef,
                                                   " must be a finite number >= 0, and 0 without experts"));
  }
  return absl::OkStatus();
}

absl::Status TransformerConfig::ValidateGptOss() const {
  if (!gpt_oss()) {
    if (attention_bias || sliding_window != 0 || !sliding_layers.empty()) {
      return absl::InvalidArgumentError(
          "model: attention biases and sliding-window attention are supported for the gpt_oss family only");
    }
    return absl::OkStatus();
  }
  if (num_experts == 0 || decoder_sparse_step != 1 || !mlp_only_layers.empty() || qk_norm) {
    return absl::InvalidArgumentError(
        "model: a gpt_oss model has experts in every block (num_local_experts > 0, no dense MLP layers) and no q/k "
        "norm");
  }
  if (sliding_window < 0 || sliding_window > (int64_t{1} << 24) || (!sliding_layers.empty() && sliding_window == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: sliding_window ", sliding_window, " must lie in 1..2^24 when a block slides"));
  }
  for (int b : sliding_layers) {
    if (b < 0 || b >= num_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("model: sliding layer ", b, " is not a block; the model has blocks 0..", num_blocks - 1));
    }
  }
  if (!(swiglu_alpha > 0) || !std::isfinite(swiglu_alpha) || !(swiglu_limit > 0) || !std::isfinite(swiglu_limit)) {
    return absl::InvalidArgumentError("model: swiglu_alpha and swiglu_limit must be finite numbers > 0");
  }
  return absl::OkStatus();
}

bool TransformerConfig::SlidingBlock(int block) const {
  return std::find(sliding_layers.begin(), sliding_layers.end(), block) != sliding_layers.end();
}

bool TransformerConfig::SparseBlock(int block) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), block) != mlp_only_layers.end()) return false;
  return (block + 1) % decoder_sparse_step == 0;
}

bool LoraConfig::Targets(const std::string& module) const {
  return rank > 0 && std::find(targets.begin(), targets.end(), module) != targets.end();
}

}  // namespace rp::workers::models
