// hf_config.h — a Hugging Face model directory's weights (and a PEFT adapter's) into a
// HostModelStore, and the same checks without loading. The directory's config.json is parsed by
// workers/files/hf_configs.h (included).
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
#include "workers/files/hf_configs.h"
#include "workers/spec/model_config.h"

namespace rp::workers {
class HostModelStore;
}

namespace rp::workers::io {

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
absl::Status CheckHfWeights(const std::string& model_dir, const spec::ModelConfig& config);

// A PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors; its config
// parsed by files/hf_configs.h).
absl::Status LoadPeftAdapter(const std::string& adapter_dir, HostModelStore* store);
absl::Status CheckPeftAdapter(const std::string& adapter_dir, const spec::ModelConfig& config);

}  // namespace rp::workers::io
