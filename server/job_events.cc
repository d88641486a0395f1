#include "server/job_events.h"

#include <google/protobuf/util/time_util.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace rp::server {

namespace v1 = roundpipe::v1;
using google::protobuf::util::TimeUtil;
using scheduler::JobState;

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

v1::PlanChange::Cause ToProto(scheduler::PlanChange::Cause c) {
  using C = scheduler::PlanChange::Cause;
  switch (c) {
    case C::kWorkerLost:
      return v1::PlanChange::WORKER_LOST;
    case C::kWorkerDrained:
      return v1::PlanChange::WORKER_DRAINED;
    case C::kWorkerReturned:
      return v1::PlanChange::WORKER_RETURNED;
    case C::kOutOfMemory:
      return v1::PlanChange::DEVICE_OUT_OF_MEMORY;
  }
  return v1::PlanChange::CAUSE_UNSPECIFIED;
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED || s == v1::JOB_STATE_CANCELLED;
}

namespace {
void Stamp(v1::Job& rec) { *rec.mutable_updated() = TimeUtil::GetCurrentTime(); }

std::string GiB(int64_t bytes) {
  if (bytes < (int64_t{1} << 30)) return absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return absl::StrFormat("%.1f GiB", static_cast<double>(bytes) / (1 << 30));
}

std::string Running(const v1::JobWait& w) {
  if (w.running_jobs().empty()) return "no other job runs";
  std::string jobs = absl::StrJoin(w.running_jobs(), ", ");
  return absl::StrCat(jobs, w.running_jobs_size() == 1 ? " runs" : " run");
}
}  // namespace

v1::JobWait ToProto(const scheduler::JobWait& w, const JobNames& names) {
  auto name = [&](scheduler::JobId id) { return names ? names(id) : absl::StrCat("engine job ", id); };
  v1::JobWait out;
  switch (w.cause) {
    case scheduler::JobWait::Cause::kNone:
      out.set_cause(v1::JobWait::CAUSE_UNSPECIFIED);
      break;
    case scheduler::JobWait::Cause::kBehind:
      out.set_cause(v1::JobWait::BEHIND);
      break;
    case scheduler::JobWait::Cause::kRunningLimit:
      out.set_cause(v1::JobWait::RUNNING_LIMIT);
      break;
    case scheduler::JobWait::Cause::kHostMemory:
      out.set_cause(v1::JobWait::HOST_MEMORY);
      break;
  }
  if (w.cause == scheduler::JobWait::Cause::kBehind) {
    out.set_ahead_job(name(w.ahead));
    out.set_ahead_priority(w.ahead_priority);
  }
  for (scheduler::JobId id : w.running) out.add_running_jobs(name(id));
  out.set_max_running_jobs(w.max_running);
  out.set_need_bytes(w.need_bytes);
  out.set_free_bytes(w.free_bytes);
  return out;
}

std::string WaitMessage(const v1::JobWait& w) {
  switch (w.cause()) {
    case v1::JobWait::BEHIND:
      return absl::StrCat("waits behind ", w.ahead_job(), " (priority ", w.ahead_priority(), ")");
    case v1::JobWait::RUNNING_LIMIT:
      return absl::StrCat("waits for a running slot: ", Running(w), " (maxRunningJobs ", w.max_running_jobs(), ")");
    case v1::JobWait::HOST_MEMORY:
      return absl::StrCat("waits for host memory: needs ", GiB(w.need_bytes()), ", ", GiB(w.free_bytes()),
                          " free while ", Running(w));
    default:
      return "queued";
  }
}

void JobEventTracker::ApplyState(const scheduler::JobEvent& e, bool drained, v1::Job& rec, EventEffect& fx) {
  v1::JobEvent& out = fx.out;
  const v1::JobState s = ToProto(e.state);
  std::string message = e.message;
  if (s == v1::JOB_STATE_FAILED) rec.set_error(message);
  if (s == v1::JOB_STATE_SUCCEEDED && message.empty() && checkpoint_failures_ > 0) {
    message = absl::StrCat("succeeded, but ", checkpoint_failures_,
                           " checkpoint(s) failed (last: ", last_checkpoint_failure_, ")");
  }
  fx.from = rec.state();
  fx.to = s;
  rec.set_state(s);
  rec.set_paused_by_drain(s == v1::JOB_STATE_PAUSED && drained);
  if (s != v1::JOB_STATE_PAUSED) {
    rec.set_message(message);
  } else if (drained) {
    rec.set_message("paused by a daemon drain");
  } else if (e.pause_cause == scheduler::JobEvent::PauseCause::kByEngine) {
    rec.set_message(message);  // the engine paused it itself (e.g. checkpoints keep failing): say why
  } else {
    rec.set_message(message.empty() ? "paused" : message);  // a caller's pause, with the engine's detail
  }
  if (s != v1::JOB_STATE_QUEUED) rec.clear_waiting();
  if (s == v1::JOB_STATE_RUNNING) {
    rec.clear_message();
    if (!rec.has_started()) *rec.mutable_started() = out.time();
  }
  Stamp(rec);
  out.set_state(s);
  out.set_message(message);
  fx.ended = IsTerminal(s);
  fx.persist = true;
  fx.log = EventEffect::Log::kInfo;
  fx.log_line = absl::StrCat(v1::JobState_Name(s), message.empty() ? "" : ": ", message);
}

void JobEventTracker::ApplyIteration(const scheduler::JobEvent& e, std::chrono::steady_clock::time_point now,
                                     v1::Job& rec, EventEffect& fx) {
  v1::JobEvent& out = fx.out;
  const scheduler::IterationStats& st = e.stats;
  v1::JobProgress* p = rec.mutable_progress();
  if (std::exchange(progress_message_, false)) rec.clear_message();  // loaded: training now
  p->set_step(p->step() + 1);
  p->set_tokens(p->tokens() + st.tokens);
  p->set_last_loss(st.loss);
  const double tps = st.seconds > 0 ? static_cast<double>(st.tokens) / st.seconds : 0;
  p->set_tokens_per_second(tps);
  p->set_last_bubble_ratio(st.bubble_ratio);
  p->set_collective_seconds(p->collective_seconds() + st.collective_seconds);
  p->set_collective_bytes(p->collective_bytes() + st.collective_bytes);
  p->set_last_collective_seconds(st.collective_seconds);
  p->set_last_collective_bytes(st.collective_bytes);
  if (last_step_at_ != std::chrono::steady_clock::time_point{}) {
    const double dt = std::chrono::duration<double>(now - last_step_at_).count();
    ema_step_s_ = ema_step_s_ == 0 ? dt : 0.8 * ema_step_s_ + 0.2 * dt;
  } else {
    ema_step_s_ = st.seconds;
  }
  last_step_at_ = now;
  if (!st.partition.empty()) rec.set_partition(st.partition);
  v1::HostMemory* mem = rec.mutable_host_memory();
  mem->set_peak_state_bytes(std::max(mem->peak_state_bytes(), st.host_state_bytes));
  mem->set_peak_activation_bytes(std::max(mem->peak_activation_bytes(), st.activation_peak_bytes));
  if (st.partition_problem != partition_problem_) {  // log changes only, not every step
    if (!st.partition_problem.empty()) {
      fx.log = EventEffect::Log::kWarn;
      fx.log_line = st.partition_problem;
    }
    partition_problem_ = st.partition_problem;
  }
  v1::StepMetrics* m = out.mutable_step();
  m->set_step(p->step());
  m->set_loss(st.loss);
  m->set_tokens_per_second(tps);
  m->set_learning_rate(st.lr);
  m->set_grad_norm(st.grad_norm);
  m->set_bubble_ratio(st.bubble_ratio);
  m->set_skipped(st.skipped_step);
  m->set_collective_seconds(st.collective_seconds);
  m->set_collective_bytes(st.collective_bytes);
  m->set_eta_seconds(rec.total_steps() > 0
                         ? std::max<double>(0, static_cast<double>(rec.total_steps() - p->step())) * ema_step_s_
                         : -1);
  if (now - last_persist_ > std::chrono::seconds(1)) {  // at most once a second: steps are frequent
    Stamp(rec);
    fx.persist = true;
    last_persist_ = now;
  }
  if (fx.log == EventEffect::Log::kNone && p->step() % 50 == 1) {
    fx.log = EventEffect::Log::kInfo;
    fx.log_line = absl::StrCat("step ", p->step(), " loss ", st.loss, " tokens/s ", static_cast<int64_t>(tps));
  }
}

void JobEventTracker::ApplyPlanChange(const scheduler::JobEvent& e, v1::Job& rec, EventEffect& fx) {
  const scheduler::PlanChange& c = e.plan_change;
  v1::PlanChange* pc = fx.out.mutable_plan_change();
  pc->set_cause(ToProto(c.cause));
  pc->set_worker(c.worker);
  pc->set_workers(c.workers);
  pc->set_partition(c.partition);
  pc->set_stage_memory_cap(c.stage_memory_cap);
  fx.out.set_message(c.detail);
  if (!c.partition.empty()) rec.set_partition(c.partition);
  fx.log = c.cause == scheduler::PlanChange::Cause::kWorkerReturned ? EventEffect::Log::kInfo : EventEffect::Log::kWarn;
  fx.log_line = absl::StrCat(scheduler::PlanChangeCauseName(c.cause),
                             c.worker >= 0 ? absl::StrCat(" (worker ", c.worker, ")") : "", ": ", c.detail);
}

void JobEventTracker::ApplyEval(const scheduler::JobEvent& e, v1::Job& rec, EventEffect& fx) {
  v1::JobEvent& out = fx.out;
  const scheduler::EvalStats& ev = e.eval;
  if (std::exchange(progress_message_, false)) rec.clear_message();  // "evaluating at step ...": done
  v1::EvalMetrics m;
  m.set_step(ev.step);
  m.set_loss(ev.loss);
  m.set_tokens(ev.tokens);
  m.set_seconds(ev.seconds);
  m.set_best_loss(ev.best_loss);
  m.set_best_step(ev.best_step);
  m.set_is_best(ev.is_best);
  for (const scheduler::GeneratedSample& g : ev.samples) FillSample(g, m.add_samples());
  *rec.mutable_last_eval() = m;
  if (!ev.checkpoint.empty()) rec.set_best_checkpoint(ev.checkpoint);
  *out.mutable_eval() = m;
  Stamp(rec);
  fx.persist = true;
  fx.log = EventEffect::Log::kInfo;
  fx.log_line =
      absl::StrCat("eval at step ", ev.step, ": loss ", ev.loss, " over ", ev.tokens, " tokens",
                   ev.is_best ? " (best)" : absl::StrCat(" (best ", ev.best_loss, " at step ", ev.best_step, ")"));
}

void JobEventTracker::ApplyWaiting(const scheduler::JobEvent& e, v1::Job& rec, EventEffect& fx) {
  const v1::JobWait w = ToProto(e.wait, names_);
  *rec.mutable_waiting() = w;
  rec.set_message(WaitMessage(w));
  Stamp(rec);
  fx.persist = true;
  *fx.out.mutable_waiting() = w;
  fx.out.set_message(rec.message());
  fx.log = EventEffect::Log::kInfo;
  fx.log_line = rec.message();
}

EventEffect JobEventTracker::Apply(const scheduler::JobEvent& e, std::chrono::steady_clock::time_point now,
                                   bool drained, v1::Job* record) {
  v1::Job& rec = *record;
  EventEffect fx;
  v1::JobEvent& out = fx.out;
  *out.mutable_time() = TimeUtil::NanosecondsToTimestamp(
      std::chrono::duration_cast<std::chrono::nanoseconds>(e.time.time_since_epoch()).count());
  const auto stamp = [&] { Stamp(rec); };
  switch (e.kind) {
    case scheduler::JobEvent::Kind::kState:
      ApplyState(e, drained, rec, fx);
      break;
    case scheduler::JobEvent::Kind::kIteration:
      ApplyIteration(e, now, rec, fx);
      break;
    case scheduler::JobEvent::Kind::kCheckpoint:
      rec.set_last_checkpoint(e.checkpoint.path);
      rec.set_last_checkpoint_step(e.checkpoint.step);
      stamp();
      fx.persist = true;
      out.mutable_checkpoint()->set_path(e.checkpoint.path);
      out.mutable_checkpoint()->set_step(e.checkpoint.step);
      fx.log = EventEffect::Log::kInfo;
      fx.log_line = absl::StrCat("checkpoint at step ", e.checkpoint.step, ": ", e.checkpoint.path);
      break;
    case scheduler::JobEvent::Kind::kCheckpointFailed:
      ++checkpoint_failures_;
      last_checkpoint_failure_ = e.message;
      rec.set_message(e.message);
      stamp();
      fx.persist = true;
      out.set_checkpoint_failed(e.message);
      fx.log = EventEffect::Log::kError;
      fx.log_line = e.message;
      break;
    case scheduler::JobEvent::Kind::kProgress:  // loading: "loading weights from ..." (GetJob's message)
      rec.set_message(e.message);
      progress_message_ = true;
      stamp();
      fx.persist = true;
      out.set_progress(e.message);
      fx.log = EventEffect::Log::kInfo;
      fx.log_line = e.message;
      break;
    case scheduler::JobEvent::Kind::kEval:
      ApplyEval(e, rec, fx);
      break;
    case scheduler::JobEvent::Kind::kProfile:
      rec.set_profile(e.message);
      stamp();
      fx.persist = true;
      out.set_profile(e.message);
      fx.log = EventEffect::Log::kInfo;
      fx.log_line = absl::StrCat("measured profile written to ", e.message);
      break;
    case scheduler::JobEvent::Kind::kProfileFailed:
      stamp();
      fx.persist = true;
      out.set_profile(e.message);
      fx.log = EventEffect::Log::kWarn;
      fx.log_line = e.message;
      break;
    case scheduler::JobEvent::Kind::kWaiting:
      ApplyWaiting(e, rec, fx);
      break;
    case scheduler::JobEvent::Kind::kPlanChange:
      ApplyPlanChange(e, rec, fx);
      break;
    case scheduler::JobEvent::Kind::kBatchRejected:
      out.set_batch_rejected(e.message);
      fx.log = EventEffect::Log::kWarn;
      fx.log_line = absl::StrCat("batch rejected: ", e.message);
      break;
  }
  return fx;
}

void FillSample(const scheduler::GeneratedSample& g, v1::Sample* out) {
  out->set_prompt(g.prompt);
  out->set_completion(g.completion);
  out->mutable_token_ids()->Add(g.token_ids.begin(), g.token_ids.end());
}

}  // namespace rp::server
