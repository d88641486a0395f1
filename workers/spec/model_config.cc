#include "workers/spec/model_config.h"

#include <algorithm>

namespace rp::spec {

bool ModelConfig::SlidingBlock(int block) const {
  return sliding_window > 0 && std::find(sliding_layers.begin(), sliding_layers.end(), block) != sliding_layers.end();
}

bool LoraSpec::Targets(std::string_view module) const {
  return rank > 0 && std::find(targets.begin(), targets.end(), module) != targets.end();
}

int64_t ModelConfig::BlockParams() const {
  const int64_t q = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv = static_cast<int64_t>(num_kv_heads) * head_dim;
  int64_t attn = hidden * q + 2 * hidden * kv + q * hidden + (qk_norm ? 2 * head_dim : 0);
  if (attention_bias) attn += q + 2 * kv + hidden;
  int64_t mlp =
      is_moe() ? num_experts * 3 * hidden * expert_intermediate + hidden * num_experts : 3 * hidden * intermediate;
  if (gpt_oss()) {  // sinks; router bias; expert biases
    attn += num_heads;
    mlp += num_experts + num_experts * (2 * expert_intermediate + hidden);
  }
  return attn + mlp + 2 * hidden /*norms*/;
}

bool ModelConfig::SparseBlock(int block) const {
  if (!is_moe()) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), block) != mlp_only_layers.end()) return false;
  return (block + 1) % std::max(1, decoder_sparse_step) == 0;
}

int ModelConfig::SparseBlockCount() const {
  if (!is_moe() || num_blocks <= 0) return 0;
  const int step = std::max(1, decoder_sparse_step);
  int count = num_blocks / step;
  std::vector<int> dense = mlp_only_layers;
  std::sort(dense.begin(), dense.end());
  dense.erase(std::unique(dense.begin(), dense.end()), dense.end());
  for (int b : dense) count -= b >= 0 && b < num_blocks && (b + 1) % step == 0;
  return count;
}

int64_t ModelConfig::DenseBlockParams() const {
  ModelConfig dense = *this;
  dense.num_experts = 0;
  return dense.BlockParams();
}

int64_t ModelConfig::BlockParams(int block) const { return SparseBlock(block) ? BlockParams() : DenseBlockParams(); }

int64_t ModelConfig::TotalParams() const {
  const int64_t sparse = SparseBlockCount();
  return EmbeddingParams() + sparse * BlockParams() + (num_blocks - sparse) * DenseBlockParams() + HeadParams();
}

int64_t ModelConfig::BlockLoraParams() const {
  if (lora.rank <= 0) return 0;
  const int64_t q = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv = static_cast<int64_t>(num_kv_heads) * head_dim;
  const int64_t inter = is_moe() ? expert_intermediate : intermediate;
  // Adapter A (rank x in) + B (out x rank) per target projection.
  int64_t n = 0;
  for (const std::string& t : lora.targets) {
    if (t.rfind("experts.", 0) == 0) continue;  // ExpertLoraShapes
    const int64_t in = t == "o_proj" ? q : t == "down_proj" ? inter : hidden;
    const int64_t out = t == "q_proj"                          ? q
                        : (t == "k_proj" || t == "v_proj")     ? kv
                        : (t == "gate_proj" || t == "up_proj") ? inter
                                                               : hidden;
    n += lora.rank * (in + out);
  }
  return n;
}

std::vector<std::pair<int64_t, int64_t>> ModelConfig::ExpertLoraShapes() const {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (lora.rank <= 0 || !is_moe()) return out;
  if (lora.Targets("experts.gate_up_proj")) out.emplace_back(hidden, 2 * expert_intermediate);
  if (lora.Targets("experts.down_proj")) out.emplace_back(expert_intermediate, hidden);
  return out;
}

namespace {
// The expert adapters of one sparse block: A [r·E, in] and B [out, r·E] per targeted tensor.
int64_t ExpertAdapterParams(const ModelConfig& m) {
  int64_t n = 0;
  for (const auto& [in, out] : m.ExpertLoraShapes())
    n += static_cast<int64_t>(m.lora.rank) * m.num_experts * (in + out);
  return n;
}
}  // namespace

int64_t ModelConfig::BlockLoraParams(int block) const {
  return BlockLoraParams() + (SparseBlock(block) ? ExpertAdapterParams(*this) : 0);
}

int64_t ModelConfig::LoraParams() const {
  return num_blocks * BlockLoraParams() + SparseBlockCount() * ExpertAdapterParams(*this);
}

int64_t ModelConfig::LayerParams(int l) const {
  if (l == 0) return EmbeddingParams();
  if (l == num_layers() - 1) return HeadParams();
  return BlockParams(l - 1) + BlockLoraParams(l - 1);
}

}  // namespace rp::spec
