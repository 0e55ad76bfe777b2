// A rank waiting for a free slot sleeps on the node's space bell
// (ctrl/space_bell.h) and is woken by the release that frees one, in real
// processes: rank 1 pins every slot of the cache; rank 0's queue submits a
// task of one new key, whose get() answers NoSpace until rank 1 releases a
// slot a while later. Rank 0 used to nap 200 us and sweep the whole cache
// again, about 1,500 sweeps in the 300 ms it waits here (each a NoSpace
// answer); now it sleeps until the release rings. Its sleeps' bound here is
// 10 s, past its task's 5 s deadline, so only the bell (or the protection's
// relaxing at half of the task's time, which looks once more) ends them: the
// counts say which, NoSpace answers (each a whole sweep) and sleeps the bell
// ended. No time is asserted.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "backend/sim_content.h"
#include "common/mp_util.h"
#include "common/test_util.h"
#include "ctrl/space_bell.h"
#include "mp/queue_rank.h"
#include "queue/load_queue.h"

namespace ucm::test {
namespace {

constexpr uint64_t kDeadlineMs = 20000;  // a hang, not slowness
constexpr uint64_t kShardBytes = 4096;
constexpr uint32_t kSlots = 8;
constexpr uint32_t kHoldMs = 300;  // how long rank 1 keeps every slot after rank 0 sleeps
constexpr uint64_t kTaskMs = 5000;
constexpr uint64_t kBackoffNs = 10'000'000'000;  // every bound of a sleep: past the task's deadline
constexpr uint64_t kBackoffMaxNs = kBackoffNs;
// The first look, the look after announcing, the look when the protection
// relaxes for level ranks (5 ms), the look the release rings: 4.
constexpr uint64_t kMostLooks = 5;

Key held_key(uint32_t i) { return key(91000 + i, 1); }
Key new_key() { return key(92000, 1); }

struct SpaceShared {
  ShmSignal full;      // rank 1 pins every slot
  ShmSignal asleep;    // rank 0's dispatcher sleeps on the space bell
  ShmSignal finished;  // rank 0's task is done
  std::atomic<uint64_t> no_space{0}, sleeps{0}, wakes{0};
  std::atomic<uint32_t> waiting_after{~0u};
};

// Rank 1: every slot pinned (Ready, its own loads) until kHoldMs after rank 0
// sleeps; then one slot released, the rest after rank 0's task.
void pin_all(const TestCache& parent, SpaceShared* sh) {
  TestCache mine;
  attach_copy(parent, &mine);
  ASSERT_EQ(join_rank_retrying(mine.ctrl, 1, deadline_after_ms(kDeadlineMs)), Result::kOk) << last_error();
  CacheOptions o;
  o.rank = 1;
  CacheBuffer cb(&mine.ctrl, &mine.data, o);
  std::vector<uint32_t> slots;
  for (uint32_t i = 0; i < kSlots; ++i) {
    GetResult g;
    ASSERT_EQ(cb.get(held_key(i), &g), Result::kOk) << last_error();
    ASSERT_EQ(g.kind, GetKind::kOwner);
    fill_pattern(cb.data_at(g.slot), kShardBytes, held_key(i));
    ASSERT_EQ(cb.mark_ready(g.slot), Result::kOk) << last_error();
    slots.push_back(g.slot);
  }
  GetResult none;
  ASSERT_EQ(cb.get(new_key(), &none), Result::kNoSpace) << "every slot is pinned";
  sh->full.set(1);
  ASSERT_TRUE(sh->asleep.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  usleep(kHoldMs * 1000);
  cb.release(slots[0]);
  ASSERT_TRUE(sh->finished.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  for (size_t i = 1; i < slots.size(); ++i) cb.release(slots[i]);
  mine.ctrl.leave(1);
}

// Rank 0: its queue (sim store) loads one new key into the full cache.
void wait_for_space(const TestCache& parent, SpaceShared* sh) {
  ASSERT_TRUE(sh->full.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  QueueRank me;
  QueueOptions qo = solo_queue();
  qo.no_space_backoff_ns = kBackoffNs;
  qo.no_space_backoff_max_ns = kBackoffMaxNs;
  ASSERT_NO_FATAL_FAILURE(me.open(parent, 0, CacheOptions{}, qo, kShardBytes, kDeadlineMs));
  std::vector<uint8_t> dst(kShardBytes, 0xee);
  std::vector<TaskEntry> es(1);
  es[0].key = new_key();
  es[0].dst = dst.data();
  auto t = std::make_shared<Task>(1, TaskKind::kLoad, es, deadline_after_ms(kTaskMs));
  ASSERT_EQ(me.queue->submit(t), Result::kOk) << last_error();
  const uint64_t until = deadline_after_ms(kDeadlineMs);
  while (me.queue->space_stats().sleeps == 0 && !t->done() && now_ns() < until) usleep(200);
  ASSERT_GE(me.queue->space_stats().sleeps, 1u) << "rank 0 never slept on the space bell";
  sh->asleep.set(1);
  ASSERT_TRUE(t->wait_until(deadline_after_ms(kDeadlineMs))) << "rank 0's task hung";
  EXPECT_EQ(t->result(), Result::kOk) << t->error();
  EXPECT_EQ(sim_verify(new_key(), dst.data(), kShardBytes), kShardBytes);
  sh->no_space.store(me.cache->ctrl().rank(0).counters.no_space.load());
  sh->sleeps.store(me.queue->space_stats().sleeps);
  sh->wakes.store(me.queue->space_stats().wakes);
  sh->waiting_after.store(me.cache->ctrl().globals().space_waiting.load());
  sh->finished.set(1);
  me.close(0);
}

TEST(SpaceWait, ARankWaitingForAFreeSlotSleepsUntilAReleaseRingsTheSpaceBell) {
  TestCache tc;
  make_cache(params(kSlots, 0, kShardBytes, 8, 2), &tc);
  Shared<SpaceShared> sh;
  Children ch;
  const pid_t r1 = ch.spawn([&] { pin_all(tc, sh.get()); });
  const pid_t r0 = ch.spawn([&] { wait_for_space(tc, sh.get()); });
  EXPECT_EQ(ch.wait(r0, 2 * kDeadlineMs), 0);
  EXPECT_EQ(ch.wait(r1, 2 * kDeadlineMs), 0);
  EXPECT_GE(sh->wakes.load(), 1u) << "the release rang the space bell (else rank 0 looked again only at half of its task's time)";
  EXPECT_LE(sh->no_space.load(), kMostLooks) << "rank 0 swept the cache " << sh->no_space.load()
                                             << " times while it waited: a nap loop, not a sleep on the bell";
  EXPECT_EQ(sh->waiting_after.load(), 0u) << "nobody waits for space any more";
  std::printf("[SpaceWait] rank 0 waited %u ms for a slot: %llu NoSpace answers, %llu sleeps, %llu ended by the bell\n",
              kHoldMs, static_cast<unsigned long long>(sh->no_space.load()),
              static_cast<unsigned long long>(sh->sleeps.load()), static_cast<unsigned long long>(sh->wakes.load()));
}

}  // namespace
}  // namespace ucm::test
