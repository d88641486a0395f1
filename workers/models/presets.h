// presets.h — named model shapes (published Llama / Qwen3 configurations and byte-level tiny
// models), shared by the daemon's job specs (model.preset), the tools and the benchmarks.
//
// Contract: pure functions; safe from any thread. Names are case-insensitive.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/models/transformer_config.h"

namespace rp::workers::models {

std::vector<std::string> TransformerPresetNames();
// InvalidArgument naming the known presets for an unknown name.
absl::StatusOr<TransformerConfig> TransformerPreset(const std::string& name);

}  // namespace rp::workers::models
