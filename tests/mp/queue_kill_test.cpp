// A rank SIGKILLed while its LoadQueue owns backend loads, with real queues
// (dispatcher, copier, sim store, host copy engine) in forked processes.
//
// Why forked processes and not mpirun: Open MPI 4.1 tears the whole job down
// when one rank dies (and the survivors' next collective, even a barrier in
// ucm_cache_finalize, would never complete), so the dead-owner path cannot be
// run through ucm_cache_init. Each process here builds what ucm_cache_init
// builds for a rank: it attaches to the shared planes, joins its local rank,
// and runs a CacheBuffer + SimBackend + host CopyEngine + LoadQueue.
//
// The story: the victim (local rank 1) has a sim store that hangs the task's
// keys, submits the task, and so owns four loads that never complete. The
// survivors (ranks 0 and 2) submit tasks with the same keys and wait on the
// victim's slots as waiters. The victim SIGKILLs itself. The survivors' waits
// notice the dead owner within a liveness slice, recover its slots (Failed),
// take them over, load them from their own stores and finish byte-exact,
// within a deadline far above the design bound (the time is printed).
#include <signal.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "backend/sim_backend.h"
#include "backend/sim_content.h"
#include "common/ctrl_check.h"
#include "common/mp_util.h"
#include "common/test_util.h"
#include "device/host_engine.h"
#include "mp/queue_rank.h"
#include "queue/load_queue.h"

namespace ucm::test {
namespace {

constexpr uint64_t kDeadlineMs = 10000;  // a hang, not slowness
constexpr uint64_t kShardBytes = 4096;
constexpr uint32_t kRanks = 3;
constexpr uint32_t kVictim = 1;
constexpr uint32_t kKeys = 4;

// One rank's queues (queue_rank.h): 3 ranks, no prealloc, 2 load retries,
// and a 50 ms liveness slice so that a killed owner is noticed soon.
void open_rank(QueueRank* me, const TestCache& parent, uint32_t rank) {
  CacheOptions co;
  co.liveness_slice_ms = 50;
  QueueOptions qo;
  qo.local_size = kRanks;
  qo.prealloc = false;
  qo.load_retries = 2;
  me->open(parent, rank, co, qo, kShardBytes, kDeadlineMs);
}

Key task_key(uint32_t i) {
  Key k;
  k.block.lo = 60000 + i;
  k.block.hi = ~k.block.lo;
  k.shard = 5;
  return k;
}

struct KillShared {
  ShmSignal owning;     // the victim owns every key's load (value 1)
  ShmSignal waiting;    // survivors whose dispatcher registered as waiter on every key
  ShmSignal finished;   // survivors done
  std::atomic<uint64_t> killed_ns{0};
  std::atomic<uint64_t> done_ns[kRanks];
  std::atomic<uint32_t> result[kRanks];
  ShmError error;
};

TEST(QueueKill, SurvivorsTakeOverTheLoadsOfARankKilledWhileItOwnsThem) {
  TestCache tc;
  make_cache(params(32, 0, kShardBytes, 8, 4), &tc);
  Shared<KillShared> sh;
  Children ch;

  const pid_t victim = ch.spawn([&] {
    QueueRank me;
    ASSERT_NO_FATAL_FAILURE(open_rank(&me, tc, kVictim));
    for (uint32_t i = 0; i < kKeys; ++i) me.store->hang_key(task_key(i));
    std::vector<TaskEntry> es(kKeys);
    std::vector<std::vector<uint8_t>> dst(kKeys, std::vector<uint8_t>(kShardBytes));
    for (uint32_t i = 0; i < kKeys; ++i) {
      es[i].key = task_key(i);
      es[i].dst = dst[i].data();
    }
    auto t = std::make_shared<Task>(1, TaskKind::kLoad, es, deadline_after_ms(kDeadlineMs));
    ASSERT_EQ(me.queue->submit(t), Result::kOk) << last_error();
    // Owning: every load admitted by the store (and hung there).
    const uint64_t until = deadline_after_ms(kDeadlineMs);
    while (me.store->counters().inflight_loads < kKeys && now_ns() < until) usleep(1000);
    ASSERT_EQ(me.store->counters().inflight_loads, kKeys) << "the victim's loads did not all start";
    for (uint32_t i = 0; i < kKeys; ++i) {
      const Key k = task_key(i);
      const uint32_t slot = resident_slot(me.planes.ctrl, k);
      ASSERT_NE(slot, kNoSlot);
      const uint32_t w = me.planes.ctrl.slot(slot).word.load();
      ASSERT_EQ(word_state(w), State::kIdle);
      ASSERT_EQ(word_owner(w), kVictim) << "key " << i << " is loaded by the victim";
    }
    sh->owning.set(1);
    // Die once both survivors wait on our loads.
    ASSERT_TRUE(sh->waiting.wait_ge(kRanks - 1, deadline_after_ms(kDeadlineMs)));
    sh->killed_ns.store(now_ns());
    kill(getpid(), SIGKILL);
    for (;;) pause();  // not reached: SIGKILL to oneself is delivered before kill() returns
  });

  auto survivor = [&](uint32_t rank) {
    QueueRank me;
    ASSERT_NO_FATAL_FAILURE(open_rank(&me, tc, rank));
    ASSERT_TRUE(sh->owning.wait_ge(1, deadline_after_ms(kDeadlineMs)));
    std::vector<TaskEntry> es(kKeys);
    std::vector<std::vector<uint8_t>> dst(kKeys, std::vector<uint8_t>(kShardBytes, 0xee));
    for (uint32_t i = 0; i < kKeys; ++i) {
      es[i].key = task_key(i);
      es[i].dst = dst[i].data();
    }
    auto t = std::make_shared<Task>(1, TaskKind::kLoad, es, deadline_after_ms(kDeadlineMs));
    ASSERT_EQ(me.queue->submit(t), Result::kOk) << last_error();
    // Our dispatcher found every key being loaded by the victim.
    const uint64_t until = deadline_after_ms(kDeadlineMs);
    while (me.cache->counters().waits.load() < kKeys && now_ns() < until) usleep(500);
    ASSERT_EQ(me.cache->counters().waits.load(), kKeys) << "every key should be a wait on the victim";
    sh->waiting.add();
    const bool done = t->wait_until(deadline_after_ms(kDeadlineMs));
    sh->done_ns[rank].store(now_ns());
    ASSERT_TRUE(done) << "the task hung after its loads' owner died";
    sh->result[rank].store(static_cast<uint32_t>(t->result()));
    EXPECT_EQ(t->result(), Result::kOk) << t->error();
    for (uint32_t i = 0; i < kKeys; ++i)
      EXPECT_EQ(sim_verify(task_key(i), dst[i].data(), kShardBytes), kShardBytes) << "rank " << rank << " key " << i;
    sh->finished.add();
    // Stay joined until both survivors are done: the other may still copy.
    ASSERT_TRUE(sh->finished.wait_ge(kRanks - 1, deadline_after_ms(kDeadlineMs)));
    me.close(rank);
  };
  const pid_t s0 = ch.spawn([&] { survivor(0); });
  const pid_t s2 = ch.spawn([&] { survivor(2); });

  EXPECT_EQ(ch.wait(victim, 2 * kDeadlineMs), 128 + SIGKILL) << "the victim dies by SIGKILL";
  EXPECT_EQ(ch.wait(s0, 2 * kDeadlineMs), 0) << "survivor 0";
  EXPECT_EQ(ch.wait(s2, 2 * kDeadlineMs), 0) << "survivor 2";
  ASSERT_FALSE(sh->error.any()) << sh->error.first();
  const uint64_t killed = sh->killed_ns.load();
  for (uint32_t r : {0u, 2u}) {
    if (killed && sh->done_ns[r].load())
      std::printf("[QueueKill] survivor %u finished %.1f ms after the owner was killed\n", r,
                  static_cast<double>(static_cast<int64_t>(sh->done_ns[r].load() - killed)) / 1e6);
  }

  // Whatever the dead rank left is recovered: the plane is clean, every
  // resident key holds its bytes, and a new process can take rank 1 again.
  ASSERT_EQ(join_rank_retrying(tc.ctrl, kVictim, deadline_after_ms(kDeadlineMs)), Result::kOk) << last_error();
  tc.ctrl.leave(kVictim);
  QuiescentOptions o;
  o.check_bytes = [](const void* src, uint64_t bytes, const Key& k) -> int64_t {
    const uint64_t bad = sim_verify(k, src, bytes);
    return bad == bytes ? -1 : static_cast<int64_t>(bad);
  };
  EXPECT_EQ(check_quiescent(tc.ctrl, &tc.data, o), "");
}

}  // namespace
}  // namespace ucm::test
