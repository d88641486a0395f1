#include "scheduler/planning/host_state.h"

#include <algorithm>
#include <string>

namespace rp::planning {

int64_t AdafactorStateElements(const spec::ModelConfig& m) {
  const int64_t h = m.hidden;
  const int64_t q = static_cast<int64_t>(m.num_heads) * m.head_dim;
  const int64_t kv = static_cast<int64_t>(m.num_kv_heads) * m.head_dim;
  int64_t block = 0;
  if (m.lora.rank <= 0) {
    int64_t attention = (q + h) + 2 * (kv + h) + (h + q) + (m.qk_norm ? 2 * m.head_dim : 0) + 2 * h /*norms*/;
    if (m.attention_bias) attention += q + 2 * kv + h;  // bias vectors
    // A sparse block: the router [E, h] and the stacked experts [E, 2I, h], [E, h, I] (E a batch).
    const int64_t i = m.expert_intermediate, e = m.num_experts, sparse = m.SparseBlockCount();
    int64_t sparse_block = (e + h) + e * (2 * i + h) + e * (h + i);
    if (m.gpt_oss()) {  // sinks [H]; router bias [E]; expert biases [E, 2I] and [E, h] (matrices)
      attention += m.num_heads;
      sparse_block += e + (e + 2 * i) + (e + h);
    }
    const int64_t blocks =
        m.num_blocks * attention + sparse * sparse_block + (m.num_blocks - sparse) * 3 * (m.intermediate + h);
    const int64_t embedding = m.vocab + h;
    const int64_t head = (m.tied_embeddings ? 0 : m.vocab + h) + h;
    return embedding + blocks + head;
  } else {
    const int64_t inter = m.is_moe() ? m.expert_intermediate : m.intermediate;
    const int64_t r = m.lora.rank;
    for (const std::string& t : m.lora.targets) {  // A [r, in], B [out, r]
      if (t.rfind("experts.", 0) == 0) continue;
      const int64_t in = t == "o_proj" ? q : t == "down_proj" ? inter : h;
      const int64_t out = t == "q_proj"                          ? q
                          : (t == "k_proj" || t == "v_proj")     ? kv
                          : (t == "gate_proj" || t == "up_proj") ? inter
                                                                 : h;
      block += (r + in) + (out + r);
    }
    int64_t experts = 0;  // A [r·E, in], B [out, r·E]
    for (const auto& [in, out] : m.ExpertLoraShapes()) experts += (r * m.num_experts + in) + (out + r * m.num_experts);
    return static_cast<int64_t>(m.num_blocks) * block + m.SparseBlockCount() * experts;
  }
}

namespace {
// The model's parameters (embedding, dense and sparse blocks, head), in double.
double ModelParams(const spec::ModelConfig& m) {
  const double sparse = m.SparseBlockCount();
  return static_cast<double>(m.EmbeddingParams()) + sparse * static_cast<double>(m.BlockParams()) +
         (m.num_blocks - sparse) * static_cast<double>(m.DenseBlockParams()) + static_cast<double>(m.HeadParams());
}

// `bytes` as int64, saturated below INT64_MAX (9.22e18); NaN saturates too.
int64_t Saturated(double bytes) {
  constexpr double kMax = 9.0e18;
  return !(bytes < kMax) ? static_cast<int64_t>(kMax) : static_cast<int64_t>(bytes);
}
}  // namespace

double StateShare(const spec::ModelConfig& m, const HostStateOptions& o) {
  if (o.state_shards <= 1) return 1.0;
  // The largest trained parameter is bounded by the largest thing that holds it: the embedding
  // or head matrix for a full fine-tune, a block's adapters for LoRA.
  double largest = 0, trained = 0;
  if (m.lora.rank > 0) {
    for (int b = 0; b < m.num_blocks; ++b) largest = std::max(largest, static_cast<double>(m.BlockLoraParams(b)));
    trained = static_cast<double>(m.LoraParams());
  } else {
    largest = static_cast<double>(std::max(m.EmbeddingParams(), m.HeadParams()));
    for (int b = 0; b < m.num_blocks; ++b) largest = std::max(largest, static_cast<double>(m.BlockParams(b)));
    trained = ModelParams(m);
  }
  if (trained <= 0) return 1.0;
  return std::min(1.0, 1.0 / o.state_shards + largest / trained);
}

int64_t HostStateBytes(const spec::ModelConfig& m, const HostStateOptions& o) {
  // In double: sizes come from clients and files.
  const double base = ModelParams(m);
  // A trained parameter: fp32 copy, master, fp32 gradient, moments (this node's share of them),
  // the async gradient copy; factored moments (Adafactor) are counted apart.
  const double share = StateShare(m, o);
  const double moments = o.factored_moments ? 0 : o.moment_bytes * share;
  const double trained = 4.0 + o.master_bytes + 4 + moments + (o.async_grad_copy ? 4 : 0);
  double bytes;
  if (m.lora.rank <= 0) {
    bytes = base * trained;
  } else {
    const double adapters = static_cast<double>(m.LoraParams());
    bytes = (o.mapped_base ? 0.0 : base * o.master_bytes) + adapters * trained;
  }
  if (o.factored_moments) bytes += 4.0 * share * static_cast<double>(AdafactorStateElements(m));
  return Saturated(bytes);
}

int64_t CpuWorkingSetBytes(const spec::ModelConfig& m, const HostStateOptions& o) {
  const double base = ModelParams(m);
  const double adapters = m.lora.rank > 0 ? static_cast<double>(m.LoraParams()) : 0.0;
  const double trained = m.lora.rank > 0 ? adapters : base;
  return Saturated(2.0 * o.master_bytes * (base + adapters + trained));
}

}  // namespace rp::planning
