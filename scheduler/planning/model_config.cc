#include "scheduler/planning/model_config.h"

#include <algorithm>
#include <cctype>

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

std::vector<ModelConfig> AllModels() {
  std::vector<ModelConfig> m;
  {
    ModelConfig c;  // Qwen/Qwen3-1.7B config.json
    c.name = "qwen3-1.7b";
    c.num_blocks = 28;
    c.hidden = 2048;
    c.intermediate = 6144;
    c.num_heads = 16;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.vocab = 151936;
    c.tied_embeddings = true;
    m.push_back(c);
  }
  {
    ModelConfig c;  // meta-llama/Llama-3.1-8B config.json
    c.name = "llama-3.1-8b";
    c.num_blocks = 32;
    c.hidden = 4096;
    c.intermediate = 14336;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.vocab = 128256;
    m.push_back(c);
  }
  {
    ModelConfig c;  // openai/gpt-oss-20b config.json: 32 experts, top-4, alternating 128-token window
    c.name = "gpt-oss-20b";
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
    c.sliding_every = 2;
    m.push_back(c);
  }
  {
    ModelConfig c;  // Qwen/Qwen3-32B config.json
    c.name = "qwen3-32b";
    c.num_blocks = 64;
    c.hidden = 5120;
    c.intermediate = 25600;
    c.num_heads = 64;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.vocab = 151936;
    m.push_back(c);
  }
  {
    ModelConfig c;  // Qwen/Qwen3-235B-A22B config.json; the paper trains it with LoRA r=32
    c.name = "qwen3-235b-a22b";
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
    c.lora_rank = 32;
    m.push_back(c);
  }
  return m;
}

std::vector<DeviceProfile> AllDevices() {
  constexpr double kT = 1e12, kG = 1e9;
  constexpr int64_t kGiB = int64_t{1} << 30;
  return {
      // GeForce RTX 4090: 165.2 TFLOP/s dense fp16/bf16 with fp32 accumulate, 1008 GB/s GDDR6X,
      // 24 GB, PCIe 4.0 x16 (32 GB/s nominal, as the paper quotes).
      {"rtx4090", 165.2 * kT, 1008 * kG, 32 * kG, 24 * kGiB},
      // A800 SXM 80GB: 312 TFLOP/s dense bf16, 2039 GB/s HBM2e, PCIe 4.0 to the host.
      {"a800", 312 * kT, 2039 * kG, 32 * kG, 80 * kGiB},
      // H200 SXM: 989 TFLOP/s dense bf16, 4.8 TB/s HBM3e, 141 GB, PCIe 5.0 x16 to the host.
      {"h200", 989 * kT, 4800 * kG, 64 * kG, 141 * int64_t{1000000000}},
  };
}

}  // namespace

int64_t ModelConfig::BlockParams() const {
  const int64_t q = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv = static_cast<int64_t>(num_kv_heads) * head_dim;
  int64_t attn = hidden * q + 2 * hidden * kv + q * hidden;
  int64_t mlp =
      is_moe() ? num_experts * 3 * hidden * expert_intermediate + hidden * num_experts : 3 * hidden * intermediate;
  return attn + mlp + 2 * hidden /*norms*/;
}

int64_t ModelConfig::TotalParams() const { return EmbeddingParams() + num_blocks * BlockParams() + HeadParams(); }

int64_t ModelConfig::BlockLoraParams() const {
  if (lora_rank <= 0) return 0;
  const int64_t q = static_cast<int64_t>(num_heads) * head_dim;
  const int64_t kv = static_cast<int64_t>(num_kv_heads) * head_dim;
  // Adapter A (in x r) + B (r x out) on q, k, v, o.
  int64_t r = lora_rank;
  return r * ((hidden + q) + 2 * (hidden + kv) + (q + hidden));
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const auto& m : AllModels()) names.push_back(m.name);
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
      absl::StrCat("unknown model preset '", std::string(name), "'; known: ", absl::StrJoin(ModelPresetNames(), ", ")));
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
