// The inline path (queue/load_queue.h): a load task whose every entry is a
// hit is copied and finished by the thread that submits it, over the host
// engine: done when submit() returns, without the dispatcher (no hand-off,
// not queued), with the same stats and byte-exact destinations. A task with
// one entry that is not a hit goes the queue's way whole, its hits counted
// once. Another engine, or inline_hits off, never takes it.
#include <atomic>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_content.h"
#include "common/stress.h"
#include "common/test_util.h"
#include "ctrl/recovery.h"
#include "device/host_engine.h"
#include "queue/counters.h"
#include "queue/queue_fixture.h"

namespace ucm {
namespace {

constexpr uint64_t kShard = 4096;
constexpr uint64_t kWaitMs = 20000;  // a hang, not slowness

uint64_t latency_count(const QueueCounters& c) {
  uint64_t n = 0;
  for (uint32_t i = 0; i < kLatencyBuckets; ++i) n += c.latency_us[i].load();
  return n;
}

struct Rank : test::QueuePath {
  void open(bool inline_hits, std::unique_ptr<CopyEngine> eng = make_host_engine(0)) {
    test::QueueParts p;
    p.shard_bytes = kShard;
    p.queue.inline_hits = inline_hits;
    p.engine = std::move(eng);
    open_alone(128, std::move(p), kWaitMs);
  }
  const QueueCounters& ctr() const { return queue_counters(planes.ctrl.rank(0)); }
  // Until the queue's threads are done with the first `n` load tasks: the
  // dispatcher has finished dispatching them (tasks_passed) and the copier
  // has dropped their pins. A task is done when its copies are, which can be
  // just before the copier releases the last pin.
  void settle(uint32_t n) const {
    const uint64_t until = deadline_after_ms(kWaitMs);
    while ((planes.ctrl.rank(0).tasks_passed.load() != n || cache->references_held() != 0) && now_ns() < until)
      std::this_thread::yield();
    ASSERT_EQ(planes.ctrl.rank(0).tasks_passed.load(), n) << "the dispatcher never finished task " << n - 1;
    ASSERT_EQ(cache->references_held(), 0) << "the queue kept a reference after its tasks were done";
  }
  // Every hit of this rank: the cache's get() (RankCounters) and the inline path's.
  uint64_t hits() const { return planes.ctrl.rank(0).counters.hits.load() + ctr().inline_hits.load(); }
};

// A task over blocks [first, first + n) with its own destinations.
struct Job {
  std::vector<std::vector<uint8_t>> dst;
  std::shared_ptr<Task> task;
  uint64_t first = 0;

  Job(uint64_t first_block, uint32_t n) : dst(n, std::vector<uint8_t>(kShard, 0xee)), first(first_block) {
    std::vector<TaskEntry> es(n);
    for (uint32_t i = 0; i < n; ++i) {
      es[i].key = test::key(first + i, 0);
      es[i].dst = dst[i].data();
    }
    task = std::make_shared<Task>(1, TaskKind::kLoad, std::move(es), deadline_after_ms(kWaitMs));
  }
  bool exact() const {
    for (size_t i = 0; i < dst.size(); ++i)
      if (sim_verify(test::key(first + i, 0), dst[i].data(), kShard) != kShard) return false;
    return true;
  }
  void finish() const {
    ASSERT_TRUE(task->wait_until(deadline_after_ms(kWaitMs)));
    ASSERT_EQ(task->result(), Result::kOk) << task->error();
  }
};

TEST(Inline, AnAllHitTaskIsDoneWhenSubmitReturnsWithoutTheDispatcher) {
  Rank r;
  ASSERT_NO_FATAL_FAILURE(r.open(true));
  ASSERT_TRUE(r.queue->inline_enabled());
  Job cold(100, 64);
  ASSERT_EQ(r.queue->submit(cold.task), Result::kOk) << last_error();
  ASSERT_NO_FATAL_FAILURE(cold.finish());  // misses: the queue's way
  ASSERT_NO_FATAL_FAILURE(r.settle(1));
  EXPECT_EQ(r.queue->queued_tasks(), 1u);
  EXPECT_EQ(r.ctr().inline_tasks.load(), 0u);

  for (uint32_t n : {1u, 64u}) {
    const uint64_t handoffs = r.queue->handoffs(), queued = r.queue->queued_tasks();
    const uint64_t tasks = r.ctr().tasks.load(), shards = r.ctr().shards.load(), hits = r.hits();
    const uint64_t bytes = r.ctr().bytes_to_device.load(), lat = latency_count(r.ctr());
    const uint64_t inlined = r.ctr().inline_tasks.load();
    Job warm(100, n);
    ASSERT_EQ(r.queue->submit(warm.task), Result::kOk) << last_error();
    EXPECT_TRUE(warm.task->done()) << n << " hits: done when submit returns";
    EXPECT_EQ(warm.task->result(), Result::kOk) << warm.task->error();
    EXPECT_TRUE(warm.exact());
    EXPECT_EQ(r.queue->handoffs(), handoffs) << "nothing was handed to the copier";
    EXPECT_EQ(r.queue->queued_tasks(), queued) << "the dispatcher never saw it";
    EXPECT_EQ(r.ctr().inline_tasks.load(), inlined + 1);
    EXPECT_EQ(r.ctr().tasks.load(), tasks + 1);
    EXPECT_EQ(r.ctr().shards.load(), shards + n);
    EXPECT_EQ(r.hits(), hits + n);
    EXPECT_EQ(r.ctr().bytes_to_device.load(), bytes + n * kShard);
    EXPECT_EQ(latency_count(r.ctr()), lat + 1) << "its latency is in the histogram";
    EXPECT_EQ(r.cache->references_held(), 0) << "every pin it took is released";
    EXPECT_TRUE(warm.task->wait_until(deadline_after_ms(0))) << "a wait returns at once";
  }
}

TEST(Inline, APartialHitTaskGoesTheQueuesWayWholeAndCountsItsHitsOnce) {
  Rank r;
  ASSERT_NO_FATAL_FAILURE(r.open(true));
  Job cold(200, 63);
  ASSERT_EQ(r.queue->submit(cold.task), Result::kOk) << last_error();
  ASSERT_NO_FATAL_FAILURE(cold.finish());
  const uint64_t queued = r.queue->queued_tasks(), hits = r.hits();
  const uint64_t loads = r.ctr().backend_loads.load(), bytes = r.ctr().bytes_to_device.load();
  Job mixed(200, 64);  // blocks 200..262 are hits, 263 is not
  ASSERT_EQ(r.queue->submit(mixed.task), Result::kOk) << last_error();
  ASSERT_NO_FATAL_FAILURE(mixed.finish());
  EXPECT_TRUE(mixed.exact());
  EXPECT_EQ(r.queue->queued_tasks(), queued + 1);
  EXPECT_EQ(r.ctr().inline_tasks.load(), 0u);
  EXPECT_EQ(r.hits(), hits + 63) << "the look at the hits before the miss is not counted";
  EXPECT_EQ(r.ctr().backend_loads.load(), loads + 1);
  EXPECT_EQ(r.ctr().bytes_to_device.load(), bytes + 64 * kShard);
  r.queue->stop();  // the copier's pins are dropped by now; so are the look's
  EXPECT_EQ(r.cache->references_held(), 0);
}

TEST(Inline, OffWithoutInlineHitsOrOverAnotherEngine) {
  for (int variant = 0; variant < 2; ++variant) {
    Rank r;
    if (variant == 0) {
      ASSERT_NO_FATAL_FAILURE(r.open(false));
    } else {
      ASSERT_NO_FATAL_FAILURE(r.open(true, make_async_test_engine(0, AsyncTestOptions{})));
    }
    EXPECT_FALSE(r.queue->inline_enabled());
    for (int round = 0; round < 2; ++round) {
      Job j(300, 8);
      ASSERT_EQ(r.queue->submit(j.task), Result::kOk) << last_error();
      ASSERT_NO_FATAL_FAILURE(j.finish());
      EXPECT_TRUE(j.exact());
    }
    EXPECT_EQ(r.queue->queued_tasks(), 2u) << "variant " << variant << ": the warm task was queued too";
    EXPECT_EQ(r.ctr().inline_tasks.load(), 0u);
  }
}

// The inline path drops exactly the pins it took, from its own pin row: on a
// slot whose load this rank finished and still holds (the hold, slot_word.h),
// the slot's word is left as it was (not written, nobody woken), and the hold
// stays for the release() that owns it.
TEST(Inline, AHitOnASlotThisRankHoldsDropsItsOwnPinAndLeavesTheWordAlone) {
  Rank r;
  ASSERT_NO_FATAL_FAILURE(r.open(true));
  const Key k = test::key(500, 0);
  GetResult g;
  ASSERT_EQ(r.cache->get(k, &g), Result::kOk) << last_error();
  ASSERT_EQ(g.kind, GetKind::kOwner);
  sim_fill(k, r.cache->data_at(g.slot), kShard);
  ASSERT_EQ(r.cache->mark_ready(g.slot), Result::kOk) << last_error();
  const uint32_t word = r.planes.ctrl.slot(g.slot).word.load();
  ASSERT_TRUE(word_held(word)) << "a finished load keeps its hold until released";
  for (int round = 0; round < 2; ++round) {
    Job warm(500, 1);
    ASSERT_EQ(r.queue->submit(warm.task), Result::kOk) << last_error();
    ASSERT_TRUE(warm.task->done()) << "an all-hit task, inline";
    EXPECT_TRUE(warm.exact());
    EXPECT_EQ(r.planes.ctrl.slot(g.slot).word.load(), word) << "the word is not written: the hold is the owner's";
    EXPECT_EQ(r.planes.ctrl.pin(0, g.slot).load(), 0u) << "the inline pin is gone";
    EXPECT_EQ(r.cache->references_held(), 1) << "the hold, no more";
  }
  r.cache->release(g.slot);
  EXPECT_FALSE(word_held(r.planes.ctrl.slot(g.slot).word.load()));
  EXPECT_EQ(r.cache->references_held(), 0);
}

// Two app threads copy the same warm slots inline while a third loads fresh
// keys through the queue into a cache too small for both, so evictors claim
// slots between and under the hitters' pins (pins.h, the Dekker pair): every
// task ends exact, by either path, and every reference is dropped.
TEST(Inline, ThreadsHittingSlotsThatMissesEvictCopyExactBytesAndDropEveryPin) {
  Rank r;
  ASSERT_NO_FATAL_FAILURE(r.open(true));
  const int rounds = test::stress_rounds(200);
  std::atomic<int> bad{0};
  auto hitter = [&] {
    for (int i = 0; i < rounds; ++i) {
      Job j(600, 48);
      if (r.queue->submit(j.task) != Result::kOk || !j.task->wait_until(deadline_after_ms(kWaitMs)) ||
          j.task->result() != Result::kOk || !j.exact())
        ++bad;
    }
  };
  auto loader = [&] {
    for (int i = 0; i < rounds; ++i) {
      Job j(10000 + static_cast<uint64_t>(i) * 40, 40);  // 48 + 40 + 40 > 128 slots: evictions
      if (r.queue->submit(j.task) != Result::kOk || !j.task->wait_until(deadline_after_ms(kWaitMs)) ||
          j.task->result() != Result::kOk || !j.exact())
        ++bad;
    }
  };
  std::thread a(hitter), b(hitter), c(loader);
  a.join();
  b.join();
  c.join();
  EXPECT_EQ(bad.load(), 0) << "tasks that failed or copied wrong bytes";
  EXPECT_GT(r.ctr().inline_tasks.load(), 0u) << "some hits went inline";
  r.queue->stop();
  EXPECT_EQ(r.cache->references_held(), 0);
  for (uint32_t i = 0; i < r.planes.ctrl.total_slots(); ++i) EXPECT_EQ(r.planes.ctrl.pin(0, i).load(), 0u) << "slot " << i;
}

TEST(Inline, AStoppedQueueRefusesEvenAnAllHitTask) {
  Rank r;
  ASSERT_NO_FATAL_FAILURE(r.open(true));
  Job cold(400, 4);
  ASSERT_EQ(r.queue->submit(cold.task), Result::kOk) << last_error();
  ASSERT_NO_FATAL_FAILURE(cold.finish());
  r.queue->stop();
  Job warm(400, 4);
  EXPECT_EQ(r.queue->submit(warm.task), Result::kFinalized);
  EXPECT_FALSE(warm.task->done());
  for (const auto& d : warm.dst) EXPECT_EQ(d[0], 0xee) << "nothing is written after stop";
}

}  // namespace
}  // namespace ucm
