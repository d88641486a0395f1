// Must compile (layering_server_sees_the_facade, the control for the probes above): the same
// include path holds everything the daemon is meant to use.
#include "scheduler/engine.h"
#include "scheduler/job_files.h"
#include "server/job_manager.h"

int LayeringProbeFacade() { return static_cast<int>(rp::scheduler::JobState::kQueued); }
