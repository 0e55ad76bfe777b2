// Faults for real: a rank is SIGKILLed while it holds a bucket lock, while it
// owns a load in flight, while it writes a dump through, while it pins every
// slot, and at random moments of a random workload. Every time, the survivors
// finish their work within a deadline far above the design bound (under 2 s
// per dead rank; the measured time is printed), no half-loaded slot is ever
// served as Ready, and the control plane ends clean.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/ctrl_check.h"
#include "common/hang_guard.h"
#include "common/mp_util.h"
#include "common/test_util.h"
#include "ctrl/pins.h"
#include "ctrl/recovery.h"
#include "mp/random_workload.h"
#include "sync/shared_lock.h"

namespace ucm::test {
namespace {

// The bound of every wait here: a hang, not slowness (the design bound is
// < 2 s; the tests print how long recovery took, and assert only its outcome).
uint64_t deadline_ms() { return hang_ms(20); }

void sleep_forever() {
  for (;;) pause();
}

double ms_between(uint64_t from_ns, uint64_t to_ns) {
  return static_cast<double>(static_cast<int64_t>(to_ns - from_ns)) / 1e6;
}

// In a child: attaches to the parent's planes and joins as `rank` (reaping a
// dead predecessor first); a child that cannot exits at once with code 100.
void join_as(const TestCache& parent, uint32_t rank, TestCache* mine) {
  attach_copy(parent, mine);
  if (::testing::Test::HasFatalFailure()) _exit(100);
  if (const Result r = join_rank_retrying(mine->ctrl, rank, deadline_after_ms(deadline_ms())); r != Result::kOk) {
    ADD_FAILURE() << "join as rank " << rank << ": " << result_name(r) << ": " << last_error();
    _exit(100);
  }
}

CacheBuffer cache_for(const TestCache& tc, uint32_t rank) {
  CacheOptions o;
  o.rank = rank;
  return CacheBuffer(&tc.ctrl, &tc.data, o);
}

// Loads k as owner in this process; returns the slot.
uint32_t load_key(CacheBuffer& cb, const Key& k) {
  GetResult g;
  EXPECT_EQ(cb.get(k, &g), Result::kOk) << last_error();
  EXPECT_EQ(g.kind, GetKind::kOwner);
  fill_pattern(cb.data_at(g.slot), cb.ctrl().slot_bytes(), k);
  EXPECT_EQ(cb.mark_ready(g.slot), Result::kOk) << last_error();
  cb.release(g.slot);
  return g.slot;
}

// Parent-side: joins `rank`, expects k to be a hit holding its bytes, leaves.
void expect_hit(TestCache& tc, uint32_t rank, const Key& k) {
  ASSERT_EQ(tc.ctrl.join(rank), Result::kOk) << last_error();
  CacheBuffer cb = cache_for(tc, rank);
  GetResult g;
  ASSERT_EQ(cb.get(k, &g), Result::kOk) << last_error();
  EXPECT_EQ(g.kind, GetKind::kHit);
  EXPECT_EQ(check_pattern(cb.data_at(g.slot), tc.ctrl.slot_bytes(), k), -1);
  cb.release(g.slot);
  tc.ctrl.leave(rank);
}

std::string quiescent(const TestCache& tc) {
  QuiescentOptions o;
  o.check_bytes = &check_pattern;
  return check_quiescent(tc.ctrl, &tc.data, o);
}

// ---- (a) killed while holding a bucket lock -------------------------------------

struct LockShared {
  ShmSignal locked;
  ShmSignal getting;
  std::atomic<uint64_t> got_ns{0};
  std::atomic<int32_t> get_result{-1};
  std::atomic<int32_t> get_kind{-1};
};

TEST(SigKill, BucketLockOfAKilledHolderIsRecoveredAndGetOnItsBucketSucceeds) {
  TestCache tc;
  make_cache(params(64, 8, 256), &tc);
  Shared<LockShared> sh;
  const Key K = key(7, 1);
  const uint32_t b = bucket_of(K, tc.ctrl.bucket_mask());
  Children ch;

  const pid_t holder = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 1, &mine);
    uint32_t dead = 0;
    ASSERT_EQ(shared_lock(&mine.ctrl.bucket(b).lock, holder_id(1), deadline_after_ms(deadline_ms()),
                          lock_policy_for(mine.ctrl, 50'000'000), &dead),
              Result::kOk);
    sh->locked.set(1);
    sleep_forever();
  });
  ASSERT_TRUE(sh->locked.wait_ge(1, deadline_after_ms(deadline_ms())));

  const pid_t getter = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 2, &mine);
    CacheBuffer cb = cache_for(mine, 2);
    sh->getting.set(1);
    GetResult g;
    const Result r = cb.get(K, &g);  // misses: needs bucket b's lock
    sh->got_ns.store(now_ns());
    sh->get_result.store(static_cast<int32_t>(r));
    sh->get_kind.store(static_cast<int32_t>(g.kind));
    ASSERT_EQ(r, Result::kOk) << last_error();
    ASSERT_EQ(g.kind, GetKind::kOwner);
    fill_pattern(cb.data_at(g.slot), mine.ctrl.slot_bytes(), K);
    ASSERT_EQ(cb.mark_ready(g.slot), Result::kOk);
    cb.release(g.slot);
    mine.ctrl.leave(2);
  });
  ASSERT_TRUE(sh->getting.wait_ge(1, deadline_after_ms(deadline_ms())));
  // While the holder lives, nobody gets through its lock.
  usleep(200 * 1000);
  EXPECT_EQ(sh->got_ns.load(), 0u) << "get() went through a bucket lock held by a live process (result "
                                   << sh->get_result.load() << ")";

  // Killed, and left a zombie (not waited for): that must count as dead too.
  const uint64_t t_kill = now_ns();
  ASSERT_EQ(::kill(holder, SIGKILL), 0);
  EXPECT_EQ(ch.wait(getter, deadline_ms()), 0) << "hung: the getter did not finish within " << deadline_ms() << " ms";
  const uint64_t got = sh->got_ns.load();
  ASSERT_NE(got, 0u);
  std::printf("[SigKill lock] get() on the dead holder's bucket returned %.1f ms after SIGKILL\n", ms_between(t_kill, got));
  EXPECT_EQ(ch.wait(holder, deadline_ms()), 128 + SIGKILL);

  EXPECT_EQ(tc.ctrl.bucket(b).lock.load(), 0u);
  EXPECT_EQ(tc.ctrl.rank(1).state.load(), static_cast<uint32_t>(RankState::kFree)) << "rank 1 was reaped";
  EXPECT_GE(tc.ctrl.globals().reap_count.load(), 1u);
  EXPECT_EQ(quiescent(tc), "");
  expect_hit(tc, 0, K);
}

// ---- (b) killed while it owns a load: waiters take over -----------------------

constexpr uint32_t kOwnerWaiters = 3;

struct OwnerShared {
  ShmSignal owning;
  ShmSignal waiting;
  std::atomic<uint32_t> slot{kNoSlot};
  std::atomic<uint32_t> winners{0};
  std::atomic<uint32_t> saw_failed{0};
  std::atomic<uint32_t> done{0};
  std::atomic<uint64_t> ready_ns{0};
  ShmError error;
};

// Pinned on `slot` (which holds k) having seen `w`: waits until Ready, taking
// a Failed load over (and loading k) if it can. Returns false on a failure.
bool wait_or_take_over(CacheBuffer& cb, const Key& k, uint32_t slot, uint32_t w, OwnerShared* sh) {
  const uint64_t deadline = deadline_after_ms(deadline_ms());
  std::atomic<uint32_t>& word = cb.ctrl().slot(slot).word;
  for (;;) {
    const State s = word_state(w);
    if (s == State::kReady) break;
    if (s == State::kFailed || (s == State::kIdle && word_owner(w) == kNoOwner)) {
      sh->saw_failed.fetch_add(1);
      if (cb.try_take_over(slot, w)) {
        sh->winners.fetch_add(1);
        std::memset(cb.data_at(slot), 0xEE, cb.ctrl().slot_bytes());
        fill_pattern(cb.data_at(slot), cb.ctrl().slot_bytes(), k);
        sh->ready_ns.store(now_ns());
        if (cb.mark_ready(slot) != Result::kOk) {
          sh->error.report("rank %u: mark_ready after the takeover failed: %s", cb.rank(), last_error().c_str());
          return false;
        }
        break;
      }
      w = word.load(std::memory_order_acquire);
      continue;
    }
    uint32_t now_word = 0;
    if (cb.wait_for_change(slot, w, deadline, &now_word) != Result::kOk) {
      sh->error.report("rank %u: wait_for_change timed out on slot %u (word 0x%x): %s", cb.rank(), slot,
                       word.load(), last_error().c_str());
      return false;
    }
    w = now_word;
  }
  if (check_pattern(cb.data_at(slot), cb.ctrl().slot_bytes(), k) != -1) {
    sh->error.report("rank %u: slot %u is Ready but does not hold the key's bytes (a half load served?)", cb.rank(),
                     slot);
    return false;
  }
  return true;
}

// The dead owner's half load: the first half is right, the rest is not.
void half_load(CacheBuffer& cb, uint32_t slot, const Key& k) {
  const uint64_t bytes = cb.ctrl().slot_bytes();
  std::memset(cb.data_at(slot), 0xEE, bytes);
  fill_pattern(cb.data_at(slot), bytes, k, 0, bytes / 16);
}

// Rank 1 in a child: owns K, half-loads it, then sleeps and never marks or
// releases it. Returns the child once its load is under way, else -1.
pid_t spawn_half_loading_owner(Children& ch, const TestCache& tc, OwnerShared* sh, const Key& K) {
  const pid_t owner = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 1, &mine);
    CacheBuffer cb = cache_for(mine, 1);
    GetResult g;
    ASSERT_EQ(cb.get(K, &g), Result::kOk) << last_error();
    ASSERT_EQ(g.kind, GetKind::kOwner);
    half_load(cb, g.slot, K);
    sh->slot.store(g.slot);
    sh->owning.set(1);
    sleep_forever();
  });
  return sh->owning.wait_ge(1, deadline_after_ms(deadline_ms())) ? owner : -1;
}

TEST(SigKill, KilledOwnersHalfLoadIsNeverServedAndExactlyOneWaiterReloads) {
  TestCache tc;
  make_cache(params(64, 8, 4096), &tc);
  Shared<OwnerShared> sh;
  const Key K = key(11, 2);
  Children ch;

  const pid_t owner = spawn_half_loading_owner(ch, tc, sh.get(), K);
  ASSERT_NE(owner, -1) << "the owner never reported its load";

  const uint32_t waiter_ranks[kOwnerWaiters] = {0, 2, 3};
  pid_t waiters[kOwnerWaiters];
  for (uint32_t i = 0; i < kOwnerWaiters; ++i) {
    const uint32_t rank = waiter_ranks[i];
    waiters[i] = ch.spawn([&, rank] {
      TestCache mine;
      join_as(tc, rank, &mine);
      CacheBuffer cb = cache_for(mine, rank);
      GetResult g;
      ASSERT_EQ(cb.get(K, &g), Result::kOk) << last_error();
      ASSERT_EQ(g.kind, GetKind::kWaiter) << "the owner is alive and loading";
      sh->waiting.add();
      EXPECT_TRUE(wait_or_take_over(cb, K, g.slot, g.word, sh.get())) << sh->error.first();
      sh->done.fetch_add(1);
      cb.release(g.slot);
      mine.ctrl.leave(rank);
    });
  }
  ASSERT_TRUE(sh->waiting.wait_ge(kOwnerWaiters, deadline_after_ms(deadline_ms())));
  usleep(100 * 1000);
  const uint32_t slot = sh->slot.load();
  const uint32_t w = tc.ctrl.slot(slot).word.load();
  EXPECT_EQ(word_state(w), State::kIdle) << "still loading while the owner lives";
  EXPECT_EQ(word_owner(w), 1u);
  EXPECT_EQ(sh->done.load(), 0u) << "a waiter finished while the owner was alive and had not marked";

  const uint64_t t_kill = now_ns();
  ch.kill_now(owner);  // dead and waited for
  for (uint32_t i = 0; i < kOwnerWaiters; ++i) EXPECT_EQ(ch.wait(waiters[i], deadline_ms()), 0) << "waiter " << i;
  EXPECT_FALSE(sh->error.any()) << sh->error.first();
  EXPECT_EQ(sh->winners.load(), 1u) << "exactly one waiter reloads the dead owner's shard";
  EXPECT_GE(sh->saw_failed.load(), 1u) << "the dead owner's slot went through Failed";
  ASSERT_NE(sh->ready_ns.load(), 0u);
  std::printf("[SigKill owner] the dead owner's shard was reloaded and Ready %.1f ms after SIGKILL (%u waiters, %u "
              "saw it Failed)\n",
              ms_between(t_kill, sh->ready_ns.load()), kOwnerWaiters, sh->saw_failed.load());

  EXPECT_EQ(tc.ctrl.rank(1).state.load(), static_cast<uint32_t>(RankState::kFree));
  EXPECT_EQ(quiescent(tc), "");
  EXPECT_EQ(resident_slot(tc.ctrl, K), slot) << "reloaded in place";
  expect_hit(tc, 0, K);
}

TEST(SigKill, LateGetOfAKilledOwnersKeyTakesTheLoadOver) {
  // Nobody was waiting when the owner died; a later get() meets the orphan.
  TestCache tc;
  make_cache(params(64, 8, 4096), &tc);
  Shared<OwnerShared> sh;
  const Key K = key(12, 5);
  Children ch;
  const pid_t owner = spawn_half_loading_owner(ch, tc, sh.get(), K);
  ASSERT_NE(owner, -1) << "the owner never reported its load";
  ch.kill_now(owner);
  // The kill is not noticed yet: the slot still says "loading, owner 1".
  const uint32_t slot = sh->slot.load();
  EXPECT_EQ(word_state(tc.ctrl.slot(slot).word.load()), State::kIdle);
  EXPECT_FALSE(tc.ctrl.rank_alive(1));

  const uint64_t t0 = now_ns();
  const pid_t late = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 2, &mine);
    CacheBuffer cb = cache_for(mine, 2);
    EXPECT_FALSE(cb.exists(K)) << "a half load is not Ready";
    GetResult g;
    ASSERT_EQ(cb.get(K, &g), Result::kOk) << last_error();
    EXPECT_EQ(g.slot, sh->slot.load()) << "the same slot: no second copy of K";
    if (g.kind == GetKind::kOwner) {
      sh->winners.fetch_add(1);
      fill_pattern(cb.data_at(g.slot), mine.ctrl.slot_bytes(), K);
      sh->ready_ns.store(now_ns());
      ASSERT_EQ(cb.mark_ready(g.slot), Result::kOk);
    } else {
      ASSERT_EQ(g.kind, GetKind::kWaiter) << "never a hit on a half load";
      EXPECT_TRUE(wait_or_take_over(cb, K, g.slot, g.word, sh.get())) << sh->error.first();
    }
    cb.release(g.slot);
    mine.ctrl.leave(2);
  });
  EXPECT_EQ(ch.wait(late, deadline_ms()), 0);
  EXPECT_FALSE(sh->error.any()) << sh->error.first();
  EXPECT_EQ(sh->winners.load(), 1u);
  ASSERT_NE(sh->ready_ns.load(), 0u);
  std::printf("[SigKill orphan] a later get() reloaded the dead owner's shard in %.1f ms\n",
              ms_between(t0, sh->ready_ns.load()));
  EXPECT_EQ(quiescent(tc), "");
  expect_hit(tc, 0, K);
}

// ---- (b') killed while it writes a dump through: a waiting dumper writes it ----

constexpr uint32_t kWriteWaiters = 2;

struct WriterShared {
  ShmSignal writing;
  ShmSignal waiting;
  std::atomic<uint32_t> slot{kNoSlot};
  std::atomic<uint32_t> writers{0};  // waiters that became the writer
  std::atomic<uint32_t> stored{0};   // waiters that saw the other's write succeed
  std::atomic<uint32_t> done{0};
  std::atomic<uint64_t> written_ns{0};
  ShmError error;
};

// A dumper pinned on Ready `slot` that saw the write `seen` in flight: waits
// for its outcome, writing the bytes itself if the writer is gone.
void await_write_or_take_over(CacheBuffer& cb, uint32_t slot, uint32_t seen, WriterShared* sh) {
  const uint64_t deadline = deadline_after_ms(deadline_ms());
  for (;;) {
    uint32_t now = 0;
    if (cb.wait_store_change(slot, seen, deadline, &now) != Result::kOk) {
      sh->error.report("rank %u: wait_store_change on slot %u (stored word 0x%x): %s", cb.rank(), slot, seen,
                       last_error().c_str());
      return;
    }
    switch (static_cast<StoreState>(now & kStoredStateMask)) {
      case StoreState::kWriting:
        seen = now;
        continue;
      case StoreState::kStored:
        sh->stored.fetch_add(1);
        return;
      case StoreState::kWriteFailed:
        sh->error.report("rank %u: nobody failed a write, yet the stored word says 0x%x", cb.rank(), now);
        return;
      case StoreState::kNotStored: {
        WriteClaim wc = WriteClaim::kStored;
        if (cb.claim_write(slot, &wc, &seen) != Result::kOk) {
          sh->error.report("rank %u: claim_write: %s", cb.rank(), last_error().c_str());
          return;
        }
        if (wc == WriteClaim::kWriter) {
          sh->writers.fetch_add(1);
          sh->written_ns.store(now_ns());
          if (cb.finish_write(slot, true) != Result::kOk)
            sh->error.report("rank %u: finish_write: %s", cb.rank(), last_error().c_str());
          return;
        }
        if (wc == WriteClaim::kStored) {
          sh->stored.fetch_add(1);
          return;
        }
        continue;  // another waiter writes it: wait for that
      }
    }
  }
}

TEST(SigKill, KilledWritersWriteThroughIsWrittenByExactlyOneWaitingDumper) {
  TestCache tc;
  make_cache(params(64, 8, 4096), &tc);
  Shared<WriterShared> sh;
  const Key K = key(13, 1);
  Children ch;

  // Rank 1 dumps K: fills it, makes it Ready as its writer, and never ends the write.
  const pid_t writer = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 1, &mine);
    CacheBuffer cb = cache_for(mine, 1);
    GetResult g;
    ASSERT_EQ(cb.get(K, &g), Result::kOk) << last_error();
    ASSERT_EQ(g.kind, GetKind::kOwner);
    fill_pattern(cb.data_at(g.slot), mine.ctrl.slot_bytes(), K);
    ASSERT_EQ(cb.mark_ready_for_write(g.slot), Result::kOk) << last_error();
    cb.add_pin(g.slot);  // the write's own pin
    sh->slot.store(g.slot);
    sh->writing.set(1);
    sleep_forever();
  });
  ASSERT_TRUE(sh->writing.wait_ge(1, deadline_after_ms(deadline_ms()))) << "the writer never reported";

  const uint32_t waiter_ranks[kWriteWaiters] = {2, 3};
  pid_t waiters[kWriteWaiters];
  for (uint32_t i = 0; i < kWriteWaiters; ++i) {
    const uint32_t rank = waiter_ranks[i];
    waiters[i] = ch.spawn([&, rank] {
      TestCache mine;
      join_as(tc, rank, &mine);
      CacheBuffer cb = cache_for(mine, rank);
      GetResult g;
      ASSERT_EQ(cb.get(K, &g), Result::kOk) << last_error();
      ASSERT_EQ(g.kind, GetKind::kHit) << "a dump's bytes are served while they are written";
      WriteClaim wc = WriteClaim::kStored;
      uint32_t seen = 0;
      ASSERT_EQ(cb.claim_write(g.slot, &wc, &seen), Result::kOk) << last_error();
      ASSERT_EQ(wc, WriteClaim::kBeingWritten) << "the writer is alive and writing";
      sh->waiting.add();
      await_write_or_take_over(cb, g.slot, seen, sh.get());
      sh->done.fetch_add(1);
      cb.release(g.slot);
      mine.ctrl.leave(rank);
    });
  }
  ASSERT_TRUE(sh->waiting.wait_ge(kWriteWaiters, deadline_after_ms(deadline_ms())));
  usleep(100 * 1000);
  const uint32_t slot = sh->slot.load();
  const uint32_t sw = tc.ctrl.stored(slot).load();
  EXPECT_EQ(static_cast<StoreState>(sw & kStoredStateMask), StoreState::kWriting) << "still writing while it lives";
  EXPECT_EQ(stored_writer(sw), 1u);
  EXPECT_EQ(sh->done.load(), 0u) << "a dumper was answered while the write was in flight";

  const uint64_t t_kill = now_ns();
  ch.kill_now(writer);
  for (uint32_t i = 0; i < kWriteWaiters; ++i) EXPECT_EQ(ch.wait(waiters[i], deadline_ms()), 0) << "waiter " << i;
  EXPECT_FALSE(sh->error.any()) << sh->error.first();
  EXPECT_EQ(sh->writers.load(), 1u) << "exactly one waiting dumper writes the dead writer's bytes";
  EXPECT_EQ(sh->stored.load(), kWriteWaiters - 1) << "the other gets that write's outcome";
  ASSERT_NE(sh->written_ns.load(), 0u);
  std::printf("[SigKill writer] the dead writer's write-through was taken over %.1f ms after SIGKILL\n",
              ms_between(t_kill, sh->written_ns.load()));
  EXPECT_EQ(tc.ctrl.rank(1).state.load(), static_cast<uint32_t>(RankState::kFree));
  EXPECT_EQ(quiescent(tc), "");
  EXPECT_EQ(stored_state(tc.ctrl.stored(slot).load(), tc.ctrl.slot(slot).word.load()), StoreState::kStored);
  expect_hit(tc, 0, K);
}

// ---- (c) killed while it pins every slot ------------------------------------------

struct PinShared {
  ShmSignal pinned;
  ShmSignal saw_no_space;
  ShmSignal killed;
  std::atomic<uint64_t> owner_ns{0};
  std::atomic<int32_t> first_result{-1};
};

TEST(SigKill, PinsOfAKilledRankOnEverySlotAreReleasedAndTheCacheIsUsableAgain) {
  constexpr uint32_t kRegular = 64;
  TestCache tc;
  make_cache(params(kRegular, 8, 256), &tc);
  Shared<PinShared> sh;
  // Fill the regular pool with Ready shards.
  {
    ASSERT_EQ(tc.ctrl.join(0), Result::kOk);
    CacheBuffer cb = cache_for(tc, 0);
    for (uint32_t i = 0; i < kRegular; ++i) load_key(cb, key(100 + i, 0));
    tc.ctrl.leave(0);
  }
  const Key fresh = key(999, 0);
  Children ch;
  const pid_t pinner = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 1, &mine);
    CacheBuffer cb = cache_for(mine, 1);
    for (uint32_t i = 0; i < kRegular; ++i) {
      GetResult g;
      ASSERT_EQ(cb.get(key(100 + i, 0), &g), Result::kOk) << last_error();
      ASSERT_EQ(g.kind, GetKind::kHit);
    }
    sh->pinned.set(1);
    sleep_forever();  // holds 64 pins
  });
  ASSERT_TRUE(sh->pinned.wait_ge(1, deadline_after_ms(deadline_ms())));

  const pid_t user = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 2, &mine);
    CacheBuffer cb = cache_for(mine, 2);
    GetResult g;
    EXPECT_EQ(cb.get(fresh, &g), Result::kNoSpace) << "every regular slot is pinned by a live rank";
    // Prealloc never evicts the regular pool: it goes to the reserved one.
    PreallocOutcome po;
    ASSERT_EQ(cb.prealloc(key(998, 1), &po), Result::kOk);
    EXPECT_EQ(po, PreallocOutcome::kPlacedReserved);
    sh->saw_no_space.set(1);
    ASSERT_TRUE(sh->killed.wait_ge(1, deadline_after_ms(deadline_ms())));
    const Result r = cb.get(fresh, &g);  // the pinner is dead now
    sh->first_result.store(static_cast<int32_t>(r));
    ASSERT_EQ(r, Result::kOk) << "the first get() after the death must recover the pins: " << last_error();
    ASSERT_EQ(g.kind, GetKind::kOwner);
    EXPECT_LT(g.slot, kRegular);
    fill_pattern(cb.data_at(g.slot), mine.ctrl.slot_bytes(), fresh);
    ASSERT_EQ(cb.mark_ready(g.slot), Result::kOk);
    sh->owner_ns.store(now_ns());
    cb.release(g.slot);
    mine.ctrl.leave(2);
  });
  ASSERT_TRUE(sh->saw_no_space.wait_ge(1, deadline_after_ms(deadline_ms())));
  const uint64_t t_kill = now_ns();
  ch.kill_now(pinner);
  sh->killed.set(1);
  EXPECT_EQ(ch.wait(user, deadline_ms()), 0);
  ASSERT_NE(sh->owner_ns.load(), 0u);
  std::printf("[SigKill pins] a get() needing a victim succeeded %.1f ms after SIGKILL of the rank pinning all %u "
              "slots\n",
              ms_between(t_kill, sh->owner_ns.load()), kRegular);
  for (uint32_t i = 0; i < tc.ctrl.total_slots(); ++i) EXPECT_EQ(tc.ctrl.pin(1, i).load(), 0u) << "slot " << i;
  EXPECT_EQ(tc.ctrl.rank(1).state.load(), static_cast<uint32_t>(RankState::kFree));
  EXPECT_EQ(quiescent(tc), "");
  expect_hit(tc, 0, fresh);
}

// ---- a replacement reaping its own dead predecessor ---------------------------------
//
// join() refuses a rank whose record names a dead process; the replacement
// reaps (as that rank) and joins again. While it reaps it is alive and holds
// the recovery lock, so nobody may take that lock from it, however long the
// reap takes (here: a live rank holds a bucket lock the reap needs).

struct ReplaceShared {
  ShmSignal claimed;      // the doomed rank 1 holds a claim on K's slot
  ShmSignal locked;       // rank 2 holds K's bucket lock
  ShmSignal release;      // the parent lets rank 2 unlock
  ShmSignal reaping;      // the replacement is inside reap_dead_ranks
  ShmSignal reaped;       // ... and has returned from it
  ShmSignal survivor_in;  // rank 3 is calling reap_dead_ranks
  ShmSignal survivor_up;  // rank 3 has joined (joining takes the recovery lock too)
  ShmSignal survivor_go;  // the parent lets rank 3 reap
  ShmSignal finish;       // the parent is done observing
  std::atomic<uint32_t> replacement_in_reap{0};
  std::atomic<int32_t> join_first{-1};
  std::atomic<int32_t> record_pid_at_end{0};
  std::atomic<uint32_t> record_state_at_end{0};
};

TEST(SigKill, AReplacementReapingItsDeadPredecessorKeepsTheRecoveryLock) {
  TestCache tc;
  make_cache(params(64, 8, 256), &tc);
  Shared<ReplaceShared> sh;
  const Key K = key(21, 0);
  const uint32_t b = bucket_of(K, tc.ctrl.bucket_mask());
  uint32_t slot = kNoSlot;
  {
    ASSERT_EQ(tc.ctrl.join(0), Result::kOk);
    CacheBuffer cb = cache_for(tc, 0);
    slot = load_key(cb, K);
    tc.ctrl.leave(0);
  }
  Children ch;
  // Rank 1 dies while it holds a claim on K's slot (as an evictor would).
  const pid_t doomed = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 1, &mine);
    ASSERT_TRUE(claim_slot(mine.ctrl, holder_id(1), slot));
    sh->claimed.set(1);
    sleep_forever();
  });
  ASSERT_TRUE(sh->claimed.wait_ge(1, deadline_after_ms(deadline_ms())));
  ch.kill_now(doomed);

  // Rank 2, alive, holds K's bucket lock for a while: reaping the claim waits for it.
  const pid_t holder = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 2, &mine);
    uint32_t dead = 0;
    ASSERT_EQ(shared_lock(&mine.ctrl.bucket(b).lock, holder_id(2), deadline_after_ms(deadline_ms()),
                          lock_policy_for(mine.ctrl, 50'000'000), &dead),
              Result::kOk);
    sh->locked.set(1);
    EXPECT_TRUE(sh->release.wait_ge(1, deadline_after_ms(deadline_ms())));
    shared_unlock(&mine.ctrl.bucket(b).lock);
    mine.ctrl.leave(2);
  });
  ASSERT_TRUE(sh->locked.wait_ge(1, deadline_after_ms(deadline_ms())));

  // A survivor, joined before the replacement starts; later it notices the
  // dead rank and reaps too: it must wait its turn.
  const pid_t survivor = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 3, &mine);
    sh->survivor_up.set(1);
    EXPECT_TRUE(sh->survivor_go.wait_ge(1, deadline_after_ms(deadline_ms())));
    sh->survivor_in.set(1);
    EXPECT_EQ(reap_dead_ranks(mine.ctrl, 3, nullptr, deadline_after_ms(deadline_ms())), Result::kOk) << last_error();
    mine.ctrl.leave(3);
  });
  ASSERT_TRUE(sh->survivor_up.wait_ge(1, deadline_after_ms(deadline_ms())));

  // The replacement for rank 1.
  const pid_t replacement = ch.spawn([&] {
    TestCache mine;
    attach_copy(tc, &mine);
    sh->join_first.store(static_cast<int32_t>(mine.ctrl.join(1)));
    sh->replacement_in_reap.store(1);
    sh->reaping.set(1);
    const Result r = reap_dead_ranks(mine.ctrl, 1, nullptr, deadline_after_ms(deadline_ms()));
    sh->replacement_in_reap.store(0);
    sh->reaped.set(1);
    ASSERT_EQ(r, Result::kOk) << last_error();
    ASSERT_EQ(mine.ctrl.join(1), Result::kOk) << last_error();
    EXPECT_TRUE(sh->finish.wait_ge(1, deadline_after_ms(deadline_ms())));
    sh->record_pid_at_end.store(mine.ctrl.rank(1).pid.load());
    sh->record_state_at_end.store(mine.ctrl.rank(1).state.load());
    mine.ctrl.leave(1);
  });
  ASSERT_TRUE(sh->reaping.wait_ge(1, deadline_after_ms(deadline_ms())));

  // The replacement holds the recovery lock now (under whatever holder id it
  // uses), unless it could finish without waiting for the bucket.
  uint32_t reaper = 0;
  {
    const uint64_t deadline = deadline_after_ms(deadline_ms());
    while (now_ns() < deadline && !sh->reaped.get()) {
      const uint32_t h = static_cast<uint32_t>(recovery_lock_holder(tc.ctrl));
      if (h != 0 && sh->replacement_in_reap.load()) {
        reaper = h;
        break;
      }
      usleep(200);
    }
  }
  EXPECT_EQ(sh->join_first.load(), static_cast<int32_t>(Result::kPeerDead));

  sh->survivor_go.set(1);
  ASSERT_TRUE(sh->survivor_in.wait_ge(1, deadline_after_ms(deadline_ms())));
  uint32_t stolen_by = 0;
  for (int i = 0; i < 300 && stolen_by == 0 && reaper != 0; ++i) {
    // In reap before and after the read: the holder we read is not its successor's.
    const bool before = sh->replacement_in_reap.load();
    const uint32_t h = static_cast<uint32_t>(recovery_lock_holder(tc.ctrl));
    const bool after = sh->replacement_in_reap.load();
    if (before && after && h != reaper) stolen_by = h;
    usleep(1000);
  }
  sh->release.set(1);
  EXPECT_EQ(ch.wait(holder, deadline_ms()), 0);
  EXPECT_EQ(ch.wait(survivor, deadline_ms()), 0);
  EXPECT_TRUE(sh->reaped.wait_ge(1, deadline_after_ms(deadline_ms())));
  sh->finish.set(1);
  EXPECT_EQ(ch.wait(replacement, deadline_ms()), 0);
  EXPECT_EQ(stolen_by, 0u) << "while the live replacement of rank 1 was reaping (holder id " << reaper
                           << "), holder id " << stolen_by
                           << " took the recovery lock from it: the liveness probe asks rank_alive(1), which still "
                              "names the dead predecessor, so a live reaper is taken for the dead one";
  EXPECT_EQ(sh->record_pid_at_end.load(), static_cast<int32_t>(replacement)) << "rank 1's record names the replacement";
  EXPECT_EQ(sh->record_state_at_end.load(), static_cast<uint32_t>(RankState::kAlive));
  EXPECT_EQ(quiescent(tc), "");
}

// ---- (d) chaos: random kills in a random workload ------------------------------

struct ChaosShared {
  std::atomic<uint64_t> joined_ns[kMaxRanks];  // a worker of this rank joined
  std::atomic<uint32_t> join_attempts[kMaxRanks];
};

TEST(SigKill, ChaosKillsRandomRanksWhileTheOthersKeepWorkingCorrectly) {
  constexpr uint32_t kRanks = 4;
  constexpr uint32_t kills = 16;
  const uint64_t seed = test_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (rerun with UCM_TEST_SEED=" << seed << ")");
  std::mt19937_64 rng(seed);
  CtrlParams cp = params(64, 8, 4096, 8, kRanks);
  cp.bucket_count = 32;
  TestCache tc;
  make_cache(cp, &tc);
  Shared<WorkloadShared> sh;
  Shared<ChaosShared> cs;
  sh->cfg.workers = kRanks;
  sh->cfg.ops = 0;  // until stopped
  sh->cfg.yield_permille = 150;

  Children ch;
  auto spawn_worker = [&](uint32_t r) {
    return ch.spawn([&, r] {
      TestCache mine;
      attach_copy(tc, &mine);
      // A replacement finds its rank still held by the dead: reap, then join.
      const Result j = join_rank_retrying(mine.ctrl, r, deadline_after_ms(deadline_ms()));
      if (j != Result::kOk) {
        sh->error.report("rank %u: a new worker could not join: %s", r, last_error().c_str());
        return;
      }
      cs->joined_ns[r].store(now_ns());
      const uint32_t inc = register_incarnation(sh.get(), r);
      const bool good = run_worker(sh.get(), mine, r, inc, mix64(seed ^ (uint64_t{inc} << 32) ^ r));
      mine.ctrl.leave(r);
      EXPECT_TRUE(good) << sh->error.first();
    });
  };
  pid_t pids[kRanks];
  for (uint32_t r = 0; r < kRanks; ++r) pids[r] = spawn_worker(r);

  double worst_join_ms = 0, worst_progress_ms = 0;
  std::vector<pid_t> zombies;
  for (uint32_t n = 0; n < kills && !sh->error.any(); ++n) {
    usleep(static_cast<useconds_t>(20000 + rng() % 200000));
    const uint32_t victim = static_cast<uint32_t>(rng() % kRanks);
    uint64_t ops_before[kRanks];
    for (uint32_t r = 0; r < kRanks; ++r) ops_before[r] = sh->ranks[r].ops.load();
    cs->joined_ns[victim].store(0);
    const uint64_t t_kill = now_ns();
    if (n % 2 == 0) {
      ch.kill_now(pids[victim]);
    } else {
      ::kill(pids[victim], SIGKILL);  // left a zombie until the end
      zombies.push_back(pids[victim]);
    }
    pids[victim] = spawn_worker(victim);
    // Within the deadline: the replacement has joined, and every survivor has
    // finished an operation since the kill (nobody hangs on the dead).
    const uint64_t deadline = deadline_after_ms(deadline_ms());
    while (cs->joined_ns[victim].load() == 0 && now_ns() < deadline && !sh->error.any()) usleep(500);
    ASSERT_NE(cs->joined_ns[victim].load(), 0u) << "kill " << n << ": the replacement of rank " << victim
                                                << " did not join: " << sh->error.first();
    worst_join_ms = std::max(worst_join_ms, ms_between(t_kill, cs->joined_ns[victim].load()));
    for (uint32_t r = 0; r < kRanks; ++r) {
      if (r == victim) continue;
      while (sh->ranks[r].ops.load() == ops_before[r] && now_ns() < deadline && !sh->error.any()) usleep(500);
      ASSERT_GT(sh->ranks[r].ops.load(), ops_before[r])
          << "kill " << n << " of rank " << victim << ": rank " << r << " made no progress for " << deadline_ms()
          << " ms: " << sh->error.first();
      worst_progress_ms = std::max(worst_progress_ms, ms_between(t_kill, now_ns()));
    }
  }
  usleep(100 * 1000);
  sh->stop.store(1);
  for (uint32_t r = 0; r < kRanks; ++r) EXPECT_EQ(ch.wait(pids[r], 20000), 0) << "rank " << r;
  for (pid_t z : zombies) EXPECT_EQ(ch.wait(z, deadline_ms()), 128 + SIGKILL);
  ASSERT_FALSE(sh->error.any()) << sh->error.first();

  // All workers have left; every dead one was reaped by its replacement.
  QuiescentOptions qo;
  qo.check_bytes = &check_pattern;
  QuiescentStats qs;
  EXPECT_EQ(check_quiescent(tc.ctrl, &tc.data, qo, &qs), "");

  // A killed owner's load began and never ended: at most one per kill.
  uint64_t begun = 0, ended = 0, reads = 0;
  for (uint32_t i = 0; i < workload_keys(sh->cfg); ++i) {
    const KeyStats& k = sh->keys[i];
    const uint64_t e = k.ready.load() + k.failed.load() + k.abandoned.load();
    EXPECT_GE(k.owner_events.load(), e) << "key index " << i;
    begun += k.owner_events.load();
    ended += e;
    reads += k.reads.load();
  }
  EXPECT_LE(begun - ended, uint64_t{kills});
  uint64_t ops = 0, waiters = 0, takeovers = 0, reaps = 0;
  for (uint32_t r = 0; r < kRanks; ++r) {
    ops += sh->ranks[r].ops.load();
    waiters += sh->ranks[r].waiters.load();
    takeovers += sh->ranks[r].takeovers.load();
    reaps += tc.ctrl.rank(r).counters.reaps.load();
  }
  std::printf("[SigKill chaos] seed %" PRIu64 ": %u kills, %" PRIu64 " ops, %" PRIu64 " waiters, %" PRIu64
              " takeovers, %" PRIu64 " verified reads, %" PRIu64 " loads cut short by a kill, %" PRIu64
              " dead ranks reaped (%u reap passes); worst kill->replacement joined %.1f ms, worst kill->every "
              "survivor progressed %.1f ms; final: %u resident, %u Ready\n",
              seed, kills, ops, waiters, takeovers, reads, begun - ended, reaps,
              tc.ctrl.globals().reap_count.load(), worst_join_ms, worst_progress_ms, qs.resident, qs.ready);
  EXPECT_GE(tc.ctrl.globals().reap_count.load(), 1u);
}

}  // namespace
}  // namespace ucm::test
