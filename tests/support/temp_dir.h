// temp_dir.h — a fresh, empty scratch directory for a test: <tmp>/rp_<suite>_<name>_<pid>
// (the pid keeps ctest's parallel processes apart; a leftover of an earlier run is removed).
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace rp::testing {

inline std::filesystem::path FreshTempDir(const std::string& suite, const std::string& name) {
  std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("rp_" + suite + "_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace rp::testing
