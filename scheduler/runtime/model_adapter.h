// model_adapter.h — (runtime) what little the facade's value types need to become the data
// plane's: precision as a LibTorch dtype, the job's optimizer as the workers' AdamW options (the
// hyperparameters are shared: workers/spec), its host-state layout, and the planner's stage slot
// as the workers' StageTask. The model description needs no translation (workers/spec).
//
// Contract: pure functions, any thread.
#pragma once

#include <c10/core/ScalarType.h>

#include "absl/status/statusor.h"
#include "scheduler/engine_types.h"
#include "scheduler/planning/dispatch_plan.h"
#include "scheduler/planning/host_state.h"
#include "workers/optim/adamw.h"
#include "workers/stage_task.h"

namespace rp::scheduler::runtime {

at::ScalarType ToScalarType(Precision p);
// The job's hyperparameters with this process's defaults for how to run them.
workers::AdamWOptions ToAdamW(const spec::OptimizerSpec& o);
// The host-state layout of a job (planning::HostStateBytes): `base_mapped` when its LoRA base
// comes from model files already in the job's dtype (workers::io::HfBaseIsStoredAs).
planning::HostStateOptions HostStateOptionsFor(const JobSpec& spec, bool base_mapped);
// The planner's stage slot as the data plane's task (the workers never see the plan).
workers::StageTask ToStageTask(const planning::StageSlot& sl);

}  // namespace rp::scheduler::runtime
