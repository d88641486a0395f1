#include "scheduler/planning/model_config.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace rp::planning {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

// The paper's five workloads come first (PaperModelPresetNames), then models for CPUs and tests.
constexpr int kPaperModels = 5;

// GPT-OSS's rope: YaRN, factor 32 over 4096 original positions (its config.json), the attention
// factor transformers derives from it (0.1 ln 32 + 1).
RopeScalingSpec GptOssYarn() {
  RopeScalingSpec r;
  r.yarn = true;
  r.factor = 32;
  r.original_max_position = 4096;
  r.beta_fast = 32;
  r.beta_slow = 1;
  r.truncate = false;
  r.attention_factor = 0.1 * std::log(32.0) + 1;
  return r;
}

// The CPU-sized presets' shape: byte-level (vocab 256), 4 blocks of width 128, 4 heads of 32
// (2 kv heads); their MoE ones have 8 experts of width 96, top-2.
void TinyShape(ModelConfig& c) {
  c.vocab = 256;
  c.hidden = 128;
  c.num_blocks = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
}
void TinyExperts(ModelConfig& c) {
  c.num_experts = 8;
  c.active_experts = 2;
  c.expert_intermediate = 96;
}

// Qwen/Qwen3-1.7B config.json
ModelConfig Qwen3_1_7B() {
  ModelConfig c;
  c.name = "qwen3-1.7b";
  c.family = "qwen3";
  c.qk_norm = true;
  c.rope_theta = 1000000;
  c.num_blocks = 28;
  c.hidden = 2048;
  c.intermediate = 6144;
  c.num_heads = 16;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.vocab = 151936;
  c.tied_embeddings = true;
  return c;
}

// meta-llama/Llama-3.1-8B config.json
ModelConfig Llama31_8B() {
  ModelConfig c;
  c.name = "llama-3.1-8b";
  c.family = "llama";
  c.rope_theta = 500000;
  c.rms_eps = 1e-5;
  c.rope_scaling = {8.0, 1.0, 4.0, 8192};
  c.num_blocks = 32;
  c.hidden = 4096;
  c.intermediate = 14336;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.vocab = 128256;
  return c;
}

// openai/gpt-oss-20b config.json: 32 experts, top-4, alternating 128-token window
ModelConfig GptOss20B() {
  ModelConfig c;
  c.name = "gpt-oss-20b";
  c.family = "gpt_oss";
  c.rope_theta = 150000;
  c.rms_eps = 1e-5;
  c.num_blocks = 24;
  c.hidden = 2880;
  c.intermediate = 0;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.head_dim = 64;
  c.vocab = 201088;
  c.num_experts = 32;
  c.active_experts = 4;
  c.expert_intermediate = 2880;
  c.sliding_window = 128;
  for (int b = 0; b < c.num_blocks; b += 2) c.sliding_layers.push_back(b);
  c.attention_bias = true;
  c.rope_scaling = GptOssYarn();
  return c;
}

// Qwen/Qwen3-32B config.json
ModelConfig Qwen3_32B() {
  ModelConfig c;
  c.name = "qwen3-32b";
  c.family = "qwen3";
  c.qk_norm = true;
  c.rope_theta = 1000000;
  c.num_blocks = 64;
  c.hidden = 5120;
  c.intermediate = 25600;
  c.num_heads = 64;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.vocab = 151936;
  return c;
}

// Qwen/Qwen3-235B-A22B config.json; the paper trains it with LoRA r=32
ModelConfig Qwen3_235B_A22B() {
  ModelConfig c;
  c.name = "qwen3-235b-a22b";
  c.family = "qwen3_moe";
  c.qk_norm = true;
  c.rope_theta = 1000000;
  c.num_blocks = 94;
  c.hidden = 4096;
  c.intermediate = 0;
  c.num_heads = 64;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.vocab = 151936;
  c.num_experts = 128;
  c.active_experts = 8;
  c.expert_intermediate = 1536;
  c.lora.rank = 32;
  return c;
}

// Qwen/Qwen3-30B-A3B config.json: every block sparse
ModelConfig Qwen3_30B_A3B() {
  ModelConfig c;
  c.name = "qwen3-30b-a3b";
  c.family = "qwen3_moe";
  c.qk_norm = true;
  c.rope_theta = 1000000;
  c.num_blocks = 48;
  c.hidden = 2048;
  c.intermediate = 6144;
  c.num_heads = 32;
  c.num_kv_heads = 4;
  c.head_dim = 128;
  c.vocab = 151936;
  c.num_experts = 128;
  c.active_experts = 8;
  c.expert_intermediate = 768;
  return c;
}

// A byte-level Qwen3-MoE small enough to train on a CPU: 8 experts, top-2, every block sparse.
ModelConfig Qwen3MoeTiny() {
  ModelConfig c;
  c.name = "qwen3-moe-tiny";
  c.family = "qwen3_moe";
  c.qk_norm = true;
  c.rope_theta = 1000000;
  TinyShape(c);
  c.intermediate = 352;
  TinyExperts(c);
  return c;
}

// openai/gpt-oss-120b config.json: gpt-oss-20b's, larger: 36 blocks of 128 experts, top-4.
ModelConfig GptOss120B() {
  ModelConfig c = GptOss20B();
  c.name = "gpt-oss-120b";
  c.num_blocks = 36;
  c.num_experts = 128;
  c.sliding_layers.clear();
  for (int b = 0; b < c.num_blocks; b += 2) c.sliding_layers.push_back(b);
  return c;
}

// A byte-level GPT-OSS small enough to train on a CPU: 8 experts, top-2, blocks 0 and 2
// attending to 16 positions, 1 and 3 to all.
ModelConfig GptOssTiny() {
  ModelConfig c = GptOss120B();
  c.name = "gpt-oss-tiny";
  TinyShape(c);
  TinyExperts(c);
  c.sliding_window = 16;
  c.sliding_layers = {0, 2};
  c.rope_scaling.original_max_position = 64;
  return c;
}

// Byte-level (vocab 256) dense models small enough to train on a laptop CPU in minutes.
ModelConfig DenseTiny(const char* name) {
  ModelConfig c;
  c.name = name;
  const bool qwen = c.name == "qwen3-tiny";
  c.family = qwen ? "qwen3" : "llama";
  c.qk_norm = c.tied_embeddings = qwen;
  TinyShape(c);
  c.intermediate = 352;
  return c;
}

// The paper's five workloads first (kPaperModels), then models for CPUs and tests.
std::vector<ModelConfig> AllModels() {
  return {Qwen3_1_7B(),           Llama31_8B(),   GptOss20B(),  Qwen3_32B(),  Qwen3_235B_A22B(),
          Qwen3_30B_A3B(),        Qwen3MoeTiny(), GptOss120B(), GptOssTiny(), DenseTiny("llama-tiny"),
          DenseTiny("qwen3-tiny")};
}

std::vector<DeviceProfile> AllDevices() {
  constexpr double kT = 1e12, kG = 1e9;
  constexpr int64_t kGiB = int64_t{1} << 30;
  return {
      // GeForce RTX 4090: 330.3 TFLOP/s dense fp16 tensor peak (the datasheet's 165.2 with fp32
      // accumulate cannot be the ceiling: the authors' measured LM-head GEMMs run at 231 TFLOP/s,
      // 0.70 of 330.3), 1008 GB/s GDDR6X, 24 GB, PCIe 4.0 x16 (32 GB/s nominal, as the paper quotes).
      {"rtx4090", 330.3 * kT, 1008 * kG, 32 * kG, 24 * kGiB},
      // A800 SXM 80GB: 312 TFLOP/s dense bf16, 2039 GB/s HBM2e, PCIe 4.0 to the host.
      {"a800", 312 * kT, 2039 * kG, 32 * kG, 80 * kGiB},
      // H200 SXM: 989 TFLOP/s dense bf16, 4.8 TB/s HBM3e, 141 GB, PCIe 5.0 x16 to the host.
      {"h200", 989 * kT, 4800 * kG, 64 * kG, 141 * int64_t{1000000000}},
  };
}

}  // namespace

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

int64_t AdafactorStateElements(const ModelConfig& m) {
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

int64_t HostStateBytes(const ModelConfig& m, const HostStateOptions& o) {
  // In double: sizes come from clients and files.
  const double sparse = m.SparseBlockCount();
  const double base = static_cast<double>(m.EmbeddingParams()) + sparse * static_cast<double>(m.BlockParams()) +
                      (m.num_blocks - sparse) * static_cast<double>(m.DenseBlockParams()) +
                      static_cast<double>(m.HeadParams());
  // A trained parameter: fp32 copy, master, fp32 gradient, moments, the async gradient copy;
  // factored moments (Adafactor) are counted apart.
  const double moments = o.factored_moments ? 0 : o.moment_bytes;
  const double trained = 4.0 + o.master_bytes + 4 + moments + (o.async_grad_copy ? 4 : 0);
  double bytes;
  if (m.lora.rank <= 0) {
    bytes = base * trained;
  } else {
    const double adapters = static_cast<double>(m.LoraParams());
    bytes = (o.mapped_base ? 0.0 : base * o.master_bytes) + adapters * trained;
  }
  if (o.factored_moments) bytes += 4.0 * static_cast<double>(AdafactorStateElements(m));
  constexpr double kMax = 9.0e18;  // below INT64_MAX (9.22e18)
  return !(bytes < kMax) ? static_cast<int64_t>(kMax) : static_cast<int64_t>(bytes);
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const auto& m : AllModels()) names.push_back(m.name);
  return names;
}

std::vector<std::string> PaperModelPresetNames() {
  std::vector<std::string> names = ModelPresetNames();
  names.resize(kPaperModels);
  return names;
}

std::vector<std::string> DevicePresetNames() {
  std::vector<std::string> names;
  for (const auto& d : AllDevices()) names.push_back(d.name);
  return names;
}

absl::StatusOr<ModelConfig> ModelPreset(std::string_view name) {
  const std::string key = Lower(name);
  for (auto& m : AllModels()) {
    if (m.name == key) return m;
  }
  return absl::NotFoundError(
      absl::StrCat("unknown preset '", std::string(name), "'; known: ", absl::StrJoin(ModelPresetNames(), ", ")));
}

absl::StatusOr<DeviceProfile> DevicePreset(std::string_view name) {
  const std::string key = Lower(name);
  for (auto& d : AllDevices()) {
    if (d.name == key) return d;
  }
  return absl::NotFoundError(absl::StrCat("unknown device preset '", std::string(name),
                                          "'; known: ", absl::StrJoin(DevicePresetNames(), ", ")));
}

}  // namespace rp::planning
