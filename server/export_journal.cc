#include "server/export_journal.h"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "scheduler/job_files.h"

namespace rp::server {

std::string ExportJournal::Begin(const std::string& job_id, const std::string& target_dir) const {
  const std::string entry =
      (std::filesystem::path(jobs_dir_) / absl::StrCat(job_id, kInfix, absl::Hex(std::hash<std::string>{}(target_dir))))
          .string();
  std::ofstream(entry) << target_dir;
  return entry;
}

void ExportJournal::End(const std::string& entry) const {
  std::error_code ec;
  std::filesystem::remove(entry, ec);
}

int ExportJournal::RemoveTorn() const {
  int total = 0;
  std::error_code ec;
  for (const auto& file : std::filesystem::directory_iterator(jobs_dir_, ec)) {
    const std::string name = file.path().filename().string();
    if (name.find(kInfix) == std::string::npos || !file.is_regular_file(ec)) continue;
    std::string target;
    std::getline(std::ifstream(file.path()), target);
    if (!target.empty()) {
      const int removed = scheduler::RemoveTornWrite(target);
      if (removed > 0) {
        spdlog::warn("removed {} torn export temporar{} of {}", removed, removed == 1 ? "y" : "ies", target);
      }
      total += removed;
    }
    std::filesystem::remove(file.path(), ec);
  }
  return total;
}

}  // namespace rp::server
