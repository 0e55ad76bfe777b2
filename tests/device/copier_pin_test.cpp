// The copier against an engine whose copies land later (async-test): the
// contract of device/copy_engine.h as the load path relies on it. A copy
// keeps its slot pinned until the engine says it landed, also when the flush
// that started it failed.
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_content.h"
#include "common/time.h"
#include "device/copy_engine.h"
#include "common/hang_guard.h"
#include "queue/queue_fixture.h"

namespace ucm {
namespace {

constexpr uint64_t kShard = 4096;

struct Rank : test::QueuePath {
  void open(const AsyncTestOptions& o) {
    test::QueueParts p;
    p.shard_bytes = kShard;
    p.shards_per_block = 8;
    p.engine = make_async_test_engine(0, o);
    open_alone(64, std::move(p));
  }
  uint64_t pins() const {
    uint64_t n = 0;
    const CtrlParams p = planes.ctrl.params();
    for (uint32_t i = 0; i < p.regular_slots + p.reserved_slots; ++i)
      n += planes.ctrl.pin(0, i).load(std::memory_order_acquire);
    return n;
  }
};

std::shared_ptr<Task> load_task(uint64_t id, std::vector<std::vector<uint8_t>>* dst, uint32_t n, uint64_t first = 100) {
  dst->assign(n, std::vector<uint8_t>(kShard));
  std::vector<TaskEntry> es(n);
  for (uint32_t i = 0; i < n; ++i) {
    es[i].key = test::key(first + i, 3);
    es[i].dst = (*dst)[i].data();
  }
  return std::make_shared<Task>(id, TaskKind::kLoad, std::move(es), deadline_after_ms(20000));
}

TEST(CopierWithAsyncEngine, LoadsLandByteExactWhenCopiesCompleteLateAndOutOfOrder) {
  AsyncTestOptions o;
  o.delay_us = 500;
  o.reorder = true;
  Rank r;
  ASSERT_NO_FATAL_FAILURE(r.open(o));
  std::vector<std::vector<uint8_t>> dst;
  auto t = load_task(1, &dst, 32);
  ASSERT_EQ(r.queue->submit(t), Result::kOk) << last_error();
  ASSERT_TRUE(t->wait_until(deadline_after_ms(20000)));
  ASSERT_EQ(t->result(), Result::kOk) << t->error();
  for (uint32_t i = 0; i < 32; ++i) EXPECT_EQ(sim_verify(test::key(100 + i, 3), dst[i].data(), kShard), kShard) << i;
  EXPECT_EQ(r.pins(), 0u);
}

TEST(CopierWithAsyncEngine, AFailedFlushKeepsThePinUntilTheCopyInFlightLanded) {
  AsyncTestOptions o;
  o.delay_us = 0;
  o.fail_flush = 1;
  o.fail_after = 1;  // the copy went out before the flush failed
  o.gate = std::make_shared<AsyncTestGate>();
  struct Opener {
    std::shared_ptr<AsyncTestGate> g;
    ~Opener() { g->open(); }
  } opener{o.gate};
  Rank r;
  ASSERT_NO_FATAL_FAILURE(r.open(o));
  std::vector<std::vector<uint8_t>> dst;
  auto t = load_task(1, &dst, 1);
  ASSERT_EQ(r.queue->submit(t), Result::kOk) << last_error();
  // The copy is in flight and the engine holds it: the task must not finish,
  // and the slot the DMA reads must stay pinned.
  EXPECT_FALSE(t->wait_until(deadline_after_ms(300)))
      << "the task finished (" << t->error() << ") while its copy was still in flight";
  EXPECT_GE(r.pins(), 1u) << "the slot was unpinned while a copy still reads it";
  o.gate->open();
  ASSERT_TRUE(t->wait_until(deadline_after_ms(20000)));
  EXPECT_EQ(t->result(), Result::kDevice);
  EXPECT_NE(t->error().find("failed after 1 of its 1 copies"), std::string::npos) << t->error();
  EXPECT_EQ(r.pins(), 0u) << "settled: the pin is released";
}

// Opens the gate for good when the test ends, however it ends.
struct GateOpener {
  std::shared_ptr<AsyncTestGate> g;
  ~GateOpener() { g->open(); }
};

// Loads keys [first, first + n) and lets their copies land: they are then
// Ready and resident, so a later task of them is all hits.
void warm(Rank& r, AsyncTestGate& gate, uint64_t first, uint32_t n, uint64_t id) {
  std::vector<std::vector<uint8_t>> dst;
  auto t = load_task(id, &dst, n, first);
  ASSERT_EQ(r.queue->submit(t), Result::kOk) << last_error();
  gate.allow(n);
  ASSERT_TRUE(t->wait_until(deadline_after_ms(20000)));
  ASSERT_EQ(t->result(), Result::kOk) << t->error();
}

// Shards that are Ready when the copier looks go out in one call: copy() for
// each, then one flush() (one cudaMemcpyBatchAsync on a GPU), not a flush per
// shard.
TEST(CopierWithAsyncEngine, ShardsReadyTogetherGoOutInOneBatch) {
  AsyncTestOptions o;
  o.delay_us = 0;
  o.gate = std::make_shared<AsyncTestGate>();
  o.stats = std::make_shared<AsyncTestStats>();
  Rank r;
  GateOpener opener{o.gate};  // destroyed first: a failed ASSERT never leaves the copier waiting on a shut gate
  ASSERT_NO_FATAL_FAILURE(r.open(o));
  ASSERT_NO_FATAL_FAILURE(warm(r, *o.gate, 200, 6, 1));
  // One copy held in flight: the idle copier waits for it to land.
  std::vector<std::vector<uint8_t>> da, db;
  auto a = load_task(2, &da, 1, 300);
  ASSERT_EQ(r.queue->submit(a), Result::kOk) << last_error();
  ASSERT_TRUE(test::eventually("the copier waiting for the held copy", [&] { return o.stats->waiting.load() == 1; }));
  // Six hits dispatched while the copier waits: all six wait for it.
  const uint64_t hits = r.cache->counters().hits.load();
  auto b = load_task(3, &db, 6, 200);
  ASSERT_EQ(r.queue->submit(b), Result::kOk) << last_error();
  ASSERT_TRUE(test::eventually("six hits", [&] { return r.cache->counters().hits.load() >= hits + 6; }));
  const uint64_t flushes = o.stats->flushes.load();
  o.gate->open();
  ASSERT_TRUE(a->wait_until(deadline_after_ms(20000)));
  ASSERT_TRUE(b->wait_until(deadline_after_ms(20000)));
  ASSERT_EQ(b->result(), Result::kOk) << b->error();
  for (uint32_t i = 0; i < 6; ++i) EXPECT_EQ(sim_verify(test::key(200 + i, 3), db[i].data(), kShard), kShard) << i;
  EXPECT_EQ(o.stats->flushes.load() - flushes, 1u) << "the six ready shards went out in more than one call";
  EXPECT_GE(o.stats->max_batch.load(), 6u);
  EXPECT_EQ(r.pins(), 0u);
}

// The window of copies in flight slides: when it is full, the copier waits
// for the oldest copy only, and the next shard goes out as soon as that one
// landed (not once all eight have).
TEST(CopierWithAsyncEngine, AFullWindowWaitsForTheOldestCopyOnly) {
  AsyncTestOptions o;
  o.delay_us = 0;
  o.gate = std::make_shared<AsyncTestGate>();
  o.stats = std::make_shared<AsyncTestStats>();
  Rank r;
  GateOpener opener{o.gate};  // destroyed first: a failed ASSERT never leaves the copier waiting on a shut gate
  ASSERT_NO_FATAL_FAILURE(r.open(o));
  ASSERT_NO_FATAL_FAILURE(warm(r, *o.gate, 400, 12, 1));
  // Step-synchronized, not raced: one copy held in flight keeps the idle
  // copier waiting while all twelve hits are handed to it, so it finds them
  // in one round whatever the scheduler does.
  std::vector<std::vector<uint8_t>> da, d;
  auto a = load_task(2, &da, 1, 500);
  ASSERT_EQ(r.queue->submit(a), Result::kOk) << last_error();
  ASSERT_TRUE(test::eventually("the copier waiting for the held copy", [&] { return o.stats->waiting.load() == 1; }));
  const uint64_t hits = r.cache->counters().hits.load();
  auto t = load_task(3, &d, 12, 400);
  ASSERT_EQ(r.queue->submit(t), Result::kOk) << last_error();
  ASSERT_TRUE(test::eventually("twelve hits", [&] { return r.cache->counters().hits.load() >= hits + 12; }));
  const uint64_t copies = o.stats->copies.load();
  o.gate->allow(1);  // the held copy lands
  // The window fills (8 copies) and nothing more lands.
  ASSERT_TRUE(test::eventually("eight copies in flight",
                               [&] { return o.stats->copies.load() >= copies + 8 && o.stats->waiting.load() == 1; }));
  EXPECT_EQ(o.stats->copies.load(), copies + 8) << "more copies than the window in flight";
  o.gate->allow(1);  // the oldest lands
  EXPECT_TRUE(test::eventually("the ninth copy, once the oldest landed",
                               [&] { return o.stats->copies.load() >= copies + 9; }))
      << "the ninth shard waited for more than the oldest copy";
  o.gate->open();
  ASSERT_TRUE(t->wait_until(deadline_after_ms(20000)));
  ASSERT_EQ(t->result(), Result::kOk) << t->error();
  for (uint32_t i = 0; i < 12; ++i) EXPECT_EQ(sim_verify(test::key(400 + i, 3), d[i].data(), kShard), kShard) << i;
  EXPECT_EQ(r.pins(), 0u);
}

}  // namespace
}  // namespace ucm
