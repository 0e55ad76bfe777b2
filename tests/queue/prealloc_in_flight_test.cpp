// The prealloc pass waits for the node's loads in flight (issue 15 goal 1,
// design.md 9.1 step 6). With 4 ranks at window 2 the reserved pool (64)
// was held by up to 4 x io_depth (16) loads and the copies behind them when
// a dispatcher preallocated the next layer: the pass found no slot, and the
// pending task's shards missed into the regular pool, evicting what the next
// step would hit (1,100-1,200 loads against 1 rank's 1,081). A pool held by
// work in flight frees on its own, so the pass now waits for it, bounded by
// the task's deadline; the next task then takes every shard over.
//
// Step-synchronized, never timed: a peer (local rank 1, in this process)
// holds every reserved slot as the owner of a load; the test lets them go
// only once the dispatcher has swept the reserved pool again (its hand
// moved on past the first look), which the old pass, stopping at once,
// never did.
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_content.h"
#include "common/one_rank_queue.h"
#include "ctrl/clock.h"

namespace ucm {
namespace {

constexpr uint64_t kShard = 4096;
constexpr uint32_t kSpb = 8;       // shards per block
constexpr uint32_t kRegular = 8;   // regular slots
constexpr uint32_t kReserved = 4;  // reserved slots
constexpr uint32_t kBlocks = 3;    // blocks per task

struct InFlight : test::OneRankQueue {
  std::unique_ptr<CacheBuffer> peer;  // local rank 1
  std::vector<uint32_t> held;         // the peer's loads

  void open() {
    ASSERT_NO_FATAL_FAILURE(open_cache(test::params(kRegular, kReserved, kShard, kSpb, 2)));
    planes.ctrl.set_protect_grace_ms(1000);
    ASSERT_EQ(join_rank(planes.ctrl, 1, deadline_after_ms(10000)), Result::kOk) << last_error();
    CacheOptions o1;
    o1.rank = 1;
    peer = std::make_unique<CacheBuffer>(&planes.ctrl, &planes.data, o1);
  }
  std::shared_ptr<Task> task(uint64_t first_block, uint32_t n, uint32_t shard) {
    return load_task(first_block, n, shard, kShard);
  }
  void finish(const std::shared_ptr<Task>& t) { finish_verified(t, kShard); }
  // The regular pool full of last shards (nothing to prealloc after them),
  // loaded by a queue without prealloc.
  void fill_regular() {
    QueueOptions off;
    off.prealloc = false;
    new_queue(off);
    ASSERT_EQ(queue->start(), Result::kOk) << last_error();
    const auto fill = task(100, kRegular, kSpb - 1);
    ASSERT_EQ(queue->submit(fill), Result::kOk) << last_error();
    ASSERT_NO_FATAL_FAILURE(finish(fill));
  }
  // A queue with options o starts with two tasks pending: the next-to-last
  // shard of kBlocks blocks, then their last; both succeed.
  void run_two_pending(const QueueOptions& o) {
    new_queue(o);
    const auto t1 = task(0, kBlocks, kSpb - 2), t2 = task(0, kBlocks, kSpb - 1);
    ASSERT_EQ(queue->submit(t1), Result::kOk) << last_error();
    ASSERT_EQ(queue->submit(t2), Result::kOk) << last_error();
    ASSERT_EQ(queue->start(), Result::kOk) << last_error();
    ASSERT_NO_FATAL_FAILURE(finish(t1));
    ASSERT_NO_FATAL_FAILURE(finish(t2));
  }
  // The peer takes every reserved slot over and keeps loading into it.
  void peer_holds_the_reserved_pool() {
    for (uint32_t i = 0; i < kReserved; ++i) {
      PreallocOutcome o;
      ASSERT_EQ(peer->prealloc(test::key(500 + i, 0), &o), Result::kOk) << last_error();
      ASSERT_EQ(o, PreallocOutcome::kPlacedReserved);
      GetResult g;
      ASSERT_EQ(peer->get(test::key(500 + i, 0), &g), Result::kOk) << last_error();
      ASSERT_TRUE(g.took_prealloc);
      held.push_back(g.slot);
    }
  }
  // The peer's loads end (failed: no rank waits for them, nothing protects them).
  void peer_loads_end() {
    for (uint32_t s : held) {
      EXPECT_EQ(peer->mark_failed(s), Result::kOk) << last_error();
      peer->release(s);
    }
    held.clear();
  }
};

TEST(PreallocInFlight, APassThatFindsThePoolHeldByLoadsWaitsAndTheNextTaskTakesEveryShardOver) {
  InFlight w;
  ASSERT_NO_FATAL_FAILURE(w.open());
  ASSERT_NO_FATAL_FAILURE(w.fill_regular());
  ASSERT_NO_FATAL_FAILURE(w.peer_holds_the_reserved_pool());

  const RankCounters& c = w.cache->counters();
  const uint64_t made0 = c.prealloc_made.load(), used0 = c.prealloc_used.load(), ev0 = c.evictions.load();
  const uint64_t hand0 = w.planes.ctrl.globals().reserved_hand.load();
  QueueOptions on;
  on.prealloc = true;
  on.prealloc_wait_ns = 20'000'000'000;  // the tasks' deadline bounds it: the test, not a clock, ends the wait
  w.new_queue(on);
  const auto t1 = w.task(0, kBlocks, kSpb - 2), t2 = w.task(0, kBlocks, kSpb - 1);
  ASSERT_EQ(w.queue->submit(t1), Result::kOk) << last_error();
  ASSERT_EQ(w.queue->submit(t2), Result::kOk) << last_error();  // pending when t1 is dispatched
  ASSERT_EQ(w.queue->start(), Result::kOk) << last_error();
  // One look at the held pool moves the reserved hand by one sweep (every
  // phase over kReserved slots); a pass that looks again moves it further.
  const uint64_t one_sweep = 3ull * kReserved;
  const bool looked_again =
      test::eventually("the prealloc pass looking at the held pool again",
                       [&] { return w.planes.ctrl.globals().reserved_hand.load() >= hand0 + 2 * one_sweep; });
  w.peer_loads_end();
  ASSERT_NO_FATAL_FAILURE(w.finish(t1));
  ASSERT_NO_FATAL_FAILURE(w.finish(t2));
  EXPECT_TRUE(looked_again);
  EXPECT_EQ(c.prealloc_made.load() - made0, uint64_t{kBlocks}) << "(B0..B2, 7) preallocated once the loads ended";
  EXPECT_EQ(c.prealloc_used.load() - used0, uint64_t{kBlocks}) << "task 2 takes them over";
  EXPECT_EQ(c.evictions.load() - ev0, uint64_t{kBlocks}) << "only task 1's misses evict from the regular pool";
}

TEST(PreallocInFlight, APassWaitsNoLongerThanItsBoundForLoadsThatDoNotEnd) {
  // The peer's loads never end while the tasks run (a store that hangs): the
  // pass gives up after prealloc_wait_ns and the pending task's shards miss
  // into the regular pool, as with no wait at all. The outcome, not the time.
  InFlight w;
  ASSERT_NO_FATAL_FAILURE(w.open());
  ASSERT_NO_FATAL_FAILURE(w.fill_regular());
  ASSERT_NO_FATAL_FAILURE(w.peer_holds_the_reserved_pool());
  const RankCounters& c = w.cache->counters();
  const uint64_t made0 = c.prealloc_made.load(), ev0 = c.evictions.load();
  QueueOptions on;
  on.prealloc = true;
  on.prealloc_wait_ns = 1'000'000;
  ASSERT_NO_FATAL_FAILURE(w.run_two_pending(on));
  EXPECT_EQ(c.prealloc_made.load() - made0, 0u);
  EXPECT_EQ(c.evictions.load() - ev0, 2ull * kBlocks) << "both tasks' misses evict from the regular pool";
  w.peer_loads_end();
}

TEST(PreallocInFlight, APoolFullOfUnusedHintsStopsThePassAtOnce) {
  // Nothing in flight: the hints are the peer's, unused and young. The pass
  // does not wait (they free only when used, or when the grace passes) and
  // does not evict them; the pending task's shards miss into the regular pool.
  InFlight w;
  ASSERT_NO_FATAL_FAILURE(w.open());
  ASSERT_NO_FATAL_FAILURE(w.fill_regular());
  for (uint32_t i = 0; i < kReserved; ++i) {
    PreallocOutcome o;
    ASSERT_EQ(w.peer->prealloc(test::key(600 + i, 0), &o), Result::kOk) << last_error();
    ASSERT_EQ(o, PreallocOutcome::kPlacedReserved);
  }
  const RankCounters& c = w.cache->counters();
  const uint64_t made0 = c.prealloc_made.load();
  QueueOptions on;
  on.prealloc = true;
  ASSERT_NO_FATAL_FAILURE(w.run_two_pending(on));
  EXPECT_EQ(c.prealloc_made.load() - made0, 0u);
  for (uint32_t i = 0; i < kReserved; ++i)
    EXPECT_NE(test::resident_slot(w.planes.ctrl, test::key(600 + i, 0)), kNoSlot) << "the peer's hint " << i << " stays";
}

}  // namespace
}  // namespace ucm
