// ModelConfig::Validate: one check per concern (the shape and its bounds, LoRA, experts, rope,
// GPT-OSS), each an InvalidArgument naming the field to fix.
#include <algorithm>
#include <cmath>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "workers/spec/model_config.h"

namespace rp::spec {
namespace {

absl::Status Invalid(absl::string_view message) { return absl::InvalidArgumentError(message); }

// Sizes positive and far below overflow. Upper bounds far above any published decoder
// (Llama-3.1-405B: vocab 128256, hidden 16384, intermediate 53248, 126 blocks, 128 heads): sizes
// from untrusted files stay far from overflow in every product the engine and the planner form.
// A model whose every block is sparse needs no dense MLP width (intermediate 0).
absl::Status ValidateShape(const ModelConfig& m) {
  const bool has_dense_block = m.SparseBlockCount() < m.num_blocks;
  if (m.vocab <= 0 || m.hidden <= 0 || m.intermediate < 0 || (has_dense_block && m.intermediate == 0) ||
      m.num_blocks <= 0 || m.num_heads <= 0 || m.num_kv_heads <= 0 || m.head_dim <= 0) {
    return Invalid(
        "model: vocab, hidden, intermediate (for dense blocks), blocks, heads, kv heads and head_dim must be "
        "positive");
  }
  struct Bound {
    const char* field;
    int64_t value, max;
  };
  for (const Bound& b : {Bound{"vocab", m.vocab, int64_t{1} << 24}, Bound{"hidden", m.hidden, int64_t{1} << 16},
                         Bound{"intermediate", m.intermediate, int64_t{1} << 20},
                         Bound{"num_blocks", m.num_blocks, 1024}, Bound{"num_heads", m.num_heads, 1024},
                         Bound{"num_kv_heads", m.num_kv_heads, 1024}, Bound{"head_dim", m.head_dim, 4096}}) {
    if (b.value > b.max) return Invalid(absl::StrCat("model: ", b.field, " ", b.value, " is above the limit ", b.max));
  }
  if (m.num_heads % m.num_kv_heads != 0) {
    return Invalid(
        absl::StrCat("model: heads (", m.num_heads, ") must be a multiple of kv heads (", m.num_kv_heads, ")"));
  }
  if (m.head_dim % 2 != 0) return Invalid("model: head_dim must be even (rotary embedding)");
  if (!(m.rope_theta > 0) || !std::isfinite(m.rope_theta))
    return Invalid("model: rope_theta must be a finite number > 0");
  if (!(m.rms_eps > 0) || !(m.rms_eps < 1)) return Invalid("model: rms_eps must lie in (0, 1)");
  return absl::OkStatus();
}

absl::Status ValidateLora(const ModelConfig& m) {
  const LoraSpec& lora = m.lora;
  if (lora.rank < 0 || (lora.rank > 0 && !(lora.alpha > 0 && std::isfinite(lora.alpha)))) {
    return Invalid("model: lora rank must be >= 0 and alpha a finite number > 0");
  }
  if (lora.rank > m.hidden) {
    return Invalid(absl::StrCat("model: lora rank ", lora.rank, " is above hidden (", m.hidden, ")"));
  }
  if (lora.rank > 0 && lora.targets.empty()) return Invalid("model: lora needs target modules");
  static const char* kModules[] = {"q_proj",           "k_proj",  "v_proj",    "o_proj",
                                   "gate_proj",        "up_proj", "down_proj", "experts.gate_up_proj",
                                   "experts.down_proj"};
  for (const std::string& t : lora.targets) {
    if (std::find(std::begin(kModules), std::end(kModules), t) == std::end(kModules)) {
      return Invalid(absl::StrCat("model: lora target '", t,
                                  "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, "
                                  "experts.gate_up_proj, experts.down_proj"));
    }
    if (lora.rank > 0 && t.rfind("experts.", 0) == 0 && m.num_experts == 0) {
      return Invalid(absl::StrCat("model: lora target '", t, "' needs a model with experts"));
    }
    if (lora.rank > 0 && m.is_moe() && (t == "gate_proj" || t == "up_proj" || t == "down_proj")) {
      return Invalid(absl::StrCat("model: lora target '", t,
                                  "' on a mixture-of-experts model: target the experts as experts.gate_up_proj / "
                                  "experts.down_proj (PEFT's target_parameters), or the attention projections"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateExperts(const ModelConfig& m) {
  if (!(m.router_aux_loss_coef >= 0) || !std::isfinite(m.router_aux_loss_coef) ||
      (m.router_aux_loss_coef > 0 && m.num_experts == 0)) {
    return Invalid(absl::StrCat("model: router_aux_loss_coef ", m.router_aux_loss_coef,
                                " must be a finite number >= 0, and 0 without experts"));
  }
  if (m.num_experts == 0 && m.experts_per_token == 0 && m.expert_intermediate == 0) return absl::OkStatus();
  if (m.num_experts < 1 || m.num_experts > 4096) {
    return Invalid(absl::StrCat("model: num_experts ", m.num_experts, " must lie in 1..4096"));
  }
  if (m.experts_per_token < 1 || m.experts_per_token > m.num_experts) {
    return Invalid(absl::StrCat("model: experts_per_token (num_experts_per_tok) ", m.experts_per_token,
                                " must lie in 1..", m.num_experts, " (num_experts)"));
  }
  if (m.expert_intermediate < 1 || m.expert_intermediate > (int64_t{1} << 20)) {
    return Invalid("model: expert_intermediate (moe_intermediate_size) must lie in 1..2^20");
  }
  if (m.decoder_sparse_step < 1 || m.decoder_sparse_step > m.num_blocks) {
    return Invalid(
        absl::StrCat("model: decoder_sparse_step ", m.decoder_sparse_step, " must lie in 1..", m.num_blocks));
  }
  for (int b : m.mlp_only_layers) {
    if (b < 0 || b >= m.num_blocks) {
      return Invalid(
          absl::StrCat("model: mlp_only_layers names block ", b, "; the model has blocks 0..", m.num_blocks - 1));
    }
  }
  if (m.family == "llama") return Invalid("model: experts need the qwen3 or gpt_oss family");
  return absl::OkStatus();
}

absl::Status ValidateRope(const RopeScaling& r) {
  if (r.factor == 0) return absl::OkStatus();
  if (r.yarn) {
    for (double v : {r.factor, r.beta_fast, r.beta_slow, r.attention_factor}) {
      if (!(v > 0) || !std::isfinite(v)) {
        return Invalid("model: yarn rope scaling needs finite factor, beta_fast, beta_slow and attention_factor > 0");
      }
    }
    if (r.original_max_position <= 0 || r.original_max_position > (int64_t{1} << 24)) {
      return Invalid("model: yarn rope scaling needs original_max_position in [1, 2^24]");
    }
    return absl::OkStatus();
  }
  if (!(r.factor > 0) || !std::isfinite(r.factor) || !(r.low_freq_factor > 0) || !std::isfinite(r.low_freq_factor) ||
      !(r.high_freq_factor > r.low_freq_factor) || !std::isfinite(r.high_freq_factor) || r.original_max_position <= 0 ||
      r.original_max_position > (int64_t{1} << 24)) {
    return Invalid(
        "model: rope scaling needs finite factor > 0, 0 < low_freq_factor < high_freq_factor and "
        "original_max_position in [1, 2^24]");
  }
  return absl::OkStatus();
}

absl::Status ValidateGptOss(const ModelConfig& m) {
  if (!m.gpt_oss()) {
    if (m.attention_bias || m.sliding_window != 0 || !m.sliding_layers.empty()) {
      return Invalid("model: attention biases and sliding-window attention are supported for the gpt_oss family only");
    }
    return absl::OkStatus();
  }
  if (m.num_experts == 0 || m.decoder_sparse_step != 1 || !m.mlp_only_layers.empty() || m.qk_norm) {
    return Invalid(
        "model: a gpt_oss model has experts in every block (num_local_experts > 0, no dense MLP layers) and no q/k "
        "norm");
  }
  if (m.sliding_window < 0 || m.sliding_window > (int64_t{1} << 24) ||
      (!m.sliding_layers.empty() && m.sliding_window == 0)) {
    return Invalid(
        absl::StrCat("model: sliding_window ", m.sliding_window, " must lie in 1..2^24 when a block slides"));
  }
  for (int b : m.sliding_layers) {
    if (b < 0 || b >= m.num_blocks) {
      return Invalid(
          absl::StrCat("model: sliding layer ", b, " is not a block; the model has blocks 0..", m.num_blocks - 1));
    }
  }
  if (!(m.swiglu_alpha > 0) || !std::isfinite(m.swiglu_alpha) || !(m.swiglu_limit > 0) ||
      !std::isfinite(m.swiglu_limit)) {
    return Invalid("model: swiglu_alpha and swiglu_limit must be finite numbers > 0");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelConfig::Validate() const {
  if (family != "llama" && family != "qwen3" && family != "gpt_oss") {
    return Invalid(
        absl::StrCat("model family '", family, "': expected llama, qwen3 (with experts: Qwen3-MoE) or gpt_oss"));
  }
  for (auto* check : {&ValidateShape, &ValidateLora, &ValidateExperts, &ValidateGptOss}) {
    if (absl::Status st = check(*this); !st.ok()) return st;
  }
  return ValidateRope(rope_scaling);
}

}  // namespace rp::spec
