// One rank's load path over a parent's planes, as ucm_cache_init builds it
// (a CacheBuffer, a sim store, a host copy engine and a LoadQueue), for the
// mp tests that run real queues in forked processes (defer_test.cpp,
// queue_kill_test.cpp).
#pragma once

#include <memory>

#include <gtest/gtest.h>

#include "backend/sim_backend.h"
#include "cache/cache_buffer.h"
#include "common/mp_util.h"
#include "common/test_util.h"
#include "device/host_engine.h"
#include "queue/load_queue.h"

namespace ucm::test {

struct QueueRank {
  TestCache planes;
  std::unique_ptr<CacheBuffer> cache;
  std::unique_ptr<SimBackend> store;
  std::unique_ptr<CopyEngine> engine;
  std::unique_ptr<LoadQueue> queue;

  // Joins as local rank `rank` (co.rank and qo.local_rank are set here; the
  // rest of co and qo is the caller's) over a sim store of 1 ms latency and
  // 8 shards per block of `shard_bytes`. Fatal failures return early: call it
  // under ASSERT_NO_FATAL_FAILURE.
  void open(const TestCache& parent, uint32_t rank, CacheOptions co, QueueOptions qo, uint64_t shard_bytes,
            uint64_t deadline_ms) {
    attach_copy(parent, &planes);
    ASSERT_EQ(join_rank_retrying(planes.ctrl, rank, deadline_after_ms(deadline_ms)), Result::kOk) << last_error();
    co.rank = rank;
    cache = std::make_unique<CacheBuffer>(&planes.ctrl, &planes.data, co);
    SimOptions so;
    so.latency_us = 1000;
    BackendContext ctx;
    ctx.shard_bytes = shard_bytes;
    ctx.shards_per_block = 8;
    ASSERT_EQ(SimBackend::create(so, ctx, &store), Result::kOk) << last_error();
    engine = make_host_engine(static_cast<int>(rank));
    qo.local_rank = rank;
    queue = std::make_unique<LoadQueue>(cache.get(), store.get(), engine.get(), Placement{}, qo);
    ASSERT_EQ(queue->start(), Result::kOk) << last_error();
  }

  // As Cache::release_local: threads, then the store's I/O, then the cache.
  void close(uint32_t rank) {
    queue->stop();
    store.reset();
    queue.reset();
    cache.reset();
    planes.ctrl.leave(rank);
  }
};

}  // namespace ucm::test
