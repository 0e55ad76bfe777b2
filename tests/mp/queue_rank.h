// One rank's load path over a parent's planes, as ucm_cache_init builds it
// (a CacheBuffer, a sim store, a host copy engine and a LoadQueue), for the
// mp tests that run real queues in forked processes (defer_test.cpp,
// queue_kill_test.cpp).
#pragma once

#include <memory>

#include <gtest/gtest.h>

#include "common/mp_util.h"
#include "queue/queue_fixture.h"

namespace ucm::test {

// The options of a queue that is its node's only loader (local_size 1: no
// peers' strides, no owner grace), preallocation off (the tests count what a
// task asks for).
inline QueueOptions solo_queue() {
  QueueOptions qo;
  qo.local_size = 1;
  qo.prealloc = false;
  return qo;
}

struct QueueRank : QueuePath {
  // Joins as local rank `rank` (co.rank and qo.local_rank are set here; the
  // rest of co and qo is the caller's) over a sim store of 1 ms latency and
  // 8 shards per block of `shard_bytes`. Fatal failures return early: call it
  // under ASSERT_NO_FATAL_FAILURE.
  void open(const TestCache& parent, uint32_t rank, CacheOptions co, QueueOptions qo, uint64_t shard_bytes,
            uint64_t deadline_ms) {
    attach_copy(parent, &planes);
    ASSERT_EQ(join_rank_retrying(planes.ctrl, rank, deadline_after_ms(deadline_ms)), Result::kOk) << last_error();
    QueueParts p;
    p.rank = rank;
    p.shard_bytes = shard_bytes;
    p.shards_per_block = 8;
    p.store_latency_us = 1000;
    p.cache = co;
    p.queue = qo;
    build(std::move(p));
  }

  // As Cache::release_local (QueuePath::stop), then leaves the control plane.
  void close(uint32_t rank) {
    stop();
    planes.ctrl.leave(rank);
  }
};

}  // namespace ucm::test
