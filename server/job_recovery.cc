// Restart recovery: the job store's records become jobs again (job_manager.h, Create).
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "scheduler/job_files.h"
#include "server/job_manager_internal.h"
#include "server/recovery_plan.h"
#include "server/status_util.h"

namespace rp::server {

namespace v1 = roundpipe::v1;

absl::Status JobManager::Recover() {
  auto all = store_->LoadAll();
  if (!all.ok()) return all.status();
  std::vector<RecoveredJob> readmit;  // never ran
  std::vector<RecoveredJob> resume;   // started ones
  for (auto& [seq, record] : *all) {
    auto job = std::make_shared<ManagedJob>();
    job->id = record.id();
    job->seq = seq;
    const RecoveryPlan plan = PlanRecovery(record);
    {
      absl::MutexLock lock(&job->mu);  // not published yet; the lock states the rule
      job->record = record;
      // Listed as QUEUED until it runs again (the pump records what the engine does next).
      if (plan.action != RecoveryAction::kList) job->record.set_state(v1::JOB_STATE_QUEUED);
    }
    if (absl::Status st = table_.Add(job); !st.ok()) {
      JobLog()->error("job store: {}; the later record is not listed", std::string(st.message()));
      continue;
    }
    if (plan.action != RecoveryAction::kList && record.cluster().size() > 1) {
      // Its other nodes went on without it, or failed: a node never continues alone.
      FailRecovered(*job,
                    "a node of a cluster job does not resume after a daemon restart: resume the job on its "
                    "coordinator (ResumeJob), which starts its nodes again from their checkpoints");
      continue;
    }
    if (plan.action == RecoveryAction::kReadmit) readmit.push_back({job, plan.pause_again});
    if (plan.action == RecoveryAction::kResume) resume.push_back({job, plan.pause_again});
  }
  ContinueIdsAfterJobDirs(all->size());
  export_journal_.RemoveTorn();
  gauges_.SetCounts(table_.CountByState());  // absolute counts before any pump moves them
  for (const RecoveredJob& r : readmit) ReadmitAfterRestart(r);
  for (const RecoveredJob& r : resume) ResumeAfterRestart(r);
  return absl::OkStatus();
}

// Ids never restart: a damaged or replaced store must not hand out the id (and so the default
// output dir and checkpoints) of a job that existed before.
void JobManager::ContinueIdsAfterJobDirs(size_t listed) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(options_.jobs_dir, ec)) {
    names.push_back(entry.path().filename().string());
  }
  const int64_t highest_dir = HighestJobSeq(names);
  if (highest_dir >= table_.next_seq()) {
    JobLog()->error(
        "the job store lists {} job(s) but {} holds directories up to {}: the store was damaged or "
        "replaced; those jobs are not listed, new ids continue after them",
        listed, options_.jobs_dir, JobTable::IdOf(highest_dir));
    table_.ContinueAfter(highest_dir);
  }
}

void JobManager::FailRecovered(ManagedJob& job, const std::string& why) {
  absl::MutexLock lock(&job.mu);
  gauges_.Move(job.record.state(), v1::JOB_STATE_FAILED);
  job.record.set_state(v1::JOB_STATE_FAILED);
  job.record.set_error(why);
  *job.record.mutable_updated() = Now();
  Persist(job);
  JobLog()->error("[{}] {}", job.id, why);
}

// A recovered job's stored spec and its output-dir owner token.
std::pair<v1::JobSpec, std::string> JobManager::StoredSpec(ManagedJob& job) {
  absl::MutexLock lock(&job.mu);
  return {job.record.spec(), OwnerToken(job.record)};
}

void JobManager::ReadmitAfterRestart(const RecoveredJob& r) {
  const std::shared_ptr<ManagedJob>& job = r.job;
  JobSpecContext ctx = options_.spec;
  ctx.default_output_dir = (std::filesystem::path(options_.jobs_dir) / job->id).string();
  const auto stored = StoredSpec(*job);
  const v1::JobSpec& spec = stored.first;
  const std::string& owner = stored.second;
  absl::Status st = Guarded("restart recovery", [&]() -> absl::Status {
    auto resolved = ResolveJobSpec(spec, ctx);
    if (!resolved.ok()) return resolved.status();
    job->resolved = *resolved;
    job->resolved.engine.start_paused = r.pause_again;  // never runs before its user resumes it
    if (absl::Status c = scheduler::ClaimOutputDir(job->resolved.output_dir, owner); !c.ok()) return c;
    return Admit(job);
  });
  if (!st.ok()) {
    FailRecovered(*job, absl::StrCat("could not be re-admitted after a daemon restart: ", st.message()));
    return;
  }
  JobLog()->info("[{}] re-admitted after restart{}", job->id, r.pause_again ? " (paused, as its user left it)" : "");
}

void JobManager::ResumeAfterRestart(const RecoveredJob& r) {
  const std::shared_ptr<ManagedJob>& job = r.job;
  bool resumed = false;
  absl::Status st = Guarded("restart recovery", [&]() -> absl::Status {
    resumed = ResumeFromCheckpoint(job, r.pause_again);
    return absl::OkStatus();
  });
  if (!st.ok()) {
    FailRecovered(*job, absl::StrCat("could not be resumed after a daemon restart: ", st.message()));
    return;
  }
  if (resumed) return;
  WithoutCheckpoint plan;
  {
    absl::MutexLock lock(&job->mu);
    plan = PlanWithoutCheckpoint(job->record.progress().step());
  }
  if (plan.start_over) {
    ReadmitAfterRestart(r);
    return;
  }
  absl::MutexLock lock(&job->mu);
  gauges_.Move(job->record.state(), v1::JOB_STATE_PAUSED);
  job->record.set_state(v1::JOB_STATE_PAUSED);
  job->record.set_message(plan.message);
  *job->record.mutable_updated() = Now();
  Persist(*job);
  JobLog()->warn("[{}] interrupted at step {} and has no usable checkpoint; listed as PAUSED", job->id,
                 job->record.progress().step());
}

bool JobManager::ResumeFromCheckpoint(const std::shared_ptr<ManagedJob>& job, bool paused) {
  JobSpecContext ctx = options_.spec;
  ctx.default_output_dir = (std::filesystem::path(options_.jobs_dir) / job->id).string();
  const auto [spec, owner] = StoredSpec(*job);
  auto resolved = ResolveJobSpec(spec, ctx);
  if (!resolved.ok()) {
    JobLog()->warn("[{}] cannot resume: {}", job->id, std::string(resolved.status().message()));
    return false;
  }
  if (absl::Status c = scheduler::ClaimOutputDir(resolved->output_dir, owner); !c.ok()) {
    JobLog()->warn("[{}] cannot resume: {}", job->id, std::string(c.message()));
    return false;
  }
  std::vector<std::string> skipped;
  const auto checkpoints = scheduler::ListJobCheckpoints(resolved->engine.checkpoint_root, &skipped);
  for (const std::string& why : skipped) JobLog()->warn("[{}] skipping checkpoint {}", job->id, why);
  for (const scheduler::CheckpointInfo& cp : checkpoints) {
    const std::string& dir = cp.path;
    const scheduler::CheckpointInfo* meta = &cp;
    job->resolved = *resolved;
    scheduler::JobSpec& e = job->resolved.engine;
    const CheckpointResume at = ResumeAt(meta->step, e.max_steps);
    if (at.already_finished) {  // only the final record was lost
      absl::MutexLock lock(&job->mu);
      gauges_.Move(job->record.state(), v1::JOB_STATE_SUCCEEDED);
      job->record.set_state(v1::JOB_STATE_SUCCEEDED);
      Persist(*job);
      return true;
    }
    e.max_steps = at.steps_left;
    e.resume_from = dir;
    e.start_paused = paused;  // a user-paused job is submitted paused: it never runs before Resume
    {
      absl::MutexLock lock(&job->mu);
      job->record.mutable_progress()->set_step(meta->step);
      job->record.set_last_checkpoint(dir);
      job->record.set_last_checkpoint_step(meta->step);
      job->record.set_message(absl::StrCat("resumed from ", dir, " after a daemon restart"));
    }
    absl::Status st = Admit(job);
    if (st.ok()) {
      // Admit counts the total from the spec; keep it.
      JobLog()->info("[{}] resumed from {} (step {}, data cursor {})", job->id, dir, meta->step,
                     meta->batches_consumed);
      absl::MutexLock lock(&job->mu);
      Persist(*job);
      return true;
    }
    JobLog()->warn("[{}] checkpoint {} unusable: {}", job->id, dir, std::string(st.message()));
  }
  return false;
}

}  // namespace rp::server
