// The per-rank tally of references (CacheBuffer::references_held) and what
// leaving costs with it: a rank that holds nothing does not walk the slots,
// one that holds pins still has them released.
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "common/test_util.h"
#include "ctrl/pins.h"

namespace ucm::test {
namespace {

class RefTally : public ::testing::Test {
 protected:
  void SetUp() override {
    make_cache(params(64, 0, 64, 4, 2), &tc_);
    ASSERT_EQ(tc_.ctrl.join(0), Result::kOk);
    ASSERT_EQ(tc_.ctrl.join(1), Result::kOk);
    CacheOptions o1;
    o1.rank = 1;
    r0_ = std::make_unique<CacheBuffer>(&tc_.ctrl, &tc_.data, CacheOptions{});
    r1_ = std::make_unique<CacheBuffer>(&tc_.ctrl, &tc_.data, o1);
  }
  // Every reference rank r holds on any slot, read from the planes.
  uint64_t held_in_planes(uint32_t r) const {
    uint64_t n = 0;
    for (uint32_t i = 0; i < tc_.ctrl.total_slots(); ++i) {
      n += tc_.ctrl.pin(r, i).load();
      const uint32_t w = tc_.ctrl.slot(i).word.load();
      if ((w & kWordHold) && word_owner(w) == r) ++n;
    }
    return n;
  }
  TestCache tc_;
  std::unique_ptr<CacheBuffer> r0_, r1_;
};

TEST_F(RefTally, FollowsOwnerHitWaiterTakeoverAndExtraPins) {
  EXPECT_EQ(r0_->references_held(), 0);
  GetResult own;
  ASSERT_EQ(r0_->get(key(1, 0), &own), Result::kOk);
  ASSERT_EQ(own.kind, GetKind::kOwner);
  EXPECT_EQ(r0_->references_held(), 1);
  r0_->add_pin(own.slot);  // an I/O's own pin
  EXPECT_EQ(r0_->references_held(), 2);
  EXPECT_EQ(held_in_planes(0), 2u);

  GetResult wait;
  ASSERT_EQ(r1_->get(key(1, 0), &wait), Result::kOk);
  ASSERT_EQ(wait.kind, GetKind::kWaiter);
  EXPECT_EQ(r1_->references_held(), 1);

  // The owner fails; the waiter takes over with the pin it already has.
  ASSERT_EQ(r0_->mark_failed(own.slot), Result::kOk);
  EXPECT_EQ(r0_->references_held(), 2) << "the hold became a pin: still two";
  r0_->release(own.slot);
  r0_->release(own.slot);
  EXPECT_EQ(r0_->references_held(), 0);
  EXPECT_EQ(held_in_planes(0), 0u);
  const uint32_t w = tc_.ctrl.slot(wait.slot).word.load();
  ASSERT_TRUE(r1_->try_take_over(wait.slot, w));
  EXPECT_EQ(r1_->references_held(), 1);
  ASSERT_EQ(r1_->mark_ready(wait.slot), Result::kOk);
  r1_->release(wait.slot);
  EXPECT_EQ(r1_->references_held(), 0);

  GetResult hit;
  ASSERT_EQ(r0_->get(key(1, 0), &hit), Result::kOk);
  ASSERT_EQ(hit.kind, GetKind::kHit);
  EXPECT_EQ(r0_->references_held(), 1);
  r0_->release(hit.slot);
  EXPECT_EQ(r0_->references_held(), 0);
  // A release without a reference (a caller's error) drops nothing.
  r0_->release(hit.slot);
  EXPECT_EQ(r0_->references_held(), 0);
  EXPECT_EQ(held_in_planes(0), 0u);
  EXPECT_EQ(held_in_planes(1), 0u);
}

TEST_F(RefTally, CountsAWriteThroughUntilItsEnd) {
  GetResult g;
  ASSERT_EQ(r0_->get(key(2, 0), &g), Result::kOk);
  ASSERT_EQ(r0_->mark_ready_for_write(g.slot), Result::kOk);
  EXPECT_EQ(r0_->references_held(), 2) << "the hold and the write-through";
  r0_->release(g.slot);
  EXPECT_EQ(r0_->references_held(), 1) << "the write is still this rank's";
  ASSERT_EQ(r0_->finish_write(g.slot, true), Result::kOk);
  EXPECT_EQ(r0_->references_held(), 0);

  // A write-through claimed by a hit.
  ASSERT_EQ(r1_->get(key(3, 0), &g), Result::kOk);
  ASSERT_EQ(r1_->mark_ready(g.slot), Result::kOk);
  r1_->release(g.slot);
  ASSERT_EQ(r0_->get(key(3, 0), &g), Result::kOk);
  ASSERT_EQ(g.kind, GetKind::kHit);
  // A loaded slot is Stored: make it unstored as a failed dump would leave it.
  tc_.ctrl.stored(g.slot).store(
      stored_make(StoreState::kNotStored, kNoOwner, word_version(tc_.ctrl.slot(g.slot).word.load())));
  WriteClaim wc;
  uint32_t seen = 0;
  ASSERT_EQ(r0_->claim_write(g.slot, &wc, &seen), Result::kOk) << last_error();
  ASSERT_EQ(wc, WriteClaim::kWriter);
  EXPECT_EQ(r0_->references_held(), 2);
  ASSERT_EQ(r0_->finish_write(g.slot, false), Result::kOk);
  r0_->release(g.slot);
  EXPECT_EQ(r0_->references_held(), 0);
}

TEST_F(RefTally, ReferencesTakenAndDroppedOnDifferentThreadsSumExactly) {
  // The dispatcher gets, the copier releases: each thread's cell alone is
  // nonzero, their sum is not.
  std::vector<uint32_t> slots;
  std::thread taker([&] {
    for (uint64_t b = 10; b < 40; ++b) {
      GetResult g;
      ASSERT_EQ(r0_->get(key(b, 0), &g), Result::kOk);
      ASSERT_EQ(r0_->mark_ready(g.slot), Result::kOk);
      slots.push_back(g.slot);
    }
  });
  taker.join();
  EXPECT_EQ(r0_->references_held(), 30);
  std::thread dropper([&] {
    for (uint32_t s : slots) r0_->release(s);
  });
  dropper.join();
  EXPECT_EQ(r0_->references_held(), 0);
  EXPECT_EQ(held_in_planes(0), 0u);
}

TEST_F(RefTally, ARankThatHoldsNothingLeavesWithoutAWalk) {
  for (uint64_t b = 1; b <= 20; ++b) {
    GetResult g;
    ASSERT_EQ(r0_->get(key(b, 0), &g), Result::kOk);
    ASSERT_EQ(r0_->mark_ready(g.slot), Result::kOk);
    r0_->release(g.slot);
  }
  ASSERT_EQ(r0_->references_held(), 0);
  EXPECT_EQ(tc_.ctrl.leave(0, r0_->references_held() != 0), 0u) << "no slot walked";
  EXPECT_FALSE(tc_.ctrl.rank_alive(0)) << "the rank's record is free";
}

TEST_F(RefTally, ARankThatHoldsPinsStillHasThemReleasedWhenItLeaves) {
  std::vector<uint32_t> held;
  for (uint64_t b = 1; b <= 5; ++b) {
    GetResult g;
    ASSERT_EQ(r0_->get(key(b, 0), &g), Result::kOk);
    ASSERT_EQ(r0_->mark_ready(g.slot), Result::kOk);
    r0_->add_pin(g.slot);
    r0_->release(g.slot);  // the hold goes, the extra pin stays
    held.push_back(g.slot);
  }
  ASSERT_EQ(r0_->references_held(), 5);
  ASSERT_EQ(held_in_planes(0), 5u);
  EXPECT_EQ(tc_.ctrl.leave(0, r0_->references_held() != 0), tc_.ctrl.total_slots()) << "every slot walked";
  EXPECT_EQ(held_in_planes(0), 0u) << "its pins are released";
  for (uint32_t s : held) EXPECT_FALSE(slot_pinned(tc_.ctrl, s)) << "slot " << s;
}

}  // namespace
}  // namespace ucm::test
