// Bucket chains (ctrl/chain.h): the locked walks' work is counted per thread
// (chain_stats), in links visited, never timed.
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "ctrl/chain.h"
#include "ctrl/pins.h"

namespace ucm::test {
namespace {

class ChainWalk : public ::testing::Test {
 protected:
  void SetUp() override {
    make_cache(params(64, 0, 64, 16, 1), &tc_);
    ASSERT_EQ(tc_.ctrl.join(0), Result::kOk) << last_error();
    // Slots 3, 9, 12 on bucket kB, pushed in that order: the chain reads
    // 12 -> 9 -> 3.
    for (uint32_t s : {3u, 9u, 12u}) {
      ASSERT_TRUE(claim_slot(tc_.ctrl, 1, s));
      install_claimed_slot(tc_.ctrl, s, kB, key(100 + s, 0), State::kIdle, 0, false, false);
    }
    reset_chain_stats();
  }
  void TearDown() override { tc_.ctrl.leave(0); }
  static constexpr uint32_t kB = 5;
  TestCache tc_;
};

TEST_F(ChainWalk, AFindVisitsTheLinksUpToItsKeyAndNoMore) {
  uint32_t slot = kNoSlot;
  ASSERT_EQ(chain_find_locked(tc_.ctrl, kB, key(109, 0), &slot), Result::kOk) << last_error();
  EXPECT_EQ(slot, 9u);
  EXPECT_EQ(chain_stats().locked_walks, 1u);
  EXPECT_EQ(chain_stats().links, 2u) << "12, then 9";
}

TEST_F(ChainWalk, AMissVisitsTheWholeChainOnce) {
  uint32_t slot = kNoSlot;
  ASSERT_EQ(chain_find_locked(tc_.ctrl, kB, key(7, 0), &slot), Result::kOk) << last_error();
  EXPECT_EQ(slot, kNoSlot);
  EXPECT_EQ(chain_stats().links, 3u);
  bool found = true;
  ASSERT_EQ(chain_contains(tc_.ctrl, kB, 40, &found), Result::kOk) << last_error();
  EXPECT_FALSE(found);
  EXPECT_EQ(chain_stats().locked_walks, 2u);
  EXPECT_EQ(chain_stats().links, 6u);
}

TEST_F(ChainWalk, AnUnlinkVisitsUpToItsSlotAndLeavesTheRestLinked) {
  bool found = false;
  ASSERT_EQ(chain_unlink(tc_.ctrl, kB, 9, &found), Result::kOk) << last_error();
  EXPECT_TRUE(found);
  EXPECT_EQ(chain_stats().links, 2u);
  uint32_t slot = kNoSlot;
  ASSERT_EQ(chain_find_locked(tc_.ctrl, kB, key(103, 0), &slot), Result::kOk) << last_error();
  EXPECT_EQ(slot, 3u);
  EXPECT_EQ(chain_stats().links, 4u) << "12, then 3: 9 is gone";
}

TEST_F(ChainWalk, ACycleEndsTheWalkAfterTotalSlotsLinksAsCorrupt) {
  tc_.ctrl.slot(3).next.store(12, std::memory_order_relaxed);  // 12 -> 9 -> 3 -> 12 ...
  uint32_t slot = kNoSlot;
  EXPECT_EQ(chain_find_locked(tc_.ctrl, kB, key(7, 0), &slot), Result::kCorrupt);
  EXPECT_EQ(chain_stats().links, uint64_t{tc_.ctrl.total_slots()}) << "bounded by the slot count, then kCorrupt";
  tc_.ctrl.slot(3).next.store(kNoSlot, std::memory_order_relaxed);
}

}  // namespace
}  // namespace ucm::test
