// tensorboard_reader.h — what PyPI tensorboard's own readers find in a log directory
// (tests/unit/server/read_tfevents.py run by the venv's Python), for the tests of the daemon's
// TensorBoard files. Header-only; the including target defines RP_VENV_PYTHON and RP_SOURCE_DIR.
//
// Contract: ReadTensorBoard fails the calling test (and returns an empty object) when the reader
// cannot run or cannot read the files: a missing oracle is a failure, never a skip.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/support/run_command.h"

namespace rp::testing {

inline nlohmann::json ReadTensorBoard(const std::string& dir) {
  std::string out;
  const int rc = RunCommand(std::string(RP_VENV_PYTHON) + " " + RP_SOURCE_DIR +
                                "/tests/unit/server/read_tfevents.py '" + dir + "' 2>/dev/null",
                            &out);
  EXPECT_EQ(rc, 0) << "tensorboard's reader failed on " << dir << " (is PyPI tensorboard in the venv?):\n" << out;
  if (rc != 0) return nlohmann::json::object();
  return nlohmann::json::parse(out);
}

// A scalar series as TensorBoard read it: (step, value) in file order, duplicates included.
inline std::vector<std::pair<int64_t, double>> TensorBoardSeries(const nlohmann::json& j, const std::string& tag) {
  std::vector<std::pair<int64_t, double>> s;
  if (!j.contains("scalars") || !j["scalars"].contains(tag)) return s;
  for (const auto& p : j["scalars"][tag]) s.emplace_back(p[0].get<int64_t>(), p[1].get<double>());
  return s;
}

}  // namespace rp::testing
