// job_events.h — what an engine event does to a job's record and what watchers see of it: the
// one translation from the engine's value types (scheduler::JobEvent, JobState) to the API's
// (roundpipe.v1.Job, JobEvent, JobState). The job manager's event pump applies it and then does
// the side effects it asks for (persist, publish, metrics, log).
//
// Contract: pure (no I/O, no locks, no clock of its own: `now` is given); one JobEventTracker
// per job, used by one thread at a time (the pump, under the job's lock).
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "roundpipe/v1/jobs.pb.h"
#include "scheduler/engine_types.h"

namespace rp::server {

roundpipe::v1::JobState ToProto(scheduler::JobState s);
bool IsTerminal(roundpipe::v1::JobState s);
roundpipe::v1::PlanChange::Cause ToProto(scheduler::PlanChange::Cause c);

// The daemon's id of an engine job ("job-000007"), for what one job says of others.
using JobNames = std::function<std::string(scheduler::JobId)>;
roundpipe::v1::JobWait ToProto(const scheduler::JobWait& w, const JobNames& names);
// "waits behind job-000009 (priority 5)", "waits for host memory: needs 41.2 GiB, 12.5 GiB free
// while job-000007 runs", ...
std::string WaitMessage(const roundpipe::v1::JobWait& w);

// One generated sample as the API shows it (EvalMetrics.samples, GenerateResponse.samples).
void FillSample(const scheduler::GeneratedSample& g, roundpipe::v1::Sample* out);

// The effects the caller carries out.
struct EventEffect {
  roundpipe::v1::JobEvent out;  // for watchers (time set from the engine's)
  bool publish = true;
  bool persist = false;  // the record changed enough to write it to the job store now
  bool ended = false;    // a terminal state: no events follow
  roundpipe::v1::JobState from = roundpipe::v1::JOB_STATE_UNSPECIFIED, to = from;  // a transition
  enum class Log { kNone, kInfo, kWarn, kError } log = Log::kNone;
  std::string log_line;
};

class JobEventTracker {
 public:
  // Applies `e` to `record` (state, message/error, progress, ETA, partition, checkpoints).
  // `drained`: the daemon's drain paused the job (the message says so).
  EventEffect Apply(const scheduler::JobEvent& e, std::chrono::steady_clock::time_point now, bool drained,
                    roundpipe::v1::Job* record);
  int checkpoint_failures() const { return checkpoint_failures_; }
  // How engine job ids become the daemon's (kWaiting names other jobs); unset: "engine job N".
  void set_names(JobNames names) { names_ = std::move(names); }

 private:
  // One kind of event each (Apply stamps the event's time and dispatches).
  void ApplyState(const scheduler::JobEvent& e, bool drained, roundpipe::v1::Job& rec, EventEffect& fx);
  void ApplyIteration(const scheduler::JobEvent& e, std::chrono::steady_clock::time_point now, roundpipe::v1::Job& rec,
                      EventEffect& fx);
  void ApplyEval(const scheduler::JobEvent& e, roundpipe::v1::Job& rec, EventEffect& fx);
  void ApplyWaiting(const scheduler::JobEvent& e, roundpipe::v1::Job& rec, EventEffect& fx);
  void ApplyPlanChange(const scheduler::JobEvent& e, roundpipe::v1::Job& rec, EventEffect& fx);

  std::chrono::steady_clock::time_point last_step_at_{}, last_persist_{};
  double ema_step_s_ = 0;          // smoothed wall time per step (ETA)
  std::string partition_problem_;  // the last automatic-partition problem logged
  int checkpoint_failures_ = 0;    // in this daemon run (the final message says so)
  std::string last_checkpoint_failure_;
  bool progress_message_ = false;  // record.message is the engine's loading progress
  JobNames names_;
};

}  // namespace rp::server
