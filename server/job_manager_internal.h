// job_manager_internal.h — what the job manager's files share (job_manager.cc: admission,
// control, streams, the event pump, export, drain; job_recovery.cc: restart recovery): the
// per-job record and the log. Not for other rooms.
#pragma once

#include <google/protobuf/util/time_util.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "server/job_events.h"
#include "server/job_manager.h"

namespace rp::server {

inline std::shared_ptr<spdlog::logger> JobLog() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::get("jobs");
    if (l) return l;
    l = spdlog::default_logger()->clone("jobs");
    spdlog::register_logger(l);
    return l;
  }();
  return logger;
}

inline google::protobuf::Timestamp Now() { return google::protobuf::util::TimeUtil::GetCurrentTime(); }

// "<id> <created seconds>.<nanos>": unique even if a damaged job store made ids restart.
inline std::string OwnerToken(const roundpipe::v1::Job& record) {
  return absl::StrCat(record.id(), " ", record.created().seconds(), ".", record.created().nanos());
}

// One job of the daemon: its record, how it runs in the engine, its watchers and its pump.
struct JobManager::Managed {
  std::string id;  // fixed at creation
  int64_t seq = 0;
  absl::Mutex mu;
  absl::CondVar cv;  // signalled at every state change the pump applies, and at shutdown
  roundpipe::v1::Job record ABSL_GUARDED_BY(mu);
  std::optional<scheduler::JobId> engine_id ABSL_GUARDED_BY(mu);  // absent: listed from a previous daemon run
  ResolvedJob resolved;  // set before the job is published (jobs_, or Recover's re-admission), read-only after
  bool input_end ABSL_GUARDED_BY(mu) = false;  // a stream closed the job's input
  std::atomic<int> threads_running{0};         // the pump is still inside its loop (reaped at 0)
  bool stop ABSL_GUARDED_BY(mu) = false;       // daemon shutdown: threads leave without touching the record
  bool drained ABSL_GUARDED_BY(mu) = false;    // paused by Drain (not by a user)
  JobWatchers watchers ABSL_GUARDED_BY(mu);
  std::thread pump;                             // joined under JobManager::reap_mu_
  JobEventTracker tracker ABSL_GUARDED_BY(mu);  // engine events -> record (the pump only)
};

}  // namespace rp::server
