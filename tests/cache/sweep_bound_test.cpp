// CLOCK's work per lock hold is bounded (clock.h): counted in slot positions
// examined (the sweep's own per-thread tally), never timed.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "common/test_util.h"
#include "ctrl/clock.h"
#include "ctrl/pins.h"

namespace ucm::test {
namespace {

constexpr uint32_t kSlots = 8192;

// Loads k as owner; the slot it got.
uint32_t load(CacheBuffer& cb, const Key& k) {
  GetResult g;
  EXPECT_EQ(cb.get(k, &g), Result::kOk) << last_error();
  EXPECT_EQ(g.kind, GetKind::kOwner);
  EXPECT_EQ(cb.mark_ready(g.slot), Result::kOk) << last_error();
  cb.release(g.slot);
  return g.slot;
}

class SweepBound : public ::testing::Test {
 protected:
  void SetUp() override {
    make_cache(params(kSlots, 0, 64, 16, 1), &tc_);
    ASSERT_EQ(tc_.ctrl.join(0), Result::kOk) << last_error();
    cb_ = std::make_unique<CacheBuffer>(&tc_.ctrl, &tc_.data, CacheOptions{});
    // Every slot loaded once: every accessed bit is set, the state in which
    // the first miss used to clear a whole lap under its bucket lock.
    for (uint32_t i = 0; i < kSlots; ++i) load(*cb_, key(1000 + i, 0));
    for (uint32_t i = 0; i < kSlots; ++i) ASSERT_EQ(tc_.ctrl.accessed(i).load(), 1u) << "slot " << i;
    reset_sweep_stats();
  }
  TestCache tc_;
  std::unique_ptr<CacheBuffer> cb_;
};

TEST_F(SweepBound, FirstMissAfterAFillExaminesAtMostTheSecondChanceBudgetPlusOne) {
  const Key k = key(1, 0);
  const uint32_t slot = load(*cb_, k);
  EXPECT_NE(slot, kNoSlot);
  const SweepStats s = sweep_stats();
  EXPECT_EQ(s.calls, 1u) << "one lock hold";
  // 64 bits cleared, then the raw cursor's next slot is the victim.
  EXPECT_EQ(s.positions, kSweepSecondChance + 1);
  EXPECT_EQ(cb_->counters().evictions.load(), 1u);
  // Only the second-chance phase's positions lost their bit.
  uint32_t cleared = 0;
  for (uint32_t i = 0; i < kSlots; ++i) cleared += tc_.ctrl.accessed(i).load() == 0;
  EXPECT_EQ(cleared, kSweepSecondChance);
}

TEST_F(SweepBound, EveryMissOfALapStaysWithinOneCallsBudget) {
  // A lap's worth of misses: none examines more than one call's budget, and
  // each is one lock hold.
  for (uint32_t i = 0; i < kSlots; ++i) load(*cb_, key(100000 + i, 0));
  const SweepStats s = sweep_stats();
  EXPECT_EQ(s.calls, uint64_t{kSlots});
  EXPECT_LE(s.max_per_call, uint64_t{kSweepSecondChance} + 1);
  EXPECT_EQ(cb_->counters().evictions.load(), uint64_t{kSlots});
}

TEST_F(SweepBound, EveryMissOfTwoLapsWalksTwoChainsUnderLocksAndNoMore) {
  // Besides the sweep, a miss walks chains under a lock: its own bucket's
  // (the key is not there) and its victim's (to unlink it). Both cost what
  // the chain holds, never what the cache holds.
  uint32_t longest = 0;
  for (uint32_t b = 0; b < tc_.ctrl.bucket_count(); ++b) {
    uint32_t n = 0;
    for (uint32_t i = tc_.ctrl.bucket(b).head.load(); i != kNoSlot; i = tc_.ctrl.slot(i).next.load()) ++n;
    longest = std::max(longest, n);
  }
  ASSERT_LT(longest, 32u) << "a bucket per slot: chains are short";
  for (uint32_t i = 0; i < 2 * kSlots; ++i) {
    reset_chain_stats();
    reset_sweep_stats();
    load(*cb_, key(200000 + i, 0));
    const ChainStats c = chain_stats();
    ASSERT_EQ(c.locked_walks, 2u) << "miss " << i << ": its bucket, then its victim's";
    ASSERT_LE(c.links, 64u) << "miss " << i << ": two short chains";
    ASSERT_EQ(sweep_stats().calls, 1u) << "miss " << i << ": one lock hold";
  }
}

TEST_F(SweepBound, AllButOneSlotPinnedFindsTheFreeOneInBoundedHolds) {
  std::vector<uint32_t> pinned;
  const uint32_t free_slot = kSlots / 2 + 17;
  for (uint32_t i = 0; i < kSlots; ++i) {
    if (i == free_slot) continue;
    GetResult g;
    ASSERT_EQ(cb_->get(key(1000 + i, 0), &g), Result::kOk) << last_error();
    ASSERT_EQ(g.kind, GetKind::kHit);
    pinned.push_back(g.slot);
  }
  reset_sweep_stats();
  const Key k = key(7, 0);
  EXPECT_EQ(load(*cb_, k), free_slot) << "the one unpinned slot is the victim";
  const SweepStats s = sweep_stats();
  EXPECT_LE(s.max_per_call, uint64_t{kSweepPerCall}) << "no hold examines more than its budget";
  EXPECT_GT(s.calls, 1u) << "the bucket lock was let go between budgets";
  EXPECT_LE(s.positions, uint64_t{kSweepSecondChance} + kSlots) << "within the raw-cursor lap";
  for (uint32_t p : pinned) cb_->release(p);
}

TEST_F(SweepBound, EverySlotPinnedIsNoSpaceAfterEveryPhaseInBoundedHolds) {
  std::vector<uint32_t> pinned;
  for (uint32_t i = 0; i < kSlots; ++i) {
    GetResult g;
    ASSERT_EQ(cb_->get(key(1000 + i, 0), &g), Result::kOk) << last_error();
    pinned.push_back(g.slot);
  }
  reset_sweep_stats();
  GetResult g;
  EXPECT_EQ(cb_->get(key(7, 0), &g), Result::kNoSpace);
  EXPECT_EQ(cb_->counters().no_space.load(), 1u);
  const SweepStats s = sweep_stats();
  // Every phase ran to its end (so NoSpace means what it always meant), and
  // no single hold examined more than its budget.
  const uint64_t all = uint64_t{kSweepSecondChance} + 2ull * kSlots;
  EXPECT_EQ(s.positions, all);
  EXPECT_EQ(s.calls, (all + kSweepPerCall - 1) / kSweepPerCall);
  EXPECT_LE(s.max_per_call, uint64_t{kSweepPerCall});
  for (uint32_t p : pinned) cb_->release(p);
  // And the cache works on once the pins go.
  EXPECT_NE(load(*cb_, key(7, 0)), kNoSlot);
}

TEST(SweepBoundPrealloc, AReservedPoolSweepIsOneCallsBudget) {
  // Prealloc never waits: its reserved sweep is one call, so a reserved pool
  // whose slots are all held is NoSpace after at most kSweepPerCall positions.
  TestCache tc;
  const uint32_t reserved = 1024;
  make_cache(params(4, reserved, 64, 16, 1), &tc);
  ASSERT_EQ(tc.ctrl.join(0), Result::kOk);
  CacheBuffer cb(&tc.ctrl, &tc.data, CacheOptions{});
  for (uint32_t i = 0; i < 4; ++i) load(cb, key(50 + i, 0));
  std::vector<uint32_t> held;
  for (uint32_t i = 0; i < reserved; ++i) {
    PreallocOutcome o;
    ASSERT_EQ(cb.prealloc(key(5000 + i, 0), &o), Result::kOk) << last_error();
    ASSERT_EQ(o, PreallocOutcome::kPlacedReserved);
    GetResult g;
    ASSERT_EQ(cb.get(key(5000 + i, 0), &g), Result::kOk) << last_error();
    ASSERT_EQ(g.kind, GetKind::kOwner);
    held.push_back(g.slot);  // owner's hold: the slot stays taken
  }
  reset_sweep_stats();
  PreallocOutcome o;
  ASSERT_EQ(cb.prealloc(key(99, 0), &o), Result::kOk) << last_error();
  EXPECT_EQ(o, PreallocOutcome::kNoSpace);
  EXPECT_EQ(sweep_stats().calls, 1u);
  EXPECT_LE(sweep_stats().max_per_call, uint64_t{kSweepPerCall});
  for (uint32_t s : held) {
    EXPECT_EQ(cb.mark_failed(s), Result::kOk) << last_error();
    cb.release(s);
  }
}

}  // namespace
}  // namespace ucm::test
