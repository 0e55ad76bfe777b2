// The queue and the stores it runs on at the moments one thread's state
// change meets another's teardown (helper-20's review, session 24).
//
// A store's shutdown() returning 0 says "idle: may be destroyed" and
// "completed every request still queued" (backend.h). Cache::release_local
// relies on it: when a store call is still stuck (calls_left_ > 0) it keeps
// the store for that thread, never destroys it, and then frees the
// LoadQueue, the CacheBuffer and the data plane (fenced only when the I/O
// threads are left, io_left_ > 0). A store that still completes a request
// after shutdown() returned 0 then calls LoadQueue::on_io_done on a freed
// queue, and the sim store writes the shard into an unmapped data plane.
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_backend.h"
#include "common/hang_guard.h"
#include "common/test_util.h"
#include "common/time.h"
#include "ctrl/layout.h"
#include "queue/queue_fixture.h"

namespace ucm {
namespace {

using test::OneKey;

constexpr uint64_t kShard = 4096;
constexpr uint64_t kWaitMs = 20000;  // a hang, not slowness

// A load the store holds (hang_ms) past its task's deadline is expired by
// the queue and stays in the store, overdue. Finalize's order follows
// (Cache::release_local): the queue stops, the store shuts down. A store
// that says 0 threads are left has completed everything: the late
// completion has reached the queue by then, not after (when the queue may
// be gone).
TEST(StoreShutdown, AStoreThatShutDownWithNoThreadLeftCompletesNothingAfterwards) {
  test::QueuePath p;
  test::QueueParts parts;
  parts.shard_bytes = kShard;
  parts.store_hang_ms = 60'000;  // far past the test: only shutdown() can end it
  ASSERT_NO_FATAL_FAILURE(p.open_alone(16, std::move(parts), kWaitMs));
  const Key k = test::key(77001, 0);
  p.store->hang_key(k);
  OneKey l(1, k, 200);  // sent at once, and expired while the store holds it
  ASSERT_EQ(p.queue->submit(l.task), Result::kOk) << last_error();
  ASSERT_TRUE(l.task->wait_until(deadline_after_ms(kWaitMs))) << "the load never ended";
  EXPECT_EQ(l.task->result(), Result::kTimeout) << l.task->error();
  ASSERT_TRUE(test::eventually("the queue's expiry of the hung load", [&] { return p.queue->expired_ios() == 1; }));
  ASSERT_EQ(p.queue->cancelled_ios(), 0u) << "the sim store had admitted it: not taken back";
  EXPECT_EQ(p.queue->late_completions(), 0u);

  p.queue->stop();
  const uint32_t left = p.store->shutdown(deadline_after_ms(kWaitMs));
  ASSERT_EQ(left, 0u) << "the sim store has no thread that can be stuck in the kernel";
  // 0: idle, every request completed (backend.h). The overdue load's
  // completion must have come (as a late one) before shutdown returned.
  EXPECT_EQ(p.queue->late_completions(), 1u)
      << "shutdown() returned 0 with the overdue load still in the store: it completes later into whatever "
         "the caller freed after shutdown (Cache::release_local frees the queue, the cache and the data plane "
         "while it keeps a store whose synchronous call is stuck)";
  EXPECT_EQ(p.queue->io_in_flight(), 0u);
}

// The same contract for a request the store had not even admitted (over
// max_inflight) and for one in its latency: each gets its one completion
// before shutdown() returns 0.
TEST(StoreShutdown, AStoreShutDownCompletesEveryRequestItHeldBeforeItReturns) {
  test::QueuePath p;
  test::QueueParts parts;
  parts.shard_bytes = kShard;
  parts.store_latency_us = 60'000'000;  // admitted, and due long after the test
  parts.store_max_inflight = 1;         // the second waits for admission
  ASSERT_NO_FATAL_FAILURE(p.open_alone(16, std::move(parts), kWaitMs));  // the queue sends nothing here
  struct Done {
    std::atomic<uint32_t> n{0};
    static void count(IoRequest* r) { static_cast<Done*>(r->user)->n.fetch_add(1); }
  } done;
  std::vector<uint8_t> a(kShard), b(kShard);
  IoRequest ra, rb;
  for (IoRequest* r : {&ra, &rb}) {
    r->buf = r == &ra ? a.data() : b.data();
    r->bytes = kShard;
    r->done = &Done::count;
    r->user = &done;
  }
  ra.key = test::key(77101, 0);
  rb.key = test::key(77102, 0);
  p.store->load(&ra);
  p.store->load(&rb);
  ASSERT_EQ(p.store->waiting(), 1u);
  const uint32_t left = p.store->shutdown(deadline_after_ms(kWaitMs));
  ASSERT_EQ(left, 0u);
  EXPECT_EQ(done.n.load(), 2u) << "shutdown() returned 0 with requests still held: they complete later, if ever, "
                                  "into buffers and callers the shutdown's caller may have freed";
  EXPECT_NE(ra.result, Result::kOk);
  EXPECT_NE(rb.result, Result::kOk);
  // The requests live on this stack: the store's destruction must not
  // complete them again.
  p.store.reset();
  EXPECT_EQ(done.n.load(), 2u) << "a request completed twice";
}


// Two write-throughs of one dump task expire in one pass of expire_due_ios
// while the store still holds them (not taken back): the pass ends them one
// after the other (end_expired: finish_write(slot, false), then the entry's
// failure), with io_mu_ released. Each write's I/O pin is its slot's only
// reference, and the store's late completion drops it (drop_late) at any
// time: a slot whose write is not ended yet may then be evicted (CLOCK takes
// an unstored slot when nothing else is free), re-keyed, and written by this
// rank again; the pass's stale finish_write then ends that new write as
// failed. The task's on_failed hook holds the pass between the two ends, so
// the moment is met every run.
TEST(ExpiredWrite, AnExpiredWriteThroughEndsOnlyItsOwnWriteNotTheNextKeysOfItsSlot) {
  test::QueuePath p;
  test::QueueParts parts;
  parts.shard_bytes = kShard;
  parts.store_hang_ms = 300;  // late: after the task's deadline
  parts.store_hang_dumps = true;
  ASSERT_NO_FATAL_FAILURE(p.open_alone(2, std::move(parts), kWaitMs));
  const Key keys[2] = {test::key(78001, 0), test::key(78002, 0)};
  std::vector<uint8_t> src(kShard, 0x5a);
  std::vector<TaskEntry> es(2);
  for (int i = 0; i < 2; ++i) {
    p.store->hang_key(keys[i]);
    es[i].key = keys[i];
    es[i].src = src.data();
  }
  auto dump = std::make_shared<Task>(1, TaskKind::kDump, std::move(es), deadline_after_ms(100));
  std::atomic<int> first{-1};
  std::atomic<bool> go{false};
  dump->set_on_failed([&](uint32_t i, Result, const std::string&) {
    int none = -1;
    if (!first.compare_exchange_strong(none, static_cast<int>(i))) return;
    const uint64_t until = deadline_after_ms(kWaitMs);
    while (!go.load() && now_ns() < until) usleep(1000);
  });
  ASSERT_EQ(p.queue->submit(dump), Result::kOk) << last_error();
  ASSERT_TRUE(test::eventually("the first expired write's end", [&] { return first.load() >= 0; }));
  ASSERT_EQ(p.queue->expired_ios(), 2u) << "both writes are expired in one pass";
  const int held = first.load();
  const Key victim = keys[1 - held];
  // Both late completions land (each drops its I/O's pin); the held one's
  // slot is pinned here, so the victim's is the only one a miss can take.
  ASSERT_TRUE(test::eventually("the late completions", [&] { return p.queue->late_completions() == 2; }));
  GetFor f;
  f.take = false;
  f.wait_self = false;
  f.deadline_ns = deadline_after_ms(kWaitMs);
  GetResult pin;
  ASSERT_EQ(p.cache->get(keys[held], &pin, f), Result::kOk) << last_error();
  ASSERT_EQ(pin.kind, GetKind::kHit);
  GetResult next;
  const Result r = p.cache->get(test::key(78003, 0), &next, f);
  bool rekeyed = false;
  if (r == Result::kOk) {
    ASSERT_EQ(next.kind, GetKind::kOwner);
    rekeyed = true;
    ASSERT_EQ(p.cache->mark_ready_for_write(next.slot), Result::kOk) << last_error();  // this rank writes key 78003
  } else {
    EXPECT_EQ(r, Result::kNoSpace) << last_error();  // the victim's slot is still its expired write's
  }
  go.store(true);
  ASSERT_TRUE(dump->wait_until(deadline_after_ms(kWaitMs)));
  EXPECT_EQ(dump->result(), Result::kTimeout) << dump->error();
  if (rekeyed) {
    const uint32_t sw = p.cache->stored_word(next.slot);
    EXPECT_EQ(static_cast<StoreState>(sw & kStoredStateMask), StoreState::kWriting)
        << "slot " << next.slot << " (key " << victim.block.lo
        << "'s before) was re-keyed and is being written by this rank: the expired write's stale end failed that "
           "new write (stored word 0x"
        << std::hex << sw << ")";
    (void)p.cache->finish_write(next.slot, true);
    p.cache->release(next.slot);
  }
  p.cache->release(pin.slot);
}

}  // namespace
}  // namespace ucm
