// The facade's model functions that need no LibTorch: ValidateModel (engine.h) and
// ReadHfModelConfig (job_files.h). Kept apart from engine.cc and job_files.cc so that the
// daemon's admission rules (server/job_spec.cc) build without LibTorch: the admission fuzz target
// compiles them with this file.
#include "scheduler/engine.h"
#include "scheduler/job_files.h"
#include "scheduler/runtime/model_config_adapter.h"
#include "workers/io/hf_config.h"

namespace rp::scheduler {

absl::Status ValidateModel(const planning::ModelConfig& model) { return runtime::ToTransformerConfig(model).status(); }

absl::StatusOr<planning::ModelConfig> ReadHfModelConfig(const std::string& dir) {
  auto c = workers::io::ReadHfConfig(dir);
  if (!c.ok()) return c.status();
  return runtime::FromTransformerConfig(*c);
}

}  // namespace rp::scheduler
