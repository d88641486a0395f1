// export_journal.h — crash safety for model exports: while an export writes its directory, a
// journal file under the daemon's jobs directory names the target; a kill -9 meanwhile leaves a
// temporary beside the target (workers/files/atomic_dir.h) that the next start removes
// (RemoveTorn), even if nothing exports there again.
//
// Contract: Begin writes the entry and returns its path; End removes it. RemoveTorn runs at
// start-up, before any export: it removes every temporary a journaled export left and then the
// journal entries. Files only under `jobs_dir`; no locking of its own (distinct exports have
// distinct entries: job id + a hash of the target).
#pragma once

#include <string>

namespace rp::server {

class ExportJournal {
 public:
  explicit ExportJournal(std::string jobs_dir) : jobs_dir_(std::move(jobs_dir)) {}

  std::string Begin(const std::string& job_id, const std::string& target_dir) const;
  void End(const std::string& entry) const;
  // Returns how many temporaries it removed.
  int RemoveTorn() const;

  static constexpr char kInfix[] = ".export-";  // <jobs_dir>/<id>.export-<hash>

 private:
  std::string jobs_dir_;
};

}  // namespace rp::server
