// model_config.h — the one description of a decoder-only LLM (architecture, rope, LoRA) and of a
// GPU, plus the one preset registry: the planner, the simulator, the engine (through
// scheduler/runtime/model_adapter.h) and the daemon's job specs all read these numbers.
//
// Contract: plain value types, no I/O, no allocation beyond std::string/vector. Thread-safe to
// read from any thread. Presets carry the real published architecture numbers of the paper's
// models (Qwen3-1.7B, Llama-3.1-8B, GPT-OSS-20B, Qwen3-32B, Qwen3-235B-A22B), byte-level tiny
// models that train on a CPU, and datasheet figures of the paper's GPUs (RTX 4090, A800) and of
// the H200. Parameter counts here are the only arithmetic ones; tests hold them equal to the
// engine's parameter layout (workers/models/layers.h ModelParams).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::planning {

// Rope scaling as transformers' "llama3" or "yarn" (workers/models/transformer_config.h's
// RopeScaling, field for field); factor 0 = none.
struct RopeScalingSpec {
  double factor = 0;
  double low_freq_factor = 1;
  double high_freq_factor = 4;
  int64_t original_max_position = 8192;
  bool yarn = false;
  double beta_fast = 32;
  double beta_slow = 1;
  bool truncate = true;
  double attention_factor = 1;
};

// LoRA fine-tuning (PEFT's LoRA) on `targets` among q_proj k_proj v_proj o_proj gate_proj
// up_proj down_proj, and experts.gate_up_proj experts.down_proj (a sparse block's stacked
// experts, PEFT's target_parameters); rank 0 = full fine-tuning.
struct LoraSpec {
  int rank = 0;
  double alpha = 16;
  std::vector<std::string> targets = {"q_proj", "k_proj", "v_proj", "o_proj"};
  bool Targets(std::string_view module) const;
};

struct ModelConfig {
  std::string name;
  std::string family = "llama";  // "llama", "qwen3" (per-head q/k RMSNorm); MoE presets: "gpt_oss", "qwen3_moe"
  int num_blocks = 0;            // decoder blocks (the partitioner also sees embedding + head)
  int64_t hidden = 0;            // model width h
  int64_t intermediate = 0;      // dense MLP width (0 for MoE-only models)
  int num_heads = 0;
  int num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  int num_experts = 0;     // 0 = dense
  int active_experts = 0;  // experts per token (top-k)
  int64_t expert_intermediate = 0;
  bool tied_embeddings = false;
  bool norm_topk_prob = true;        // MoE: top-k weights renormalised (Qwen3-MoE)
  int decoder_sparse_step = 1;       // MoE: block i sparse when (i + 1) % step == 0 ...
  std::vector<int> mlp_only_layers;  // ... and i not listed here (those are dense, `intermediate` wide)
  double router_aux_loss_coef = 0;   // MoE: the router's load-balancing loss coefficient, 0 = off
  int64_t sliding_window = 0;        // 0 = full causal attention in every block
  std::vector<int> sliding_layers;   // the blocks (0-based) that use it (GPT-OSS: 0, 2, 4, ...)
  // GPT-OSS (family "gpt_oss"): q/k/v/o biases, the experts' clamped SwiGLU; sinks, router and
  // expert biases come with the family.
  bool attention_bias = false;
  double swiglu_alpha = 1.702;
  double swiglu_limit = 7.0;
  bool qk_norm = false;  // Qwen3: RMSNorm over each head's q and k
  double rope_theta = 10000;
  double rms_eps = 1e-6;
  RopeScalingSpec rope_scaling;
  LoraSpec lora;  // rank > 0: adapters train, the base stays frozen

  bool is_moe() const { return num_experts > 0; }
  bool gpt_oss() const { return family == "gpt_oss"; }
  bool SlidingBlock(int block) const;
  int num_layers() const { return num_blocks + 2; }  // embedding, blocks, head
  // Base parameters of one decoder block (a sparse one in an MoE model) / of block `block`
  // (0-based: dense or sparse) / of the embedding / of the LM head (+ final norm).
  int64_t BlockParams() const;
  int64_t BlockParams(int block) const;
  int64_t DenseBlockParams() const;  // a block with the dense MLP (`intermediate` wide)
  bool SparseBlock(int block) const;
  int SparseBlockCount() const;  // without visiting every block (sizes come from clients)
  int64_t EmbeddingParams() const { return vocab * hidden; }
  int64_t HeadParams() const { return (tied_embeddings ? 0 : vocab * hidden) + hidden; }
  int64_t TotalParams() const;  // base parameters (tied embedding once), adapters excluded
  // Trainable LoRA parameters of one block on its projections (0 without LoRA) / of block
  // `block`, a sparse one's expert adapters included (experts.* targets: r·E·(in + out) each) /
  // of the whole model.
  int64_t BlockLoraParams() const;
  int64_t BlockLoraParams(int block) const;
  int64_t LoraParams() const;
  // One expert's (in, out) features for each targeted stacked expert tensor.
  std::vector<std::pair<int64_t, int64_t>> ExpertLoraShapes() const;
  // Parameters of engine layer l (0 = embedding, 1..num_blocks, head) including its adapters.
  int64_t LayerParams(int l) const;
};

// What a job's host state holds per parameter beyond the model's layout.
struct HostStateOptions {
  int master_bytes = 2;  // the master copy workers upload: 4 (fp32) or 2 (bf16, fp16)
  int moment_bytes = 8;  // optimizer state per trained parameter: AdamW 8 (4 with bf16 moments), SGD 4 or 0, Lion 4
  bool async_grad_copy = false;  // async optimizer: G_cp's own gradient copy, 4 B per trained parameter
  bool mapped_base = false;      // LoRA: the frozen base's masters alias the model files (allocated: none)
  // Adafactor: the optimizer state is factored (AdafactorStateElements fp32 values in all, not
  // moment_bytes per trained parameter).
  bool factored_moments = false;
};

// Elements of Adafactor's state over the trained parameters (torch.optim.Adafactor's layout):
// rows + columns per matrix (leading dimensions of stacked experts count as a batch), every
// element of a vector.
int64_t AdafactorStateElements(const ModelConfig& m);

// Host bytes the engine allocates for a model's state (fp32 copy, master copy, gradient,
// moments, the async gradient copy; with LoRA the frozen base keeps only its master copy, or
// nothing when mapped, and the adapters the full state): what admission checks and what the
// store and optimizer hold once a step ran (tested against them). In double arithmetic,
// saturated near INT64_MAX: sizes come from clients and files and the estimate never wraps.
int64_t HostStateBytes(const ModelConfig& m, const HostStateOptions& o);

struct DeviceProfile {
  std::string name;
  double peak_matmul_flops = 0;    // dense bf16/fp16 tensor-core FLOP/s (datasheet peak)
  double memory_bandwidth = 0;     // device memory bytes/s
  double host_link_bandwidth = 0;  // host<->device bytes/s per direction (PCIe)
  int64_t memory_bytes = 0;        // device memory capacity
};

// Presets, names case-insensitive. Models: the paper's five (PaperModelPresetNames: qwen3-1.7b,
// llama-3.1-8b, gpt-oss-20b, qwen3-32b, qwen3-235b-a22b with LoRA r=32 as in the paper), then
// llama-tiny and qwen3-tiny (byte-level, vocab 256, 4 blocks). Devices: rtx4090, a800, h200.
std::vector<std::string> ModelPresetNames();
std::vector<std::string> PaperModelPresetNames();
std::vector<std::string> DevicePresetNames();
absl::StatusOr<ModelConfig> ModelPreset(std::string_view name);
absl::StatusOr<DeviceProfile> DevicePreset(std::string_view name);

}  // namespace rp::planning
