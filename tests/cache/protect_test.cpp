// Eviction protection (ctrl/protect.h) in one process: two ranks over the
// same planes. A loaded shard stays until every copier rank has taken it, or
// its grace passes; dumps never arm it; a rank out of the copier mask holds
// nothing; a grace of 0 is no protection at all.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_backend.h"
#include "backend/sim_content.h"
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
  // As Cache::release_local: the queue's threads, then the store (its
  // completions run into the queue and rank 1's cache), then the queue. A
  // task is done when its copy is, while the store thread that completed its
  // load is still on its way out of the queue: the members' own order (the
  // queue first) let that thread release a pin through a freed queue.
  ~Protect() override {
    if (queue_) queue_->stop();
    store_.reset();
    queue_.reset();
  }
  // `ranks` copier ranks (2 or 3) over one cache of kSlots slots.
  void open(uint32_t grace_ms, uint32_t ranks = 2) {
    make_cache(params(kSlots, 0, 256, 4, ranks), &tc_);
    tc_.ctrl.set_protect_grace_ms(grace_ms);
    for (uint32_t r = 0; r < ranks; ++r) {
      ASSERT_EQ(tc_.ctrl.join(r), Result::kOk);
      tc_.ctrl.set_copier(r, true);
    }
    CacheOptions o1, o2;
    o1.rank = 1;
    o2.rank = 2;
    r0_ = std::make_unique<CacheBuffer>(&tc_.ctrl, &tc_.data, CacheOptions{});
    r1_ = std::make_unique<CacheBuffer>(&tc_.ctrl, &tc_.data, o1);
    if (ranks > 2) r2_ = std::make_unique<CacheBuffer>(&tc_.ctrl, &tc_.data, o2);
  }
  // Rank r has finished dispatching `passed` load tasks and dispatches the next.
  void at_task(CacheBuffer* cb, uint32_t r, uint32_t passed) {
    tc_.ctrl.rank(r).tasks_passed.store(passed);
    cb->set_task_ordinal(passed);
  }
  // What rank cb's miss of a new key answers (kOk: it evicted a slot), for a
  // get at its task ordinal that relaxes the protection that far (protect_relax.h).
  Result miss(CacheBuffer* cb, uint64_t b, ProtectRelax relax = ProtectRelax::kStrict) {
    GetFor f{cb->task_ordinal(), true};
    f.relax = relax;
    GetResult o;
    const Result r = cb->get(key(b, 0), &o, f);
    if (r == Result::kOk) {
      EXPECT_EQ(o.kind, GetKind::kOwner);
      EXPECT_TRUE(o.evicted);
      EXPECT_EQ(cb->mark_ready(o.slot), Result::kOk);
      cb->release(o.slot);
    }
    return r;
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
  Result next_after(uint32_t stamp, uint32_t passed);
  // Rank 1's load queue over a sim store (no latency), inline hits on.
  void start_queue(size_t pending_limit = QueueOptions{}.pending_limit) {
    SimOptions so;
    so.latency_us = 0;
    BackendContext ctx;
    ctx.shard_bytes = 256;
    ctx.shards_per_block = 4;
    ASSERT_EQ(SimBackend::create(so, ctx, &store_), Result::kOk) << last_error();
    engine_ = make_host_engine(0);
    QueueOptions q;
    q.local_rank = 1;
    q.local_size = 2;
    q.prealloc = false;
    q.inline_hits = true;
    q.pending_limit = pending_limit;
    queue_ = std::make_unique<LoadQueue>(r1_.get(), store_.get(), engine_.get(), Placement{}, q);
    ASSERT_EQ(queue_->start(), Result::kOk) << last_error();
  }
  TestCache tc_;
  std::unique_ptr<CacheBuffer> r0_, r1_, r2_;
  std::unique_ptr<SimBackend> store_;
  std::unique_ptr<CopyEngine> engine_;
  std::unique_ptr<LoadQueue> queue_;
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
// copied on the submitting thread): it records that it took the slot for its
// task exactly as its copier would. Its first task is its task 0, the task
// rank 0 loaded the keys for; its next inline task (task 1) asks for key 11
// again: a new round, which rank 0 owes until it takes it for task 1 too.
TEST_F(Protect, AnInlineHitTakesTheSlotAsTheCopierWould) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  const std::vector<uint32_t> slots = load(r0_.get(), 10, kSlots);
  ASSERT_NO_FATAL_FAILURE(start_queue());
  LoadQueue& queue = *queue_;
  std::vector<uint8_t> dst(256, 0xee);
  std::memset(tc_.data.at(slots[1]), 0x11, 256);
  auto run = [&](uint64_t b) {
    std::vector<TaskEntry> es(1);
    es[0].key = key(b, 0);
    es[0].dst = dst.data();
    auto t = std::make_shared<Task>(1, TaskKind::kLoad, std::move(es), deadline_after_ms(20000));
    ASSERT_EQ(queue.submit(t), Result::kOk) << last_error();
    EXPECT_TRUE(t->done()) << "an all-hit task is done when submit returns";
    EXPECT_EQ(t->result(), Result::kOk) << t->error();
  };
  ASSERT_NO_FATAL_FAILURE(run(11));
  EXPECT_EQ(queue.queued_tasks(), 0u);
  EXPECT_EQ(queue_counters(tc_.ctrl.rank(1)).inline_tasks.load(), 1u);
  EXPECT_EQ(dst[0], 0x11);
  EXPECT_EQ(dst[255], 0x11);
  EXPECT_EQ(guard_taken(tc_.ctrl.guard(slots[1]).load()), 3u) << "rank 1 recorded its take";
  for (uint32_t i : {0u, 2u, 3u}) EXPECT_EQ(guard_taken(tc_.ctrl.guard(slots[i]).load()), 1u);
  ASSERT_NO_FATAL_FAILURE(run(11));  // its task 1
  const uint64_t g = tc_.ctrl.guard(slots[1]).load();
  EXPECT_EQ(guard_task(g), 1u) << "taken for a later task: that task's round";
  EXPECT_EQ(guard_taken(g), 2u) << "rank 1 alone has taken it for task 1";
  EXPECT_TRUE(guard_armed(g));
  queue.stop();
}

// A shard the cache still holds, asked for again by a later task: the rank
// that hits it first starts that task's round, and the shard stays until
// every copier has taken it for that task (or passed it, or the grace ends),
// as a shard loaded for that task would. Before, a hit left the old round's
// takes standing, and the fast rank's next misses evicted the shard before
// a slow rank came for it again (a reload per such shard).
TEST_F(Protect, AResidentShardAskedForAgainStaysForTheCopiersOfTheLaterTask) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  const std::vector<uint32_t> slots = load(r0_.get(), 10, kSlots);  // task 0
  for (uint64_t b = 10; b < 10 + kSlots; ++b) ASSERT_NO_FATAL_FAILURE(hit(r1_.get(), b));  // rank 1's task 0
  for (uint32_t s : slots) EXPECT_EQ(guard_taken(tc_.ctrl.guard(s).load()), 3u);
  at_task(r0_.get(), 0, 1);
  for (uint64_t b = 10; b < 10 + kSlots; ++b) ASSERT_NO_FATAL_FAILURE(hit(r0_.get(), b));  // rank 0's task 1
  for (uint32_t s : slots) {
    const uint64_t g = tc_.ctrl.guard(s).load();
    EXPECT_EQ(guard_task(g), 1u) << "slot " << s;
    EXPECT_EQ(guard_taken(g), 1u) << "slot " << s << ": rank 0 alone, for task 1";
    EXPECT_TRUE(guard_armed(g)) << "slot " << s;
  }
  GetResult o;
  ASSERT_EQ(r0_->get(key(99, 0), &o), Result::kNoSpace) << "every slot waits for rank 1's task 1";
  tc_.ctrl.rank(1).tasks_passed.store(1);  // rank 1 is past task 0, not task 1
  ASSERT_EQ(r0_->get(key(99, 0), &o), Result::kNoSpace) << "still";
  at_task(r1_.get(), 1, 1);
  ASSERT_NO_FATAL_FAILURE(hit(r1_.get(), 11));
  ASSERT_EQ(r0_->get(key(99, 0), &o), Result::kOk) << last_error();
  EXPECT_EQ(o.slot, slots[1]) << "the slot rank 1 took for task 1, and only it, may go";
  ASSERT_EQ(r0_->mark_ready(o.slot), Result::kOk);
  r0_->release(o.slot);
  for (uint64_t b : {10, 12, 13}) ASSERT_NO_FATAL_FAILURE(hit(r1_.get(), b)) << "key " << b << " was kept for rank 1";
}

// A rank behind the residency's task (a peer ahead loaded it for task 5;
// this rank asks for it in its task 0, and will again in its task 5) records
// nothing: the shard stays for its task 5.
TEST_F(Protect, ATakeForAnEarlierTaskThanTheStampRecordsNothing) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  at_task(r0_.get(), 0, 5);
  const std::vector<uint32_t> slots = load(r0_.get(), 10, kSlots);
  ASSERT_NO_FATAL_FAILURE(hit(r1_.get(), 11));  // rank 1's task 0
  EXPECT_EQ(tc_.ctrl.guard(slots[1]).load() & (kGuardTakenMask | kGuardTaskMask),
            1u | (5ull << kGuardTaskShift)) << "unchanged";
  GetResult o;
  ASSERT_EQ(r0_->get(key(99, 0), &o), Result::kNoSpace) << "key 11 waits for rank 1's task 5";
  at_task(r1_.get(), 1, 5);
  ASSERT_NO_FATAL_FAILURE(hit(r1_.get(), 11));
  ASSERT_EQ(r0_->get(key(99, 0), &o), Result::kOk) << last_error();
  EXPECT_EQ(o.slot, slots[1]);
  ASSERT_EQ(r0_->mark_ready(o.slot), Result::kOk);
  r0_->release(o.slot);
}

// A rank numbered ahead of its peers (it submitted load tasks of its own
// first: the API allows it) takes, as its task 8, shards ranks 0 and 1 loaded
// and took for their task 5. That is its first take of the residency, not a
// shard asked for again, so it starts no round 8 (it records nothing: it is
// past task 5, nobody waits for it there) and the shard is free once ranks 0
// and 1 have it. A round 8 wiped the peers' takes, and the two level peers
// then waited on each other for 3 tasks' worth of slots, each wait the grace
// (tasks failing at a long grace; an adversarial helper's reproducer,
// session 19). Only a rank that has taken the residency starts a round.
TEST_F(Protect, OnlyARankThatTookTheResidencyStartsARoundForALaterTask) {
  ASSERT_NO_FATAL_FAILURE(open(kNever, 3));
  at_task(r0_.get(), 0, 5);
  const std::vector<uint32_t> slots = load(r0_.get(), 10, kSlots);
  at_task(r1_.get(), 1, 5);
  for (uint64_t b = 10; b < 10 + kSlots; ++b) ASSERT_NO_FATAL_FAILURE(hit(r1_.get(), b));
  at_task(r2_.get(), 2, 8);
  for (uint64_t b = 10; b < 10 + kSlots; ++b) ASSERT_NO_FATAL_FAILURE(hit(r2_.get(), b));
  for (uint32_t s : slots) {
    const uint64_t g = tc_.ctrl.guard(s).load();
    EXPECT_EQ(guard_task(g), 5u) << "slot " << s << ": round 5 stands";
    EXPECT_EQ(guard_taken(g), 3u) << "slot " << s << ": ranks 0 and 1 took it for task 5";
  }
  // Rank 0 has taken key 12: asked for again in its task 6, it starts round 6.
  at_task(r0_.get(), 0, 6);
  ASSERT_NO_FATAL_FAILURE(hit(r0_.get(), 12));
  const uint64_t again = tc_.ctrl.guard(slots[2]).load();
  EXPECT_EQ(guard_task(again), 6u);
  EXPECT_EQ(guard_taken(again), 1u);
  EXPECT_EQ(miss(r0_.get(), 99), Result::kOk) << "keys 10, 11 and 13 are owed to nobody: " << last_error();
}

// A stamp farther ahead of the taker's task than kGuardLagWindow is not
// drift but a rank numbered out of step with its peers (one that joined
// late, or submitted load tasks they did not): its take counts as it did
// before ordinals, or it would be owed every shard for the whole grace.
TEST_F(Protect, ATakeFarBehindTheStampCountsAsBefore) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  at_task(r0_.get(), 0, kGuardLagWindow + 1);
  const std::vector<uint32_t> slots = load(r0_.get(), 10, kSlots);
  ASSERT_NO_FATAL_FAILURE(hit(r1_.get(), 11));  // rank 1's task 0
  EXPECT_EQ(guard_taken(tc_.ctrl.guard(slots[1]).load()), 3u);
  EXPECT_EQ(guard_task(tc_.ctrl.guard(slots[1]).load()), kGuardLagWindow + 1) << "the stamp stays";
  GetResult o;
  ASSERT_EQ(r0_->get(key(99, 0), &o), Result::kOk) << last_error();
  EXPECT_EQ(o.slot, slots[1]);
  ASSERT_EQ(r0_->mark_ready(o.slot), Result::kOk);
  r0_->release(o.slot);
}

// A waiter starts no round: the load in flight is its owner's (task 0 here),
// which the owner arms when it lands; a waiter for a later task (3) is past
// task 0 and records nothing, and never arms a slot that is not Ready.
TEST_F(Protect, AWaiterForALaterTaskStartsNoRound) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  GetResult o, w;
  ASSERT_EQ(r0_->get(key(20, 0), &o), Result::kOk);
  ASSERT_EQ(o.kind, GetKind::kOwner);
  ASSERT_EQ(r1_->get(key(20, 0), &w, GetFor{3, true}), Result::kOk);
  ASSERT_EQ(w.kind, GetKind::kWaiter);
  uint64_t g = tc_.ctrl.guard(o.slot).load();
  EXPECT_FALSE(guard_armed(g)) << "not Ready: not armed";
  EXPECT_EQ(guard_task(g), 0u);
  EXPECT_EQ(guard_taken(g), 0u);
  ASSERT_EQ(r0_->mark_ready(o.slot), Result::kOk);
  g = tc_.ctrl.guard(o.slot).load();
  EXPECT_TRUE(guard_armed(g));
  EXPECT_EQ(guard_task(g), 0u) << "the owner's round";
  EXPECT_EQ(guard_taken(g), 1u) << "the owner's take";
  r1_->release(w.slot);
  r0_->release(o.slot);
}

// A dump's get copies nothing to its rank: a hit or a wait for a dump takes
// nothing and starts no round, whatever the ordinal it carries.
TEST_F(Protect, ADumpsGetTakesNothing) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  const std::vector<uint32_t> slots = load(r0_.get(), 10, 1);
  const uint64_t before = tc_.ctrl.guard(slots[0]).load();
  GetResult g;
  ASSERT_EQ(r1_->get(key(10, 0), &g, GetFor{9, false}), Result::kOk);
  ASSERT_EQ(g.kind, GetKind::kHit);
  EXPECT_EQ(tc_.ctrl.guard(slots[0]).load(), before);
  r1_->release(g.slot);
}

// A get names the task it serves: its stamp and its take are that task's,
// not the task set_task_ordinal() last named (the dispatcher's, which the
// copier's retries of an older task would otherwise use).
TEST_F(Protect, AGetStampsAndTakesForTheTaskItNames) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  r0_->set_task_ordinal(7);
  GetResult o;
  ASSERT_EQ(r0_->get(key(30, 0), &o, GetFor{2, true}), Result::kOk);
  ASSERT_EQ(o.kind, GetKind::kOwner);
  EXPECT_EQ(guard_task(tc_.ctrl.guard(o.slot).load()), 2u);
  ASSERT_EQ(r0_->mark_ready(o.slot), Result::kOk);
  r0_->release(o.slot);
  r1_->set_task_ordinal(9);
  GetResult h;
  ASSERT_EQ(r1_->get(key(30, 0), &h, GetFor{2, true}), Result::kOk);
  ASSERT_EQ(h.kind, GetKind::kHit);
  EXPECT_EQ(guard_taken(tc_.ctrl.guard(o.slot).load()), 3u) << "taken for task 2, in the owner's round";
  EXPECT_EQ(guard_task(tc_.ctrl.guard(o.slot).load()), 2u);
  r1_->release(h.slot);
}

// Rank 1's queue numbers its load tasks and publishes how many it has
// finished dispatching, through the dispatcher and through the inline path,
// and its loads carry the ordinal of their task.
// A task past half of its time gives up the protection once, for all of its
// entries: each entry started strict again, swept the whole pool and only
// then looked unprotected (an adversarial run: 4,096 entries on 128k slots,
// a sweep 3 ms each, the task ended 10 s past its 8 s deadline). Rank 0 loads
// every slot; rank 1 owes them at its own task and never takes them, so only
// the relaxing lets its queue's task of kSlots new keys (deadline 300 ms)
// evict: once, counted once.
TEST_F(Protect, ATaskGivesUpTheProtectionOnceForAllOfItsEntries) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  load(r0_.get(), 10, kSlots);  // stamped for task 0, owed to rank 1
  ASSERT_NO_FATAL_FAILURE(start_queue());
  std::vector<std::vector<uint8_t>> dst(kSlots, std::vector<uint8_t>(256, 0xee));
  std::vector<TaskEntry> es(kSlots);
  for (uint32_t i = 0; i < kSlots; ++i) {
    es[i].key = key(500 + i, 0);
    es[i].dst = dst[i].data();
  }
  auto t = std::make_shared<Task>(1, TaskKind::kLoad, std::move(es), deadline_after_ms(300));
  ASSERT_EQ(queue_->submit(t), Result::kOk) << last_error();
  ASSERT_TRUE(t->wait_until(deadline_after_ms(20000)));
  EXPECT_EQ(t->result(), Result::kOk) << t->error();
  for (uint32_t i = 0; i < kSlots; ++i) EXPECT_EQ(sim_verify(key(500 + i, 0), dst[i].data(), 256), 256u) << "entry " << i;
  EXPECT_EQ(queue_counters(tc_.ctrl.rank(1)).protect_overrides.load(), 1u) << "one override for the task, not one per entry";
}

TEST_F(Protect, TheQueuePublishesTheLoadTasksItHasPassed) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  ASSERT_NO_FATAL_FAILURE(start_queue());
  const std::atomic<uint32_t>& passed = tc_.ctrl.rank(1).tasks_passed;
  const std::atomic<uint32_t>& idle = tc_.ctrl.rank(1).idle_since_ms;
  EXPECT_NE(idle.load(), 0u) << "a started queue with nothing in it is idle";
  std::vector<uint8_t> dst(256);
  auto run = [&](uint64_t b, uint32_t through) {
    std::vector<TaskEntry> es(1);
    es[0].key = key(b, 0);
    es[0].dst = dst.data();
    auto t = std::make_shared<Task>(1, TaskKind::kLoad, std::move(es), deadline_after_ms(20000));
    ASSERT_EQ(queue_->submit(t), Result::kOk) << last_error();
    ASSERT_TRUE(t->wait_until(deadline_after_ms(20000)));
    ASSERT_EQ(t->result(), Result::kOk) << t->error();
    // Published when the dispatch ends, which may be just after the copy.
    const uint64_t until = deadline_after_ms(20000);
    while ((passed.load() != through || idle.load() == 0) && now_ns() < until) usleep(100);
    EXPECT_EQ(passed.load(), through) << "after the task of key " << b;
    EXPECT_NE(idle.load(), 0u) << "idle again after the task of key " << b;
  };
  ASSERT_NO_FATAL_FAILURE(run(300, 1));  // a miss: the dispatcher loads it as task 0
  ASSERT_NO_FATAL_FAILURE(run(300, 2));  // all hits: inline, task 1
  EXPECT_EQ(queue_counters(tc_.ctrl.rank(1)).inline_tasks.load(), 1u);
  ASSERT_NO_FATAL_FAILURE(run(301, 3));  // task 2
  // Key 300: loaded for task 0, taken again by the inline task 1 (its round).
  for (uint64_t b : {300, 301}) {
    GetResult g;
    ASSERT_EQ(r0_->get(key(b, 0), &g), Result::kOk);
    ASSERT_EQ(g.kind, GetKind::kHit);
    EXPECT_EQ(guard_task(tc_.ctrl.guard(g.slot).load()), b == 300 ? 1u : 2u) << "key " << b;
    r0_->release(g.slot);
  }
  // A task its dispatcher cannot pass (rank 0 pins every slot: no room for
  // its miss) keeps the rank busy: idle_since_ms is 0 until it passes. The
  // store's completion drops its I/O pin just after it marks the slot Ready,
  // which can be after the task is done (ASan: 2 runs in 300): first let
  // rank 1's pins go.
  auto rank1_pins = [&] {
    uint32_t n = 0;
    for (uint32_t j = 0; j < kSlots; ++j) n += tc_.ctrl.pin(1, j).load();
    return n;
  };
  const uint64_t pins_until = deadline_after_ms(20000);
  while (rank1_pins() != 0 && now_ns() < pins_until) usleep(100);
  ASSERT_EQ(rank1_pins(), 0u) << "rank 1 still pins a slot of a finished task";
  std::vector<GetResult> pins(kSlots);
  for (uint32_t i = 0; i < kSlots; ++i) {
    ASSERT_EQ(r0_->get(key(400 + i, 0), &pins[i]), Result::kOk) << last_error();
    ASSERT_EQ(r0_->mark_ready(pins[i].slot), Result::kOk);
  }
  std::vector<TaskEntry> es(1);
  es[0].key = key(302, 0);
  es[0].dst = dst.data();
  auto t = std::make_shared<Task>(1, TaskKind::kLoad, std::move(es), deadline_after_ms(20000));
  ASSERT_EQ(queue_->submit(t), Result::kOk) << last_error();
  EXPECT_EQ(idle.load(), 0u) << "a load task is in the queue";
  EXPECT_FALSE(t->done());
  for (const GetResult& g : pins) r0_->release(g.slot);
  ASSERT_TRUE(t->wait_until(deadline_after_ms(20000)));
  EXPECT_EQ(t->result(), Result::kOk) << t->error();
  const uint64_t until = deadline_after_ms(20000);
  while (idle.load() == 0 && now_ns() < until) usleep(100);
  EXPECT_NE(idle.load(), 0u) << "idle once it passed";
  queue_->stop();
}

// The inline path's look at a task that is not all hits (one key still being
// loaded) drops its pins and hands the task to the dispatcher: it has copied
// nothing, so it must not have taken anything. A take recorded there let the
// fast ranks evict the shard before this rank's dispatcher came for it, and
// this rank's reload then waited the whole grace (the drift bench's no-space
// storms at a lag equal to the cache).
TEST_F(Protect, AnInlineLookThatFindsAMissTakesNothing) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  const std::vector<uint32_t> ready = load(r0_.get(), 10, 2);
  GetResult loading;
  ASSERT_EQ(r0_->get(key(12, 0), &loading), Result::kOk);
  ASSERT_EQ(loading.kind, GetKind::kOwner);
  const Key keys[] = {key(10, 0), key(11, 0), key(12, 0)};
  uint32_t slots[3];
  EXPECT_FALSE(r1_->pin_all_ready(3, KeyRun{keys}, slots));
  EXPECT_EQ(r1_->references_held(), 0);
  for (uint32_t s : ready) EXPECT_EQ(guard_taken(tc_.ctrl.guard(s).load()), 1u) << "slot " << s << ": rank 1 took it";
  ASSERT_EQ(r0_->mark_ready(loading.slot), Result::kOk);
  r0_->release(loading.slot);
  // All hits now: the caller numbers its task and takes the batch for it.
  ASSERT_TRUE(r1_->pin_all_ready(3, KeyRun{keys}, slots));
  for (uint32_t s : slots) EXPECT_EQ(guard_taken(tc_.ctrl.guard(s).load()), 1u) << "slot " << s << ": not yet";
  r1_->take_all(slots, 3, 0);
  for (uint32_t s : slots) EXPECT_EQ(guard_taken(tc_.ctrl.guard(s).load()), 3u) << "slot " << s;
  r1_->release_ready_pins(slots, 3);
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

// Rank 0 loads the whole cache for load task `stamp` while rank 1 has
// finished dispatching `passed` load tasks; then rank 0, as far on as rank 1
// (so that the order of waits does not decide), asks for one more key.
// What get() answered: kOk when the cache let a slot go, kNoSpace when every
// slot still waits for rank 1.
Result Protect::next_after(uint32_t stamp, uint32_t passed) {
  r0_.reset();
  r1_.reset();
  tc_ = TestCache();
  open(kNever);
  at_task(r0_.get(), 0, stamp);
  const std::vector<uint32_t> slots = load(r0_.get(), 10, kSlots);
  for (uint32_t s : slots) EXPECT_EQ(guard_task(tc_.ctrl.guard(s).load()), stamp % kGuardTaskModulo);
  tc_.ctrl.rank(1).tasks_passed.store(passed);
  tc_.ctrl.rank(0).tasks_passed.store(std::max(stamp, passed));
  GetResult o;
  const Result r = r0_->get(key(99, 0), &o);
  if (r == Result::kOk) {
    EXPECT_EQ(r0_->mark_ready(o.slot), Result::kOk);
    r0_->release(o.slot);
  }
  return r;
}

// The lagging rank's reload: its peers copied an earlier residency of these
// keys and are past the task, so nobody will take this one. It must not wait
// the grace for them (that made the drift bench's no-space storms).
TEST_F(Protect, AShardWaitsOnlyForCopiersNotPastItsTask) {
  EXPECT_EQ(next_after(0, 1), Result::kOk) << "rank 1 has asked for every key of task 0 already";
  EXPECT_EQ(next_after(5, 9), Result::kOk) << "rank 1 is 4 tasks past task 5";
  EXPECT_EQ(next_after(3, 3), Result::kNoSpace) << "rank 1 has not finished dispatching task 3";
  EXPECT_EQ(next_after(3, 0), Result::kNoSpace) << "rank 1 is 3 tasks behind";
  EXPECT_EQ(next_after(0, 0), Result::kNoSpace) << "no ordinals at all: every copier is waited for";
}

// The order of waits (protect.h): an evictor waits for an owed copier only
// when that copier is not ahead of it, and for itself only at the task it
// dispatches (its dispatcher takes those slots before it backs off). So waits
// run from ahead to behind and never close a cycle. Here rank 1 ran ahead and
// loaded the whole cache for task 5; rank 0 dispatches task 2 and meets a key
// the cache lost: before, every slot waited for rank 0 itself, which could
// take none of them before its task 2 was done, so it backed off for the
// whole grace (the paused rank's stall, docs/results.md).
TEST_F(Protect, AnEvictorDoesNotWaitForItselfForALaterTask) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  at_task(r1_.get(), 1, 5);
  load(r1_.get(), 10, kSlots);
  at_task(r0_.get(), 0, 2);
  EXPECT_EQ(miss(r0_.get(), 99), Result::kOk) << last_error();
}

// At the task it dispatches, the evictor waits for its own takes: those are
// the out-of-order takes (LoadQueue::take_served) that free the slots.
TEST_F(Protect, AnEvictorWaitsForItselfAtTheTaskItDispatches) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  at_task(r1_.get(), 1, 5);
  load(r1_.get(), 10, kSlots);
  at_task(r0_.get(), 0, 5);
  EXPECT_EQ(miss(r0_.get(), 99), Result::kNoSpace) << "rank 0 takes these for task 5";
}

// Three ranks: rank 2 loaded task 5 and rank 1 dispatches task 3. Rank 1
// waits for rank 0 while rank 0 is not ahead of it (equal progress keeps the
// rule before the order); rank 0 at task 1 waits for neither rank 1 (ahead of
// it) nor itself (task 5 is later than its own).
TEST_F(Protect, AnEvictorWaitsForTheRanksBehindItNotForThoseAhead) {
  ASSERT_NO_FATAL_FAILURE(open(kNever, 3));
  at_task(r2_.get(), 2, 5);
  load(r2_.get(), 10, kSlots);
  at_task(r1_.get(), 1, 3);
  at_task(r0_.get(), 0, 3);
  EXPECT_EQ(miss(r1_.get(), 97), Result::kNoSpace) << "rank 0 is at rank 1's task";
  at_task(r0_.get(), 0, 1);
  EXPECT_EQ(miss(r1_.get(), 98), Result::kNoSpace) << "rank 0, behind rank 1, has yet to take them";
  EXPECT_EQ(miss(r0_.get(), 99), Result::kOk) << last_error();
}

// Two level ranks behind a third that loaded slots for a later task used to
// wait for each other on those slots (neither takes them before it finishes
// the task they share, which needs one): a grace at a time, and tasks failing
// with UCM_ERR_NO_SPACE (an adversarial run, session 20). Relaxed
// (kLevelLater, protect_relax.h), an evictor no longer waits for a level rank
// on a slot stamped for a task after its own; it still waits for a level rank
// at its own task and for a rank behind it. kNone waits for nobody.
TEST_F(Protect, ARelaxedEvictorDoesNotWaitForALevelRankOnALaterTask) {
  ASSERT_NO_FATAL_FAILURE(open(kNever, 3));
  at_task(r2_.get(), 2, 5);
  load(r2_.get(), 10, kSlots);  // stamped for task 5, taken by rank 2 only
  at_task(r1_.get(), 1, 3);
  at_task(r0_.get(), 0, 3);
  EXPECT_EQ(miss(r0_.get(), 97, ProtectRelax::kStrict), Result::kNoSpace) << "strict: rank 1 is level";
  at_task(r1_.get(), 1, 2);
  EXPECT_EQ(miss(r0_.get(), 97, ProtectRelax::kLevelLater), Result::kNoSpace) << "rank 1, behind rank 0, is waited for";
  EXPECT_EQ(miss(r0_.get(), 97, ProtectRelax::kNone), Result::kOk) << last_error();
  at_task(r1_.get(), 1, 3);
  EXPECT_EQ(miss(r0_.get(), 98, ProtectRelax::kLevelLater), Result::kOk) << "level, for task 5: " << last_error();
}

// ... but at the evictor's own task a level rank is waited for, relaxed or not.
TEST_F(Protect, ARelaxedEvictorWaitsForALevelRankAtItsOwnTask) {
  ASSERT_NO_FATAL_FAILURE(open(kNever, 3));
  at_task(r2_.get(), 2, 3);
  load(r2_.get(), 10, kSlots);  // stamped for task 3
  at_task(r2_.get(), 2, 4);     // rank 2 is past it
  at_task(r1_.get(), 1, 3);
  at_task(r0_.get(), 0, 3);
  for (uint32_t i = 0; i < kSlots; ++i) hit(r0_.get(), 10 + i);  // rank 0 owes itself nothing: only rank 1 is owed
  EXPECT_EQ(miss(r0_.get(), 99, ProtectRelax::kLevelLater), Result::kNoSpace) << "rank 1 is level at task 3";
  EXPECT_EQ(miss(r0_.get(), 99, ProtectRelax::kNone), Result::kOk) << last_error();
}

// An idle rank that let a protection lapse holds nothing (protect.h): rank 1
// loads for task 5 what rank 0, behind it, owes. While rank 0 is busy, or idle
// with no lapse, it is waited for. A slot whose grace ran out while rank 0
// was idle marks it lapsed, and from then on rank 1's loads do not wait for it
// until it asks again. Before, a live rank that stopped asking held every
// shard loaded after it stopped for a grace each (an adversarial run: 7.0 s
// where a grace is 1 s); and idle time alone is not the test (a rank that
// computes longer than the grace between bursts must keep its shards).
TEST_F(Protect, AnIdleRankThatLetAProtectionLapseHoldsNothing) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  at_task(r1_.get(), 1, 5);
  const std::vector<uint32_t> slots = load(r1_.get(), 10, kSlots);
  at_task(r0_.get(), 0, 2);
  std::atomic<uint32_t>& idle = tc_.ctrl.rank(0).idle_since_ms;
  const uint32_t went_idle = protect_now_ms() - kNever - 1;  // a whole grace ago: idle time alone is not the test
  idle.store(went_idle == 0 ? 1 : went_idle);
  EXPECT_EQ(miss(r1_.get(), 95), Result::kNoSpace) << "rank 0 has been idle for a grace but let nothing lapse";
  EXPECT_EQ(tc_.ctrl.rank(0).lapsed_ms.load(), 0u);
  // Slot 0's grace ran out while rank 0 was idle: rank 1 evicts it and marks rank 0.
  std::atomic<uint64_t>& g0 = tc_.ctrl.guard(slots[0]);
  const uint64_t old_arm = (uint64_t{protect_now_ms() - kNever - 1} << kGuardTimeShift);
  g0.store((g0.load() & ((1ull << kGuardTimeShift) - 1)) | old_arm);
  EXPECT_EQ(miss(r1_.get(), 96), Result::kOk) << last_error();
  EXPECT_NE(tc_.ctrl.rank(0).lapsed_ms.load(), 0u) << "the lapse is recorded";
  EXPECT_EQ(miss(r1_.get(), 97), Result::kOk) << "rank 0 holds nothing now: " << last_error();
  // It asks again (busy), then goes idle again: waited for until its next lapse.
  idle.store(0);
  EXPECT_EQ(miss(r1_.get(), 98), Result::kNoSpace) << "rank 0 is busy";
  usleep(2000);  // the next idle period starts after the lapse (ms clock)
  idle.store(idle_stamp_now());
  EXPECT_EQ(miss(r1_.get(), 99), Result::kNoSpace) << "a lapse of an earlier idle period does not count";
}

// A load task the queue refuses (kBusy: its dispatcher has the most tasks
// waiting it takes) leaves the rank idle: nothing of it is queued. When the
// refusal came after the rank marked itself busy, it stayed busy for good and
// every peer waited a grace per slot for it again (a review, session 19).
TEST_F(Protect, ARefusedLoadTaskLeavesTheRankIdle) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  ASSERT_NO_FATAL_FAILURE(start_queue(0));  // refuses every queued task
  std::vector<uint8_t> dst(256);
  std::vector<TaskEntry> es(1);
  es[0].key = key(500, 0);  // a miss: not an inline task
  es[0].dst = dst.data();
  auto t = std::make_shared<Task>(1, TaskKind::kLoad, std::move(es), deadline_after_ms(20000));
  EXPECT_EQ(queue_->submit(t), Result::kBusy);
  EXPECT_NE(tc_.ctrl.rank(1).idle_since_ms.load(), 0u);
  queue_->stop();
}

// The evictor reads the clock once per sweep; an arm or a round written after
// that read (a ms later) is new, not 2^32 ms old: the slot stays within its
// grace (a review, session 19: such a stamp read as long past, and the sweep
// evicted a slot just loaded).
TEST_F(Protect, AStampNewerThanTheSweepsClockIsNew) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  const std::vector<uint32_t> slots = load(r0_.get(), 10, 1);
  ProtectView v = protect_view(tc_.ctrl, holder_id(0));
  v.have_now = true;
  v.now_ms = guard_time_ms(tc_.ctrl.guard(slots[0]).load()) - 1;  // the sweep's clock: a ms before the arm
  EXPECT_TRUE(slot_protected(tc_.ctrl, slots[0], &v)) << "armed a ms after the sweep read its clock";
  EXPECT_EQ(elapsed_ms(5, 7), 0u);
  EXPECT_EQ(elapsed_ms(7, 5), 2u);
  EXPECT_EQ(elapsed_ms(1, 0xffffffffu), 2u) << "across the wrap";
}

// Whom the evictor waits for of itself: its own takes at the task its get
// serves (GetFor.ordinal), not at tasks_passed, which lags behind it when an
// inline task finished ahead of a queued one (a review, session 19); and none
// for a get that takes nothing or says so (GetFor.wait_self).
TEST_F(Protect, AnEvictorWaitsForItselfOnlyAtTheTaskItsGetServes) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  at_task(r1_.get(), 1, 6);
  load(r1_.get(), 10, kSlots);  // task 6, owed to rank 0
  tc_.ctrl.rank(0).tasks_passed.store(6);
  GetResult o;
  EXPECT_EQ(r0_->get(key(97, 0), &o, GetFor{6, true}), Result::kNoSpace) << "its own task 6";
  EXPECT_EQ(r0_->get(key(98, 0), &o, GetFor{6, true, false}), Result::kOk) << "a get that waits for none of its own takes";
  EXPECT_EQ(r0_->mark_ready(o.slot), Result::kOk);
  r0_->release(o.slot);
  EXPECT_EQ(r0_->get(key(99, 0), &o, GetFor{7, true}), Result::kOk) << "task 6 is behind it (passed lags)";
  EXPECT_EQ(r0_->mark_ready(o.slot), Result::kOk);
  r0_->release(o.slot);
}

// The stamp is 14 bits: ordinals compare modulo 2^14, and a rank half the
// range or more away counts as not past (it waits longer, never shorter).
TEST_F(Protect, TaskOrdinalsCompareAcrossTheStampsWrap) {
  EXPECT_EQ(next_after(kGuardTaskModulo - 1, kGuardTaskModulo), Result::kOk) << "one past, across the wrap";
  EXPECT_EQ(next_after(kGuardTaskModulo + 2, 3 * kGuardTaskModulo + 4), Result::kOk) << "2 past, several wraps on";
  EXPECT_EQ(next_after(7, 7 + kGuardTaskModulo / 2), Result::kNoSpace) << "half the range away";
  EXPECT_EQ(next_after(7, 7 + kGuardTaskModulo), Result::kNoSpace) << "a whole range away reads as at the task";
  EXPECT_TRUE(task_passed(1, 0));
  EXPECT_FALSE(task_passed(0, 0));
  EXPECT_FALSE(task_passed(0, 1));
}

// A takeover (here of a preallocated slot) stamps its task as a miss does,
// and the arm keeps the stamp.
TEST_F(Protect, ATakeoverStampsItsTaskAndTheArmKeepsIt) {
  ASSERT_NO_FATAL_FAILURE(open(kNever));
  PreallocOutcome out;
  ASSERT_EQ(r0_->prealloc(key(200, 0), &out), Result::kOk) << last_error();
  r0_->set_task_ordinal(42);
  GetResult g;
  ASSERT_EQ(r0_->get(key(200, 0), &g), Result::kOk) << last_error();
  ASSERT_EQ(g.kind, GetKind::kOwner);
  ASSERT_TRUE(g.took_prealloc);
  EXPECT_EQ(guard_task(tc_.ctrl.guard(g.slot).load()), 42u);
  ASSERT_EQ(r0_->mark_ready(g.slot), Result::kOk);
  r0_->release(g.slot);
  const uint64_t armed = tc_.ctrl.guard(g.slot).load();
  EXPECT_TRUE(guard_armed(armed));
  EXPECT_EQ(guard_task(armed), 42u);
  EXPECT_EQ(guard_taken(armed), 1u);
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
