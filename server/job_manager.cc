#include "server/job_manager.h"

#include <google/protobuf/util/time_util.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "scheduler/job_files.h"
#include "server/job_events.h"
#include "server/job_manager_internal.h"
#include "server/job_tensorboard.h"
#include "server/paths.h"
#include "server/recovery_plan.h"
#include "server/status_util.h"
#include "server/stream_batch.h"

namespace rp::server {

namespace v1 = roundpipe::v1;
using google::protobuf::util::TimeUtil;
using scheduler::JobState;

JobManager::JobManager(scheduler::Engine* engine, JobStore* store, DaemonMetrics* metrics, JobManagerOptions options)
    : engine_(engine),
      store_(store),
      metrics_(metrics),
      options_(std::move(options)),
      export_journal_(options_.jobs_dir),
      gauges_(&metrics->jobs),
      engine_metrics_(metrics) {}

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(scheduler::Engine* engine, JobStore* store,
                                                               DaemonMetrics* metrics, JobManagerOptions options) {
  std::unique_ptr<JobManager> m(new JobManager(engine, store, metrics, std::move(options)));
  if (absl::Status st = m->Recover(); !st.ok()) return st;
  return m;
}

JobManager::~JobManager() { Shutdown(); }

void JobManager::Persist(ManagedJob& job) {
  job.mu.AssertHeld();
  if (absl::Status st = store_->Put(job.seq, job.record); !st.ok()) {
    JobLog()->error("[{}] job store: {}", job.id, std::string(st.message()));
  }
}

void JobManager::Publish(ManagedJob& job, v1::JobEvent event, bool last) {
  job.mu.AssertHeld();
  event.set_job_id(job.id);
  if (!event.has_time()) *event.mutable_time() = Now();
  job.watchers.Publish(event, last);
}

absl::Status JobManager::Admit(const std::shared_ptr<ManagedJob>& job) {
  auto eid = engine_->Submit(job->resolved.engine);
  if (!eid.ok()) return eid.status();
  auto info = engine_->Info(*eid);
  const scheduler::JobId engine_id = *eid;
  {
    absl::MutexLock lock(&names_mu_);
    names_[engine_id] = job->id;
  }
  {
    absl::MutexLock lock(&job->mu);
    job->engine_id = *eid;
    job->tracker.set_names([this](scheduler::JobId id) { return NameOf(id); });
    // Steps of the whole job (resumed steps included): max_steps, capped by what a token file holds.
    const int64_t total = info.ok() ? info->total_steps : 0;
    job->record.set_total_steps(total > 0 ? total : job->record.spec().max_steps());
    if (info.ok()) {
      job->record.mutable_host_memory()->set_predicted_state_bytes(info->predicted_host_state_bytes);
      job->record.mutable_host_memory()->set_predicted_worker_bytes(info->predicted_worker_bytes);
    }
  }
  // The pump runs behind a barrier: an unexpected exception cancels that job (logged), it never
  // terminates the daemon.
  bool in_cluster = false;
  {
    absl::MutexLock lock(&job->mu);
    in_cluster = job->record.cluster().size() > 1;
  }
  job->threads_running = in_cluster ? 2 : 1;
  if (in_cluster) {
    job->cluster_watch = std::thread([this, job] {
      (void)Guarded(absl::StrCat("[", job->id, "] cluster watch"), [&] {
        WatchCluster(job);
        return absl::OkStatus();
      });
      --job->threads_running;
    });
  }
  job->pump = std::thread([this, job, engine_id] {
    absl::Status st = Guarded(absl::StrCat("[", job->id, "] event pump"), [&] {
      PumpLoop(job);
      return absl::OkStatus();
    });
    if (!st.ok()) (void)engine_->Cancel(engine_id);
    --job->threads_running;
  });
  return absl::OkStatus();
}

void JobManager::ReapJobThreads() {
  const std::vector<std::shared_ptr<ManagedJob>> jobs = table_.All();
  absl::MutexLock reap(&reap_mu_);
  for (const auto& j : jobs) {
    if (j->threads_running.load() != 0) continue;
    if (j->pump.joinable()) j->pump.join();
    if (j->cluster_watch.joinable()) j->cluster_watch.join();
  }
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::JobSpec& spec) {
  if (spec.cluster().nodes() > 1) return SubmitCluster(spec);
  return SubmitAs(spec, nullptr);
}

absl::StatusOr<v1::Job> JobManager::SubmitAs(const v1::JobSpec& spec, ClusterJoin* join) {
  ReapJobThreads();  // ended jobs keep no threads
  {
    absl::MutexLock lock(&mu_);
    if (draining_ || shutdown_) return absl::UnavailableError("the daemon is draining and admits no new jobs");
  }
  auto job = std::make_shared<ManagedJob>();
  job->seq = table_.ReserveSeq();
  job->id = JobTable::IdOf(job->seq);
  JobSpecContext ctx = options_.spec;
  ctx.default_output_dir = (std::filesystem::path(options_.jobs_dir) / job->id).string();
  v1::JobSpec own = spec;
  if (join && join->own_output_dir) own.clear_output_dir();
  if (join) ctx.nodes = join->data_parallel.size;
  auto resolved = ResolveJobSpec(own, ctx);
  if (!resolved.ok()) return resolved.status();
  job->resolved = *resolved;
  if (join && join->data_parallel.size > 1) job->resolved.engine.data_parallel = join->data_parallel;
  if (join && !join->resume_from.empty()) {
    const CheckpointResume at = ResumeAt(join->resume_step, job->resolved.engine.max_steps);
    if (at.already_finished) return absl::FailedPreconditionError("the job had run all its steps at that checkpoint");
    job->resolved.engine.resume_from = join->resume_from;
    job->resolved.engine.max_steps = at.steps_left;
  }
  std::string owner;
  {
    absl::MutexLock lock(&job->mu);  // not published yet; the lock states the rule
    job->record.set_id(job->id);
    *job->record.mutable_spec() = spec;
    job->record.set_state(v1::JOB_STATE_QUEUED);
    *job->record.mutable_created() = Now();
    *job->record.mutable_updated() = Now();
    if (join) *job->record.mutable_cluster() = join->membership;
    if (join && !join->resume_from.empty()) {
      job->record.mutable_progress()->set_step(join->resume_step);
      job->record.set_message(absl::StrCat("resumed from ", join->resume_from));
    }
    owner = OwnerToken(job->record);
  }
  // The job owns its output dir from here on (no other job may share its checkpoints).
  if (absl::Status st = scheduler::ClaimOutputDir(job->resolved.output_dir, owner); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("output_dir: ", st.message()));
  }
  if (join && join->before_admit) {
    if (absl::Status st = join->before_admit(*job); !st.ok()) {
      scheduler::ReleaseOutputDir(job->resolved.output_dir);
      return st;
    }
  }
  if (absl::Status st = Admit(job); !st.ok()) {
    if (join && join->stop_others) join->stop_others(*job);
    scheduler::ReleaseOutputDir(job->resolved.output_dir);
    return st;
  }
  {
    absl::MutexLock lock(&job->mu);
    Persist(*job);
  }
  if (absl::Status st = table_.Add(job); !st.ok()) return st;  // a reserved seq is never listed yet
  gauges_.Move(v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_QUEUED);
  JobLog()->info(
      "[{}] submitted: name '{}', {} blocks x {} hidden, batch {} x {}, {}", job->id, spec.name(),
      job->resolved.engine.model.num_blocks, job->resolved.engine.model.hidden, job->resolved.global_batch,
      job->resolved.sequence_length,
      job->resolved.streamed() ? std::string("streamed data") : "token file " + job->resolved.engine.token_file->path);
  return Snapshot(job);
}

absl::StatusOr<v1::Job> JobManager::Snapshot(const std::shared_ptr<ManagedJob>& job) {
  absl::MutexLock lock(&job->mu);
  return job->record;
}

std::string JobManager::NameOf(scheduler::JobId engine_id) const {
  absl::MutexLock lock(&names_mu_);
  // A job the engine just accepted may be named by another job's event (a queued job now waits
  // behind it) a moment before its submission recorded its name: wait that moment (bounded).
  auto known = [this, engine_id]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(names_mu_) { return names_.count(engine_id) != 0; };
  names_mu_.AwaitWithTimeout(absl::Condition(&known), absl::Seconds(2));
  auto it = names_.find(engine_id);
  return it == names_.end() ? absl::StrCat("engine job ", engine_id) : it->second;
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& id) {
  auto job = table_.Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return Snapshot(job);
}

absl::StatusOr<v1::ListJobsResponse> JobManager::List(const v1::ListJobsRequest& req) { return table_.Page(req); }

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& id) {
  auto job = table_.Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  std::optional<scheduler::JobId> eid;
  {
    absl::MutexLock lock(&job->mu);
    if (IsTerminal(job->record.state())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " already ended (", v1::JobState_Name(job->record.state()), ")"));
    }
    eid = job->engine_id;
    if (!eid) {  // listed from a previous run: nothing runs, just record it
      gauges_.Move(job->record.state(), v1::JOB_STATE_CANCELLED);
      job->record.set_state(v1::JOB_STATE_CANCELLED);
      job->record.set_message("cancelled");
      *job->record.mutable_updated() = Now();
      Persist(*job);
    }
  }
  if (eid) {
    if (absl::Status st = engine_->Cancel(*eid); !st.ok()) return st;
  }
  JobLog()->info("[{}] cancel requested", id);
  return Snapshot(job);
}

absl::StatusOr<std::pair<std::shared_ptr<ManagedJob>, scheduler::JobId>> JobManager::LiveJob(const std::string& id,
                                                                                             const char* action) {
  auto job = table_.Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  absl::MutexLock lock(&job->mu);
  if (IsTerminal(job->record.state())) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " already ended"));
  }
  if (!job->engine_id) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " cannot ", action, ": ", job->record.message()));
  }
  return std::make_pair(job, *job->engine_id);
}

absl::StatusOr<v1::Job> JobManager::Pause(const std::string& id) {
  auto live = LiveJob(id, "pause");
  if (!live.ok()) return live.status();
  {
    absl::MutexLock lock(&live->first->mu);
    if (live->first->record.cluster().size() > 1) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " runs on ", live->first->record.cluster().size(),
          " nodes and cannot pause (the other nodes would wait for it in a collective until their timeout); cancel "
          "it (its checkpoint_every checkpoints resume on any number of nodes)"));
    }
  }
  if (absl::Status st = engine_->Pause(live->second); !st.ok()) return st;
  JobLog()->info("[{}] pause requested", id);
  return Snapshot(live->first);
}

absl::StatusOr<v1::Job> JobManager::Resume(const std::string& id, int nodes) {
  if (auto job = table_.Find(id); job) {
    bool ended_cluster_job = false;
    {
      absl::MutexLock lock(&job->mu);
      const v1::JobState s = job->record.state();
      ended_cluster_job = job->record.cluster().size() > 1 && job->record.cluster().rank() == 0 &&
                          (s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED);
    }
    if (ended_cluster_job) return ResumeCluster(job, nodes);
  }
  if (nodes != 0) {
    return absl::InvalidArgumentError(
        "nodes: only a cluster job that failed or was cancelled resumes on a number of nodes (ask its coordinator)");
  }
  auto live = LiveJob(id, "resume");
  if (!live.ok()) return live.status();
  {
    absl::MutexLock lock(&mu_);
    if (draining_) return absl::UnavailableError("the daemon is draining; jobs resume after it restarts");
  }
  if (absl::Status st = engine_->Resume(live->second); !st.ok()) return st;
  JobLog()->info("[{}] resume requested", id);
  return Snapshot(live->first);
}

absl::Status JobManager::OpenStream(const std::string& id) {
  auto job = table_.Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("StreamBatches: no job '", id, "'"));
  absl::MutexLock lock(&job->mu);
  if (!job->engine_id) return absl::FailedPreconditionError(absl::StrCat("job ", id, ": ", job->record.message()));
  if (!job->resolved.streamed()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " reads a token file; it takes no streamed batches"));
  }
  if (IsTerminal(job->record.state()) || job->input_end) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " accepts no more batches (",
                                                      v1::JobState_Name(job->record.state()),
                                                      job->input_end ? ", input closed" : "", ")"));
  }
  return absl::OkStatus();
}

absl::Status JobManager::FeedAsync(const std::string& id, const v1::Batch& b, std::function<void(absl::Status)> done) {
  auto job = table_.Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("StreamBatches: no job '", id, "'"));
  const ResolvedJob& r = job->resolved;  // immutable once admitted
  auto converted = ToEngineBatch(b, r.global_batch, r.sequence_length);
  if (!converted.ok()) {
    metrics_->batches_rejected.Increment();
    return converted.status();
  }
  scheduler::Batch batch = *std::move(converted);
  std::optional<scheduler::JobId> eid;
  {
    absl::MutexLock lock(&job->mu);
    if (job->stop) return absl::UnavailableError("the daemon is shutting down");
    if (IsTerminal(job->record.state()) || job->input_end) {
      return absl::FailedPreconditionError(absl::StrCat("job ", id, " accepts no more batches"));
    }
    eid = job->engine_id;
  }
  if (!eid) return absl::FailedPreconditionError(absl::StrCat("job ", id, " does not run in this daemon"));
  absl::Status st = engine_->FeedBatchAsync(*eid, std::move(batch), [this, done = std::move(done)](absl::Status st) {
    if (st.ok()) metrics_->batches_received.Increment();
    done(st);
  });
  if (st.code() == absl::StatusCode::kInvalidArgument) metrics_->batches_rejected.Increment();
  return st;
}

absl::Status JobManager::EndStream(const std::string& id, bool keep_open) {
  auto job = table_.Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  if (keep_open) return absl::OkStatus();
  std::optional<scheduler::JobId> eid;
  {
    absl::MutexLock lock(&job->mu);
    job->input_end = true;
    eid = job->engine_id;
  }
  if (eid) (void)engine_->CloseInput(*eid);
  return absl::OkStatus();
}

void JobManager::PumpLoop(const std::shared_ptr<ManagedJob>& job) {
  scheduler::JobId eid;
  v1::Job at_start;
  {
    absl::MutexLock lock(&job->mu);
    eid = *job->engine_id;
    at_start = job->record;
  }
  // The pump's own: opened here (a resumed job's log is trimmed first), off the Submit path.
  // A job resumed from a checkpoint taken after its evaluation at that step does not evaluate again.
  const auto info = engine_->Info(eid);
  const bool evaluated_at_resume = info.ok() && info->resumed_after_its_evaluation;
  JobTensorBoard tensorboard(job->id, at_start, job->resolved.output_dir, evaluated_at_resume);
  for (;;) {
    auto events = engine_->AwaitEvents(eid, std::chrono::milliseconds(250));
    {
      absl::MutexLock lock(&job->mu);
      if (job->stop || !events.ok()) return;
    }
    bool ended = false;
    for (const scheduler::JobEvent& e : *events) {
      if (e.kind == scheduler::JobEvent::Kind::kIteration) {
        engine_metrics_.RecordIteration(e.stats, engine_->Stats(), engine_->Timeline(engine_metrics_.seen_until()));
        // A token-file job's batches are read by the engine: each step took one in.
        if (!job->resolved.streamed()) metrics_->batches_received.Increment();
      }
      const bool failed = e.kind == scheduler::JobEvent::Kind::kState && e.state == scheduler::JobState::kFailed;
      // A cluster job's failure is often another node's: ask them before saying why.
      const std::string fault = failed && job->resolved.engine.data_parallel ? ExplainNodeFailure(job) : "";
      absl::MutexLock lock(&job->mu);
      if (!fault.empty()) job->cluster_fault = fault;
      scheduler::JobEvent named;
      if (failed && !job->cluster_fault.empty()) {  // another node's failure explains this one's
        named = e;
        named.message = absl::StrCat(job->cluster_fault, "; here: ", e.message);
      }
      EventEffect fx = job->tracker.Apply(failed && !job->cluster_fault.empty() ? named : e,
                                          std::chrono::steady_clock::now(), job->drained, &job->record);
      if (fx.to != fx.from) gauges_.Move(fx.from, fx.to);  // the gauge moves before watchers hear of it
      if (e.kind == scheduler::JobEvent::Kind::kCheckpointFailed) metrics_->checkpoint_failures.Increment();
      if (e.kind == scheduler::JobEvent::Kind::kBatchRejected) metrics_->batches_rejected.Increment();
      if (e.kind == scheduler::JobEvent::Kind::kEval) {
        metrics_->eval_loss.Set(e.eval.loss);
        metrics_->evaluations.Increment();
      }
      if (fx.persist) Persist(*job);
      tensorboard.OnEvent(e, fx.out);
      if (fx.publish) Publish(*job, fx.out, fx.ended);
      if (fx.ended) ended = true;
      // Every state change wakes the job's waiters (a drain waits for PAUSED, not only the end).
      if (fx.ended || fx.to != fx.from) job->cv.SignalAll();
      switch (fx.log) {
        case EventEffect::Log::kInfo:
          JobLog()->info("[{}] {}", job->id, fx.log_line);
          break;
        case EventEffect::Log::kWarn:
          JobLog()->warn("[{}] {}", job->id, fx.log_line);
          break;
        case EventEffect::Log::kError:
          JobLog()->error("[{}] {}", job->id, fx.log_line);
          break;
        case EventEffect::Log::kNone:
          break;
      }
    }
    if (ended) return;
  }
}

absl::Status JobManager::Subscribe(const std::string& id, std::shared_ptr<JobSubscriber> subscriber) {
  auto job = table_.Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  absl::MutexLock lock(&job->mu);
  v1::JobEvent now;
  now.set_state(job->record.state());
  now.set_message(job->record.state() == v1::JOB_STATE_FAILED ? job->record.error() : job->record.message());
  const bool last = IsTerminal(job->record.state());
  now.set_job_id(job->id);
  *now.mutable_time() = Now();
  job->watchers.Add(std::move(subscriber), now, last);
  return absl::OkStatus();
}

void JobManager::Unsubscribe(const std::string& id, JobSubscriber* subscriber) {
  auto job = table_.Find(id);
  if (!job) return;
  absl::MutexLock lock(&job->mu);
  job->watchers.Remove(subscriber);
}

bool JobManager::draining() const {
  absl::MutexLock lock(&mu_);
  return draining_;
}

int JobManager::active_jobs() const { return table_.CountNotEnded(); }

absl::Status JobManager::RunInBackground(std::function<void()> task) { return tasks_.Run(std::move(task)); }

}  // namespace rp::server
