// One rank's load path in this process for the queue tests: a real node cache
// (control memfd + data memfds), a sim store with no latency, the host engine
// and a LoadQueue over them (not started: the test submits first if it needs
// tasks pending when the dispatcher starts).
#pragma once

#include <memory>

#include <gtest/gtest.h>

#include "backend/sim_backend.h"
#include "common/test_util.h"
#include "ctrl/recovery.h"
#include "device/host_engine.h"
#include "queue/load_queue.h"

namespace ucm::test {

struct OneRankQueue {
  TestCache planes;
  std::unique_ptr<CacheBuffer> cache;
  std::unique_ptr<SimBackend> store;
  std::unique_ptr<CopyEngine> engine;
  std::unique_ptr<LoadQueue> queue;

  // The cache (p's slots and shards per block), joined as rank 0, its store and engine.
  void open_cache(const CtrlParams& p) {
    make_cache(p, &planes);
    ASSERT_EQ(join_rank(planes.ctrl, 0, deadline_after_ms(10000)), Result::kOk) << last_error();
    cache = std::make_unique<CacheBuffer>(&planes.ctrl, &planes.data, CacheOptions{});
    SimOptions so;
    so.latency_us = 0;
    BackendContext ctx;
    ctx.shard_bytes = p.slot_bytes;
    ctx.shards_per_block = p.shards_per_block;
    ASSERT_EQ(SimBackend::create(so, ctx, &store), Result::kOk) << last_error();
    engine = make_host_engine(0);
  }
  // A fresh queue on the same cache (the previous one stopped first).
  void new_queue(const QueueOptions& qo) {
    if (queue) queue->stop();
    queue = std::make_unique<LoadQueue>(cache.get(), store.get(), engine.get(), Placement{}, qo);
  }
  ~OneRankQueue() {
    if (queue) queue->stop();
    store.reset();
    queue.reset();
    cache.reset();
  }
};

}  // namespace ucm::test
