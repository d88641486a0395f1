#include "workers/models/presets.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rp::workers::models {

std::vector<std::string> TransformerPresetNames() {
  return {"llama-tiny", "qwen3-tiny", "qwen3-1.7b", "llama-3.1-8b", "qwen3-32b"};
}

absl::StatusOr<TransformerConfig> TransformerPreset(const std::string& name_in) {
  const std::string name = absl::AsciiStrToLower(name_in);
  TransformerConfig c;
  if (name == "llama-tiny" || name == "qwen3-tiny") {
    // Byte-level (vocab 256) models small enough to train on a laptop CPU in minutes.
    c.family = name == "qwen3-tiny" ? "qwen3" : "llama";
    c.qk_norm = c.tied_embeddings = name == "qwen3-tiny";
    c.vocab = 256;
    c.hidden = 128;
    c.intermediate = 352;
    c.num_blocks = 4;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 32;
    c.rope_theta = 10000;
    c.rms_eps = 1e-6;
    return c;
  }
  if (name == "qwen3-1.7b" || name == "qwen3-32b") {  // published Qwen3 configs
    const bool big = name == "qwen3-32b";
    c.family = "qwen3";
    c.qk_norm = true;
    c.tied_embeddings = !big;
    c.vocab = 151936;
    c.hidden = big ? 5120 : 2048;
    c.intermediate = big ? 25600 : 6144;
    c.num_blocks = big ? 64 : 28;
    c.num_heads = big ? 64 : 16;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.rope_theta = 1000000;
    c.rms_eps = 1e-6;
    return c;
  }
  if (name == "llama-3.1-8b") {
    c.family = "llama";
    c.vocab = 128256;
    c.hidden = 4096;
    c.intermediate = 14336;
    c.num_blocks = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.rope_theta = 500000;
    c.rms_eps = 1e-5;
    c.rope_scaling = {8.0, 1.0, 4.0, 8192};
    return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown preset '", name_in, "'; known: ", absl::StrJoin(TransformerPresetNames(), ", ")));
}

}  // namespace rp::workers::models
