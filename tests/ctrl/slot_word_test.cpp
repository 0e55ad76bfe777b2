// The slot word's transition table (ctrl/slot_word.h): each transition makes
// the word its row says, and in a build with debug asserts an illegal one
// aborts naming the transition and the word's old and new values.
#include <gtest/gtest.h>

#include "ctrl/slot_word.h"

namespace ucm::test {
namespace {

// A word some transitions into the slot's life, so versions are not all 0.
uint32_t loading(uint32_t owner, bool hold) { return word_install(word_next(word_initial(), State::kReady, 2), State::kIdle, owner, hold); }

TEST(SlotWord, EveryTransitionMakesTheWordItsRowSays) {
  const uint32_t w0 = word_initial();
  EXPECT_TRUE(SlotView(w0).is_unowned()) << "T0: Idle, owned by nobody";
  EXPECT_EQ(word_version(w0), 0u);

  const uint32_t w1 = loading(3, true);  // T1: a miss, owner 3 with its hold
  EXPECT_TRUE(SlotView(w1).is_loading());
  EXPECT_EQ(SlotView(w1).owner(), 3u);
  EXPECT_TRUE(word_held(w1));
  EXPECT_EQ(word_version(w1), 2u) << "every change of state or owner bumps the version";

  const uint32_t ready = word_finish(w1, State::kReady, 3);  // T2 keeps the hold
  EXPECT_TRUE(SlotView(ready).is_ready());
  EXPECT_TRUE(word_held(ready));
  EXPECT_EQ(word_version(ready), 3u);
  const uint32_t failed = word_finish(w1, State::kFailed, 3);  // T3 drops it (the caller made it a pin)
  EXPECT_TRUE(SlotView(failed).is_failed());
  EXPECT_FALSE(word_held(failed));
  EXPECT_FALSE(word_held(word_finish(w1, State::kCorrupt, 3))) << "T4 as T3";

  const uint32_t taken = word_take_over(failed, 5, false);  // T5
  EXPECT_TRUE(SlotView(taken).is_loading());
  EXPECT_EQ(SlotView(taken).owner(), 5u);
  EXPECT_FALSE(word_held(taken)) << "a taker holds a pin, not the hold";
  EXPECT_EQ(SlotView(word_take_over(w0, 5, false)).owner(), 5u) << "T5 on an unowned Idle slot (prealloc)";

  const uint32_t dropped = word_drop_hold(word_with_waiters(ready));  // T9 then T6
  EXPECT_TRUE(SlotView(dropped).is_ready());
  EXPECT_FALSE(word_held(dropped));
  EXPECT_FALSE(word_has_waiters(dropped)) << "every CAS clears the waiters bit; its maker wakes the sleepers";
  EXPECT_EQ(word_version(dropped), word_version(ready)) << "T6 changes neither state nor owner";
  EXPECT_TRUE(SlotView(dropped).changed_from(ready)) << "but a sleeper on the held word sees a change";
  EXPECT_FALSE(SlotView(word_with_waiters(ready)).changed_from(ready)) << "the waiters bit alone is no change";

  const uint32_t abandoned = word_abandon(w1);  // T7
  EXPECT_TRUE(SlotView(abandoned).is_failed());
  EXPECT_EQ(SlotView(abandoned).owner(), kNoOwner) << "a waiter takes it over";
  const uint32_t keyless = word_abandon_keyless(w1, 3);  // T8
  EXPECT_TRUE(SlotView(keyless).is_failed());
  EXPECT_EQ(SlotView(keyless).owner(), 3u);
  EXPECT_FALSE(word_held(keyless));

  EXPECT_TRUE(SlotView(word_reset(w1)).is_unowned()) << "T10 from any word, a half-made T1 included";
  EXPECT_FALSE(word_held(word_reset(w1)));
}

TEST(SlotWordDeathTest, AnIllegalTransitionTripsTheAssert) {
  if (!kDebugAsserts) GTEST_SKIP() << "built without debug asserts (-Ddebug_asserts=disabled, or a release build)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const uint32_t ready = word_finish(loading(1, true), State::kReady, 1);
  // Finishing a load twice: the old word is Ready, not Idle.
  EXPECT_DEATH((void)word_finish(ready, State::kReady, 1),
               "T2 finish Ready: 0x[0-9a-f]{8} \\(Ready, owner 1, hold\\) -> 0x[0-9a-f]{8} \\(Ready, owner 1, hold\\)");
  // Finishing another rank's load.
  EXPECT_DEATH((void)word_finish(loading(1, true), State::kFailed, 2), "T3 finish Failed: .*\\(Idle, owner 1, hold\\)");
  // Taking over a load in flight.
  EXPECT_DEATH((void)word_take_over(loading(1, false), 2, false), "T5 take over: .*\\(Idle, owner 1\\)");
  // Taking over a Corrupt slot without asking to replace it.
  EXPECT_DEATH((void)word_take_over(word_finish(loading(1, false), State::kCorrupt, 1), 2, false), "T5 take over");
  // Dropping a hold that is not there.
  EXPECT_DEATH((void)word_drop_hold(word_drop_hold(ready)), "T6 drop hold: .*\\(Ready, owner 1\\)");
  // Re-keying a held slot: a claim never sees a hold.
  EXPECT_DEATH((void)word_install(ready, State::kIdle, 2, true), "T1 install");
  // Abandoning a slot nobody loads.
  EXPECT_DEATH((void)word_abandon(word_initial()), "T7 abandon");
}

}  // namespace
}  // namespace ucm::test
