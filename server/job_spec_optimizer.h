// job_spec_optimizer.h — one step of ResolveJobSpec (job_spec.h): a JobSpec's optimizer (the
// update rule and its hyper-parameters, validated in the optimizer's float32 where it matters,
// the learning-rate schedule, the optimizer mode) into the engine's spec, defaults filled.
//
// Contract: a pure function, any thread; InvalidArgument naming the field and the fix.
#pragma once

#include "absl/status/status.h"
#include "server/job_spec.h"

namespace rp::server {

absl::Status ResolveOptimizer(const roundpipe::v1::JobSpec& spec, const JobSpecContext& ctx, ResolvedJob& r);

}  // namespace rp::server
