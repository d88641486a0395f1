// export.h — (runtime) one way to write a job's weights in a user-facing format, whatever they
// come from (a running job's store, a released job's final checkpoint, an old checkpoint).
//
// Contract: pure function over `fetch`, any thread; the directory is written atomically
// (workers/files/atomic_dir) and must not exist.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/engine_types.h"
#include "workers/spec/model_config.h"

namespace rp::scheduler::runtime {

using TensorFetch = std::function<absl::StatusOr<at::Tensor>(const std::string&)>;

// InvalidArgument for a LoRA format on a job without adapters. `stop` (optional) is polled before
// each tensor; its error ends the export (the temporary directory removed) with that status.
absl::StatusOr<int64_t> WriteExport(const std::string& dir, const spec::ModelConfig& config,
                                    const std::vector<ParameterShape>& shapes, const TensorFetch& fetch,
                                    at::ScalarType dtype, ExportKind kind, const StopCheck& stop = {});

}  // namespace rp::scheduler::runtime
