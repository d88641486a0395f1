// oracle_cache.h — the output of a Python oracle script, made once and shared by every test
// process: CTest runs each test case in its own process, in parallel, and an oracle that trains
// tokenizers or builds models with transformers costs tens of seconds per run.
//
// Contract: CachedOracle runs `python script OUT_DIR args` into a cache directory under the temp
// dir named by a hash of the script's text, `args`, the text of `key_files` (code the script
// imports from the checkout) and the venv's site-packages time stamp (an
// upgraded transformers or tokenizers makes new references), under an exclusive file lock so
// parallel callers wait for the first. The directory is complete (marked after the script exits
// 0) or remade. A failing script is an error carrying its output: callers fail the test with it
// (a missing oracle is never a skip). Callers copy the directory before writing into it.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/support/run_command.h"

namespace rp::testing {

inline absl::StatusOr<std::string> CachedOracle(const std::string& python, const std::string& script,
                                                const std::string& args = "",
                                                const std::vector<std::string>& key_files = {}) {
  namespace fs = std::filesystem;
  std::string key = ReadWholeFile(script) + "\n" + args;
  for (const std::string& f : key_files) key += "\n" + ReadWholeFile(f);
  const fs::path venv_lib = fs::path(python).parent_path().parent_path() / "lib";
  std::error_code ec;
  for (const auto& version : fs::directory_iterator(venv_lib, ec)) {
    const auto stamp = fs::last_write_time(version.path() / "site-packages", ec);
    if (!ec) key += std::to_string(stamp.time_since_epoch().count());
  }
  const fs::path cache = fs::temp_directory_path() / ("rp_oracle_" + fs::path(script).stem().string() + "_" +
                                                      std::to_string(std::hash<std::string>{}(key)));
  const int lock = ::open((cache.string() + ".lock").c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  if (lock < 0 || ::flock(lock, LOCK_EX) != 0) {
    if (lock >= 0) ::close(lock);
    return absl::InternalError("cannot lock the oracle cache " + cache.string());
  }
  absl::Status result;
  if (!fs::exists(cache / ".complete")) {
    fs::remove_all(cache, ec);
    std::string out;
    if (RunCommand(python + " " + script + " " + cache.string() + args, &out) != 0) {
      result = absl::UnavailableError("the oracle " + script + " failed:\n" + out);
    } else {
      std::ofstream(cache / ".complete") << "made\n";
    }
  }
  ::close(lock);
  if (!result.ok()) return result;
  return cache.string();
}

}  // namespace rp::testing
