// The dispatcher hands entries to the copier in batches: one lock and one
// wake for many entries (issue 15, goal 3), never per entry, and never held
// back while the dispatcher waits for anything.
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_content.h"
#include "queue/queue_fixture.h"

namespace ucm {
namespace {

constexpr uint64_t kShard = 4096;
constexpr uint32_t kEntries = 64;

struct OneRank : test::QueuePath {
  void open(uint32_t slots, uint32_t io_depth) {
    test::QueueParts p;
    p.shard_bytes = kShard;
    p.queue.io_depth = io_depth;
    open_alone(slots, std::move(p));
  }
  // One task over blocks [first, first + n); true when every entry holds its bytes.
  bool run(uint64_t first, uint32_t n) {
    std::vector<std::vector<uint8_t>> dst(n, std::vector<uint8_t>(kShard));
    std::vector<TaskEntry> es(n);
    for (uint32_t i = 0; i < n; ++i) {
      es[i].key = test::key(first + i, 0);
      es[i].dst = dst[i].data();
    }
    auto t = std::make_shared<Task>(1, TaskKind::kLoad, std::move(es), deadline_after_ms(20000));
    EXPECT_EQ(queue->submit(t), Result::kOk) << last_error();
    EXPECT_TRUE(t->wait_until(deadline_after_ms(20000)));
    EXPECT_EQ(t->result(), Result::kOk) << t->error();
    bool ok = true;
    for (uint32_t i = 0; i < n; ++i) ok = ok && sim_verify(test::key(first + i, 0), dst[i].data(), kShard) == kShard;
    return ok;
  }
};

TEST(Handoff, AWarmTaskReachesTheCopierInBatchesNotPerEntry) {
  OneRank r;
  ASSERT_NO_FATAL_FAILURE(r.open(2 * kEntries, 16));
  ASSERT_TRUE(r.run(100, kEntries));  // cold: loads
  const uint64_t before = r.queue->handoffs();
  ASSERT_TRUE(r.run(100, kEntries));  // warm: every entry a hit
  const uint64_t handoffs = r.queue->handoffs() - before;
  EXPECT_GE(handoffs, 1u);
  EXPECT_LE(handoffs, 2u) << kEntries << " hits in at most two hand-offs of 32, not one per entry";
}

TEST(Handoff, ADispatcherWaitingForIoDepthHasHandedOverWhatItHolds) {
  // io_depth 1: the dispatcher waits for each load's place; the copier must
  // already hold the entries before it (else nothing could go out).
  OneRank r;
  ASSERT_NO_FATAL_FAILURE(r.open(2 * kEntries, 1));
  ASSERT_TRUE(r.run(300, kEntries));
}

TEST(Handoff, ADispatcherBackingOffForSpaceHasHandedOverWhatItHolds) {
  // A cache of 8 slots and a task of 64: every slot is pinned by entries the
  // copier has to copy before the dispatcher can go on; it hands them over
  // before it backs off (else this would end only at the deadline).
  OneRank r;
  ASSERT_NO_FATAL_FAILURE(r.open(8, 16));
  ASSERT_TRUE(r.run(500, kEntries));
}

}  // namespace
}  // namespace ucm
