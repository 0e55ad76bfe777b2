// Peer deferral (the owner grace) without polling naps, with real queues
// (dispatcher, copier, sim store, host copy engine) in forked processes.
//
// Rank 0 submits a task alone. It loads its own stride and defers rank 1's
// share for the owner grace (60 s here: far longer than the test, so only
// the protocol can end the wait). Its dispatcher must sleep on the node's
// defer bell (ctrl/protect.h), not nap in a loop. Once it sleeps, rank 1
// submits the same task; its first miss rings the bell, rank 0 is woken,
// finds rank 1's share being served and waits for it instead of loading it.
// Each rank owns its stride; rank 0's CPU time while it deferred is printed
// (a measurement, not asserted).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "backend/sim_backend.h"
#include "backend/sim_content.h"
#include "common/mp_util.h"
#include "common/test_util.h"
#include "device/host_engine.h"
#include "mp/queue_rank.h"
#include "queue/load_queue.h"

namespace ucm::test {
namespace {

constexpr uint64_t kDeadlineMs = 20000;  // a hang, not slowness
constexpr uint64_t kShardBytes = 4096;
constexpr uint32_t kRanks = 2;
constexpr uint32_t kKeys = 8;
constexpr uint64_t kOwnerGraceNs = 60'000'000'000ull;

// One rank's queues (queue_rank.h): 2 ranks, no prealloc, the 60 s grace.
void open_rank(QueueRank* me, const TestCache& parent, uint32_t rank) {
  QueueOptions qo;
  qo.local_size = kRanks;
  qo.prealloc = false;
  qo.owner_grace_ns = kOwnerGraceNs;
  me->open(parent, rank, CacheOptions{}, qo, kShardBytes, kDeadlineMs);
}

Key task_key(uint32_t i) { return key(80000 + i, 2); }

struct DeferShared {
  ShmSignal asleep;    // rank 0's dispatcher sleeps on the defer bell
  ShmSignal finished;  // ranks done copying
  std::atomic<uint64_t> sleeps{0}, wakes{0}, cpu_ns{0}, wall_ns{0};
  std::atomic<uint64_t> loads[kRanks];
  std::atomic<uint32_t> result[kRanks];
};

void run(const TestCache& tc, DeferShared* sh, uint32_t rank) {
  QueueRank me;
  ASSERT_NO_FATAL_FAILURE(open_rank(&me, tc, rank));
  if (rank == 1) {
    ASSERT_TRUE(sh->asleep.wait_ge(1, deadline_after_ms(kDeadlineMs)));
    usleep(20000);  // so that the CPU time printed below covers a deferral of some length (not asserted)
  }
  std::vector<TaskEntry> es(kKeys);
  std::vector<std::vector<uint8_t>> dst(kKeys, std::vector<uint8_t>(kShardBytes, 0xee));
  for (uint32_t i = 0; i < kKeys; ++i) {
    es[i].key = task_key(i);
    es[i].dst = dst[i].data();
  }
  auto t = std::make_shared<Task>(1, TaskKind::kLoad, es, deadline_after_ms(kDeadlineMs));
  ASSERT_EQ(me.queue->submit(t), Result::kOk) << last_error();
  if (rank == 0) {
    // The protocol step: the dispatcher is in (or entering) its futex wait.
    const uint64_t until = deadline_after_ms(kDeadlineMs);
    while (me.queue->defer_stats().sleeps == 0 && now_ns() < until) usleep(500);
    ASSERT_GE(me.queue->defer_stats().sleeps, 1u) << "rank 0 never slept on the defer bell";
    sh->asleep.set(1);
  }
  ASSERT_TRUE(t->wait_until(deadline_after_ms(kDeadlineMs))) << "rank " << rank << "'s task hung";
  sh->result[rank].store(static_cast<uint32_t>(t->result()));
  EXPECT_EQ(t->result(), Result::kOk) << t->error();
  for (uint32_t i = 0; i < kKeys; ++i)
    EXPECT_EQ(sim_verify(task_key(i), dst[i].data(), kShardBytes), kShardBytes) << "rank " << rank << " key " << i;
  sh->loads[rank].store(queue_counters(me.cache->ctrl().rank(rank)).backend_loads.load());
  if (rank == 0) {
    const LoadQueue::DeferStats d = me.queue->defer_stats();
    sh->sleeps.store(d.sleeps);
    sh->wakes.store(d.wakes);
    sh->cpu_ns.store(d.cpu_ns);
    sh->wall_ns.store(d.wall_ns);
  }
  sh->finished.add();
  ASSERT_TRUE(sh->finished.wait_ge(kRanks, deadline_after_ms(kDeadlineMs)));
  me.close(rank);
}

TEST(Defer, AnIdleRankSleepsOnTheDeferBellAndIsWokenWhenAPeerServesItsShare) {
  TestCache tc;
  make_cache(params(32, 0, kShardBytes, 8, kRanks), &tc);
  Shared<DeferShared> sh;
  Children ch;
  const pid_t r0 = ch.spawn([&] { run(tc, sh.get(), 0); });
  const pid_t r1 = ch.spawn([&] { run(tc, sh.get(), 1); });
  EXPECT_EQ(ch.wait(r0, 2 * kDeadlineMs), 0);
  EXPECT_EQ(ch.wait(r1, 2 * kDeadlineMs), 0);
  EXPECT_GE(sh->sleeps.load(), 1u);
  EXPECT_GE(sh->wakes.load(), 1u) << "rank 0 was woken by the bell, not by a timeout";
  EXPECT_EQ(sh->loads[0].load(), kKeys / kRanks) << "rank 0 left rank 1's share to rank 1";
  EXPECT_EQ(sh->loads[1].load(), kKeys / kRanks);
  EXPECT_EQ(tc.ctrl.globals().deferring.load(), 0u) << "nobody defers any more";
  std::printf("[Defer] rank 0 deferred %.3f ms in %llu sleep(s), %llu woken by the bell, using %.3f ms of CPU\n",
              sh->wall_ns.load() / 1e6, static_cast<unsigned long long>(sh->sleeps.load()),
              static_cast<unsigned long long>(sh->wakes.load()), sh->cpu_ns.load() / 1e6);
}

// An owner grace longer than the task's timeout (UCM_OWNER_GRACE_US) held
// the task for the whole grace (an adversarial run: a 3 s grace, a 500 ms
// timeout, 3.0 s). Rank 0 submits alone, with a grace of 600 s and a task
// deadline of 300 ms; rank 1 never comes. The deferral ends at the task's
// deadline: rank 0's own stride loads, rank 1's share fails with the task
// (UCM_ERR_TIMEOUT) instead of waiting out the grace.
struct AloneShared {
  ShmSignal done;
};

TEST(Defer, TheOwnerGraceEndsAtTheTasksDeadline) {
  TestCache tc;
  make_cache(params(32, 0, kShardBytes, 8, kRanks), &tc);
  Shared<AloneShared> sh;
  Children ch;
  const pid_t r1 = ch.spawn([&] {
    QueueRank me;
    ASSERT_NO_FATAL_FAILURE(open_rank(&me, tc, 1));
    ASSERT_TRUE(sh->done.wait_ge(1, deadline_after_ms(3 * kDeadlineMs)));
    me.close(1);
  });
  const pid_t r0 = ch.spawn([&] {
    QueueRank me;
    QueueOptions qo;
    qo.local_size = kRanks;
    qo.prealloc = false;
    qo.owner_grace_ns = 600'000'000'000ull;
    me.open(tc, 0, CacheOptions{}, qo, kShardBytes, kDeadlineMs);
    ASSERT_FALSE(::testing::Test::HasFatalFailure());
    std::vector<TaskEntry> es(kKeys);
    std::vector<std::vector<uint8_t>> dst(kKeys, std::vector<uint8_t>(kShardBytes, 0xee));
    for (uint32_t i = 0; i < kKeys; ++i) {
      es[i].key = task_key(100 + i);
      es[i].dst = dst[i].data();
    }
    auto t = std::make_shared<Task>(1, TaskKind::kLoad, es, deadline_after_ms(300));
    ASSERT_EQ(me.queue->submit(t), Result::kOk) << last_error();
    ASSERT_TRUE(t->wait_until(deadline_after_ms(kDeadlineMs))) << "the task waited out the owner grace";
    EXPECT_EQ(t->result(), Result::kTimeout) << t->error();
    for (uint32_t i = 0; i < kKeys; i += kRanks)  // rank 0's stride
      EXPECT_EQ(sim_verify(task_key(100 + i), dst[i].data(), kShardBytes), kShardBytes) << "key " << i;
    sh->done.set(1);
    me.close(0);
  });
  EXPECT_EQ(ch.wait(r0, 2 * kDeadlineMs), 0);
  EXPECT_EQ(ch.wait(r1, 4 * kDeadlineMs), 0);
}

}  // namespace
}  // namespace ucm::test
