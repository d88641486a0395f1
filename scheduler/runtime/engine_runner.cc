// The engine's runner threads (engine_impl.h): which queued job starts next, why the others
// wait, and one job's run from its build to the release of its host state.
#include <algorithm>
#include <deque>
#include <future>

#include "absl/strings/str_cat.h"
#include "scheduler/runtime/engine_impl.h"
#include "scheduler/runtime/job_builder.h"
#include "scheduler/runtime/job_runner.h"
#include "workers/device/lane_device.h"
#include "workers/device/test_hooks.h"

namespace rp::scheduler {

void Engine::Impl::RunnerLoop() {
  for (;;) {
    std::shared_ptr<Job> job = NextJob();
    if (!job) return;
    RunJob(job);
    base::MutexLock lock(&mu_);
    running_.erase(std::remove(running_.begin(), running_.end(), job->id), running_.end());
    cv_.SignalAll();  // a slot (and the job's host memory) is free: waiting jobs look again
  }
}

std::shared_ptr<Engine::Impl::Job> Engine::Impl::NextJob() {
  for (;;) {
    bool others_running;
    {
      base::MutexLock lock(&mu_);
      if (shutdown_) return nullptr;
      others_running = !running_.empty() || !generating_.empty();
    }
    // Asked with no engine lock held (it may read the engine's Stats); one job always starts
    // when nothing runs.
    int64_t available = others_running && host_memory_available_ ? host_memory_available_() : -1;
    workers::MaybeDelayAdmissionForTest();
    base::MutexLock lock(&mu_);
    if (shutdown_) return nullptr;
    // A job started since the question was asked (another runner, a generation): ask again,
    // or a job would start unchecked beside it.
    if (!others_running && (!running_.empty() || !generating_.empty())) continue;
    if (host_memory_limit_ > 0 && (!running_.empty() || !generating_.empty())) {
      const int64_t room = std::max<int64_t>(0, host_memory_limit_ - HeldByRunningLocked());
      available = available < 0 ? room : std::min(available, room);
    }
    if (std::shared_ptr<Job> job = TakeRunnableLocked(available)) return job;
    // Memory frees outside the engine too (page cache, other processes): look again each second.
    if (available >= 0) {
      (void)cv_.WaitFor(&mu_, std::chrono::seconds(1));
    } else {
      cv_.Wait(&mu_);
    }
  }
}

int64_t Engine::Impl::HeldByRunningLocked() const {
  int64_t held = 0;
  std::vector<JobId> ids = running_;
  ids.insert(ids.end(), generating_.begin(), generating_.end());
  for (JobId id : ids) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    Job* j = it->second.get();
    base::MutexLock jl(&j->mu);
    held += std::max(j->predicted_host_state_bytes, j->peak_host_state_bytes) + j->predicted_worker_bytes;
  }
  return held;
}

std::shared_ptr<Engine::Impl::Job> Engine::Impl::HeadLocked(size_t* at) {
  std::shared_ptr<Job> best;
  for (size_t i = 0; i < pending_.size();) {
    auto& job = jobs_[pending_[i]];
    base::MutexLock jl(&job->mu);
    if (job->terminal()) {  // cancelled while queued
      pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      continue;
    }
    if (!job->pause && (!best || job->spec.priority > best->spec.priority)) {
      best = job;
      *at = i;
    }
    ++i;
  }
  return best;
}

JobWait Engine::Impl::HeadWaitLocked(const Job& head, int64_t available) const {
  JobWait w;
  if (static_cast<int>(running_.size()) >= max_running_) {
    w.cause = JobWait::Cause::kRunningLimit;
    w.running = running_;
    w.max_running = max_running_;
  } else if ((!running_.empty() || !generating_.empty()) && available >= 0 && head.AdmissionBytes() > available) {
    w.cause = JobWait::Cause::kHostMemory;
    w.running = running_;
    w.need_bytes = head.AdmissionBytes();
    w.free_bytes = available;
  }
  return w;
}

std::shared_ptr<Engine::Impl::Job> Engine::Impl::TakeRunnableLocked(int64_t available) {
  size_t at = 0;
  std::shared_ptr<Job> head = HeadLocked(&at);
  if (head && HeadWaitLocked(*head, available).cause == JobWait::Cause::kNone) {
    pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(at));
    running_.push_back(head->id);
    base::MutexLock jl(&head->mu);
    head->controller_started = true;
    head->wait = JobWait{};
  } else {
    head = nullptr;
  }
  UpdateWaitsLocked(available);
  return head;
}

void Engine::Impl::UpdateWaitsLocked(int64_t available) {
  size_t at = 0;
  std::shared_ptr<Job> head = HeadLocked(&at);
  if (!head) return;
  // The head's own reason is only known when it cannot start; one that can is about to be
  // taken by a runner (it keeps the reason it had).
  const JobWait head_wait = HeadWaitLocked(*head, available);
  for (JobId id : pending_) {
    const std::shared_ptr<Job>& job = jobs_[id];
    JobWait w;
    if (job == head) {
      if (head_wait.cause == JobWait::Cause::kNone) continue;
      w = head_wait;
    } else {
      w.cause = JobWait::Cause::kBehind;
      w.ahead = head->id;
      w.ahead_priority = head->spec.priority;
    }
    base::MutexLock jl(&job->mu);
    if (job->pause || job->terminal() || job->wait == w) continue;
    job->wait = w;
    JobEvent e;
    e.kind = JobEvent::Kind::kWaiting;
    e.state = job->state;
    e.wait = w;
    job->Emit(std::move(e));
  }
}

std::vector<workers::Device*> Engine::Impl::LanesOf(Job& job) {
  if (job.lanes.empty()) {
    std::vector<std::pair<int, int>> gate_lanes;
    for (size_t d = 0; d < devices_.size(); ++d) {
      auto lane = std::make_unique<workers::LaneDevice>(devices_[d].get(), gates_[d].get(), job.spec.share,
                                                        static_cast<int>(job.id));
      gate_lanes.emplace_back(static_cast<int>(d), lane->lane());
      job.lanes.push_back(std::move(lane));
    }
    base::MutexLock lock(&job.mu);
    job.gate_lanes = std::move(gate_lanes);
  }
  std::vector<workers::Device*> out;
  for (const auto& l : job.lanes) out.push_back(l.get());
  return out;
}

void Engine::Impl::FreeLanes(Job& job) {
  if (job.controller) return;
  {
    base::MutexLock lock(&job.mu);
    job.gate_lanes.clear();
  }
  job.lanes.clear();  // drains the lanes' streams; nothing of the job runs after
}

void Engine::Impl::RunJob(const std::shared_ptr<Job>& job) {
  try {  // the job's barrier: an unexpected exception fails this job, never the daemon
    bool ended;
    {  // on the workers from here: loading the host state is part of running the job
      base::MutexLock lock(&job->mu);
      ended = job->terminal();  // cancelled as it was taken
      if (!ended) job->SetState(JobState::kRunning);
    }
    absl::Status built = absl::OkStatus();
    if (!job->store && !ended) {  // Parameter() and friends wait for it (run_mu)
      base::MutexLock run(&job->run_mu);
      built = runtime::BuildJob(*job, LanesOf(*job), &timeline_);
    }
    if (built.ok()) {
      runtime::JobRunner(*job).Run();
    } else if (built.code() == absl::StatusCode::kCancelled && StartInterrupted(job)) {
      FreeLanes(*job);
      return;  // paused (or resumed) while starting: queued again, its feeds kept
    } else {
      base::MutexLock lock(&job->mu);
      if (job->generation_only) {
        job->generated = absl::Status(built.code(), absl::StrCat("could not load the weights: ", built.message()));
      }
      if (!job->terminal()) job->SetState(JobState::kFailed, absl::StrCat("could not start: ", built.message()));
    }
  } catch (const std::exception& e) {
    base::MutexLock lock(&job->mu);
    if (!job->terminal()) job->SetState(JobState::kFailed, absl::StrCat("internal error: ", e.what()));
  }
  // Checkpoint requests that raced with the end of the job: the store is final now. Feeds
  // still waiting for room never get it.
  std::deque<runtime::EngineJob::CheckpointRequest> reqs;
  std::deque<runtime::WaitingFeed> waiting;
  JobState state;
  {
    base::MutexLock lock(&job->mu);
    reqs.swap(job->checkpoints);
    waiting.swap(job->waiting);
    job->batches.clear();
    state = job->state;
  }
  for (auto& w : waiting) {
    w.done(absl::FailedPreconditionError(absl::StrCat("job ", job->id, " has ended (", JobStateName(state), ")")));
  }
  base::MutexLock run(&job->run_mu);
  for (auto& r : reqs) {
    if (state == JobState::kFailed) {
      if (r.done) r.done->set_value(absl::FailedPreconditionError("the job failed; no consistent state to checkpoint"));
    } else {
      auto info = job->CheckpointNow(r.note);
      if (r.done) r.done->set_value(info);
    }
  }
  ReleaseEnded(*job);
  ReleaseData(*job);
  FreeLanes(*job);
  base::MutexLock lock(&job->mu);
  job->finished = true;
  job->cv.SignalAll();
}

}  // namespace rp::scheduler
