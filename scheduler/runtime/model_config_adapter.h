// model_config_adapter.h — (runtime) the planner's model description (planning::ModelConfig, the
// one preset registry) as the engine's TransformerConfig and back. No LibTorch: Submit's model
// checks and the admission fuzz target use it as the engine does.
//
// Contract: pure functions, any thread. ToTransformerConfig refuses what the engine cannot run
// (InvalidArgument naming the field or family) and applies TransformerConfig::Validate.
#pragma once

#include "absl/status/statusor.h"
#include "scheduler/planning/model_config.h"
#include "workers/models/transformer_config.h"

namespace rp::scheduler::runtime {

absl::StatusOr<workers::models::TransformerConfig> ToTransformerConfig(const planning::ModelConfig& m);
planning::ModelConfig FromTransformerConfig(const workers::models::TransformerConfig& c);

}  // namespace rp::scheduler::runtime
