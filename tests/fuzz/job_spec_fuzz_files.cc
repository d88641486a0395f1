// PredictHostStateBytes (scheduler/job_files.h) for the admission fuzz target, which links no
// LibTorch. The daemon's version (scheduler/runtime/job_builder.cc) ends in the planner's
// formula, planning::HostStateBytes, after asking the model files whether a LoRA base can be
// mapped where it lies (workers::io::HfBaseIsStoredAs, a LibTorch reader); this one always
// counts the base as allocated, the larger of the two answers.
#include "scheduler/job_files.h"
#include "scheduler/planning/host_state.h"

namespace rp::scheduler {

absl::StatusOr<int64_t> PredictHostStateBytes(const JobSpec& job) {
  return planning::HostStateBytes(job.model, planning::HostStateOptions{});
}

}  // namespace rp::scheduler
