// job_manager_internal.h — what the job manager's files share (job_manager.cc: admission,
// control, streams, the event pump; job_outputs.cc: export, checkpoint, drain, shutdown;
// job_recovery.cc: restart recovery): the jobs log and the clock. Not for other rooms.
#pragma once

#include <google/protobuf/util/time_util.h>
#include <spdlog/spdlog.h>

#include <memory>

#include "server/job_manager.h"
#include "server/managed_job.h"

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

}  // namespace rp::server
