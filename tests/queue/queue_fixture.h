// One rank's load path, as ucm_cache_init builds it (a CacheBuffer over the
// planes, a sim store, a copy engine and a LoadQueue), for the tests that run
// a real queue: the queue suite (inline_test.cpp, handoff_test.cpp, and
// prealloc_window_test.cpp through common/one_rank_queue.h), the copier
// against an async engine (device/copier_pin_test.cpp), and the mp tests'
// forked ranks (mp/queue_rank.h). A test's own fixture derives from
// QueuePath and says only what it sets differently (QueueParts).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_backend.h"
#include "cache/cache_buffer.h"
#include "common/hang_guard.h"
#include "common/test_util.h"
#include "ctrl/recovery.h"
#include "device/host_engine.h"
#include "queue/load_queue.h"

namespace ucm::test {

// What differs between the tests' load paths; the rest is the library's default.
struct QueueParts {
  uint32_t rank = 0;                   // the local rank (CacheOptions::rank, QueueOptions::local_rank)
  uint64_t shard_bytes = 4096;
  uint32_t shards_per_block = 1;
  uint32_t store_latency_us = 0;       // the sim store's
  uint64_t store_hang_ms = 0;          // the sim store's hang_ms (0: a hung load ends at its destruction)
  bool store_hang_dumps = false;       // the sim store's hang_dumps
  uint32_t store_max_inflight = 0;     // the sim store's max_inflight (0: its default)
  CacheOptions cache;                  // rank is set from `rank`
  QueueOptions queue = no_prealloc();  // local_rank is set from `rank`
  std::unique_ptr<CopyEngine> engine;  // null: the host engine of `rank`

  // Preallocation off: these tests count the loads a task asks for.
  static QueueOptions no_prealloc() {
    QueueOptions q;
    q.prealloc = false;
    return q;
  }
};

// A load task of one entry, its destination filled with 0xee.
struct OneKey {
  std::vector<uint8_t> dst;
  std::shared_ptr<Task> task;
  OneKey(uint64_t id, const Key& k, uint64_t ms, uint64_t shard_bytes = 4096) : dst(shard_bytes, 0xee) {
    std::vector<TaskEntry> es(1);
    es[0].key = k;
    es[0].dst = dst.data();
    task = std::make_shared<Task>(id, TaskKind::kLoad, std::move(es), deadline_after_ms(ms));
  }
};

struct QueuePath {
  TestCache planes;
  std::unique_ptr<CacheBuffer> cache;
  std::unique_ptr<SimBackend> store;
  std::unique_ptr<CopyEngine> engine;
  std::unique_ptr<LoadQueue> queue;

  // Fresh planes of `slots` regular slots for one rank, joined as rank 0,
  // and the load path over them. Fatal failures return early: call it under
  // ASSERT_NO_FATAL_FAILURE (or check HasFatalFailure) if the test goes on.
  void open_alone(uint32_t slots, QueueParts p, uint64_t deadline_ms = 20000) {
    make_cache(params(slots, 0, p.shard_bytes, p.shards_per_block, 1), &planes);
    ASSERT_EQ(join_rank(planes.ctrl, 0, deadline_after_ms(deadline_ms)), Result::kOk) << last_error();
    build(std::move(p));
  }

  // The load path over planes this rank has joined already, its queue started.
  void build(QueueParts p) {
    p.queue.local_rank = p.rank;
    const QueueOptions qo = p.queue;
    ASSERT_NO_FATAL_FAILURE(open_below_queue(std::move(p)));
    new_queue(qo);
    ASSERT_EQ(queue->start(), Result::kOk) << last_error();
  }

  // The cache, the store and the engine over joined planes, and no queue yet
  // (a test that needs tasks pending before the dispatcher starts adds one
  // with new_queue and starts it itself).
  void open_below_queue(QueueParts p) {
    p.cache.rank = p.rank;
    cache = std::make_unique<CacheBuffer>(&planes.ctrl, &planes.data, p.cache);
    SimOptions so;
    so.latency_us = p.store_latency_us;
    so.hang_ms = p.store_hang_ms;
    so.hang_dumps = p.store_hang_dumps;
    if (p.store_max_inflight != 0) so.max_inflight = p.store_max_inflight;
    BackendContext ctx;
    ctx.shard_bytes = p.shard_bytes;
    ctx.shards_per_block = p.shards_per_block;
    ASSERT_EQ(SimBackend::create(so, ctx, &store), Result::kOk) << last_error();
    engine = p.engine ? std::move(p.engine) : make_host_engine(static_cast<int>(p.rank));
  }

  // A fresh queue, not started, on the same cache (the previous one stopped
  // first). The old queue goes only once the store's completions into it have
  // returned: a task is done when its copies are, and the store thread that
  // completed its load may still be on its way out of the queue.
  void new_queue(const QueueOptions& qo) {
    if (queue) {
      queue->stop();
      EXPECT_TRUE(eventually("the store's completions into the old queue", [&] { return queue->io_in_flight() == 0; }));
    }
    queue = std::make_unique<LoadQueue>(cache.get(), store.get(), engine.get(), Placement{}, qo);
  }

  // As Cache::release_local: the queue's threads, then the store's I/O
  // (its completions touch the queue and the cache), then the cache.
  void stop() {
    if (queue) queue->stop();
    store.reset();
    queue.reset();
    cache.reset();
  }

  QueuePath() = default;
  QueuePath(const QueuePath&) = delete;
  QueuePath& operator=(const QueuePath&) = delete;
  ~QueuePath() { stop(); }
};

}  // namespace ucm::test
