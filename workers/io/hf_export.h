// hf_export.h — writes a model as a Hugging Face directory: config.json (Llama / Qwen3 dense
// decoder) and safetensors shards (+ model.safetensors.index.json when more than one), so
// `AutoModelForCausalLM.from_pretrained(dir)` loads it. Tensor names are the engine's, which
// are the HF names (workers/models/layer_params.cc is the one place that maps them).
//
// Contract: atomic — everything is written into a temporary sibling directory, fsynced, then
// renamed onto `dir`, which must not exist yet. Tensors are fetched one at a time through
// `fetch`, so at most one extra tensor is held. Any thread; no shared state.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/spec/model_config.h"

namespace rp::workers::io {

struct HfExportOptions {
  at::ScalarType dtype = at::kBFloat16;    // stored dtype ("torch_dtype" in config.json)
  int64_t shard_bytes = int64_t{2} << 30;  // a new shard starts beyond this size
};

// config.json for `config` (nlohmann json text).
std::string HfConfigJson(const spec::ModelConfig& config, at::ScalarType dtype);

using NamedShape = std::pair<std::string, std::vector<int64_t>>;

// Writes `tensors` (values from `fetch`, which must return the declared shape) to `dir`;
// returns the number of tensor bytes written.
absl::StatusOr<int64_t> ExportHfModel(const std::string& dir, const spec::ModelConfig& config,
                                      const std::vector<NamedShape>& tensors,
                                      const std::function<absl::StatusOr<at::Tensor>(const std::string&)>& fetch,
                                      const HfExportOptions& options = {});

// Writes the LoRA adapters among `tensors` (names containing ".lora_") as a PEFT adapter
// directory: adapter_config.json + adapter_model.safetensors (fp32), atomically.
absl::StatusOr<int64_t> ExportPeftAdapter(const std::string& dir, const spec::ModelConfig& config,
                                          const std::vector<NamedShape>& tensors,
                                          const std::function<absl::StatusOr<at::Tensor>(const std::string&)>& fetch);

// The merged weights W + (alpha / r) B A of a LoRA model as a plain Hugging Face directory.
absl::StatusOr<int64_t> ExportMergedLora(const std::string& dir, const spec::ModelConfig& config,
                                         const std::vector<NamedShape>& tensors,
                                         const std::function<absl::StatusOr<at::Tensor>(const std::string&)>& fetch,
                                         const HfExportOptions& options = {});

}  // namespace rp::workers::io
