// presets.h — (planning) the one preset registry: the real published architecture numbers of the
// paper's models (Qwen3-1.7B, Llama-3.1-8B, GPT-OSS-20B, Qwen3-32B, Qwen3-235B-A22B) and a few
// more, byte-level tiny models that train on a CPU, and datasheet figures of the paper's GPUs
// (RTX 4090, A800) and of the H200. The planner, the simulator, the daemon's job specs and the
// benchmarks name models and devices through it.
//
// Contract: pure functions returning value types, any thread; an unknown name is NotFound listing
// the known ones.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/spec/model_config.h"

namespace rp::planning {

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
absl::StatusOr<spec::ModelConfig> ModelPreset(std::string_view name);
absl::StatusOr<DeviceProfile> DevicePreset(std::string_view name);

}  // namespace rp::planning
