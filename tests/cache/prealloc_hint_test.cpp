// Prealloc never trades a still-unused prealloc for its own (issue 15 goal 1,
// ctrl/protect.h "Hints"). With 4 ranks and a pipeline window the node's
// loads in flight held most of the 64-slot reserved pool, and each prealloc
// pass for the next layer took its victims from the only slots left: the
// hints it had just made (2,000-2,600 made, 955 used), so the next task's
// shards went to the regular pool all the same. Slot by slot here, on the
// real shared planes, never timed.
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "ctrl/pins.h"
#include "ctrl/protect.h"

namespace ucm::test {
namespace {

constexpr uint32_t kRegular = 2, kReserved = 4;

struct Hints {
  TestCache tc;
  std::unique_ptr<CacheBuffer> cb;

  void open(uint32_t grace_ms) {
    make_cache(params(kRegular, kReserved, 64, 8, 1), &tc);
    tc.ctrl.set_protect_grace_ms(grace_ms);
    ASSERT_EQ(tc.ctrl.join(0), Result::kOk);
    cb = std::make_unique<CacheBuffer>(&tc.ctrl, &tc.data, CacheOptions{});
    // The regular pool full: prealloc goes to the reserved pool.
    for (uint64_t b = 0; b < kRegular; ++b) {
      GetResult g;
      ASSERT_EQ(cb->get(key(100 + b, 0), &g), Result::kOk) << last_error();
      ASSERT_EQ(cb->mark_ready(g.slot), Result::kOk) << last_error();
      cb->release(g.slot);
    }
  }
  PreallocOutcome prealloc(const Key& k) {
    PreallocOutcome o = PreallocOutcome::kBusy;
    EXPECT_EQ(cb->prealloc(k, &o), Result::kOk) << last_error();
    return o;
  }
  PreallocOutcome prealloc(const Key& k, bool* in_flight) {
    PreallocOutcome o = PreallocOutcome::kBusy;
    EXPECT_EQ(cb->prealloc(k, &o, in_flight), Result::kOk) << last_error();
    return o;
  }
  bool present(const Key& k) const { return resident_slot(tc.ctrl, k) != kNoSlot; }
};

TEST(PreallocHint, APassLargerThanTheFreePoolKeepsTheHintsItMadeAndStops) {
  Hints h;
  ASSERT_NO_FATAL_FAILURE(h.open(1000));
  for (uint64_t b = 0; b < kReserved; ++b) EXPECT_EQ(h.prealloc(key(b, 1)), PreallocOutcome::kPlacedReserved) << b;
  for (uint64_t b = kReserved; b < kReserved + 2; ++b) {
    EXPECT_EQ(h.prealloc(key(b, 1)), PreallocOutcome::kNoSpace) << "block " << b;
    EXPECT_FALSE(h.present(key(b, 1)));
  }
  for (uint64_t b = 0; b < kReserved; ++b) EXPECT_TRUE(h.present(key(b, 1))) << "block " << b << " kept its hint";
  EXPECT_EQ(h.cb->counters().prealloc_made.load(), uint64_t{kReserved});
}

TEST(PreallocHint, APoolOfUnusedHintsIsNotInFlight) {
  // Nothing there frees on its own: the queue's pass stops at once.
  Hints h;
  ASSERT_NO_FATAL_FAILURE(h.open(1000));
  for (uint64_t b = 0; b < kReserved; ++b) ASSERT_EQ(h.prealloc(key(b, 1)), PreallocOutcome::kPlacedReserved);
  bool in_flight = true;
  EXPECT_EQ(h.prealloc(key(9, 1), &in_flight), PreallocOutcome::kNoSpace);
  EXPECT_FALSE(in_flight);
}

TEST(PreallocHint, AUsedHintIsAnOrdinaryResidencyAgain) {
  Hints h;
  ASSERT_NO_FATAL_FAILURE(h.open(1000));
  for (uint64_t b = 0; b < kReserved; ++b) ASSERT_EQ(h.prealloc(key(b, 1)), PreallocOutcome::kPlacedReserved);
  GetResult g;
  ASSERT_EQ(h.cb->get(key(0, 1), &g), Result::kOk) << last_error();
  ASSERT_TRUE(g.took_prealloc);
  ASSERT_EQ(h.cb->mark_ready(g.slot), Result::kOk) << last_error();
  h.cb->release(g.slot);
  // No queue here, so no copier the slot waits for: the next prealloc takes it.
  EXPECT_EQ(h.prealloc(key(9, 1)), PreallocOutcome::kPlacedReserved);
  EXPECT_EQ(resident_slot(h.tc.ctrl, key(9, 1)), g.slot);
  EXPECT_FALSE(h.present(key(0, 1)));
  for (uint64_t b = 1; b < kReserved; ++b) EXPECT_TRUE(h.present(key(b, 1))) << "block " << b;
}

TEST(PreallocHint, AHintOlderThanTheGraceMayGo) {
  // A rank that never asks for its hint does not hold the slot longer than
  // the grace. The stamp is set back rather than waited for.
  Hints h;
  ASSERT_NO_FATAL_FAILURE(h.open(1000));
  for (uint64_t b = 0; b < kReserved; ++b) ASSERT_EQ(h.prealloc(key(b, 1)), PreallocOutcome::kPlacedReserved);
  const uint32_t old = resident_slot(h.tc.ctrl, key(2, 1));
  const uint64_t stale = uint64_t{protect_now_ms() - 1000} << kGuardTimeShift;
  h.tc.ctrl.guard(old).store(stale | kGuardHinted);
  EXPECT_EQ(h.prealloc(key(9, 1)), PreallocOutcome::kPlacedReserved);
  EXPECT_EQ(resident_slot(h.tc.ctrl, key(9, 1)), old);
  EXPECT_FALSE(h.present(key(2, 1)));
}

TEST(PreallocHint, WithProtectionOffAHintIsAVictimAsBefore) {
  Hints h;
  ASSERT_NO_FATAL_FAILURE(h.open(0));
  for (uint64_t b = 0; b < kReserved + 2; ++b) EXPECT_EQ(h.prealloc(key(b, 1)), PreallocOutcome::kPlacedReserved) << b;
  EXPECT_EQ(h.cb->counters().prealloc_made.load(), uint64_t{kReserved + 2});
}

TEST(PreallocHint, APoolHeldByLoadsInFlightSaysSo) {
  // The loads that took the hints over hold the pool: NoSpace, but it frees
  // on its own (the queue's pass waits for it, design.md 9.1 step 6).
  Hints h;
  ASSERT_NO_FATAL_FAILURE(h.open(1000));
  std::vector<uint32_t> held;
  for (uint64_t b = 0; b < kReserved; ++b) {
    ASSERT_EQ(h.prealloc(key(b, 1)), PreallocOutcome::kPlacedReserved);
    GetResult g;
    ASSERT_EQ(h.cb->get(key(b, 1), &g), Result::kOk) << last_error();
    ASSERT_TRUE(g.took_prealloc);
    held.push_back(g.slot);
  }
  bool in_flight = false;
  EXPECT_EQ(h.prealloc(key(9, 1), &in_flight), PreallocOutcome::kNoSpace);
  EXPECT_TRUE(in_flight);
  for (uint32_t s : held) {
    ASSERT_EQ(h.cb->mark_ready(s), Result::kOk) << last_error();
    h.cb->release(s);
  }
  EXPECT_EQ(h.prealloc(key(9, 1), &in_flight), PreallocOutcome::kPlacedReserved);
  EXPECT_FALSE(in_flight);
}

}  // namespace
}  // namespace ucm::test
