// engine_job_edges.cc — Engine::Impl at the edges of a job's run (engine_impl.h): a start
// (BuildJob: tokenizing, loading) stopped by a cancel, pause or shutdown, and what an ended job
// gives back besides its store; feeds still waiting for room ended by a shutdown; the engine's
// own shutdown, the edge of every job.
#include <malloc.h>

#include <deque>

#include "scheduler/runtime/engine_impl.h"

#include "absl/strings/str_cat.h"
#include "scheduler/runtime/token_dataset.h"

namespace rp::scheduler {

// An ended job's datasets (training and validation tokens, a mapped token file) are freed
// whatever else it keeps: nothing reads them after the runner is done. Info keeps the step count
// they implied.
void Engine::Impl::ReleaseData(Job& job) {
  std::unique_ptr<runtime::TokenDataset> data, validation;
  {
    base::MutexLock lock(&job.mu);
    if (!IsTerminal(job.state)) return;
    if (job.data) job.data_steps = job.data->batches_per_epoch() * job.spec.token_file->max_epochs;
    data = std::move(job.data);
    validation = std::move(job.validation);
  }
  // Freed outside the lock (a large unmap or free must not stall GetJob), then handed back to the
  // system: glibc raises its mmap threshold after large frees, so a dataset's vectors may sit in
  // the heap or a tokenizing thread's arena, where free() alone keeps them resident.
  data.reset();
  validation.reset();
  malloc_trim(0);
}

// A job whose start (BuildJob) was stopped by a cancel, pause or shutdown; everything it had
// loaded is freed with BuildJob's locals. Cancelled: the job ends (false: the caller ends it
// like any other). Paused: back to kPaused, not started, in the queue again so Resume starts it
// afresh; resumed already (the flag raced with Resume): queued again.
bool Engine::Impl::StartInterrupted(const std::shared_ptr<Job>& job) {
  base::MutexLock lock(&mu_);
  base::MutexLock jl(&job->mu);
  if (job->terminal()) return false;
  if (job->cancel || shutdown_) {
    job->SetState(JobState::kCancelled,
                  shutdown_ ? "stopped while starting (the daemon stopped)" : "cancelled while starting");
    return false;
  }
  job->controller_started = false;
  if (job->pause) {
    job->SetState(JobState::kPaused, "paused while starting; it starts again on resume");
  } else {
    job->SetState(JobState::kQueued, "queued again (resumed while starting)");
  }
  pending_.push_back(job->id);
  cv_.SignalAll();
  return true;
}

absl::Status Engine::Impl::EndWaitingFeeds(JobId id, const absl::Status& why) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job ", id));
  std::deque<runtime::WaitingFeed> waiting;
  {
    base::MutexLock lock(&job->mu);
    waiting.swap(job->waiting);
    job->cv.SignalAll();
  }
  for (auto& w : waiting) w.done(why);
  return absl::OkStatus();
}

// Every job is cancelled (a starting one stops at once), the runner joins, and what still waits
// for room is told.
void Engine::Impl::Shutdown() {
  {
    base::MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    for (auto& [id, job] : jobs_) {
      base::MutexLock jl(&job->mu);
      job->cancel = true;
      job->stop_starting = true;
      job->cv.SignalAll();
    }
  }
  cv_.SignalAll();
  for (std::thread& r : runners_) {
    if (r.joinable()) r.join();
  }
  base::MutexLock lock(&mu_);
  while (!generating_.empty()) cv_.Wait(&mu_);  // cancelled above: they end at the next token
  for (auto& [id, job] : jobs_) {
    std::deque<runtime::WaitingFeed> waiting;
    {
      base::MutexLock jl(&job->mu);
      if (!job->terminal()) job->SetState(JobState::kCancelled, "engine shut down");
      waiting.swap(job->waiting);
    }
    for (auto& w : waiting) w.done(absl::UnavailableError("the engine is shutting down"));
  }
}

}  // namespace rp::scheduler
