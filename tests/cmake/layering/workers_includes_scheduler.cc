// Must not compile (layering_data_plane_cannot_include_the_planner): the data plane sees
// workers/ alone; what it needs of a stage slot is workers/stage_task.h.
#include "scheduler/planning/dispatch_plan.h"
#include "workers/device_worker.h"
