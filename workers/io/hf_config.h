// hf_config.h — a Hugging Face config.json (Llama, Mistral, Qwen2, Qwen3 dense decoders) as the
// engine's TransformerConfig, and a model directory's weights into a HostModelStore.
//
// Contract: pure functions over files; LoadHfWeights writes the store's fp32 and master copies
// tensor by tensor (one converted tensor extra at a time; the file is memory-mapped) and must not
// run while the store trains.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "workers/models/transformer_config.h"

namespace rp::workers {
class HostModelStore;
}

namespace rp::workers::io {

// Parses config.json text; unsupported architectures or options are InvalidArgument naming them.
absl::StatusOr<models::TransformerConfig> ParseHfConfig(const std::string& json_text);
absl::StatusOr<models::TransformerConfig> ReadHfConfig(const std::string& model_dir);

// Loads model.safetensors or the shards listed in model.safetensors.index.json into `store`
// (whose config must be the directory's). Every store parameter must be present with its shape
// (LoRA adapters excepted: they are not part of a base model).
//
// A frozen tensor already in the store's master dtype is used where it lies in the file's
// mapping (HostModelStore::AdoptMappedMaster). With `registrar`, each file whose tensors are
// used so is registered for DMA once, as a whole (the CUDA backend's
// Device::RegisterHostMemory); its masters then hold the registration, released before the
// file is unmapped. A refused registration is not an error: those masters stay unregistered
// (RelocateMasters copies them).
using MappingRegistrar = std::function<absl::StatusOr<std::shared_ptr<void>>(void* base, int64_t bytes)>;
// `stop` (may be null), raised by another thread (the job's cancel, pause, a drain), ends the load
// between tensors with Cancelled; the store is then partly loaded and is to be dropped.
// `progress` (may be null) is told after each parameter how many of the store's are done.
using LoadProgress = std::function<void(int done, int params)>;
absl::Status LoadHfWeights(const std::string& model_dir, HostModelStore* store,
                           const MappingRegistrar& registrar = nullptr, const std::atomic<bool>* stop = nullptr,
                           const LoadProgress& progress = nullptr);
// The same checks without loading: every base parameter of `config` is in the directory with its
// shape (files opened and headers parsed; nothing allocated beyond that).
absl::Status CheckHfWeights(const std::string& model_dir, const models::TransformerConfig& config);

// A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors).
// adapter_config.json's text (ParsePeftConfig) or a directory's file: LoRA only, rank in
// [1, 65536], target modules and PEFT's stacked-expert target_parameters; DoRA / rsLoRA refused.
absl::StatusOr<models::LoraConfig> ParsePeftConfig(const std::string& json_text);
absl::StatusOr<models::LoraConfig> ReadPeftConfig(const std::string& adapter_dir);
// adapter_config.json's base_model_name_or_path: a hub id or a path ("" when absent or null).
absl::StatusOr<std::string> ParsePeftBaseModel(const std::string& json_text);
absl::StatusOr<std::string> ReadPeftBaseModel(const std::string& adapter_dir);
// Whether an adapter's base_model_name_or_path may name the model in `hf_dir`: the same directory,
// or the same last name component, case aside ("Qwen/Qwen3-1.7B" and ".../qwen3-1.7b"). Nothing
// to compare (either empty) counts as the same. A false here is a warning, never a refusal: a
// local copy may be renamed, and shapes, rank, alpha and targets are checked separately.
bool SameBaseModel(const std::string& adapter_base, const std::string& hf_dir);
absl::Status LoadPeftAdapter(const std::string& adapter_dir, HostModelStore* store);
absl::Status CheckPeftAdapter(const std::string& adapter_dir, const models::TransformerConfig& config);

}  // namespace rp::workers::io
