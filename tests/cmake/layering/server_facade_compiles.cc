// Must compile (layering_server_sees_the_facade, the control for the probes above): the same
// include path holds everything the daemon is meant to use.
#include "scheduler/engine.h"
#include "scheduler/job_files.h"
#include "server/job_manager.h"
#include "workers/base/check.h"  // the foundation: every room shares it

int LayeringProbeFacade() {
  RP_CHECK(true) << "the invariant vocabulary compiles here";
  return static_cast<int>(rp::scheduler::JobState::kQueued);
}
