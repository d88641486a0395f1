#include "server/job_gauges.h"

#include <cctype>
#include <string>

namespace rp::server {

namespace v1 = roundpipe::v1;

std::string JobGauges::Label(v1::JobState s) {
  std::string name = v1::JobState_Name(s).substr(std::string("JOB_STATE_").size());
  for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

void JobGauges::SetCounts(const std::map<v1::JobState, int>& counts) {
  for (v1::JobState s : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_PAUSED, v1::JOB_STATE_SUCCEEDED,
                         v1::JOB_STATE_FAILED, v1::JOB_STATE_CANCELLED}) {
    auto it = counts.find(s);
    jobs_->Add({{"state", Label(s)}}).Set(it == counts.end() ? 0 : it->second);
  }
}

void JobGauges::Move(v1::JobState from, v1::JobState to) {
  if (from == to) return;
  if (from != v1::JOB_STATE_UNSPECIFIED) jobs_->Add({{"state", Label(from)}}).Decrement();
  jobs_->Add({{"state", Label(to)}}).Increment();
}

}  // namespace rp::server
