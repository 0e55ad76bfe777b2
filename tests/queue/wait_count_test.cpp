// QueueCounters::wait_ns (ucm_cache_stats' wait_ns): the time the copier's
// entries waited, counted once for every entry the copier ends, whatever ends
// it: its copy, a failure, its deadline, or the queue's stop. Some endings
// used to count nothing (a stop while the entry waited on a slot being
// filled, a dump whose key a look for a slot found to own, a stop while a
// dump waited for another write-through).
#include <unistd.h>

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "common/time.h"
#include "ctrl/slot_word.h"
#include "queue/counters.h"
#include "queue/queue_fixture.h"

namespace ucm {
namespace {

constexpr uint64_t kShard = 4096;
constexpr uint64_t kWaitMs = 20000;  // a hang, not slowness
constexpr uint64_t kHeldMs = 50;     // how long the entry surely waits before the stop

TEST(WaitCount, AnEntryEndedByTheStopCountsItsWait) {
  test::QueuePath p;
  test::QueueParts parts;
  parts.shard_bytes = kShard;
  ASSERT_NO_FATAL_FAILURE(p.open_alone(8, std::move(parts), kWaitMs));
  // The test owns K and never fills it: the queue's entry waits on its slot.
  const Key k = test::key(77001, 0);
  GetResult g;
  ASSERT_EQ(p.cache->get(k, &g), Result::kOk) << last_error();
  ASSERT_EQ(g.kind, GetKind::kOwner);
  std::vector<uint8_t> dst(kShard, 0xee);
  std::vector<TaskEntry> es(1);
  es[0].key = k;
  es[0].dst = dst.data();
  auto t = std::make_shared<Task>(1, TaskKind::kLoad, std::move(es), deadline_after_ms(kWaitMs));
  const uint64_t t0 = now_ns();
  ASSERT_EQ(p.queue->submit(t), Result::kOk) << last_error();
  const uint64_t until = deadline_after_ms(kWaitMs);
  while (!word_has_waiters(p.cache->word(g.slot)) && now_ns() < until) usleep(200);
  ASSERT_TRUE(word_has_waiters(p.cache->word(g.slot))) << "the copier never waited on K";
  usleep(kHeldMs * 1000);
  p.queue->stop();
  ASSERT_TRUE(t->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_EQ(t->result(), Result::kFinalized) << t->error();
  const uint64_t waited = now_ns() - t0;
  const uint64_t counted = queue_counters(p.planes.ctrl.rank(0)).wait_ns.load();
  EXPECT_GE(counted, kHeldMs * 1'000'000) << "the stopped entry's wait was not counted";
  EXPECT_LE(counted, waited) << "counted more than the entry waited";
  (void)p.cache->mark_failed(g.slot);
  p.cache->release(g.slot);
}

}  // namespace
}  // namespace ucm
