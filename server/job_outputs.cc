// A job's outputs and the daemon's drain and shutdown: ExportModel, Checkpoint, Drain, Shutdown
// (job_manager.h).
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "scheduler/job_files.h"
#include "server/job_manager_internal.h"
#include "server/paths.h"

namespace rp::server {

namespace v1 = roundpipe::v1;

absl::StatusOr<ResolvedJob> JobManager::AdmittedSpec(ManagedJob& job, bool live, const v1::JobSpec& spec) {
  if (live) return job.resolved;
  // Listed from an earlier daemon run: resolved again.
  JobSpecContext ctx = options_.spec;
  ctx.host_memory_budget = nullptr;
  ctx.default_output_dir = (std::filesystem::path(options_.jobs_dir) / job.id).string();
  return ResolveJobSpec(spec, ctx);
}

absl::StatusOr<std::string> JobManager::FinalCheckpoint(const std::string& id, const ResolvedJob& resolved,
                                                        int64_t step) {
  // The engine writes one when a job ends; it must hold the step the job ended at.
  const auto all = scheduler::ListJobCheckpoints(resolved.engine.checkpoint_root);
  if (all.empty() || all.front().step != step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", id, " has no checkpoint of its final step ", step, " under ", resolved.engine.checkpoint_root,
        all.empty() ? std::string() : absl::StrCat(" (newest: step ", all.front().step, ")")));
  }
  return all.front().path;
}

absl::StatusOr<std::string> JobManager::Export(const std::string& id, const std::string& dir_in, bool merge_lora,
                                               const std::function<bool()>& caller_gone) {
  auto job = table_.Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  std::optional<scheduler::JobId> eid;
  int64_t step;
  v1::JobSpec spec;
  {
    absl::MutexLock lock(&job->mu);
    const v1::JobState s = job->record.state();
    if (s != v1::JOB_STATE_SUCCEEDED && s != v1::JOB_STATE_CANCELLED && s != v1::JOB_STATE_PAUSED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " is ", v1::JobState_Name(s), "; export a job that is PAUSED or has finished (pause it first)"));
    }
    eid = job->engine_id;
    step = job->record.progress().step();
    spec = job->record.spec();
  }
  auto resolved = AdmittedSpec(*job, eid.has_value(), spec);
  if (!resolved.ok()) return resolved.status();
  std::string dir;
  if (dir_in.empty()) {
    dir = (std::filesystem::path(resolved->output_dir) / absl::StrCat("export-step", step)).string();
  } else {
    auto inside = ResolveInsideRoots(dir_in, options_.spec.allowed_roots, "output_dir");
    if (!inside.ok()) return inside.status();
    dir = *inside;
  }
  const bool lora = resolved->engine.model.lora.rank > 0;
  if (merge_lora && !lora) return absl::InvalidArgumentError("merge_lora: this job has no LoRA adapters");
  const scheduler::ExportKind kind = merge_lora ? scheduler::ExportKind::kMergedLora : scheduler::ExportKind::kHfModel;
  absl::StatusOr<int64_t> bytes;
  // A journal entry while the export is written: a kill -9 meanwhile leaves a temporary beside
  // `dir` that the next start removes (Recover), even if nothing exports there again.
  const std::string journal = export_journal_.Begin(id, dir);
  absl::Cleanup end_journal = [&] { export_journal_.End(journal); };
  const auto started = std::chrono::steady_clock::now();
  auto last_log = started;
  int64_t tensors = 0;
  const scheduler::StopCheck stop = [&]() -> absl::Status {
    if (caller_gone && caller_gone()) return absl::CancelledError("the client cancelled the export");
    {
      absl::MutexLock lock(&mu_);
      if (draining_ || shutdown_) {
        return absl::UnavailableError("the daemon is draining; nothing was exported (export again after the restart)");
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (now - last_log >= std::chrono::seconds(10)) {
      last_log = now;
      JobLog()->info("[{}] exporting to {}: {} tensors written in {} s", id, dir, tensors,
                     std::chrono::duration_cast<std::chrono::seconds>(now - started).count());
    }
    ++tensors;
    return absl::OkStatus();
  };
  if (eid) {
    bytes = engine_->Export(*eid, dir, kind, stop);
  } else {
    // From an earlier daemon run: the job's final weights are its newest checkpoint.
    auto final_checkpoint = FinalCheckpoint(id, *resolved, step);
    if (!final_checkpoint.ok()) return final_checkpoint.status();
    bytes = scheduler::ExportCheckpoint(*final_checkpoint, resolved->engine, dir, kind, stop);
  }
  if (!bytes.ok()) return bytes.status();
  JobLog()->info("[{}] exported {} MiB at step {} to {}", id, *bytes >> 20, step, dir);
  return dir;
}

absl::StatusOr<v1::CheckpointResponse> JobManager::Checkpoint(const std::string& id) {
  auto job = table_.Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  scheduler::JobId eid;
  {
    absl::MutexLock lock(&job->mu);
    if (!job->engine_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " has no training state in this daemon: ", job->record.message()));
    }
    if (job->record.state() == v1::JOB_STATE_FAILED) {
      return absl::FailedPreconditionError(absl::StrCat("job ", id, " failed; its state is not consistent"));
    }
    eid = *job->engine_id;
  }
  auto info = engine_->Checkpoint(eid, "requested");
  if (!info.ok()) return absl::Status(info.status().code(), absl::StrCat("job ", id, ": ", info.status().message()));
  v1::CheckpointResponse r;
  r.set_path(info->path);
  r.set_step(info->step);
  return r;
}

int JobManager::Drain(std::chrono::seconds deadline) {
  std::vector<std::shared_ptr<ManagedJob>> jobs;
  {
    absl::MutexLock lock(&mu_);
    draining_ = true;
    jobs = table_.All();
  }
  int paused = 0;
  std::vector<std::shared_ptr<ManagedJob>> waiting;
  for (const auto& j : jobs) {
    std::optional<scheduler::JobId> eid;
    bool user_paused = false;
    {
      absl::MutexLock lock(&j->mu);
      const v1::JobState s = j->record.state();
      if (!j->engine_id) continue;
      // Paused by its user: it stays paused, but its state must survive the restart too.
      user_paused = s == v1::JOB_STATE_PAUSED && j->record.has_started();
      if (!user_paused && s != v1::JOB_STATE_RUNNING && s != v1::JOB_STATE_QUEUED) continue;
      eid = j->engine_id;
      if (!user_paused) j->drained = true;
    }
    if (user_paused) {
      auto info = engine_->Checkpoint(*eid, "drain");
      if (!info.ok()) JobLog()->warn("[{}] drain checkpoint: {}", j->id, std::string(info.status().message()));
    } else if (engine_->Pause(*eid).ok()) {
      waiting.push_back(j);
    }
  }
  const auto until = std::chrono::steady_clock::now() + deadline;
  for (const auto& j : waiting) {
    bool started = false;
    std::optional<scheduler::JobId> eid;
    {
      absl::MutexLock lock(&j->mu);
      while (j->record.state() != v1::JOB_STATE_PAUSED && !IsTerminal(j->record.state())) {
        const auto left = until - std::chrono::steady_clock::now();
        if (left <= std::chrono::steady_clock::duration::zero() ||
            j->cv.WaitWithTimeout(&j->mu, absl::FromChrono(left))) {
          break;
        }
      }
      if (j->record.state() == v1::JOB_STATE_PAUSED) {
        ++paused;  // counted (and logged below) once it really paused
        j->record.set_message("paused by a daemon drain");
        j->record.set_paused_by_drain(true);
        Persist(*j);
        started = j->record.has_started();
        eid = j->engine_id;
      }
    }
    if (eid) {
      if (started) {  // so the restarted daemon continues from exactly here
        auto info = engine_->Checkpoint(*eid, "drain");
        if (!info.ok()) JobLog()->warn("[{}] drain checkpoint: {}", j->id, std::string(info.status().message()));
      }
    }
  }
  JobLog()->info("drain: paused {} job(s)", paused);
  return paused;
}

void JobManager::Shutdown() {
  std::vector<std::shared_ptr<ManagedJob>> jobs;
  {
    absl::MutexLock lock(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    jobs = table_.All();
  }
  // Feeds still waiting for room in a job's queue (a paused job's, a full one's) end now with a
  // status: their StreamBatches calls finish, so the gRPC server's shutdown never waits on them.
  for (const auto& j : jobs) {
    std::optional<scheduler::JobId> eid;
    {
      absl::MutexLock lock(&j->mu);
      j->stop = true;  // no new feed is accepted from here
      eid = j->engine_id;
    }
    if (eid) {
      (void)engine_->EndWaitingFeeds(
          *eid, absl::UnavailableError("the daemon is shutting down; this batch was not queued (resend it after the "
                                       "restart)"));
    }
  }
  for (const auto& j : jobs) {
    absl::MutexLock lock(&j->mu);
    j->stop = true;
    j->cv.SignalAll();
    // Watchers learn that the daemon is going away (their stream ends with UNAVAILABLE).
    j->watchers.CloseAll(j->id, "daemon shutting down");
  }
  {
    absl::MutexLock reap(&reap_mu_);
    for (const auto& j : jobs) {
      if (j->pump.joinable()) j->pump.join();
      if (j->cluster_watch.joinable()) j->cluster_watch.join();
    }
  }
  tasks_.JoinAll();
}

}  // namespace rp::server
