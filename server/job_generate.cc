// Generate (job_manager.h): completions from a finished job's final weights, loaded on demand
// by the engine (Engine::Generate) and freed after.
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "server/job_events.h"
#include "server/job_manager_internal.h"
#include "server/job_spec.h"

namespace rp::server {

namespace v1 = roundpipe::v1;

absl::StatusOr<v1::GenerateResponse> JobManager::Generate(const std::string& id, const v1::SamplePolicy& sampling,
                                                          const std::function<bool()>& caller_gone) {
  const scheduler::EvalPolicy::Samples request = ToSamples(sampling);
  if (request.prompts.empty()) return absl::InvalidArgumentError("sampling.prompts: give at least one prompt");
  if (absl::Status st = scheduler::CheckSampleOptions(request, "sampling"); !st.ok()) return st;
  auto job = table_.Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  bool live;
  int64_t step;
  v1::JobSpec spec;
  {
    absl::MutexLock lock(&job->mu);
    const v1::JobState s = job->record.state();
    if (s != v1::JOB_STATE_SUCCEEDED && s != v1::JOB_STATE_CANCELLED) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " is ", v1::JobState_Name(s),
                       "; generate from a job that SUCCEEDED or was CANCELLED (a running job shows samples at its "
                       "evaluations: eval.samples)"));
    }
    live = job->engine_id.has_value();
    step = job->record.progress().step();
    spec = job->record.spec();
  }
  auto resolved = AdmittedSpec(*job, live, spec);
  if (!resolved.ok()) return resolved.status();
  auto checkpoint = FinalCheckpoint(id, *resolved, step);
  if (!checkpoint.ok()) return checkpoint.status();
  scheduler::JobSpec engine_spec = resolved->engine;
  engine_spec.resume_from = *checkpoint;
  engine_spec.priority = std::numeric_limits<int>::max();  // a person waits for it: before queued jobs
  const scheduler::StopCheck stop = [&]() -> absl::Status {
    if (caller_gone && caller_gone()) return absl::CancelledError("the client cancelled the generation");
    absl::MutexLock lock(&mu_);
    if (draining_ || shutdown_)
      return absl::UnavailableError("the daemon is draining; generate again after the restart");
    return absl::OkStatus();
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto samples = engine_->Generate(engine_spec, request, stop);
  if (!samples.ok()) {
    return absl::Status(samples.status().code(), absl::StrCat("job ", id, ": ", samples.status().message()));
  }
  v1::GenerateResponse r;
  for (const scheduler::GeneratedSample& g : *samples) FillSample(g, r.add_samples());
  r.set_step(step);
  r.set_checkpoint(*checkpoint);
  r.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  JobLog()->info("[{}] generated {} completion(s) from step {} in {:.2f} s", id, r.samples_size(), step, r.seconds());
  return r;
}

}  // namespace rp::server
