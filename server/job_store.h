// job_store.h — every job the daemon has seen (spec, state, progress, error) in a SQLite file in
// the state directory, so a restarted daemon lists them all and knows which were running.
//
// Contract: thread-safe (one connection behind a mutex). Writes are transactions in WAL mode
// (synchronous=NORMAL): a crash loses at most the last progress update, never a job.
#pragma once

#include <sqlite3.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "roundpipe/v1/jobs.pb.h"

namespace rp::server {

class JobStore {
 public:
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();

  // Inserts or replaces the job (keyed by id; `seq` orders jobs by submission).
  absl::Status Put(int64_t seq, const roundpipe::v1::Job& job);
  // Every stored job in submission order, with its seq. A row whose record does not parse comes
  // back as a FAILED job (its id, an error saying the record is damaged), never as an error.
  absl::StatusOr<std::vector<std::pair<int64_t, roundpipe::v1::Job>>> LoadAll();
  absl::StatusOr<int64_t> MaxSeq();

 private:
  explicit JobStore(sqlite3* db) : db_(db) {}
  absl::Status Exec(const char* sql);
  absl::Mutex mu_;
  sqlite3* db_ ABSL_PT_GUARDED_BY(mu_);  // the connection is used by one caller at a time
};

}  // namespace rp::server
