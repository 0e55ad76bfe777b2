// A key of which the store still holds two loads past their deadlines is
// not sent to the store again until the store returns one: a task that asks
// for it meanwhile fails at once, naming them. Each retry of one hung key used
// to send another load that hung too, and each held a slot of its own
// (pinned until the store lets go of it, so that a late write cannot land in
// another key's bytes) and, in the posix store's thread engine, an I/O
// thread: one bad file asked for again and again took the cache's slots and
// the store's threads one by one (an adversarial run on 4 slots: 47 of 144
// tasks failed, most with NoSpace). One retry is still sent (a store that
// recovered answers it: Hang.ALateCompletionWritesNoWrongByteAndLeaksNothing);
// once the store returns a late load, the key loads again.
#include <unistd.h>

#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_content.h"
#include "common/test_util.h"
#include "common/time.h"
#include "queue/counters.h"
#include "queue/queue_fixture.h"

namespace ucm {
namespace {

using test::OneKey;

constexpr uint64_t kShard = 4096;
constexpr uint64_t kWaitMs = 20000;  // a hang, not slowness
constexpr uint64_t kFirstMs = 300;   // the first task's deadline: its load expires then
constexpr uint64_t kHangMs = 3000;   // the store returns each load of the hung key this late

uint32_t slots_pinned(const test::QueuePath& p) {
  uint32_t n = 0;
  for (uint32_t s = 0; s < p.planes.ctrl.total_slots(); ++s) n += p.planes.ctrl.pin(0, s).load() != 0;
  return n;
}

// A queue alone over 8 slots whose sim store hangs every load of key `h`
// (each returned kHangMs late).
struct HungStore : test::QueuePath {
  Key h;
  void open(uint64_t block) {
    test::QueueParts parts;
    parts.shard_bytes = kShard;
    parts.store_hang_ms = kHangMs;
    ASSERT_NO_FATAL_FAILURE(open_alone(8, std::move(parts), kWaitMs));
    h = test::key(block, 0);
    store->hang_key(h);
  }
  const QueueCounters& ctr() const { return queue_counters(planes.ctrl.rank(0)); }
  // Submits the task and waits for its end.
  void run(const OneKey& k) {
    ASSERT_EQ(queue->submit(k.task), Result::kOk) << last_error();
    ASSERT_TRUE(k.task->wait_until(deadline_after_ms(kWaitMs)));
  }
};

TEST(HungKey, IsNotSentAgainWhileTheStoreHoldsTwoExpiredLoads) {
  HungStore p;
  ASSERT_NO_FATAL_FAILURE(p.open(78001));
  const Key h = p.h;
  const QueueCounters& ctr = p.ctr();
  OneKey a(1, h, kFirstMs);
  ASSERT_NO_FATAL_FAILURE(p.run(a));
  EXPECT_EQ(a.task->result(), Result::kTimeout) << a.task->error();
  ASSERT_EQ(ctr.backend_loads.load(), 1u);
  ASSERT_EQ(p.queue->late_completions(), 0u) << "the store returned the hung load before the test asked again";
  // One retry goes to the store (it hangs too, and expires).
  OneKey b(2, h, kFirstMs);
  ASSERT_NO_FATAL_FAILURE(p.run(b));
  EXPECT_EQ(b.task->result(), Result::kTimeout) << b.task->error();
  ASSERT_EQ(ctr.backend_loads.load(), 2u) << "the retry did not go to the store";
  ASSERT_EQ(p.queue->late_completions(), 0u) << "the store returned a hung load before the test asked again";
  // Asked again while the store holds both: not sent.
  OneKey c(3, h, kWaitMs);
  ASSERT_NO_FATAL_FAILURE(p.run(c));
  EXPECT_EQ(c.task->result(), Result::kBackend) << c.task->error();
  EXPECT_NE(c.task->error().find("earlier loads"), std::string::npos) << c.task->error();
  const std::string& why = c.task->error();
  const size_t first = why.find("shard 0");
  EXPECT_TRUE(first != std::string::npos && why.find("shard 0", first + 1) == std::string::npos)
      << "the key is named once: " << why;
  EXPECT_EQ(ctr.backend_loads.load(), 2u) << "a third load of the hung key went to the store";
  EXPECT_EQ(slots_pinned(p), 2u) << "only the two hung loads' slots stay pinned by the store";
  // The store answers new loads again, and returns the first (late): the key loads again.
  p.store->clear_faults();
  const uint64_t until = deadline_after_ms(kWaitMs);
  while (p.queue->late_completions() == 0 && now_ns() < until) usleep(1000);
  ASSERT_GE(p.queue->late_completions(), 1u) << "the store never returned a hung load";
  OneKey d(4, h, kWaitMs);
  ASSERT_NO_FATAL_FAILURE(p.run(d));
  EXPECT_EQ(d.task->result(), Result::kOk) << d.task->error();
  EXPECT_EQ(sim_verify(h, d.dst.data(), kShard), kShard);
  EXPECT_EQ(ctr.backend_loads.load(), 3u);
}

// The same refusal on the copier's path: entries that waited on the hung
// load's slot get the key again when that load expires. B (deadline 2 x
// kFirstMs) becomes the owner and sends the retry; C (long deadline) waits on
// it, and when the retry expires too, C would own a third load: it fails at
// once instead, naming the two.
TEST(HungKey, AWaitingEntryThatComesToOwnItIsRefusedToo) {
  HungStore p;
  ASSERT_NO_FATAL_FAILURE(p.open(78002));
  const Key h = p.h;
  const QueueCounters& ctr = p.ctr();
  OneKey a(1, h, kFirstMs), b(2, h, 2 * kFirstMs), c(3, h, kWaitMs);
  ASSERT_EQ(p.queue->submit(a.task), Result::kOk) << last_error();
  ASSERT_EQ(p.queue->submit(b.task), Result::kOk) << last_error();
  ASSERT_EQ(p.queue->submit(c.task), Result::kOk) << last_error();
  ASSERT_TRUE(c.task->wait_until(deadline_after_ms(kWaitMs)));
  ASSERT_EQ(p.queue->late_completions(), 0u) << "the store returned a hung load before C ended";
  EXPECT_EQ(a.task->result(), Result::kTimeout) << a.task->error();
  EXPECT_EQ(b.task->result(), Result::kTimeout) << b.task->error();
  EXPECT_EQ(c.task->result(), Result::kBackend) << c.task->error();
  EXPECT_NE(c.task->error().find("earlier loads"), std::string::npos) << c.task->error();
  EXPECT_EQ(ctr.backend_loads.load(), 2u) << "the copier sent a third load of the hung key";
  EXPECT_EQ(slots_pinned(p), 2u) << "only the two hung loads' slots stay pinned by the store";
}

}  // namespace
}  // namespace ucm
