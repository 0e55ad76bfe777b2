// Eviction protection (ctrl/protect.h) in one process: two ranks over the
// same planes. A loaded shard stays until every copier rank has taken it, or
// its grace passes; dumps never arm it; a rank out of the copier mask holds
// nothing; a grace of 0 is no protection at all.
#include <unistd.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_backend.h"
#include "common/test_util.h"
#include "ctrl/protect.h"
#include "device/host_engine.h"
#include "queue/counters.h"
#include "queue/load_queue.h"

namespace ucm::test {
namespace {

constexpr uint32_t kSlots = 4;
constexpr uint32_t kNever = 600000;  // a grace no test run reaches: protection ends only by protocol

class Protect : public ::testing::Test {
 protected:
  void open(uint32_t grace_ms) {
    make_cache(params(kSlots, 0, 256, 4, 2), &tc_);
    tc_.ctrl.set_protect_grace_ms(grace_ms);
    ASSERT_EQ(tc_.ctrl.join(0), Result::kOk);
    ASSERT_EQ(tc_.ctrl.join(1), Result::kOk);
    tc_.ctrl.set_copier(0, true);
    tc_.ctrl.set_copier(1, true);
    CacheOptions o1;
    o1.rank = 1;
    r0_ = std::make_unique<CacheBuffer>(&tc_.ctrl, &tc_.data, CacheOptions{});
    r1_ = std::make_unique<CacheBuffer>(&tc_.ctrl, &tc_.data, o1);
  }
  // Rank 0 loads keys base..base+n-1 (owner, Ready, released).
  std::vector<uint32_t> load(CacheBuffer* cb, uint64_t base, uint32_t n) {
    std::vector<uint32_t> slots;
    for (uint32_t i = 0; i < n; ++i) {
      GetResult g;
      EXPECT_EQ(cb->get(key(base + i, 0), &g), Result::kOk) << last_error();
      EXPECT_EQ(g.kind, GetKind::kOwner);
      EXPECT_EQ(cb->mark_ready(g.slot), Result::kOk) << last_error();
      cb->release(g.slot);
      slots.push_back(g.slot);
    }
    return slots;
  }
  void hit(CacheBuffer* cb, uint64_t b) {
    GetResult g;
    ASSERT_EQ(cb->get(key(b, 0), &g), Result::kOk) << last_error();
    ASSERT_EQ(g.kind, GetKind::kHit);
    cb->release(g.slot);
  }
  TestCache tc_;
  std::unique_ptr<CacheBuffer> r0_, r1_;
};

TEST_F(Protect, ALoadedShardStaysUntilEveryCopierHasTakenIt) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  const std::vector<uint32_t> slots = load(r0_.get(), 10, kSlots);
  const uint64_t g = tc_.ctrl.guard(slots[1]).load();
  EXPECT_TRUE(guard_armed(g));
  EXPECT_EQ(guard_taken(g), 1u) << "the owner took it";
  GetResult o;
  ASSERT_EQ(r0_->get(key(99, 0), &o), Result::kNoSpace) << "every slot waits for rank 1";
  EXPECT_NE(last_error().find("protected"), std::string::npos) << last_error();
  // Rank 1 takes key 11: that slot, and only it, may go.
  ASSERT_NO_FATAL_FAILURE(hit(r1_.get(), 11));
  EXPECT_EQ(guard_taken(tc_.ctrl.guard(slots[1]).load()), 3u);
  ASSERT_EQ(r0_->get(key(99, 0), &o), Result::kOk) << last_error();
  EXPECT_EQ(o.kind, GetKind::kOwner);
  EXPECT_EQ(o.slot, slots[1]);
  EXPECT_TRUE(o.evicted);
  EXPECT_EQ(tc_.ctrl.guard(o.slot).load(), 0u) << "a new residency starts unarmed";
  ASSERT_EQ(r0_->mark_ready(o.slot), Result::kOk);
  r0_->release(o.slot);
  for (uint64_t b : {10, 12, 13}) ASSERT_NO_FATAL_FAILURE(hit(r1_.get(), b)) << "key " << b << " was kept for rank 1";
}

// Rank 1 copies key 11 through its queue's inline path (an all-hit task,
// copied on the submitting thread): it records that it took the slot exactly
// as its copier would, so that slot, and only it, may go.
TEST_F(Protect, AnInlineHitTakesTheSlotAsTheCopierWould) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  const std::vector<uint32_t> slots = load(r0_.get(), 10, kSlots);
  SimOptions so;
  so.latency_us = 0;
  BackendContext ctx;
  ctx.shard_bytes = 256;
  ctx.shards_per_block = 4;
  std::unique_ptr<SimBackend> store;
  ASSERT_EQ(SimBackend::create(so, ctx, &store), Result::kOk) << last_error();
  std::unique_ptr<CopyEngine> engine = make_host_engine(0);
  QueueOptions q;
  q.local_rank = 1;
  q.local_size = 2;
  q.prealloc = false;
  q.inline_hits = true;
  LoadQueue queue(r1_.get(), store.get(), engine.get(), Placement{}, q);
  ASSERT_EQ(queue.start(), Result::kOk) << last_error();
  std::vector<uint8_t> dst(256, 0xee);
  std::memset(tc_.data.at(slots[1]), 0x11, 256);
  std::vector<TaskEntry> es(1);
  es[0].key = key(11, 0);
  es[0].dst = dst.data();
  auto t = std::make_shared<Task>(1, TaskKind::kLoad, std::move(es), deadline_after_ms(20000));
  ASSERT_EQ(queue.submit(t), Result::kOk) << last_error();
  EXPECT_TRUE(t->done()) << "an all-hit task is done when submit returns";
  EXPECT_EQ(t->result(), Result::kOk) << t->error();
  EXPECT_EQ(queue.queued_tasks(), 0u);
  EXPECT_EQ(queue_counters(tc_.ctrl.rank(1)).inline_tasks.load(), 1u);
  EXPECT_EQ(dst[0], 0x11);
  EXPECT_EQ(dst[255], 0x11);
  EXPECT_EQ(guard_taken(tc_.ctrl.guard(slots[1]).load()), 3u) << "rank 1 recorded its take";
  for (uint32_t i : {0u, 2u, 3u}) EXPECT_EQ(guard_taken(tc_.ctrl.guard(slots[i]).load()), 1u);
  GetResult o;
  ASSERT_EQ(r0_->get(key(99, 0), &o), Result::kOk) << last_error();
  EXPECT_EQ(o.kind, GetKind::kOwner);
  EXPECT_EQ(o.slot, slots[1]) << "the slot rank 1 took, and only it, may go";
  ASSERT_EQ(r0_->mark_ready(o.slot), Result::kOk);
  r0_->release(o.slot);
  queue.stop();
  for (uint64_t b : {10, 12, 13}) ASSERT_NO_FATAL_FAILURE(hit(r1_.get(), b)) << "key " << b << " was kept for rank 1";
}

TEST_F(Protect, AWaiterTakesTheSlotBeforeItIsReady) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  GetResult o, w;
  ASSERT_EQ(r0_->get(key(20, 0), &o), Result::kOk);
  ASSERT_EQ(r1_->get(key(20, 0), &w), Result::kOk);
  ASSERT_EQ(w.kind, GetKind::kWaiter);
  ASSERT_EQ(r0_->mark_ready(o.slot), Result::kOk);
  EXPECT_EQ(guard_taken(tc_.ctrl.guard(o.slot).load()), 3u) << "the arm keeps the waiter's bit";
  r1_->release(w.slot);
  r0_->release(o.slot);
  load(r0_.get(), 30, kSlots - 1);
  // Slot of key 20 is the only one rank 1 has taken: the victim.
  GetResult n;
  ASSERT_EQ(r0_->get(key(40, 0), &n), Result::kOk) << last_error();
  EXPECT_EQ(n.slot, o.slot);
  r0_->release(n.slot);
}

TEST_F(Protect, DumpedShardsAreNotProtected) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  for (uint32_t i = 0; i < kSlots; ++i) {
    GetResult g;
    ASSERT_EQ(r0_->get(key(50 + i, 0), &g), Result::kOk);
    ASSERT_EQ(r0_->mark_ready_for_write(g.slot), Result::kOk);
    ASSERT_EQ(r0_->finish_write(g.slot, true), Result::kOk);
    EXPECT_FALSE(guard_armed(tc_.ctrl.guard(g.slot).load())) << "a dump never arms";
    r0_->release(g.slot);
  }
  GetResult g;
  ASSERT_EQ(r0_->get(key(60, 0), &g), Result::kOk) << "rank 1 may never ask for what rank 0 dumped: " << last_error();
  EXPECT_TRUE(g.evicted);
  r0_->release(g.slot);
}

TEST_F(Protect, ARankOutOfTheCopierMaskHoldsNothing) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  load(r0_.get(), 70, kSlots);
  GetResult g;
  ASSERT_EQ(r0_->get(key(80, 0), &g), Result::kNoSpace);
  tc_.ctrl.set_copier(1, false);  // its queue stopped (finalize), or it never had one (a scheduler)
  ASSERT_EQ(r0_->get(key(80, 0), &g), Result::kOk) << last_error();
  r0_->release(g.slot);
}

TEST_F(Protect, LeaveDropsTheRanksBit) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  load(r0_.get(), 90, kSlots);
  tc_.ctrl.leave(1);
  EXPECT_EQ(tc_.ctrl.globals().copiers.load(), 1u);
  GetResult g;
  ASSERT_EQ(r0_->get(key(95, 0), &g), Result::kOk) << last_error();
  r0_->release(g.slot);
}

TEST_F(Protect, TheGraceBoundsIt) {
  ASSERT_NO_FATAL_FAILURE(open(1));
  const std::vector<uint32_t> slots = load(r0_.get(), 100, kSlots);
  // Past the grace on the clock the arm used (not a timing assertion: we
  // wait for the clock, then check the protocol).
  const uint32_t armed = guard_time_ms(tc_.ctrl.guard(slots.back()).load());
  const uint64_t until = deadline_after_ms(10000);
  while (protect_now_ms() - armed < 2 && now_ns() < until) usleep(1000);
  GetResult g;
  ASSERT_EQ(r0_->get(key(110, 0), &g), Result::kOk) << "rank 1 never came: " << last_error();
  r0_->release(g.slot);
}

TEST_F(Protect, OffWithAGraceOfZero) {
  ASSERT_NO_FATAL_FAILURE(open(0));
  const std::vector<uint32_t> slots = load(r0_.get(), 120, kSlots);
  ASSERT_NO_FATAL_FAILURE(hit(r1_.get(), 120));
  for (uint32_t s : slots) EXPECT_EQ(tc_.ctrl.guard(s).load(), 0u) << "nothing arms, nothing takes";
  GetResult g;
  ASSERT_EQ(r0_->get(key(130, 0), &g), Result::kOk) << last_error();
  r0_->release(g.slot);
}

}  // namespace
}  // namespace ucm::test
