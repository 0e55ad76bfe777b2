// A load the store holds for a large share of its task's time no longer
// holds one of the rank's io_depth places: it counts as stuck, and the rank
// sends its other loads past it, up to io_depth stuck ones (2 x io_depth in
// flight at most). Before, io_depth was a hard bound: loads of distinct keys
// that the store never answered held every place until their tasks'
// deadlines, and every other task of the rank (and its peers' waits on the
// keys it owned) ended at its own deadline with UCM_ERR_TIMEOUT (helper-15's
// public-API run, session 22).
#include <unistd.h>

#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_content.h"
#include "common/stress.h"
#include "common/test_util.h"
#include "common/time.h"
#include "queue/counters.h"
#include "queue/queue_fixture.h"

namespace ucm {
namespace {

using test::OneKey;

constexpr uint64_t kShard = 4096;
constexpr uint64_t kWaitMs = 20000;  // a hang, not slowness

// A queue alone over 16 slots (or `slots`) with io_depth places, whose sim store never
// answers the loads of the keys hung (until it is destroyed).
struct StuckStore : test::QueuePath {
  void open(uint32_t depth, uint64_t stuck_ns, uint32_t slots = 16, test::QueueParts parts = {}) {
    parts.shard_bytes = kShard;
    parts.queue.io_depth = depth;
    parts.queue.io_stuck_ns = stuck_ns;
    ASSERT_NO_FATAL_FAILURE(open_alone(slots, std::move(parts), kWaitMs));
  }
  const QueueCounters& ctr() const { return queue_counters(planes.ctrl.rank(0)); }
  // Submits a task of one hung key of its own.
  std::unique_ptr<OneKey> hang(uint64_t block, uint64_t ms) {
    const Key k = test::key(block, 0);
    store->hang_key(k);
    auto t = std::make_unique<OneKey>(block, k, ms);
    EXPECT_EQ(queue->submit(t->task), Result::kOk) << last_error();
    return t;
  }
  // io_depth 1, stuck after 100 ms: blocks first..first+2 hung, the first
  // stuck, the second sent past it and holding the place, the third waiting.
  void three_hung_at_depth_one(uint64_t first, std::vector<std::unique_ptr<OneKey>>* hung) {
    ASSERT_NO_FATAL_FAILURE(open(1, 100'000'000));
    for (uint64_t b = first; b < first + 3; ++b) hung->push_back(hang(b, kWaitMs));
    ASSERT_TRUE(sent(2, kWaitMs)) << "the second hung load was never sent past the first";
  }
  bool sent(uint64_t loads, uint64_t ms) {
    const uint64_t until = deadline_after_ms(ms);
    while (ctr().backend_loads.load() < loads && now_ns() < until) usleep(1000);
    return ctr().backend_loads.load() >= loads;
  }
};

// Both places held by loads that hang, whose tasks end in 2 s: a quarter of
// that in, they count as stuck, and a task of another key (its deadline
// 1.5 s) loads. Before, it waited for a place until its deadline (TIMEOUT).
TEST(StuckIo, ATaskOfOtherKeysIsNotHeldBehindLoadsThatHang) {
  StuckStore p;
  ASSERT_NO_FATAL_FAILURE(p.open(2, QueueOptions{}.io_stuck_ns));
  auto h1 = p.hang(91001, 2000);
  auto h2 = p.hang(91002, 2000);
  ASSERT_TRUE(p.sent(2, kWaitMs)) << "the hung loads never went to the store";
  const Key k = test::key(91003, 0);
  OneKey b(3, k, 1500);
  ASSERT_EQ(p.queue->submit(b.task), Result::kOk) << last_error();
  ASSERT_TRUE(b.task->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_EQ(b.task->result(), Result::kOk) << b.task->error();
  EXPECT_EQ(sim_verify(k, b.dst.data(), kShard), kShard);
  EXPECT_EQ(p.ctr().backend_loads.load(), 3u);
  // The hung ones still end at their own deadlines.
  ASSERT_TRUE(h1->task->wait_until(deadline_after_ms(kWaitMs)));
  ASSERT_TRUE(h2->task->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_EQ(h1->task->result(), Result::kTimeout) << h1->task->error();
  EXPECT_EQ(h2->task->result(), Result::kTimeout) << h2->task->error();
}

// Stuck loads are bounded too: with io_depth 1, one stuck load and one that
// holds the place; the third hung key waits for a place (until the second's
// deadline). Loads that outlive io_stuck_ns are stuck whatever their tasks'
// deadlines.
TEST(StuckIo, NoMoreThanTwiceTheDepthGoToTheStore) {
  StuckStore p;
  std::vector<std::unique_ptr<OneKey>> hung;
  ASSERT_NO_FATAL_FAILURE(p.three_hung_at_depth_one(92001, &hung));
  usleep(600'000);  // six times io_stuck_ns: time enough for more to be sent, were they allowed
  EXPECT_EQ(p.ctr().backend_loads.load(), 2u);
  EXPECT_EQ(p.queue->io_in_flight(), 2u);
}

// The dispatcher waits for a place inside the third hung key's task (the
// stuck ones are at their bound); a task of another key queued behind it
// fails at its own deadline, naming that wait, not when the dispatcher
// reaches it (at the second hung load's deadline, 20 s). Its order against
// the hung task's end says so, not a clock.
TEST(StuckIo, ATaskQueuedBehindAWaitForAPlaceFailsAtItsOwnDeadline) {
  StuckStore p;
  std::vector<std::unique_ptr<OneKey>> hung;
  ASSERT_NO_FATAL_FAILURE(p.three_hung_at_depth_one(93001, &hung));
  const Key k = test::key(93004, 0);
  OneKey d(4, k, 300);
  ASSERT_EQ(p.queue->submit(d.task), Result::kOk) << last_error();
  ASSERT_TRUE(d.task->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_FALSE(hung[2]->task->done()) << "the task the dispatcher waited in ended first";
  EXPECT_EQ(d.task->result(), Result::kTimeout) << d.task->error();
  EXPECT_NE(d.task->error().find("waited in rank 0's queue, behind an earlier task waiting for an I/O place"),
            std::string::npos)
      << d.task->error();
  EXPECT_EQ(p.ctr().backend_loads.load(), 2u);
}

// The same for a wait for space: two slots, both held by loads that hang;
// the third hung key's task waits for a free slot (until its deadline, 20 s),
// and a task queued behind it fails at its own.
TEST(StuckIo, ATaskQueuedBehindAWaitForSpaceFailsAtItsOwnDeadline) {
  StuckStore p;
  ASSERT_NO_FATAL_FAILURE(p.open(4, QueueOptions{}.io_stuck_ns, 2));
  auto h1 = p.hang(94001, kWaitMs);
  auto h2 = p.hang(94002, kWaitMs);
  ASSERT_TRUE(p.sent(2, kWaitMs)) << "the hung loads never went to the store";
  auto h3 = p.hang(94003, kWaitMs);
  const Key k = test::key(94004, 0);
  OneKey d(4, k, 300);
  ASSERT_EQ(p.queue->submit(d.task), Result::kOk) << last_error();
  ASSERT_TRUE(d.task->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_FALSE(h3->task->done()) << "the task the dispatcher waited in ended first";
  EXPECT_EQ(d.task->result(), Result::kTimeout) << d.task->error();
  EXPECT_NE(d.task->error().find("behind an earlier task waiting for a free cache slot"), std::string::npos)
      << d.task->error();
}

// The store is told: a sim store that admits 2 requests at once, both held
// by hung loads, queues a third load behind them until the queue counts them
// stuck and says so (Backend::requests_stuck); it then admits it beside them.
TEST(StuckIo, TheStoreIsToldAndMakesRoomBesideTheStuckLoads) {
  StuckStore p;
  test::QueueParts parts;
  parts.store_max_inflight = 2;
  ASSERT_NO_FATAL_FAILURE(p.open(4, 100'000'000, 16, std::move(parts)));
  auto h1 = p.hang(95001, kWaitMs);
  auto h2 = p.hang(95002, kWaitMs);
  ASSERT_TRUE(p.sent(2, kWaitMs)) << "the hung loads never went to the store";
  const Key k = test::key(95003, 0);
  OneKey b(3, k, kWaitMs);
  ASSERT_EQ(p.queue->submit(b.task), Result::kOk) << last_error();
  ASSERT_TRUE(b.task->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_FALSE(h1->task->done()) << "the hung task ended first";
  EXPECT_EQ(b.task->result(), Result::kOk) << b.task->error();
  EXPECT_EQ(sim_verify(k, b.dst.data(), kShard), kShard);
  EXPECT_GE(p.store->inflight_limit(), 4u) << "the store was not told of both stuck loads";
}

// A stuck load that the store then answers (650 ms late, before its
// deadline) lands as any load does, and gives back its stuck count; a dump's
// write-through the same. Nothing is counted in flight after them.
TEST(StuckIo, AStuckLoadOrWriteThatLandsEndsAsAnyOther) {
  StuckStore p;
  test::QueueParts parts;
  parts.store_hang_ms = 650;
  parts.store_hang_dumps = true;
  ASSERT_NO_FATAL_FAILURE(p.open(1, 100'000'000, 16, std::move(parts)));
  auto h = p.hang(96001, kWaitMs);
  ASSERT_TRUE(h->task->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_EQ(h->task->result(), Result::kOk) << h->task->error();
  EXPECT_EQ(sim_verify(test::key(96001, 0), h->dst.data(), kShard), kShard);
  std::vector<uint8_t> src(kShard);
  const Key d = test::key(96002, 0);
  sim_fill(d, src.data(), kShard);
  p.store->hang_key(d);
  std::vector<TaskEntry> es(1);
  es[0].key = d;
  es[0].src = src.data();
  auto dump = std::make_shared<Task>(2, TaskKind::kDump, std::move(es), deadline_after_ms(kWaitMs));
  ASSERT_EQ(p.queue->submit(dump), Result::kOk) << last_error();
  ASSERT_TRUE(dump->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_EQ(dump->result(), Result::kOk) << dump->error();
  EXPECT_TRUE(test::eventually("nothing left in flight", [&] { return p.queue->io_in_flight() == 0; }));
  EXPECT_EQ(p.queue->io_stuck(), 0u);
  EXPECT_EQ(p.queue->late_completions(), 0u);
  EXPECT_GE(p.store->inflight_limit(), 66u) << "the store was not told of the stuck load and write";
}

// A load the store has not started when its deadline passes is taken back
// (Backend::cancel): it never holds a thread or a place of the store's for
// a task nobody waits for. Here it waits for admission behind a hung load
// (the sim store admits one at a time).
TEST(StuckIo, TheStoreTakesBackAnExpiredLoadItHasNotStarted) {
  StuckStore p;
  test::QueueParts parts;
  parts.store_max_inflight = 1;
  ASSERT_NO_FATAL_FAILURE(p.open(4, QueueOptions{}.io_stuck_ns, 16, std::move(parts)));
  auto h = p.hang(97001, kWaitMs);
  ASSERT_TRUE(p.sent(1, kWaitMs)) << "the hung load never went to the store";
  OneKey b(2, test::key(97002, 0), 200);  // past its deadline before its load counts as stuck (250 ms)
  ASSERT_EQ(p.queue->submit(b.task), Result::kOk) << last_error();
  ASSERT_TRUE(b.task->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_EQ(b.task->result(), Result::kTimeout) << b.task->error();
  EXPECT_EQ(p.queue->cancelled_ios(), 1u);
  EXPECT_EQ(p.store->waiting(), 0u) << "the expired load still waits in the store";
  EXPECT_EQ(p.queue->io_in_flight(), 1u);  // the hung one
  // Its slot is free again: the key loads once the store admits it.
  OneKey c(3, test::key(97002, 0), kWaitMs);
  ASSERT_EQ(p.queue->submit(c.task), Result::kOk) << last_error();
  ASSERT_TRUE(c.task->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_EQ(c.task->result(), Result::kOk) << c.task->error();
  EXPECT_EQ(sim_verify(test::key(97002, 0), c.dst.data(), kShard), kShard);
}


// A write-through submitted just as the copier goes idle (its last task has
// just ended) is watched all the same: its dump fails at the task's deadline
// while the store holds the write. Before, the copier checked for I/Os in
// flight and then waited with no bound for a wake-up that the dispatcher
// could send between the two (track_io did not take the copier's mutex):
// the copier slept through the write's deadline, and the dump ended only
// when the store answered (with hang_ms 0, never). Many rounds, each its
// load ending right before its dump's write starts, to meet that moment.
TEST(StuckIo, AWriteSentAsTheCopierGoesIdleStillEndsAtItsDeadline) {
  StuckStore p;
  test::QueueParts parts;
  parts.store_hang_ms = 40;  // the late writes give their slots back
  parts.store_hang_dumps = true;
  ASSERT_NO_FATAL_FAILURE(p.open(4, QueueOptions{}.io_stuck_ns, 64, std::move(parts)));
  std::vector<uint8_t> src(kShard);
  std::mt19937 rng(std::random_device{}());  // jitter only: any seed sweeps the moment
  const uint64_t until = deadline_after_ms(static_cast<uint64_t>(2000 * test::test_time_multiplier()));
  uint32_t rounds = 0;
  for (; rounds < 2000 && now_ns() < until; ++rounds) {
    OneKey l(2 * rounds, test::key(98000 + rounds, 0), kWaitMs);
    const Key d = test::key(99000 + rounds, 0);
    sim_fill(d, src.data(), kShard);
    p.store->hang_key(d);
    std::vector<TaskEntry> es(1);
    es[0].key = d;
    es[0].src = src.data();
    auto dump = std::make_shared<Task>(2 * rounds + 1, TaskKind::kDump, std::move(es), deadline_after_ms(3));
    // The load's end and the write's start a varying few microseconds apart.
    ASSERT_EQ(p.queue->submit(l.task), Result::kOk) << last_error();
    const uint64_t spin_until = now_ns() + rng() % 20'000;
    while (now_ns() < spin_until) {
    }
    ASSERT_EQ(p.queue->submit(dump), Result::kOk) << last_error();
    ASSERT_TRUE(l.task->wait_until(deadline_after_ms(kWaitMs))) << "round " << rounds << ": the load";
    ASSERT_EQ(l.task->result(), Result::kOk) << l.task->error();
    // Its deadline is 3 ms away and the store answers after 40 ms: the
    // copier ends it at its deadline, or nothing ends it before the store.
    ASSERT_TRUE(dump->wait_until(deadline_after_ms(kWaitMs))) << "round " << rounds << ": the dump";
    ASSERT_EQ(dump->result(), Result::kTimeout)
        << "round " << rounds << ": the dump's write-through was not watched: it ended when the store answered ("
        << dump->error() << ")";
  }
  std::printf("%u rounds\n", rounds);
}

}  // namespace
}  // namespace ucm
