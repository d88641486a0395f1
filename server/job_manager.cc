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
#include "server/paths.h"
#include "server/status_util.h"

namespace rp::server {

namespace v1 = roundpipe::v1;
using google::protobuf::util::TimeUtil;
using scheduler::JobState;

namespace {

std::shared_ptr<spdlog::logger> Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::get("jobs");
    if (l) return l;
    l = spdlog::default_logger()->clone("jobs");
    spdlog::register_logger(l);
    return l;
  }();
  return logger;
}

v1::JobState ToProto(JobState s) {
  switch (s) {
    case JobState::kQueued:
      return v1::JOB_STATE_QUEUED;
    case JobState::kRunning:
      return v1::JOB_STATE_RUNNING;
    case JobState::kPaused:
      return v1::JOB_STATE_PAUSED;
    case JobState::kSucceeded:
      return v1::JOB_STATE_SUCCEEDED;
    case JobState::kFailed:
      return v1::JOB_STATE_FAILED;
    case JobState::kCancelled:
      return v1::JOB_STATE_CANCELLED;
  }
  return v1::JOB_STATE_UNSPECIFIED;
}

bool Terminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

google::protobuf::Timestamp Now() { return TimeUtil::GetCurrentTime(); }

// "<id> <created seconds>.<nanos>": unique even if a damaged job store made ids restart.
std::string OwnerToken(const v1::Job& record) {
  return absl::StrCat(record.id(), " ", record.created().seconds(), ".", record.created().nanos());
}

}  // namespace

struct JobManager::Managed {
  std::string id;
  int64_t seq = 0;
  std::mutex mu;
  std::condition_variable cv;
  v1::Job record;
  std::optional<scheduler::JobId> engine_id;  // absent: listed from a previous daemon run
  ResolvedJob resolved;
  bool input_end = false;               // a stream closed the job's input
  std::atomic<int> threads_running{0};  // the pump is still inside its loop (reaped at 0)
  bool stop = false;                    // daemon shutdown: threads leave without touching the record
  bool drained = false;                 // paused by Drain (not by a user)
  bool progress_message = false;        // record.message is the engine's loading progress
  std::vector<std::shared_ptr<JobSubscriber>> subscribers;
  std::thread pump;
  std::chrono::steady_clock::time_point last_step_at{}, last_persist{};
  double ema_step_s = 0;
  std::string partition_problem;  // the last automatic-partition problem logged
  int checkpoint_failures = 0;    // in this daemon run (the final message says so)
  std::string last_checkpoint_failure;
};

JobManager::JobManager(scheduler::Engine* engine, JobStore* store, DaemonMetrics* metrics, JobManagerOptions options)
    : engine_(engine), store_(store), metrics_(metrics), options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<JobManager>> JobManager::Create(scheduler::Engine* engine, JobStore* store,
                                                               DaemonMetrics* metrics, JobManagerOptions options) {
  std::unique_ptr<JobManager> m(new JobManager(engine, store, metrics, std::move(options)));
  if (absl::Status st = m->Recover(); !st.ok()) return st;
  return m;
}

JobManager::~JobManager() { Shutdown(); }

absl::Status JobManager::Recover() {
  auto all = store_->LoadAll();
  if (!all.ok()) return all.status();
  const char* kDrained = "paused by a daemon drain";
  std::vector<std::pair<std::shared_ptr<Managed>, bool>> readmit;  // (job, pause again)
  std::vector<std::pair<std::shared_ptr<Managed>, bool>> resume;   // started ones
  for (auto& [seq, record] : *all) {
    auto job = std::make_shared<Managed>();
    job->id = record.id();
    job->seq = seq;
    job->record = record;
    next_seq_ = std::max(next_seq_, seq + 1);
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_[job->id] = job;
      order_.push_back(job);
    }
    const v1::JobState s = record.state();
    if (!Terminal(s) && !record.has_started()) {
      // Never ran: admit it again from its stored spec (a user's pause while queued stays).
      readmit.emplace_back(job, s == v1::JOB_STATE_PAUSED && record.message() != kDrained);
      if (s == v1::JOB_STATE_PAUSED) job->record.set_state(v1::JOB_STATE_QUEUED);
    } else if (!Terminal(s)) {
      // Started: it continues from its newest good checkpoint, if it has one (below).
      resume.emplace_back(job, s == v1::JOB_STATE_PAUSED && record.message() != kDrained);
      job->record.set_state(v1::JOB_STATE_QUEUED);
    }
  }
  // Ids never restart: a damaged or replaced store must not hand out the id (and so the default
  // output dir and checkpoints) of a job that existed before.
  int64_t highest_dir = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(options_.jobs_dir, ec)) {
    {
      const std::string n = entry.path().filename().string();
      int64_t seq = 0;
      if (n.rfind("job-", 0) == 0 && absl::SimpleAtoi(n.substr(4), &seq)) highest_dir = std::max(highest_dir, seq);
    }
  }
  if (highest_dir >= next_seq_) {
    Log()->error(
        "the job store lists {} job(s) but {} holds directories up to job-{:06d}: the store was damaged or "
        "replaced; those jobs are not listed, new ids continue after them",
        all->size(), options_.jobs_dir, highest_dir);
    next_seq_ = highest_dir + 1;
  }
  UpdateJobGauges();  // absolute counts before any pump moves them
  auto fail = [&](const std::shared_ptr<Managed>& job, const std::string& why) {
    std::lock_guard<std::mutex> lock(job->mu);
    CountTransition(job->record.state(), v1::JOB_STATE_FAILED);
    job->record.set_state(v1::JOB_STATE_FAILED);
    job->record.set_error(why);
    *job->record.mutable_updated() = Now();
    Persist(*job);
    Log()->error("[{}] {}", job->id, why);
  };
  for (auto& [job, pause] : readmit) {
    JobSpecContext ctx = options_.spec;
    ctx.default_output_dir = (std::filesystem::path(options_.jobs_dir) / job->id).string();
    absl::Status st = Guarded("restart recovery", [&]() -> absl::Status {
      auto resolved = ResolveJobSpec(job->record.spec(), ctx);
      if (!resolved.ok()) return resolved.status();
      job->resolved = *resolved;
      if (absl::Status c = scheduler::ClaimOutputDir(job->resolved.output_dir, OwnerToken(job->record)); !c.ok())
        return c;
      return Admit(job);
    });
    if (!st.ok()) {
      fail(job, absl::StrCat("could not be re-admitted after a daemon restart: ", st.message()));
      continue;
    }
    if (pause) (void)engine_->Pause(*job->engine_id);
    Log()->info("[{}] re-admitted after restart", job->id);
  }
  for (auto& [job, pause] : resume) {
    bool resumed = false;
    absl::Status st = Guarded("restart recovery", [&]() -> absl::Status {
      resumed = ResumeFromCheckpoint(job);
      return absl::OkStatus();
    });
    if (!st.ok()) {
      fail(job, absl::StrCat("could not be resumed after a daemon restart: ", st.message()));
      continue;
    }
    if (resumed) {
      if (pause) (void)engine_->Pause(*job->engine_id);
      continue;
    }
    std::lock_guard<std::mutex> lock(job->mu);
    CountTransition(job->record.state(), v1::JOB_STATE_PAUSED);
    job->record.set_state(v1::JOB_STATE_PAUSED);
    job->record.set_message("interrupted by a daemon restart at step " + std::to_string(job->record.progress().step()) +
                            " with no usable checkpoint; submit it again");
    *job->record.mutable_updated() = Now();
    Persist(*job);
    Log()->warn("[{}] interrupted at step {} and has no usable checkpoint; listed as PAUSED", job->id,
                job->record.progress().step());
  }
  return absl::OkStatus();
}

bool JobManager::ResumeFromCheckpoint(const std::shared_ptr<Managed>& job) {
  JobSpecContext ctx = options_.spec;
  ctx.default_output_dir = (std::filesystem::path(options_.jobs_dir) / job->id).string();
  auto resolved = ResolveJobSpec(job->record.spec(), ctx);
  if (!resolved.ok()) {
    Log()->warn("[{}] cannot resume: {}", job->id, std::string(resolved.status().message()));
    return false;
  }
  if (absl::Status c = scheduler::ClaimOutputDir(resolved->output_dir, OwnerToken(job->record)); !c.ok()) {
    Log()->warn("[{}] cannot resume: {}", job->id, std::string(c.message()));
    return false;
  }
  std::vector<std::string> skipped;
  const auto checkpoints = scheduler::ListJobCheckpoints(resolved->engine.checkpoint_root, &skipped);
  for (const std::string& why : skipped) Log()->warn("[{}] skipping checkpoint {}", job->id, why);
  for (const scheduler::CheckpointInfo& cp : checkpoints) {
    const std::string& dir = cp.path;
    const scheduler::CheckpointInfo* meta = &cp;
    job->resolved = *resolved;
    scheduler::JobSpec& e = job->resolved.engine;
    if (e.max_steps > 0) {
      if (meta->step >= e.max_steps) {  // it had finished; only the final record was lost
        std::lock_guard<std::mutex> lock(job->mu);
        CountTransition(job->record.state(), v1::JOB_STATE_SUCCEEDED);
        job->record.set_state(v1::JOB_STATE_SUCCEEDED);
        Persist(*job);
        return true;
      }
      e.max_steps -= meta->step;
    }
    e.resume_from = dir;
    {
      std::lock_guard<std::mutex> lock(job->mu);
      job->record.mutable_progress()->set_step(meta->step);
      job->record.set_last_checkpoint(dir);
      job->record.set_last_checkpoint_step(meta->step);
      job->record.set_message(absl::StrCat("resumed from ", dir, " after a daemon restart"));
    }
    absl::Status st = Admit(job);
    if (st.ok()) {
      // Admit counts the total from the spec; keep it.
      Log()->info("[{}] resumed from {} (step {}, data cursor {})", job->id, dir, meta->step, meta->batches_consumed);
      std::lock_guard<std::mutex> lock(job->mu);
      Persist(*job);
      return true;
    }
    Log()->warn("[{}] checkpoint {} unusable: {}", job->id, dir, std::string(st.message()));
  }
  return false;
}

std::shared_ptr<JobManager::Managed> JobManager::Find(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

void JobManager::Persist(Managed& job) {
  job.last_persist = std::chrono::steady_clock::now();
  if (absl::Status st = store_->Put(job.seq, job.record); !st.ok()) {
    Log()->error("[{}] job store: {}", job.id, std::string(st.message()));
  }
}

void JobManager::Publish(Managed& job, v1::JobEvent event, bool last) {
  event.set_job_id(job.id);
  if (!event.has_time()) *event.mutable_time() = Now();
  auto& subs = job.subscribers;
  subs.erase(std::remove_if(subs.begin(), subs.end(), [&](const auto& s) { return !s->OnEvent(event, last); }),
             subs.end());
  if (last) subs.clear();
}

absl::Status JobManager::Admit(const std::shared_ptr<Managed>& job) {
  auto eid = engine_->Submit(job->resolved.engine);
  if (!eid.ok()) return eid.status();
  auto info = engine_->Info(*eid);
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->engine_id = *eid;
    // Steps of the whole job (resumed steps included): max_steps, capped by what a token file holds.
    const int64_t total = info.ok() ? info->total_steps : 0;
    job->record.set_total_steps(total > 0 ? total : job->record.spec().max_steps());
  }
  // The pump runs behind a barrier: an unexpected exception cancels that job (logged), it never
  // terminates the daemon.
  job->threads_running = 1;
  job->pump = std::thread([this, job] {
    absl::Status st = Guarded(absl::StrCat("[", job->id, "] event pump"), [&] {
      PumpLoop(job);
      return absl::OkStatus();
    });
    if (!st.ok()) (void)engine_->Cancel(*job->engine_id);
    --job->threads_running;
  });
  return absl::OkStatus();
}

void JobManager::ReapJobThreads() {
  std::vector<std::shared_ptr<Managed>> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs = order_;
  }
  std::lock_guard<std::mutex> reap(reap_mu_);
  for (const auto& j : jobs) {
    if (j->threads_running.load() != 0) continue;
    if (j->pump.joinable()) j->pump.join();
  }
}

absl::StatusOr<v1::Job> JobManager::Submit(const v1::JobSpec& spec) {
  ReapJobThreads();  // ended jobs keep no threads
  int64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_ || shutdown_) return absl::UnavailableError("the daemon is draining and admits no new jobs");
    seq = next_seq_++;
  }
  auto job = std::make_shared<Managed>();
  job->seq = seq;
  char id[32];
  std::snprintf(id, sizeof(id), "job-%06lld", static_cast<long long>(seq));
  job->id = id;
  JobSpecContext ctx = options_.spec;
  ctx.default_output_dir = (std::filesystem::path(options_.jobs_dir) / job->id).string();
  auto resolved = ResolveJobSpec(spec, ctx);
  if (!resolved.ok()) return resolved.status();
  job->resolved = *resolved;
  job->record.set_id(job->id);
  *job->record.mutable_spec() = spec;
  job->record.set_state(v1::JOB_STATE_QUEUED);
  *job->record.mutable_created() = Now();
  *job->record.mutable_updated() = Now();
  // The job owns its output dir from here on (no other job may share its checkpoints).
  if (absl::Status st = scheduler::ClaimOutputDir(job->resolved.output_dir, OwnerToken(job->record)); !st.ok()) {
    return absl::Status(st.code(), absl::StrCat("output_dir: ", st.message()));
  }
  if (absl::Status st = Admit(job); !st.ok()) {
    scheduler::ReleaseOutputDir(job->resolved.output_dir);
    return st;
  }
  {
    std::lock_guard<std::mutex> lock(job->mu);
    Persist(*job);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_[job->id] = job;
    order_.push_back(job);
  }
  CountTransition(v1::JOB_STATE_UNSPECIFIED, v1::JOB_STATE_QUEUED);
  Log()->info(
      "[{}] submitted: name '{}', {} blocks x {} hidden, batch {} x {}, {}", job->id, spec.name(),
      job->resolved.engine.model.num_blocks, job->resolved.engine.model.hidden, job->resolved.global_batch,
      job->resolved.sequence_length,
      job->resolved.streamed() ? std::string("streamed data") : "token file " + job->resolved.engine.token_file->path);
  return Snapshot(job);
}

absl::StatusOr<v1::Job> JobManager::Snapshot(const std::shared_ptr<Managed>& job) {
  std::lock_guard<std::mutex> lock(job->mu);
  return job->record;
}

absl::StatusOr<v1::Job> JobManager::Get(const std::string& id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  return Snapshot(job);
}

absl::StatusOr<v1::ListJobsResponse> JobManager::List(const v1::ListJobsRequest& req) {
  if (req.page_size() < 0) return absl::InvalidArgumentError("page_size must not be negative");
  const int page = req.page_size() > 0 ? std::min(req.page_size(), 1000) : 100;
  int64_t after = 0;
  if (!req.page_token().empty() && !absl::SimpleAtoi(req.page_token(), &after)) {
    return absl::InvalidArgumentError("page_token: not a token this daemon issued");
  }
  std::vector<std::shared_ptr<Managed>> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs = order_;
  }
  v1::ListJobsResponse out;
  for (const auto& job : jobs) {
    if (job->seq <= after) continue;
    std::lock_guard<std::mutex> lock(job->mu);
    if (!req.states().empty() &&
        std::find(req.states().begin(), req.states().end(), job->record.state()) == req.states().end()) {
      continue;
    }
    if (out.jobs_size() == page) {
      out.set_next_page_token(std::to_string(after));
      break;
    }
    *out.add_jobs() = job->record;
    after = job->seq;
  }
  return out;
}

absl::StatusOr<v1::Job> JobManager::Cancel(const std::string& id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  std::optional<scheduler::JobId> eid;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (Terminal(job->record.state())) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", id, " already ended (", v1::JobState_Name(job->record.state()), ")"));
    }
    eid = job->engine_id;
    if (!eid) {  // listed from a previous run: nothing runs, just record it
      CountTransition(job->record.state(), v1::JOB_STATE_CANCELLED);
      job->record.set_state(v1::JOB_STATE_CANCELLED);
      job->record.set_message("cancelled");
      *job->record.mutable_updated() = Now();
      Persist(*job);
    }
  }
  if (eid) {
    if (absl::Status st = engine_->Cancel(*eid); !st.ok()) return st;
  }
  Log()->info("[{}] cancel requested", id);
  return Snapshot(job);
}

absl::StatusOr<std::pair<std::shared_ptr<JobManager::Managed>, scheduler::JobId>> JobManager::LiveJob(
    const std::string& id, const char* action) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  std::lock_guard<std::mutex> lock(job->mu);
  if (Terminal(job->record.state())) {
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
  if (absl::Status st = engine_->Pause(live->second); !st.ok()) return st;
  Log()->info("[{}] pause requested", id);
  return Snapshot(live->first);
}

absl::StatusOr<v1::Job> JobManager::Resume(const std::string& id) {
  auto live = LiveJob(id, "resume");
  if (!live.ok()) return live.status();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (draining_) return absl::UnavailableError("the daemon is draining; jobs resume after it restarts");
  }
  if (absl::Status st = engine_->Resume(live->second); !st.ok()) return st;
  Log()->info("[{}] resume requested", id);
  return Snapshot(live->first);
}

absl::Status JobManager::OpenStream(const std::string& id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("StreamBatches: no job '", id, "'"));
  std::lock_guard<std::mutex> lock(job->mu);
  if (!job->engine_id) return absl::FailedPreconditionError(absl::StrCat("job ", id, ": ", job->record.message()));
  if (!job->resolved.streamed()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " reads a token file; it takes no streamed batches"));
  }
  if (Terminal(job->record.state()) || job->input_end) {
    return absl::FailedPreconditionError(absl::StrCat("job ", id, " accepts no more batches (",
                                                      v1::JobState_Name(job->record.state()),
                                                      job->input_end ? ", input closed" : "", ")"));
  }
  return absl::OkStatus();
}

absl::Status JobManager::FeedAsync(const std::string& id, const v1::Batch& b, std::function<void(absl::Status)> done) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("StreamBatches: no job '", id, "'"));
  const ResolvedJob& r = job->resolved;  // immutable once admitted
  auto bad = [&](std::string msg) {
    metrics_->batches_rejected.Increment();
    return absl::InvalidArgumentError(std::move(msg));
  };
  if (b.batch() != r.global_batch || b.sequence() != r.sequence_length) {
    return bad(absl::StrCat("batch: shape ", b.batch(), " x ", b.sequence(),
                            " does not match the job's global_batch x ", "sequence_length = ", r.global_batch, " x ",
                            r.sequence_length));
  }
  const int64_t n = r.global_batch * r.sequence_length;
  if (b.tokens_size() != n) {
    return bad(absl::StrCat("batch: ", b.tokens_size(), " token ids for a ", b.batch(), " x ", b.sequence(),
                            " batch (expected ", n, ")"));
  }
  if (b.loss_mask_size() != 0 && b.loss_mask_size() != n) {
    return bad(absl::StrCat("batch: loss_mask has ", b.loss_mask_size(), " entries, expected 0 or ", n));
  }
  // Token ranges and the micro-batch split are the engine's to check (once, FeedBatchAsync).
  scheduler::Batch batch;
  batch.rows = b.batch();
  batch.cols = b.sequence();
  batch.tokens.assign(b.tokens().begin(), b.tokens().end());
  if (b.loss_mask_size() > 0) {
    const std::vector<bool> mask(b.loss_mask().begin(), b.loss_mask().end());
    batch.labels = scheduler::ShiftedLabels(batch.rows, batch.cols, batch.tokens, mask);
  }
  std::optional<scheduler::JobId> eid;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->stop) return absl::UnavailableError("the daemon is shutting down");
    if (Terminal(job->record.state()) || job->input_end) {
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
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  if (keep_open) return absl::OkStatus();
  std::optional<scheduler::JobId> eid;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->input_end = true;
    eid = job->engine_id;
  }
  if (eid) (void)engine_->CloseInput(*eid);
  return absl::OkStatus();
}

void JobManager::PumpLoop(const std::shared_ptr<Managed>& job) {
  const scheduler::JobId eid = *job->engine_id;
  for (;;) {
    auto events = engine_->AwaitEvents(eid, std::chrono::milliseconds(250));
    {
      std::lock_guard<std::mutex> lock(job->mu);
      if (job->stop || !events.ok()) return;
    }
    bool ended = false;
    for (const scheduler::JobEvent& e : *events) {
      if (e.kind == scheduler::JobEvent::Kind::kIteration) {
        RecordIterationMetrics(e.stats);
        // A token-file job's batches are read by the engine: each step took one in.
        if (!job->resolved.streamed()) metrics_->batches_received.Increment();
      }
      std::lock_guard<std::mutex> lock(job->mu);
      v1::Job& rec = job->record;
      v1::JobEvent out;
      *out.mutable_time() = TimeUtil::NanosecondsToTimestamp(
          std::chrono::duration_cast<std::chrono::nanoseconds>(e.time.time_since_epoch()).count());
      switch (e.kind) {
        case scheduler::JobEvent::Kind::kState: {
          const v1::JobState s = ToProto(e.state);
          std::string message = e.message;
          if (s == v1::JOB_STATE_FAILED) rec.set_error(message);
          if (s == v1::JOB_STATE_SUCCEEDED && message.empty() && job->checkpoint_failures > 0) {
            message = absl::StrCat("succeeded, but ", job->checkpoint_failures,
                                   " checkpoint(s) failed (last: ", job->last_checkpoint_failure, ")");
          }
          // The job's pump is the only writer of an admitted job's state; the counts in the
          // gauge move before watchers hear about the transition.
          CountTransition(rec.state(), s);
          rec.set_state(s);
          if (s != v1::JOB_STATE_PAUSED) {
            rec.set_message(message);
          } else if (job->drained) {
            rec.set_message("paused by a daemon drain");
          } else if (!message.empty() && message != "paused before it started") {
            rec.set_message(message);  // the engine paused it itself (e.g. checkpoints keep failing): say why
          } else if (rec.message().empty()) {
            rec.set_message("paused");
          }
          if (s == v1::JOB_STATE_RUNNING) {
            rec.clear_message();
            if (!rec.has_started()) *rec.mutable_started() = out.time();
          }
          *rec.mutable_updated() = Now();
          out.set_state(s);
          out.set_message(message);
          ended = Terminal(s);
          Persist(*job);
          Publish(*job, out, ended);
          job->cv.notify_all();
          Log()->info("[{}] {}{}{}", job->id, v1::JobState_Name(s), message.empty() ? "" : ": ", message);
          break;
        }
        case scheduler::JobEvent::Kind::kIteration: {
          const auto now = std::chrono::steady_clock::now();
          const scheduler::IterationStats& st = e.stats;
          v1::JobProgress* p = rec.mutable_progress();
          if (std::exchange(job->progress_message, false)) rec.clear_message();  // loaded: training now
          p->set_step(p->step() + 1);
          p->set_tokens(p->tokens() + st.tokens);
          p->set_last_loss(st.loss);
          const double tps = st.seconds > 0 ? static_cast<double>(st.tokens) / st.seconds : 0;
          p->set_tokens_per_second(tps);
          if (job->last_step_at != std::chrono::steady_clock::time_point{}) {
            const double dt = std::chrono::duration<double>(now - job->last_step_at).count();
            job->ema_step_s = job->ema_step_s == 0 ? dt : 0.8 * job->ema_step_s + 0.2 * dt;
          } else {
            job->ema_step_s = st.seconds;
          }
          job->last_step_at = now;
          if (!st.partition.empty()) rec.set_partition(st.partition);
          if (st.partition_problem != job->partition_problem) {  // log changes only, not every step
            if (!st.partition_problem.empty()) Log()->warn("[{}] {}", job->id, st.partition_problem);
            job->partition_problem = st.partition_problem;
          }
          v1::StepMetrics* m = out.mutable_step();
          m->set_step(p->step());
          m->set_loss(st.loss);
          m->set_tokens_per_second(tps);
          m->set_learning_rate(st.lr);
          m->set_grad_norm(st.grad_norm);
          m->set_bubble_ratio(st.bubble_ratio);
          m->set_skipped(st.skipped_step);
          m->set_eta_seconds(rec.total_steps() > 0
                                 ? std::max<double>(0, static_cast<double>(rec.total_steps() - p->step())) *
                                       job->ema_step_s
                                 : -1);
          if (now - job->last_persist > std::chrono::seconds(1)) {
            *rec.mutable_updated() = Now();
            Persist(*job);
          }
          Publish(*job, out, false);
          if (p->step() % 50 == 1) {
            Log()->info("[{}] step {} loss {:.4f} tokens/s {:.0f}", job->id, p->step(), st.loss, tps);
          }
          break;
        }
        case scheduler::JobEvent::Kind::kCheckpoint: {
          rec.set_last_checkpoint(e.checkpoint.path);
          rec.set_last_checkpoint_step(e.checkpoint.step);
          *rec.mutable_updated() = Now();
          Persist(*job);
          out.mutable_checkpoint()->set_path(e.checkpoint.path);
          out.mutable_checkpoint()->set_step(e.checkpoint.step);
          Publish(*job, out, false);
          Log()->info("[{}] checkpoint at step {}: {}", job->id, e.checkpoint.step, e.checkpoint.path);
          break;
        }
        case scheduler::JobEvent::Kind::kCheckpointFailed: {
          metrics_->checkpoint_failures.Increment();
          ++job->checkpoint_failures;
          job->last_checkpoint_failure = e.message;
          rec.set_message(e.message);
          *rec.mutable_updated() = Now();
          Persist(*job);
          out.set_checkpoint_failed(e.message);
          Publish(*job, out, false);
          Log()->error("[{}] {}", job->id, e.message);
          break;
        }
        case scheduler::JobEvent::Kind::kProgress:  // loading: "loading weights from ..." (GetJob's message)
          rec.set_message(e.message);
          job->progress_message = true;
          *rec.mutable_updated() = Now();
          Persist(*job);
          out.set_progress(e.message);
          Publish(*job, out, false);
          Log()->info("[{}] {}", job->id, e.message);
          break;
        case scheduler::JobEvent::Kind::kBatchRejected:
          metrics_->batches_rejected.Increment();
          out.set_batch_rejected(e.message);
          Publish(*job, out, false);
          Log()->warn("[{}] batch rejected: {}", job->id, e.message);
          break;
      }
    }
    if (ended) return;
  }
}

void JobManager::RecordIterationMetrics(const scheduler::IterationStats& st) {
  metrics_->iterations.Increment();
  metrics_->tokens_trained.Increment(static_cast<double>(st.tokens));
  metrics_->iteration_duration.Observe(st.seconds);
  if (st.optimizer_seconds > 0) metrics_->optimizer_step.Observe(st.optimizer_seconds);
  metrics_->loss.Set(st.loss);
  metrics_->learning_rate.Set(st.lr);
  metrics_->grad_norm.Set(st.grad_norm);
  metrics_->bubble_ratio.Set(st.bubble_ratio);
  const scheduler::EngineStats es = engine_->Stats();
  std::lock_guard<std::mutex> lock(metrics_mu_);
  double latest = timeline_seen_s_;
  for (const scheduler::OpRecord& e : engine_->Timeline(timeline_seen_s_)) {
    if (e.end_s <= timeline_seen_s_) continue;
    metrics_->worker_busy.Add({{"worker", std::to_string(e.worker)}, {"stream", e.stream}})
        .Increment(e.end_s - e.start_s);
    latest = std::max(latest, e.end_s);
  }
  timeline_seen_s_ = latest;
  transfer_seen_.resize(es.devices.size());
  for (size_t d = 0; d < es.devices.size(); ++d) {
    const scheduler::DeviceStats& ds = es.devices[d];
    const struct {
      int64_t now;
      const char* direction;
      const char* what;
    } transfers[] = {{ds.activation_up_bytes, "host_to_device", "activation"},
                     {ds.activation_down_bytes, "device_to_host", "activation"},
                     {ds.param_up_bytes, "host_to_device", "parameter"},
                     {ds.grad_down_bytes, "device_to_host", "gradient"}};
    for (size_t k = 0; k < 4; ++k) {
      const int64_t delta = transfers[k].now - transfer_seen_[d][k];
      if (delta > 0) {
        metrics_->transfer_bytes.Add({{"direction", transfers[k].direction}, {"kind", transfers[k].what}})
            .Increment(static_cast<double>(delta));
      }
      transfer_seen_[d][k] = transfers[k].now;
    }
  }
  metrics_->host_memory.Add({{"pool", "model_states"}}).Set(static_cast<double>(es.host_model_bytes));
  // The pinned arena is shared by all CUDA workers: any device reports it (zero on CPU).
  metrics_->host_memory.Add({{"pool", "pinned"}})
      .Set(es.devices.empty() ? 0.0 : static_cast<double>(es.devices.front().pinned_reserved_bytes));
  for (const scheduler::DeviceStats& d : es.devices) {
    metrics_->device_memory.Add({{"device", d.name}}).Set(static_cast<double>(d.memory_in_use_bytes));
  }
}

namespace {
std::string StateLabel(v1::JobState s) {
  std::string name = v1::JobState_Name(s).substr(std::string("JOB_STATE_").size());
  for (auto& c : name) c = static_cast<char>(std::tolower(c));
  return name;
}
}  // namespace

void JobManager::CountTransition(v1::JobState from, v1::JobState to) {
  if (from == to) return;
  if (from != v1::JOB_STATE_UNSPECIFIED) metrics_->jobs.Add({{"state", StateLabel(from)}}).Decrement();
  metrics_->jobs.Add({{"state", StateLabel(to)}}).Increment();
}

void JobManager::UpdateJobGauges() {
  std::map<v1::JobState, int> counts;
  std::vector<std::shared_ptr<Managed>> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs = order_;
  }
  for (const auto& j : jobs) {
    std::lock_guard<std::mutex> lock(j->mu);
    ++counts[j->record.state()];
  }
  for (v1::JobState s : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_PAUSED, v1::JOB_STATE_SUCCEEDED,
                         v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    metrics_->jobs.Add({{"state", StateLabel(s)}}).Set(counts[s]);
  }
}

absl::Status JobManager::Subscribe(const std::string& id, std::shared_ptr<JobSubscriber> subscriber) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  std::lock_guard<std::mutex> lock(job->mu);
  v1::JobEvent now;
  now.set_state(job->record.state());
  now.set_message(job->record.state() == v1::JOB_STATE_FAILED ? job->record.error() : job->record.message());
  const bool last = Terminal(job->record.state());
  now.set_job_id(job->id);
  *now.mutable_time() = Now();
  if (subscriber->OnEvent(now, last) && !last) job->subscribers.push_back(std::move(subscriber));
  return absl::OkStatus();
}

void JobManager::Unsubscribe(const std::string& id, JobSubscriber* subscriber) {
  auto job = Find(id);
  if (!job) return;
  std::lock_guard<std::mutex> lock(job->mu);
  auto& subs = job->subscribers;
  subs.erase(std::remove_if(subs.begin(), subs.end(), [&](const auto& s) { return s.get() == subscriber; }),
             subs.end());
}

absl::StatusOr<std::string> JobManager::Export(const std::string& id, const std::string& dir_in, bool merge_lora) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  std::optional<scheduler::JobId> eid;
  int64_t step;
  v1::JobSpec spec;
  {
    std::lock_guard<std::mutex> lock(job->mu);
    const v1::JobState s = job->record.state();
    if (s != v1::JOB_STATE_SUCCEEDED && s != v1::JOB_STATE_CANCELLED && s != v1::JOB_STATE_PAUSED) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " is ", v1::JobState_Name(s), "; export a job that is PAUSED or has finished (pause it first)"));
    }
    eid = job->engine_id;
    step = job->record.progress().step();
    spec = job->record.spec();
  }
  // The job as admitted (a job listed from an earlier daemon run is resolved again).
  JobSpecContext ctx = options_.spec;
  ctx.host_memory_budget = nullptr;
  ctx.default_output_dir = (std::filesystem::path(options_.jobs_dir) / id).string();
  auto resolved = eid ? absl::StatusOr<ResolvedJob>(job->resolved) : ResolveJobSpec(spec, ctx);
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
  if (eid) {
    bytes = engine_->Export(*eid, dir, kind);
  } else {
    // From an earlier daemon run: the job's final weights are its newest checkpoint (the engine
    // writes one when a job ends), which must hold the step the job ended at.
    const auto all = scheduler::ListJobCheckpoints(resolved->engine.checkpoint_root);
    if (all.empty() || all.front().step != step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", id, " has no checkpoint of its final step ", step, " under ", resolved->engine.checkpoint_root,
          all.empty() ? std::string() : absl::StrCat(" (newest: step ", all.front().step, ")")));
    }
    bytes =
        scheduler::ExportCheckpoint(all.front().path, resolved->engine.model, resolved->engine.precision, dir, kind);
  }
  if (!bytes.ok()) return bytes.status();
  Log()->info("[{}] exported {} MiB at step {} to {}", id, *bytes >> 20, step, dir);
  return dir;
}

absl::StatusOr<v1::CheckpointResponse> JobManager::Checkpoint(const std::string& id) {
  auto job = Find(id);
  if (!job) return absl::NotFoundError(absl::StrCat("no job '", id, "'"));
  scheduler::JobId eid;
  {
    std::lock_guard<std::mutex> lock(job->mu);
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
  std::vector<std::shared_ptr<Managed>> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
    jobs = order_;
  }
  int paused = 0;
  std::vector<std::shared_ptr<Managed>> waiting;
  for (const auto& j : jobs) {
    std::optional<scheduler::JobId> eid;
    bool user_paused = false;
    {
      std::lock_guard<std::mutex> lock(j->mu);
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
      if (!info.ok()) Log()->warn("[{}] drain checkpoint: {}", j->id, std::string(info.status().message()));
    } else if (engine_->Pause(*eid).ok()) {
      waiting.push_back(j);
    }
  }
  const auto until = std::chrono::steady_clock::now() + deadline;
  for (const auto& j : waiting) {
    std::unique_lock<std::mutex> lock(j->mu);
    j->cv.wait_until(lock, until,
                     [&] { return j->record.state() == v1::JOB_STATE_PAUSED || Terminal(j->record.state()); });
    if (j->record.state() == v1::JOB_STATE_PAUSED) {
      ++paused;  // counted (and logged below) once it really paused
      j->record.set_message("paused by a daemon drain");
      Persist(*j);
      const bool started = j->record.has_started();
      const scheduler::JobId eid = *j->engine_id;
      lock.unlock();
      if (started) {  // so the restarted daemon continues from exactly here
        auto info = engine_->Checkpoint(eid, "drain");
        if (!info.ok()) Log()->warn("[{}] drain checkpoint: {}", j->id, std::string(info.status().message()));
      }
    }
  }
  Log()->info("drain: paused {} job(s)", paused);
  return paused;
}

bool JobManager::draining() const {
  std::lock_guard<std::mutex> lock(mu_);
  return draining_;
}

int JobManager::active_jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& j : order_) {
    std::lock_guard<std::mutex> jl(j->mu);
    if (!Terminal(j->record.state())) ++n;
  }
  return n;
}

absl::Status JobManager::RunInBackground(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(tasks_mu_);
  for (auto it = tasks_.begin(); it != tasks_.end();) {  // reap finished ones
    if (it->done->load()) {
      it->thread.join();
      it = tasks_.erase(it);
    } else {
      ++it;
    }
  }
  if (static_cast<int>(tasks_.size()) >= kMaxBackgroundTasks) {
    return absl::ResourceExhaustedError(absl::StrCat(kMaxBackgroundTasks,
                                                     " requests (submit/export/checkpoint/drain) are in progress; "
                                                     "retry when one has finished"));
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  tasks_.push_back({std::thread([task = std::move(task), done] {
                      (void)Guarded("background task", [&] {
                        task();
                        return absl::OkStatus();
                      });
                      done->store(true);
                    }),
                    done});
  return absl::OkStatus();
}

void JobManager::Shutdown() {
  std::vector<std::shared_ptr<Managed>> jobs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    shutdown_ = true;
    jobs = order_;
  }
  for (const auto& j : jobs) {
    std::lock_guard<std::mutex> lock(j->mu);
    j->stop = true;
    j->cv.notify_all();
    // Watchers learn that the daemon is going away (their stream ends with UNAVAILABLE).
    for (auto& s : j->subscribers) {
      v1::JobEvent e;
      e.set_job_id(j->id);
      e.set_message("daemon shutting down");
      s->OnEvent(e, true);
    }
    j->subscribers.clear();
  }
  {
    std::lock_guard<std::mutex> reap(reap_mu_);
    for (const auto& j : jobs) {
      if (j->pump.joinable()) j->pump.join();
    }
  }
  std::vector<Task> tasks;
  {
    std::lock_guard<std::mutex> lock(tasks_mu_);
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t.thread.join();
}

}  // namespace rp::server
