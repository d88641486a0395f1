// The invariant vocabulary (workers/base/check.h): a failed check names the place, the condition
// and its context, and aborts; a check that holds costs nothing and evaluates no context.
#include "workers/base/check.h"

#include <gtest/gtest.h>

namespace {

int CountedContext(int* evaluations) {
  ++*evaluations;
  return 7;
}

TEST(CheckDeathTest, AFailedCheckNamesThePlaceTheConditionAndTheContextAndAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int two = 2;
  EXPECT_DEATH(RP_CHECK(two == 3) << "context " << 7,
               "roundpipe: invariant broken at .*check_test\\.cc:[0-9]+: two == 3: context 7");
  EXPECT_DEATH(RP_CHECK(two < 0), "invariant broken at .*check_test\\.cc:[0-9]+: two < 0\n");
  EXPECT_DEATH(RP_CHECK_FAIL() << "kind " << two, "invariant broken at .*: unreachable: kind 2");
}

TEST(CheckDeathTest, TheFailureIsAnAbortNotAnExit) {
  EXPECT_EXIT(RP_CHECK(false), testing::KilledBySignal(SIGABRT), "invariant broken");
}

TEST(Check, AHoldingCheckEvaluatesNoContext) {
  int evaluations = 0;
  for (int i = 0; i < 3; ++i) RP_CHECK(i < 3) << CountedContext(&evaluations);
  EXPECT_EQ(evaluations, 0);
}

}  // namespace
