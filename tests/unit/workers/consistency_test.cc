// The consistency protocol's events (workers/consistency.h): a countdown fires at zero, and one
// counted down past zero — more producers than the dispatch plan said — is a broken invariant.
#include "workers/consistency.h"

#include <gtest/gtest.h>

namespace rp::workers {
namespace {

TEST(CountdownEvent, FiresWhenTheLastProducerCountsDown) {
  CountdownEvent e(2);
  e.CountDown();
  EXPECT_FALSE(e.event()->IsSet());
  e.CountDown();
  EXPECT_TRUE(e.event()->IsSet());
}

TEST(CountdownEventDeathTest, CountingDownPastZeroIsABrokenInvariant) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  CountdownEvent e(1);
  e.CountDown();
  EXPECT_DEATH(e.CountDown(),
               "invariant broken at .*consistency\\.h:[0-9]+: before >= 1: consistency event counted "
               "down past zero \\(-1\\)");
}

}  // namespace
}  // namespace rp::workers
