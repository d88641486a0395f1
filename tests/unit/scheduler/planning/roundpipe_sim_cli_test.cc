// roundpipe-sim's what-if modes as a user runs them: --pool (a job submitted long after the first
// ends finishes its own alone time after its start, and took no compute before; the makespan
// is the later end), --lose_worker (the iteration with the loss ends later than without it,
// and nothing before it changes), and bad flags refused with exit code 2 and words that say why.
#include <gtest/gtest.h>

#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/run_command.h"

namespace rp::testing {
namespace {

std::string Sim(const std::string& args, int* rc) {
  std::string out;
  *rc = RunCommand(std::string(RP_ROUNDPIPE_SIM) + " --model qwen3-1.7b --gpus 4 --microbatches 8 " + args, &out);
  return out;
}

// The numbers of the first line that starts with `prefix`.
std::vector<double> Row(const std::string& out, const std::string& prefix) {
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) != 0) continue;
    std::vector<double> v;
    std::istringstream f(line.substr(prefix.size()));
    std::string w;
    while (f >> w) {
      try {
        v.push_back(std::stod(w));
      } catch (...) {
      }
    }
    return v;
  }
  return {};
}

TEST(RoundpipeSimCli, APoolJobSubmittedLaterRunsItsAloneTimeAfterItsStart) {
  int rc = 0;
  const std::string out = Sim("--pool sync,async --pool_starts_s 0,1000 --iterations 2", &rc);
  ASSERT_EQ(rc, 0) << out;
  const std::vector<double> a = Row(out, "0    sync"), b = Row(out, "1    async");
  ASSERT_EQ(a.size(), 5u) << out;  // share, start, end, alone, compute %
  ASSERT_EQ(b.size(), 5u) << out;
  EXPECT_NEAR(a[2], a[3], 1e-3) << out;         // alone until it ended
  EXPECT_NEAR(b[2], 1000 + b[3], 1e-3) << out;  // started at 1000 s, then alone
  EXPECT_NEAR(a[4], 100.0, 0.05) << out;        // all the compute until the first ended
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex("together ([0-9.]+) s"))) << out;
  EXPECT_NEAR(std::stod(m[1].str()), b[2], 1e-3) << out;
}

TEST(RoundpipeSimCli, ALostWorkerDelaysItsIterationAndNothingBefore) {
  int rc = 0;
  const std::string out = Sim("--lose_worker 1,2,4 --iterations 3", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("lost at"), std::string::npos) << out;
  const std::vector<double> it0 = Row(out, "0 "), it1 = Row(out, "1 ");
  ASSERT_EQ(it0.size(), 4u) << out;  // clean end, lost end, clean ms, lost ms
  ASSERT_EQ(it1.size(), 4u) << out;
  EXPECT_DOUBLE_EQ(it0[0], it0[1]) << out;
  EXPECT_GT(it1[1], it1[0]) << out;
}

TEST(RoundpipeSimCli, BadPoolAndLostWorkerFlagsAreRefusedWithReasons) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--pool sync,bogus", "'bogus' is not sync or async"},
      {"--pool sync,sync --pool_shares 3", "1 values for 2 jobs"},
      {"--pool sync --pool_shares 0", "a share is in (0, 1000]"},
      {"--lose_worker 1,2", "is not ITERATION,SLOT,MICROBATCH"},
      {"--lose_worker 1,99,0", "no slot 99"},
      {"--lose_worker 1,2,4 --lose_worker_mode later", "sync or async"},
  };
  for (const auto& [args, words] : cases) {
    int rc = 0;
    const std::string out = Sim(args, &rc);
    EXPECT_EQ(rc, 2) << args << ": " << out;
    EXPECT_NE(out.find(words), std::string::npos) << args << ": " << out;
  }
}

}  // namespace
}  // namespace rp::testing
