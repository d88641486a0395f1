// job_table.h — every job the daemon lists, by id and in submission order (seq): the job
// manager's index. Hands out seqs and ids, answers ListJobs pages and counts jobs per state.
//
// Contract: thread-safe. No job's lock is ever taken with the table's lock held (Page and the
// counts read the jobs from a snapshot), but Page and the counts do take each job's lock: a
// caller holding a job's `mu` must not call them. Ids never restart: ContinueAfter moves the next
// seq past any seen elsewhere (the store, the job directories).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "roundpipe/v1/jobs.pb.h"
#include "server/managed_job.h"

namespace rp::server {

class JobTable {
 public:
  // "job-000042": a job's id from its seq.
  static std::string IdOf(int64_t seq);
  // A job's seq from its id or directory name ("job-000042" -> 42); 0 when it is not one.
  static int64_t SeqOf(const std::string& id);

  // The next new job's seq (never handed out twice).
  int64_t ReserveSeq();
  // New seqs continue after `seq` (no-op when they already do).
  void ContinueAfter(int64_t seq);
  int64_t next_seq() const;

  // Lists the job (keyed by its id and seq, both set). AlreadyExists for a seq or id listed.
  absl::Status Add(std::shared_ptr<ManagedJob> job);
  std::shared_ptr<ManagedJob> Find(const std::string& id) const;  // null when not listed
  std::vector<std::shared_ptr<ManagedJob>> All() const;           // in seq order

  // One ListJobs page: jobs after the request's page token (a seq), in seq order, filtered by
  // state; a next_page_token when more may follow. InvalidArgument for a negative page size or a
  // token this table did not issue. Page size: 0 = 100, at most 1000.
  absl::StatusOr<roundpipe::v1::ListJobsResponse> Page(const roundpipe::v1::ListJobsRequest& request) const;

  std::map<roundpipe::v1::JobState, int> CountByState() const;
  int CountNotEnded() const;  // jobs in a state that is not terminal

 private:
  mutable absl::Mutex mu_;
  std::map<int64_t, std::shared_ptr<ManagedJob>> by_seq_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::shared_ptr<ManagedJob>> by_id_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace rp::server
