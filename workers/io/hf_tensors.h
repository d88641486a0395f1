// hf_tensors.h — single tensors of a Hugging Face model directory, for the engine (LibTorch):
// what a LoRA base is stored as, and one base tensor read alone. Kept apart from hf_config.h,
// whose config parsing builds without LibTorch (the fuzz targets compile it).
//
// Contract: pure functions over files (opened beneath the confined roots), any thread.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "workers/spec/model_config.h"

namespace rp::workers::io {

// Whether every base tensor of `config` is stored in `dtype` in the directory: then a frozen
// base (LoRA) is used from the files' mappings without a copy (LoadHfWeights).
absl::StatusOr<bool> HfBaseIsStoredAs(const std::string& model_dir, const spec::ModelConfig& config,
                                      at::ScalarType dtype);
// One base tensor of a model directory as fp32 (NotFound / InvalidArgument when it is absent or
// has another shape): what LoadHfWeights would have put in the store, read alone.
absl::StatusOr<at::Tensor> ReadHfTensor(const std::string& model_dir, const std::string& name,
                                        const std::vector<int64_t>& shape);

}  // namespace rp::workers::io
