// Scenario E with a pipeline window (issue 15, goal 2): an engine that keeps
// two layer tasks in flight has the next task pending while the dispatcher
// finishes the current one, so an idle window never comes. The dispatcher
// still preallocates (block, shard + 1) for the task it finished, bounded by
// one pass, and the pending task takes those slots over without evicting.
//
// Step-synchronized, never timed: both tasks are submitted before the queue
// starts, so the second is pending while the first is dispatched, every run.
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_content.h"
#include "common/one_rank_queue.h"

namespace ucm {
namespace {

constexpr uint64_t kShard = 4096;
constexpr uint32_t kSpb = 8;        // shards per block
constexpr uint32_t kRegular = 16;   // regular slots
constexpr uint32_t kReserved = 16;  // reserved slots
constexpr uint32_t kBlocks = 3;     // blocks per task

struct Window : test::OneRankQueue {

  void open() { open_cache(test::params(kRegular, kReserved, kShard, kSpb, 1)); }
  // A fresh queue (not started yet) on the same cache.
  void fresh_queue(bool prealloc) {
    QueueOptions qo;
    qo.prealloc = prealloc;
    OneRankQueue::new_queue(qo);
  }
  std::shared_ptr<Task> task(uint64_t first_block, uint32_t n, uint32_t shard) {
    return load_task(first_block, n, shard, kShard);
  }
  void finish(const std::shared_ptr<Task>& t) { finish_verified(t, kShard); }
};

struct Counts {
  uint64_t made = 0, used = 0, evictions = 0;
};

// Fills the regular pool with the last shard of 16 blocks (nothing to
// prealloc after those), then runs task 1 (B0..B2, shard 6) with task 2
// (B0..B2, shard 7) already pending. The counts are task 1 and 2's together;
// task 2's shards are the last of their blocks, so nothing follows them.
Counts two_tasks_in_flight(Window* w, bool prealloc) {
  Counts out;
  w->fresh_queue(false);
  EXPECT_EQ(w->queue->start(), Result::kOk) << last_error();
  const auto fill = w->task(100, kRegular, kSpb - 1);
  EXPECT_EQ(w->queue->submit(fill), Result::kOk) << last_error();
  w->finish(fill);
  const RankCounters& c = w->cache->counters();
  const uint64_t made0 = c.prealloc_made.load(), used0 = c.prealloc_used.load(), ev0 = c.evictions.load();

  w->fresh_queue(prealloc);
  const auto t1 = w->task(0, kBlocks, kSpb - 2), t2 = w->task(0, kBlocks, kSpb - 1);
  EXPECT_EQ(w->queue->submit(t1), Result::kOk) << last_error();
  EXPECT_EQ(w->queue->submit(t2), Result::kOk) << last_error();  // pending when t1 is dispatched
  EXPECT_EQ(w->queue->start(), Result::kOk) << last_error();
  w->finish(t1);
  w->finish(t2);
  out.made = c.prealloc_made.load() - made0;
  out.used = c.prealloc_used.load() - used0;
  out.evictions = c.evictions.load() - ev0;
  return out;
}

TEST(PreallocWindow, ANextTaskAlreadyPendingStillFindsItsShardsPreallocated) {
  Window w;
  ASSERT_NO_FATAL_FAILURE(w.open());
  const Counts on = two_tasks_in_flight(&w, true);
  EXPECT_EQ(on.made, kBlocks) << "(B0,7), (B1,7), (B2,7) preallocated although task 2 was pending";
  EXPECT_EQ(on.used, kBlocks) << "task 2 takes the three idle slots over";
  EXPECT_EQ(on.evictions, kBlocks) << "task 1's misses evict; task 2's find no victim to look for";
}

TEST(PreallocWindow, WithoutPreallocTheSecondTaskEvictsAsWell) {
  // The control: the same two tasks evict twice as many from the full regular pool.
  Window w;
  ASSERT_NO_FATAL_FAILURE(w.open());
  const Counts off = two_tasks_in_flight(&w, false);
  EXPECT_EQ(off.made, 0u);
  EXPECT_EQ(off.used, 0u);
  EXPECT_EQ(off.evictions, 2 * kBlocks);
}

}  // namespace
}  // namespace ucm
