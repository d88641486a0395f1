// job_builder.h — (runtime) a job from its spec to a runnable state, in two steps: PrepareJob
// at Submit checks everything (model, partition, round structure, the files the job names:
// headers, checksums, the token file) and decides the controller's options without allocating;
// BuildJob, on the runner when the job is about to run, allocates and loads the host model store
// (reporting progress events) and creates the controller.
//
// Contract: PrepareJob is pure apart from reading headers (any thread); BuildJob runs on the
// runner thread with the job's run_mu held. Errors name the field or file.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/runtime/engine_job.h"
#include "workers/device/device.h"
#include "workers/device/timeline.h"

namespace rp::scheduler::runtime {

// Fills `job` (spec with defaults, model, dtype, controller options, resume cursor, token file).
absl::Status PrepareJob(const JobSpec& spec, const std::vector<workers::Device*>& devices, EngineJob* job);
// The host bytes of the job's model states once it has stepped (planning::HostStateBytes of its
// layout; a LoRA base in the job's dtype in `hf_dir` counts as mapped): what admission compares
// with free memory and JobInfo::predicted_host_state_bytes reports. Reads headers only.
absl::StatusOr<int64_t> PredictHostStateBytes(const JobSpec& spec);
absl::Status BuildJob(EngineJob& job, const std::vector<workers::Device*>& devices, workers::Timeline* timeline)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.run_mu);

}  // namespace rp::scheduler::runtime

namespace rp::scheduler {

// 90 % of the smallest per-worker share of GPU memory (a GPU's memory divided among the workers
// that share it), halved because one stage is prefetched while one runs; 0 when any device has
// no memory figure (CPU).
int64_t DefaultStageMemoryCap(const std::vector<workers::Device*>& devices);

// Default partition when a job names none: AutoPartition over a cost model in which parameter
// counts (spec::ModelConfig::LayerParams) stand in for time (ARCHITECTURE §9).
absl::StatusOr<planning::Partition> PlanFromParameterSizes(const spec::ModelConfig& model, int num_workers,
                                                           int microbatches);

}  // namespace rp::scheduler
