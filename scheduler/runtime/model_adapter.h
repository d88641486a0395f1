// model_adapter.h — (runtime) the one translation between the facade's value types and the data
// plane's: the model description (model_config_adapter.h, included), precision and dtype, the
// optimizer spec and AdamW, the planner's stage slot and the workers' StageTask.
//
// Contract: pure functions, any thread.
#pragma once

#include <c10/core/ScalarType.h>

#include "absl/status/statusor.h"
#include "scheduler/engine_types.h"
#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/model_config.h"
#include "scheduler/runtime/model_config_adapter.h"
#include "workers/models/transformer_config.h"
#include "workers/optim/adamw.h"
#include "workers/stage_task.h"

namespace rp::scheduler::runtime {

at::ScalarType ToScalarType(Precision p);
workers::AdamWOptions ToAdamW(const OptimizerSpec& o);
// The update rule's name as checkpoints record it: "adamw", "sgd", "lion", "adafactor".
std::string OptimizerName(OptimizerSpec::Algorithm a);
// The host-state layout of a job (planning::HostStateBytes): `base_mapped` when its LoRA base
// comes from model files already in the job's dtype (workers::io::HfBaseIsStoredAs).
planning::HostStateOptions HostStateOptionsFor(const JobSpec& spec, bool base_mapped);
workers::LrSchedule ToLrSchedule(const LrScheduleSpec& s);
// The planner's stage slot as the data plane's task (the workers never see the plan).
workers::StageTask ToStageTask(const planning::StageSlot& sl);

}  // namespace rp::scheduler::runtime
