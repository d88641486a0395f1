#include "scheduler/planning/presets.h"

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
spec::RopeScaling GptOssYarn() {
  spec::RopeScaling r;
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
void TinyShape(spec::ModelConfig& c) {
  c.vocab = 256;
  c.hidden = 128;
  c.num_blocks = 4;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 32;
}
void TinyExperts(spec::ModelConfig& c) {
  c.num_experts = 8;
  c.experts_per_token = 2;
  c.expert_intermediate = 96;
}

// Qwen/Qwen3-1.7B config.json
spec::ModelConfig Qwen3_1_7B() {
  spec::ModelConfig c;
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
spec::ModelConfig Llama31_8B() {
  spec::ModelConfig c;
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
spec::ModelConfig GptOss20B() {
  spec::ModelConfig c;
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
  c.experts_per_token = 4;
  c.expert_intermediate = 2880;
  c.sliding_window = 128;
  for (int b = 0; b < c.num_blocks; b += 2) c.sliding_layers.push_back(b);
  c.attention_bias = true;
  c.rope_scaling = GptOssYarn();
  return c;
}

// Qwen/Qwen3-32B config.json
spec::ModelConfig Qwen3_32B() {
  spec::ModelConfig c;
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
spec::ModelConfig Qwen3_235B_A22B() {
  spec::ModelConfig c;
  c.name = "qwen3-235b-a22b";
  c.family = "qwen3";  // with experts: Qwen3-MoE
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
  c.experts_per_token = 8;
  c.expert_intermediate = 1536;
  c.lora.rank = 32;
  return c;
}

// Qwen/Qwen3-30B-A3B config.json: every block sparse
spec::ModelConfig Qwen3_30B_A3B() {
  spec::ModelConfig c;
  c.name = "qwen3-30b-a3b";
  c.family = "qwen3";  // with experts: Qwen3-MoE
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
  c.experts_per_token = 8;
  c.expert_intermediate = 768;
  return c;
}

// A byte-level Qwen3-MoE small enough to train on a CPU: 8 experts, top-2, every block sparse.
spec::ModelConfig Qwen3MoeTiny() {
  spec::ModelConfig c;
  c.name = "qwen3-moe-tiny";
  c.family = "qwen3";  // with experts: Qwen3-MoE
  c.qk_norm = true;
  c.rope_theta = 1000000;
  TinyShape(c);
  c.intermediate = 352;
  TinyExperts(c);
  return c;
}

// openai/gpt-oss-120b config.json: gpt-oss-20b's, larger: 36 blocks of 128 experts, top-4.
spec::ModelConfig GptOss120B() {
  spec::ModelConfig c = GptOss20B();
  c.name = "gpt-oss-120b";
  c.num_blocks = 36;
  c.num_experts = 128;
  c.sliding_layers.clear();
  for (int b = 0; b < c.num_blocks; b += 2) c.sliding_layers.push_back(b);
  return c;
}

// A byte-level GPT-OSS small enough to train on a CPU: 8 experts, top-2, blocks 0 and 2
// attending to 16 positions, 1 and 3 to all.
spec::ModelConfig GptOssTiny() {
  spec::ModelConfig c = GptOss120B();
  c.name = "gpt-oss-tiny";
  TinyShape(c);
  TinyExperts(c);
  c.sliding_window = 16;
  c.sliding_layers = {0, 2};
  c.rope_scaling.original_max_position = 64;
  return c;
}

// Byte-level (vocab 256) dense models small enough to train on a laptop CPU in minutes.
spec::ModelConfig DenseTiny(const char* name) {
  spec::ModelConfig c;
  c.name = name;
  const bool qwen = c.name == "qwen3-tiny";
  c.family = qwen ? "qwen3" : "llama";
  c.qk_norm = c.tied_embeddings = qwen;
  TinyShape(c);
  c.intermediate = 352;
  return c;
}

// The paper's five workloads first (kPaperModels), then models for CPUs and tests.
std::vector<spec::ModelConfig> AllModels() {
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

absl::StatusOr<spec::ModelConfig> ModelPreset(std::string_view name) {
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
