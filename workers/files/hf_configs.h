// hf_configs.h — the small JSON files of a Hugging Face model or PEFT adapter directory, parsed
// without LibTorch: config.json (Llama, Mistral, Qwen2, Qwen3 dense and MoE, GPT-OSS decoders) as
// the shared spec::ModelConfig, and adapter_config.json as its LoRA part and base model name.
//
// Contract: pure functions (text in, value out) and bounded reads of one confined file each;
// depth-bounded JSON, every size validated (spec::ModelConfig::Validate). Untrusted input: fuzzed
// (tests/fuzz hf_config_fuzzer, peft_config_fuzzer).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "workers/spec/model_config.h"

namespace rp::files {

// Parses config.json text; unsupported architectures or options are InvalidArgument naming them.
absl::StatusOr<spec::ModelConfig> ParseHfConfig(const std::string& json_text);
absl::StatusOr<spec::ModelConfig> ReadHfConfig(const std::string& model_dir);

// adapter_config.json's text (ParsePeftConfig) or a directory's file: LoRA only, rank in
// [1, 65536], target modules and PEFT's stacked-expert target_parameters; DoRA / rsLoRA refused.
absl::StatusOr<spec::LoraSpec> ParsePeftConfig(const std::string& json_text);
absl::StatusOr<spec::LoraSpec> ReadPeftConfig(const std::string& adapter_dir);
// adapter_config.json's base_model_name_or_path: a hub id or a path ("" when absent or null).
absl::StatusOr<std::string> ParsePeftBaseModel(const std::string& json_text);
absl::StatusOr<std::string> ReadPeftBaseModel(const std::string& adapter_dir);
// Whether an adapter's base_model_name_or_path may name the model in `hf_dir`: the same directory,
// or the same last name component, case aside ("Qwen/Qwen3-1.7B" and ".../qwen3-1.7b"). Nothing
// to compare (either empty) counts as the same. A false here is a warning, never a refusal: a
// local copy may be renamed, and shapes, rank, alpha and targets are checked separately.
bool SameBaseModel(const std::string& adapter_base, const std::string& hf_dir);
}  // namespace rp::files
