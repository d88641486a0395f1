#include "server/job_store.h"

#include "absl/strings/str_cat.h"

namespace rp::server {

namespace {
absl::Status SqlError(sqlite3* db, const char* what) {
  return absl::InternalError(absl::StrCat("job store: ", what, ": ", sqlite3_errmsg(db)));
}
}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr) !=
      SQLITE_OK) {
    absl::Status st = absl::InternalError(
        absl::StrCat("job store: cannot open '", path, "': ", db ? sqlite3_errmsg(db) : "out of memory"));
    sqlite3_close(db);
    return st;
  }
  std::unique_ptr<JobStore> s(new JobStore(db));
  sqlite3_busy_timeout(db, 5000);
  for (const char* sql : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL",
                          "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, seq INTEGER NOT NULL, "
                          "state INTEGER NOT NULL, record BLOB NOT NULL)"}) {
    if (absl::Status st = s->Exec(sql); !st.ok()) return st;
  }
  return s;
}

JobStore::~JobStore() { sqlite3_close(db_); }

absl::Status JobStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    absl::Status st = absl::InternalError(absl::StrCat("job store: ", sql, ": ", err ? err : "?"));
    sqlite3_free(err);
    return st;
  }
  return absl::OkStatus();
}

absl::Status JobStore::Put(int64_t seq, const roundpipe::v1::Job& job) {
  const std::string blob = job.SerializeAsString();
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO jobs (id, seq, state, record) VALUES (?, ?, ?, ?)", -1, &stmt,
                         nullptr) != SQLITE_OK) {
    return SqlError(db_, "prepare");
  }
  sqlite3_bind_text(stmt, 1, job.id().c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int64(stmt, 2, seq);
  sqlite3_bind_int(stmt, 3, static_cast<int>(job.state()));
  sqlite3_bind_blob(stmt, 4, blob.data(), static_cast<int>(blob.size()), SQLITE_TRANSIENT);
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return SqlError(db_, "insert");
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<int64_t, roundpipe::v1::Job>>> JobStore::LoadAll() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT seq, record, id FROM jobs ORDER BY seq", -1, &stmt, nullptr) != SQLITE_OK) {
    return SqlError(db_, "prepare");
  }
  std::vector<std::pair<int64_t, roundpipe::v1::Job>> out;
  int rc;
  while ((rc = sqlite3_step(stmt)) == SQLITE_ROW) {
    roundpipe::v1::Job job;
    const void* p = sqlite3_column_blob(stmt, 1);
    const int n = sqlite3_column_bytes(stmt, 1);
    if (!job.ParseFromArray(p, n) || job.id().empty()) {
      // A damaged row costs that job, never the daemon: it is listed FAILED, saying why.
      const unsigned char* id = sqlite3_column_text(stmt, 2);
      job.Clear();
      job.set_id(id ? reinterpret_cast<const char*>(id) : absl::StrCat("damaged-row-", sqlite3_column_int64(stmt, 0)));
      job.set_state(roundpipe::v1::JOB_STATE_FAILED);
      job.set_error(
          "the job store's record of this job is damaged (it does not parse); its spec and progress are lost");
    }
    out.emplace_back(sqlite3_column_int64(stmt, 0), std::move(job));
  }
  sqlite3_finalize(stmt);
  if (rc != SQLITE_DONE) return SqlError(db_, "select");
  return out;
}

absl::StatusOr<int64_t> JobStore::MaxSeq() {
  absl::MutexLock lock(&mu_);
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT COALESCE(MAX(seq), 0) FROM jobs", -1, &stmt, nullptr) != SQLITE_OK) {
    return SqlError(db_, "prepare");
  }
  int64_t v = 0;
  if (sqlite3_step(stmt) == SQLITE_ROW) v = sqlite3_column_int64(stmt, 0);
  sqlite3_finalize(stmt);
  return v;
}

}  // namespace rp::server
