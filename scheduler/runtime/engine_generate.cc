// Engine::Generate (engine.h): a generation runs as a job of its own that is never queued or
// listed — prepared like a submitted job, admitted when its host memory fits beside the running
// jobs, built and run (JobRunner::RunGeneration) on the caller's thread, outside
// max_running_jobs (a person waits for it; it is short), freed, then dropped from the table.
#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "scheduler/runtime/engine_impl.h"
#include "scheduler/runtime/job_builder.h"
#include "scheduler/runtime/job_samples.h"

namespace rp::scheduler {

namespace {

// What of a job's spec a generation keeps: the model, the weights it starts from, the partition
// and its share of the devices; no data, evaluation, checkpoints or profile.
JobSpec GenerationSpec(const JobSpec& in, const EvalPolicy::Samples& request) {
  JobSpec s = in;
  s.token_file.reset();
  s.validation.reset();
  s.eval = EvalPolicy{};
  s.eval.samples = request;
  s.checkpoint_every = 0;
  s.checkpoint_root.clear();
  s.profile_path.clear();
  s.auto_partition = false;  // nothing to profile: no training step runs
  if (s.microbatches_per_round < 0) s.microbatches_per_round = 0;
  s.max_steps = 0;
  s.start_paused = false;
  s.data_parallel.reset();  // a generation runs on this node alone
  return s;
}

}  // namespace

bool Engine::Impl::AdmitGeneration(const std::shared_ptr<Job>& job) {
  for (;;) {
    bool others;
    {
      base::MutexLock lock(&mu_);
      if (shutdown_) return false;
      others = !running_.empty() || !generating_.empty();
    }
    {
      base::MutexLock jl(&job->mu);
      if (job->cancel) return false;
    }
    // As NextJob asks: with no engine lock held; anything fits when nothing runs.
    int64_t available = others && host_memory_available_ ? host_memory_available_() : -1;
    base::MutexLock lock(&mu_);
    if (shutdown_) return false;
    if (!others && (!running_.empty() || !generating_.empty())) continue;  // one started meanwhile: ask again
    if (host_memory_limit_ > 0 && others) {
      const int64_t room = std::max<int64_t>(0, host_memory_limit_ - HeldByRunningLocked());
      available = available < 0 ? room : std::min(available, room);
    }
    if (available < 0 || job->AdmissionBytes() <= available) {
      generating_.push_back(job->id);
      base::MutexLock jl(&job->mu);
      job->controller_started = true;
      return true;
    }
    (void)cv_.WaitFor(&mu_, std::chrono::seconds(1));  // a job ended, or memory freed elsewhere
  }
}

absl::StatusOr<std::vector<GeneratedSample>> Engine::Impl::Generate(const JobSpec& spec,
                                                                    const EvalPolicy::Samples& request,
                                                                    const StopCheck& stop) {
  if (request.prompts.empty()) return absl::InvalidArgumentError("prompts: give at least one prompt");
  if (absl::Status st = CheckSampleOptions(request, "request"); !st.ok()) return st;
  // The job's tokenizer, decided on its own spec (the data's tokenizer_dir counts, though the
  // generation reads no data).
  auto tokenizer_dir = runtime::SampleTokenizerDir(spec);
  if (!tokenizer_dir.ok()) return tokenizer_dir.status();
  auto job = std::make_shared<Job>();
  job->generation_only = true;
  job->sample_tokenizer_dir = *tokenizer_dir;
  if (absl::Status st = runtime::PrepareJob(GenerationSpec(spec, request), RawDevices(), job.get()); !st.ok()) {
    return st;
  }
  if (absl::Status st = CheckHostLimit(*job); !st.ok()) return st;
  {
    base::MutexLock lock(&mu_);
    if (shutdown_) return absl::UnavailableError("engine is shutting down");
    job->id = next_id_++;
    jobs_[job->id] = job;
  }
  // The caller's stop, polled while the job waits, loads and generates: a cancel of the job
  // (a load stops at once, a generation at the next token).
  absl::Status stopped = absl::OkStatus();
  base::Mutex watch_mu;
  bool done = false;
  base::CondVar watch_cv;
  std::thread watcher;
  if (stop) {
    watcher = std::thread([&] {
      base::MutexLock lock(&watch_mu);
      while (!done) {
        (void)watch_cv.WaitFor(&watch_mu, std::chrono::milliseconds(100));
        if (done) break;
        if (absl::Status st = stop(); !st.ok()) {
          stopped = st;
          lock.Unlock();
          (void)CancelJob(job);
          return;
        }
      }
    });
  }
  const bool admitted = AdmitGeneration(job);
  if (admitted) RunJob(job);  // builds, generates (JobRunner::RunGeneration), frees
  if (watcher.joinable()) {
    {
      base::MutexLock lock(&watch_mu);
      done = true;
    }
    watch_cv.SignalAll();
    watcher.join();
  }
  {
    base::MutexLock lock(&mu_);
    generating_.erase(std::remove(generating_.begin(), generating_.end(), job->id), generating_.end());
    jobs_.erase(job->id);
    cv_.SignalAll();  // its memory is free: queued jobs and Shutdown look again
  }
  if (!stopped.ok()) return stopped;
  base::MutexLock lock(&job->mu);
  if (job->generated) return *job->generated;
  if (!admitted) return absl::UnavailableError("the engine is shutting down; nothing was generated");
  return job->state == JobState::kCancelled
             ? absl::CancelledError(absl::StrCat("the generation was cancelled: ", job->message))
             : absl::InternalError(absl::StrCat("the generation failed: ", job->message));
}

}  // namespace rp::scheduler
