// managed_job.h — one job of the daemon as the job manager holds it: its record (the proto the
// store keeps and clients read), how it runs in the engine, its watchers and its event pump.
//
// Contract: `id` and `seq` are fixed before the job is shared; `resolved` is set before the job is
// published (JobTable::Add, or restart recovery's re-admission) and read-only after; everything
// else is under `mu`. Subscribers in `watchers` are called with `mu` held and must only enqueue.
#pragma once

#include <atomic>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "roundpipe/v1/jobs.pb.h"
#include "scheduler/engine.h"
#include "server/job_events.h"
#include "server/job_spec.h"
#include "server/job_watchers.h"

namespace rp::server {

struct ManagedJob {
  std::string id;  // fixed at creation
  int64_t seq = 0;
  absl::Mutex mu;
  absl::CondVar cv;  // signalled at every state change the pump applies, and at shutdown
  roundpipe::v1::Job record ABSL_GUARDED_BY(mu);
  std::optional<scheduler::JobId> engine_id ABSL_GUARDED_BY(mu);  // absent: listed from a previous daemon run
  ResolvedJob resolved;                                           // set before the job is published, read-only after
  bool input_end ABSL_GUARDED_BY(mu) = false;                     // a stream closed the job's input
  std::atomic<int> threads_running{0};                            // the pump is still inside its loop (reaped at 0)
  bool stop ABSL_GUARDED_BY(mu) = false;     // daemon shutdown: threads leave without touching the record
  bool drained ABSL_GUARDED_BY(mu) = false;  // paused by Drain (not by a user)
  JobWatchers watchers ABSL_GUARDED_BY(mu);
  std::thread pump;                   // joined under JobManager's reap lock
  std::thread cluster_watch;          // cluster jobs (JobManager::WatchCluster); joined like pump
  std::atomic<bool> resuming{false};  // a cluster resume (JobManager::ResumeCluster) is under way
  // A cluster job: the other node whose failure (or silence) explains this one's, in words.
  std::string cluster_fault ABSL_GUARDED_BY(mu);
  JobEventTracker tracker ABSL_GUARDED_BY(mu);  // engine events -> record (the pump only)
};

// "<id> <created seconds>.<nanos>": the owner token of the job's output dir, unique even if a
// damaged job store made ids restart.
inline std::string OwnerToken(const roundpipe::v1::Job& record) {
  return absl::StrCat(record.id(), " ", record.created().seconds(), ".", record.created().nanos());
}

}  // namespace rp::server
