// The facade's ReadHfModelConfig (job_files.h), kept apart from job_files.cc because it needs no
// LibTorch: the daemon's admission rules (server/job_spec.cc) and the admission fuzz target
// compile it without the data plane's tensors.
#include "scheduler/job_files.h"
#include "workers/files/hf_configs.h"

namespace rp::scheduler {

absl::StatusOr<spec::ModelConfig> ReadHfModelConfig(const std::string& dir) { return files::ReadHfConfig(dir); }

}  // namespace rp::scheduler
