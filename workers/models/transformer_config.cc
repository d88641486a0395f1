#include "workers/models/transformer_config.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"

namespace rp::workers::models {

absl::Status TransformerConfig::Validate() const {
  if (family != "llama" && family != "qwen3") {
    return absl::InvalidArgumentError(absl::StrCat("model family '", family, "': expected llama or qwen3"));
  }
  if (vocab <= 0 || hidden <= 0 || intermediate <= 0 || num_blocks <= 0 || num_heads <= 0 || num_kv_heads <= 0 ||
      head_dim <= 0) {
    return absl::InvalidArgumentError(
        "model: vocab, hidden, intermediate, blocks, heads, kv heads and head_dim must be "
        "positive");
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: heads (", num_heads, ") must be a multiple of kv heads (", num_kv_heads, ")"));
  }
  if (head_dim % 2 != 0) return absl::InvalidArgumentError("model: head_dim must be even (rotary embedding)");
  if (lora.rank < 0 || (lora.rank > 0 && !(lora.alpha > 0))) {
    return absl::InvalidArgumentError("model: lora rank must be >= 0 and alpha > 0");
  }
  if (lora.rank > 0 && lora.targets.empty()) return absl::InvalidArgumentError("model: lora needs target modules");
  for (const std::string& t : lora.targets) {
    static const char* kModules[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
    if (std::find(std::begin(kModules), std::end(kModules), t) == std::end(kModules)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model: lora target '", t, "' is not one of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"));
    }
  }
  if (!(rope_theta > 0) || !(rms_eps > 0))
    return absl::InvalidArgumentError("model: rope_theta and rms_eps must be > 0");
  return absl::OkStatus();
}

bool LoraConfig::Targets(const std::string& module) const {
  return rank > 0 && std::find(targets.begin(), targets.end(), module) != targets.end();
}

}  // namespace rp::workers::models
