#include "workers/models/transformer_config.h"

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
  if (!(rope_theta > 0) || !(rms_eps > 0))
    return absl::InvalidArgumentError("model: rope_theta and rms_eps must be > 0");
  return absl::OkStatus();
}

}  // namespace rp::workers::models
