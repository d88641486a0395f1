// job_gauges.h — the roundpipe_jobs{state} gauge: how many of the daemon's jobs are in each state.
// Set from absolute counts once at start-up (the recovered records), then moved by each
// transition, before the job's watchers hear of it.
//
// Contract: thread-safe (prometheus-cpp gauges are atomic); the family outlives this object.
#pragma once

#include <prometheus/family.h>
#include <prometheus/gauge.h>

#include <map>

#include "roundpipe/v1/jobs.pb.h"

namespace rp::server {

class JobGauges {
 public:
  explicit JobGauges(prometheus::Family<prometheus::Gauge>* jobs) : jobs_(jobs) {}

  // Every state's gauge set to its count (absent: 0).
  void SetCounts(const std::map<roundpipe::v1::JobState, int>& counts);
  // One job moved from `from` (JOB_STATE_UNSPECIFIED: a new job) to `to`; nothing when equal.
  void Move(roundpipe::v1::JobState from, roundpipe::v1::JobState to);

  // "queued", "running", ...: the gauge's state label.
  static std::string Label(roundpipe::v1::JobState s);

 private:
  prometheus::Family<prometheus::Gauge>* jobs_;
};

}  // namespace rp::server
