// model_config.h — architecture numbers of a decoder-only LLM and of a GPU, plus presets.
//
// Contract: plain value types, no I/O, no allocation beyond std::string/vector. Thread-safe to
// read from any thread. Presets carry the real published architecture numbers of the paper's
// models (Qwen3-1.7B, Llama-3.1-8B, GPT-OSS-20B, Qwen3-32B, Qwen3-235B-A22B) and datasheet
// figures of the paper's GPUs (RTX 4090, A800) and of the H200.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace rp::planning {

struct ModelConfig {
  std::string name;
  int num_blocks = 0;        // decoder blocks (the partitioner also sees embedding + head)
  int64_t hidden = 0;        // model width h
  int64_t intermediate = 0;  // dense MLP width (0 for MoE-only models)
  int num_heads = 0;
  int num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  int num_experts = 0;     // 0 = dense
  int active_experts = 0;  // experts per token (top-k)
  int64_t expert_intermediate = 0;
  bool tied_embeddings = false;
  int64_t sliding_window = 0;  // 0 = full causal attention in every block
  int sliding_every = 0;       // every k-th block (k>0) uses the sliding window (GPT-OSS: 2)
  int lora_rank = 0;           // >0: LoRA fine-tuning (adapters on q/k/v/o) with a frozen base

  bool is_moe() const { return num_experts > 0; }
  // Parameters of one decoder block / of the embedding / of the LM head (+ final norm).
  int64_t BlockParams() const;
  int64_t EmbeddingParams() const { return vocab * hidden; }
  int64_t HeadParams() const { return (tied_embeddings ? 0 : vocab * hidden) + hidden; }
  int64_t TotalParams() const;
  // Trainable LoRA parameters of one block (q/k/v/o adapters; 0 without LoRA).
  int64_t BlockLoraParams() const;
};

struct DeviceProfile {
  std::string name;
  double peak_matmul_flops = 0;    // dense bf16/fp16 tensor-core FLOP/s (fp32 accumulate)
  double memory_bandwidth = 0;     // device memory bytes/s
  double host_link_bandwidth = 0;  // host<->device bytes/s per direction (PCIe)
  int64_t memory_bytes = 0;        // device memory capacity
};

// Presets. Names are case-insensitive: qwen3-1.7b, llama-3.1-8b, gpt-oss-20b, qwen3-32b,
// qwen3-235b-a22b (LoRA r=32 as in the paper); rtx4090, a800, h200.
std::vector<std::string> ModelPresetNames();
std::vector<std::string> DevicePresetNames();
absl::StatusOr<ModelConfig> ModelPreset(std::string_view name);
absl::StatusOr<DeviceProfile> DevicePreset(std::string_view name);

}  // namespace rp::planning
