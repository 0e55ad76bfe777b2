// The hang guard (hang_guard.h) fails what never returns, in its own words,
// and stays silent for what does.
#include <unistd.h>

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include "common/hang_guard.h"

namespace ucm::test {
namespace {

TEST(HangGuard, ACallThatReturnsPassesQuietly) {
  HangGuard g("a call that returns at once");
}

TEST(HangGuard, EventuallyIsTrueOnceThePredicateHolds) {
  int polls = 0;
  EXPECT_TRUE(eventually("the third poll", [&] { return ++polls == 3; }));
  EXPECT_EQ(polls, 3);
}

TEST(HangGuard, EventuallyFailsNamingWhatNeverHappened) {
  EXPECT_NONFATAL_FAILURE(EXPECT_FALSE(eventually("a predicate that never holds", [] { return false; }, 0.05)),
                          "hung: a predicate that never holds did not happen within ");
}

TEST(HangGuardDeathTest, ACallThatNeverReturnsEndsTheProcessNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        HangGuard g("a pause() that nothing ends", 0.05);
        pause();
      },
      ::testing::ExitedWithCode(124), "hung: a pause\\(\\) that nothing ends did not return within [0-9.]+ s");
}

}  // namespace
}  // namespace ucm::test
