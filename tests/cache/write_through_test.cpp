// The stored word of a slot (layout.h) and the Corrupt state, in one process:
// two ranks over the same planes, and forked ranks that die or leave with a
// write-through in flight.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/ctrl_check.h"
#include "common/test_util.h"
#include "ctrl/pins.h"

namespace ucm::test {
namespace {

class WriteThrough : public ::testing::Test {
 protected:
  void SetUp() override {
    make_cache(params(4, 0, 256, 4), &tc_);
    ASSERT_EQ(tc_.ctrl.join(0), Result::kOk);
    ASSERT_EQ(tc_.ctrl.join(1), Result::kOk);
    CacheOptions o1;
    o1.rank = 1;
    r0_ = std::make_unique<CacheBuffer>(&tc_.ctrl, &tc_.data, CacheOptions{});
    r1_ = std::make_unique<CacheBuffer>(&tc_.ctrl, &tc_.data, o1);
  }

  // Rank r owns k and fills it: a load (mark_ready) or a dump (for_write).
  uint32_t fill(CacheBuffer& cb, const Key& k, bool for_write) {
    GetResult g;
    EXPECT_EQ(cb.get(k, &g), Result::kOk) << last_error();
    EXPECT_EQ(g.kind, GetKind::kOwner);
    EXPECT_EQ(for_write ? cb.mark_ready_for_write(g.slot) : cb.mark_ready(g.slot), Result::kOk) << last_error();
    return g.slot;
  }

  // Rank cb hits k and asks claim_write; keeps its pin.
  WriteClaim claim(CacheBuffer& cb, const Key& k, uint32_t* slot, uint32_t* seen) {
    GetResult g;
    EXPECT_EQ(cb.get(k, &g), Result::kOk) << last_error();
    EXPECT_EQ(g.kind, GetKind::kHit);
    *slot = g.slot;
    WriteClaim wc = WriteClaim::kStored;
    EXPECT_EQ(cb.claim_write(g.slot, &wc, seen), Result::kOk) << last_error();
    return wc;
  }

  StoreState stored(uint32_t slot) const {
    return stored_state(tc_.ctrl.stored(slot).load(), tc_.ctrl.slot(slot).word.load());
  }

  TestCache tc_;
  std::unique_ptr<CacheBuffer> r0_, r1_;
};

TEST_F(WriteThrough, ALoadedSlotIsStoredWithoutTouchingItsStoredWord) {
  const uint32_t s = fill(*r0_, key(1, 0), false);
  r0_->release(s);
  EXPECT_EQ(tc_.ctrl.stored(s).load(), 0u) << "a load's path never writes the stored word";
  uint32_t slot = 0, seen = 0;
  EXPECT_EQ(claim(*r1_, key(1, 0), &slot, &seen), WriteClaim::kStored);
  r1_->release(slot);
}

TEST_F(WriteThrough, APeerWaitsForTheDumpOwnersWriteAndSeesItStored) {
  const uint32_t s = fill(*r0_, key(2, 1), true);
  EXPECT_EQ(stored(s), StoreState::kWriting);
  EXPECT_EQ(stored_writer(tc_.ctrl.stored(s).load()), 0u);
  EXPECT_EQ(tc_.ctrl.accessed(s).load(), 2u) << "bytes the store lacks get one more CLOCK lap";
  uint32_t slot = 0, seen = 0;
  ASSERT_EQ(claim(*r1_, key(2, 1), &slot, &seen), WriteClaim::kBeingWritten);
  ASSERT_EQ(slot, s);
  std::atomic<uint32_t> outcome{0};
  std::atomic<int> rc{-1};
  std::thread waiter([&] {
    uint32_t now = 0;
    rc = static_cast<int>(r1_->wait_store_change(slot, seen, deadline_after_ms(5000), &now));
    outcome = now;
  });
  usleep(20000);
  ASSERT_EQ(r0_->finish_write(s, true), Result::kOk) << last_error();
  waiter.join();
  ASSERT_EQ(rc.load(), static_cast<int>(Result::kOk)) << last_error();
  EXPECT_EQ(static_cast<StoreState>(outcome.load() & kStoredStateMask), StoreState::kStored);
  EXPECT_EQ(tc_.ctrl.accessed(s).load(), 1u);
  WriteClaim again = WriteClaim::kWriter;
  ASSERT_EQ(r1_->claim_write(slot, &again, &seen), Result::kOk);
  EXPECT_EQ(again, WriteClaim::kStored) << "a stored key is not written twice";
  r1_->release(slot);
  r0_->release(s);
  EXPECT_EQ(check_quiescent(tc_.ctrl, &tc_.data, QuiescentOptions{}), "");
}

TEST_F(WriteThrough, AFailedWriteIsReportedToItsWaiterAndTheNextDumperWritesAgain) {
  const uint32_t s = fill(*r0_, key(3, 2), true);
  uint32_t slot = 0, seen = 0;
  ASSERT_EQ(claim(*r1_, key(3, 2), &slot, &seen), WriteClaim::kBeingWritten);
  ASSERT_EQ(r0_->finish_write(s, false), Result::kOk) << last_error();
  uint32_t now = 0;
  ASSERT_EQ(r1_->wait_store_change(slot, seen, deadline_after_ms(1000), &now), Result::kOk);
  EXPECT_EQ(static_cast<StoreState>(now & kStoredStateMask), StoreState::kWriteFailed);
  EXPECT_EQ(stored_writer(now), 0u) << "the failed writer is named";
  EXPECT_EQ(tc_.ctrl.accessed(s).load(), 2u);

  // A new dump of the key (any rank) becomes the writer: one of them.
  WriteClaim wc = WriteClaim::kStored;
  ASSERT_EQ(r1_->claim_write(slot, &wc, &seen), Result::kOk);
  EXPECT_EQ(wc, WriteClaim::kWriter);
  ASSERT_EQ(r0_->claim_write(s, &wc, &seen), Result::kOk);
  EXPECT_EQ(wc, WriteClaim::kBeingWritten) << "one writer per node";
  EXPECT_EQ(stored_writer(seen), 1u);
  EXPECT_EQ(r0_->finish_write(s, true), Result::kBadState) << "only the writer ends its write";
  EXPECT_NE(last_error().find("not a write-through by rank 0"), std::string::npos) << last_error();
  ASSERT_EQ(r1_->finish_write(slot, true), Result::kOk) << last_error();
  EXPECT_EQ(stored(s), StoreState::kStored);
  r1_->release(slot);
  r0_->release(s);
}

TEST_F(WriteThrough, ClaimWriteWantsAReadySlotAndWaitsAreBounded) {
  GetResult g;
  ASSERT_EQ(r0_->get(key(4, 0), &g), Result::kOk);
  WriteClaim wc;
  uint32_t seen = 0;
  EXPECT_EQ(r0_->claim_write(g.slot, &wc, &seen), Result::kBadState);
  EXPECT_NE(last_error().find("is Idle, not Ready"), std::string::npos) << last_error();
  EXPECT_EQ(r0_->claim_write(999, &wc, &seen), Result::kInvalidArg);
  ASSERT_EQ(r0_->mark_ready_for_write(g.slot), Result::kOk);
  uint32_t slot = 0;
  ASSERT_EQ(claim(*r1_, key(4, 0), &slot, &seen), WriteClaim::kBeingWritten);
  uint32_t now = 0;
  const uint64_t start = now_ns();
  EXPECT_EQ(r1_->wait_store_change(slot, seen, deadline_after_ms(30), &now), Result::kTimeout);
  EXPECT_GE(now_ns() - start, 30'000'000ull) << "timed out before its deadline";
  EXPECT_NE(last_error().find("write-through by local rank 0 is still in flight"), std::string::npos)
      << last_error();
  ASSERT_EQ(r0_->finish_write(g.slot, true), Result::kOk);
  r1_->release(slot);
  r0_->release(g.slot);
}

TEST_F(WriteThrough, ReKeyingASlotForgetsItsStoredWord) {
  const uint32_t s = fill(*r0_, key(5, 0), true);
  ASSERT_EQ(r0_->finish_write(s, false), Result::kOk);
  r0_->release(s);
  // The other slots stay held: the failed dump's slot is the only victim
  // (CLOCK's last lap).
  std::vector<uint32_t> held;
  for (uint64_t b = 100; b < 103; ++b) held.push_back(fill(*r0_, key(b, 0), false));
  GetResult g;
  ASSERT_EQ(r0_->get(key(200, 0), &g), Result::kOk) << last_error();
  EXPECT_EQ(g.slot, s);
  EXPECT_TRUE(g.evicted);
  ASSERT_EQ(r0_->mark_ready(g.slot), Result::kOk);
  r0_->release(g.slot);
  EXPECT_EQ(static_cast<StoreState>(tc_.ctrl.stored(s).load() & kStoredStateMask), StoreState::kWriteFailed)
      << "the old word is still there, untouched by the load";
  EXPECT_EQ(stored(s), StoreState::kStored) << "but it speaks for the old residency only";
  uint32_t slot = 0, seen = 0;
  EXPECT_EQ(claim(*r1_, key(200, 0), &slot, &seen), WriteClaim::kStored);
  EXPECT_EQ(slot, s);
  r1_->release(slot);
  for (uint32_t h : held) r0_->release(h);
}

// Slots in hand order: the dump at slot 0, loads at 1..3; the hand at 0.
uint32_t first_victim(bool write_ok) {
  TestCache tc;
  make_cache(params(4, 0, 256, 4), &tc);
  EXPECT_EQ(tc.ctrl.join(0), Result::kOk);
  CacheBuffer cb(&tc.ctrl, &tc.data, CacheOptions{});
  GetResult g;
  EXPECT_EQ(cb.get(key(1, 0), &g), Result::kOk);
  EXPECT_EQ(g.slot, 0u);
  EXPECT_EQ(cb.mark_ready_for_write(g.slot), Result::kOk);
  EXPECT_EQ(cb.finish_write(g.slot, write_ok), Result::kOk);
  cb.release(g.slot);
  for (uint64_t b = 2; b <= 4; ++b) {
    EXPECT_EQ(cb.get(key(b, 0), &g), Result::kOk);
    EXPECT_EQ(cb.mark_ready(g.slot), Result::kOk);
    cb.release(g.slot);
  }
  EXPECT_EQ(cb.get(key(9, 0), &g), Result::kOk);
  EXPECT_TRUE(g.evicted);
  cb.release(g.slot);
  return g.slot;
}

TEST(WriteThroughClock, ASlotTheStoreLacksIsKeptWhileAStoredOneCanGo) {
  EXPECT_EQ(first_victim(true), 0u) << "stored: plain CLOCK, the hand's first slot goes";
  EXPECT_EQ(first_victim(false), 1u) << "its write failed: the next slot goes instead";
}

TEST_F(WriteThrough, ACorruptLoadIsNotTakenOverByLoadsButADumpMayReplaceIt) {
  GetResult o, w;
  ASSERT_EQ(r0_->get(key(6, 3), &o), Result::kOk);
  ASSERT_EQ(r1_->get(key(6, 3), &w), Result::kOk);
  ASSERT_EQ(w.kind, GetKind::kWaiter);
  ASSERT_EQ(r0_->mark_corrupt(o.slot), Result::kOk);
  EXPECT_EQ(tc_.ctrl.accessed(o.slot).load(), 0u) << "CLOCK takes a corrupt copy first";
  EXPECT_FALSE(slot_held(tc_.ctrl, o.slot)) << "the hold became a pin, as for Failed";
  r0_->release(o.slot);
  uint32_t now = 0;
  ASSERT_EQ(r1_->wait_for_change(w.slot, w.word, deadline_after_ms(1000), &now), Result::kOk);
  EXPECT_EQ(word_state(now), State::kCorrupt);
  EXPECT_EQ(word_owner(now), 0u) << "names the rank whose load found it";
  EXPECT_FALSE(r1_->try_take_over(w.slot, now)) << "a load does not retry a corrupt copy";
  r1_->release(w.slot);
  EXPECT_FALSE(r0_->exists(key(6, 3)));

  // A fresh get() meets the verdict: a waiter on the Corrupt word, no owner.
  GetResult again;
  ASSERT_EQ(r1_->get(key(6, 3), &again), Result::kOk);
  EXPECT_EQ(again.kind, GetKind::kWaiter);
  EXPECT_EQ(word_state(again.word), State::kCorrupt);
  QuiescentStats st;
  EXPECT_EQ(check_quiescent(tc_.ctrl, &tc_.data, QuiescentOptions{true, false, nullptr}, &st), "");
  EXPECT_EQ(st.failed, 1u);

  // A dump replaces it: the dumper owns it, fills it and is its writer.
  ASSERT_TRUE(r1_->try_take_over(again.slot, again.word, true));
  ASSERT_EQ(r1_->mark_ready_for_write(again.slot), Result::kOk);
  EXPECT_EQ(stored(again.slot), StoreState::kWriting);
  ASSERT_EQ(r1_->finish_write(again.slot, true), Result::kOk);
  r1_->release(again.slot);
  EXPECT_TRUE(r0_->exists(key(6, 3)));
  EXPECT_EQ(check_quiescent(tc_.ctrl, &tc_.data, QuiescentOptions{}), "");
}

TEST_F(WriteThrough, AnUnpinnedCorruptSlotIsTheFirstVictim) {
  for (uint64_t b = 1; b <= 3; ++b) r0_->release(fill(*r0_, key(b, 0), false));
  GetResult o;
  ASSERT_EQ(r0_->get(key(7, 0), &o), Result::kOk);
  ASSERT_EQ(o.slot, 3u);
  ASSERT_EQ(r0_->mark_corrupt(o.slot), Result::kOk);
  r0_->release(o.slot);
  GetResult g;
  ASSERT_EQ(r0_->get(key(8, 0), &g), Result::kOk);
  EXPECT_EQ(g.slot, o.slot) << "the hand passes three loaded slots and takes the corrupt one";
  r0_->release(g.slot);
}

// Rank 1 in a child: dumps k (owner, Ready, Writing) and then dies or leaves
// without ending the write.
void dump_and_vanish(TestCache& tc, const Key& k, bool leave) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (tc.ctrl.join(1) != Result::kOk) _exit(2);
    CacheOptions o1;
    o1.rank = 1;
    CacheBuffer r1(&tc.ctrl, &tc.data, o1);
    GetResult g;
    if (r1.get(k, &g) != Result::kOk || g.kind != GetKind::kOwner) _exit(3);
    if (r1.mark_ready_for_write(g.slot) != Result::kOk) _exit(4);
    r1.add_pin(g.slot);  // the write's own pin
    r1.release(g.slot);
    if (leave) tc.ctrl.leave(1);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(WriteThroughRecovery, ADeadWritersWriteBecomesNotStoredAndTheNextDumperWrites) {
  for (const bool leave : {false, true}) {
    SCOPED_TRACE(leave ? "rank 1 left" : "rank 1 died");
    TestCache tc;
    make_cache(params(4), &tc);
    ASSERT_EQ(tc.ctrl.join(0), Result::kOk);
    CacheBuffer r0(&tc.ctrl, &tc.data, CacheOptions{});
    const Key k = key(900, 1);
    dump_and_vanish(tc, k, leave);
    const uint32_t slot = resident_slot(tc.ctrl, k);
    ASSERT_NE(slot, kNoSlot);
    if (!leave) {
      EXPECT_EQ(static_cast<StoreState>(tc.ctrl.stored(slot).load() & kStoredStateMask), StoreState::kWriting);
      ASSERT_EQ(r0.reap(), Result::kOk);
    }
    const uint32_t sw = tc.ctrl.stored(slot).load();
    EXPECT_EQ(static_cast<StoreState>(sw & kStoredStateMask), StoreState::kNotStored) << std::hex << sw;
    EXPECT_EQ(pin_count(tc.ctrl, slot), 0u) << "the write's pin went with its writer";
    GetResult g;
    ASSERT_EQ(r0.get(k, &g), Result::kOk);
    ASSERT_EQ(g.kind, GetKind::kHit) << "its bytes are whole: still served";
    WriteClaim wc = WriteClaim::kStored;
    uint32_t seen = 0;
    ASSERT_EQ(r0.claim_write(g.slot, &wc, &seen), Result::kOk);
    EXPECT_EQ(wc, WriteClaim::kWriter) << "nobody is writing it: this dump does";
    ASSERT_EQ(r0.finish_write(g.slot, true), Result::kOk);
    r0.release(g.slot);
    EXPECT_EQ(check_quiescent(tc.ctrl, &tc.data, QuiescentOptions{}), "");
  }
}

}  // namespace
}  // namespace ucm::test
