#include "server/job_table.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace rp::server {

namespace v1 = roundpipe::v1;

std::string JobTable::IdOf(int64_t seq) {
  char id[32];
  std::snprintf(id, sizeof(id), "job-%06lld", static_cast<long long>(seq));
  return id;
}

int64_t JobTable::SeqOf(const std::string& id) {
  int64_t seq = 0;
  if (id.rfind("job-", 0) != 0 || !absl::SimpleAtoi(id.substr(4), &seq) || seq <= 0) return 0;
  return seq;
}

int64_t JobTable::ReserveSeq() {
  absl::MutexLock lock(&mu_);
  return next_seq_++;
}

void JobTable::ContinueAfter(int64_t seq) {
  absl::MutexLock lock(&mu_);
  next_seq_ = std::max(next_seq_, seq + 1);
}

int64_t JobTable::next_seq() const {
  absl::MutexLock lock(&mu_);
  return next_seq_;
}

absl::Status JobTable::Add(std::shared_ptr<ManagedJob> job) {
  absl::MutexLock lock(&mu_);
  if (by_seq_.count(job->seq) > 0 || by_id_.count(job->id) > 0) {
    return absl::AlreadyExistsError(absl::StrCat("job ", job->id, " (seq ", job->seq, ") is already listed"));
  }
  next_seq_ = std::max(next_seq_, job->seq + 1);
  by_id_[job->id] = job;
  by_seq_[job->seq] = std::move(job);
  return absl::OkStatus();
}

std::shared_ptr<ManagedJob> JobTable::Find(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second;
}

std::vector<std::shared_ptr<ManagedJob>> JobTable::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<ManagedJob>> out;
  out.reserve(by_seq_.size());
  for (const auto& [seq, job] : by_seq_) out.push_back(job);
  return out;
}

absl::StatusOr<v1::ListJobsResponse> JobTable::Page(const v1::ListJobsRequest& req) const {
  if (req.page_size() < 0) return absl::InvalidArgumentError("page_size must not be negative");
  const int page = req.page_size() > 0 ? std::min(req.page_size(), 1000) : 100;
  int64_t after = 0;
  if (!req.page_token().empty() && (!absl::SimpleAtoi(req.page_token(), &after) || after < 0)) {
    return absl::InvalidArgumentError("page_token: not a token this daemon issued");
  }
  v1::ListJobsResponse out;
  for (const auto& job : All()) {  // a snapshot: no job's lock is taken under the table's
    if (job->seq <= after) continue;
    absl::MutexLock lock(&job->mu);
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

std::map<v1::JobState, int> JobTable::CountByState() const {
  std::map<v1::JobState, int> counts;
  for (const auto& job : All()) {
    absl::MutexLock lock(&job->mu);
    ++counts[job->record.state()];
  }
  return counts;
}

int JobTable::CountNotEnded() const {
  int n = 0;
  for (const auto& [state, count] : CountByState()) {
    if (!IsTerminal(state)) n += count;
  }
  return n;
}

}  // namespace rp::server
