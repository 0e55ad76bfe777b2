// One rank's load path in this process, its queue not started (the test
// submits first if it needs tasks pending when the dispatcher starts): the
// name prealloc_window_test.cpp uses for QueuePath (queue/queue_fixture.h),
// the one load-path fixture of the tests.
#pragma once

#include <gtest/gtest.h>

#include "queue/queue_fixture.h"

namespace ucm::test {

struct OneRankQueue : QueuePath {
  // The cache (p's slots, slot bytes and shards per block), joined as rank 0,
  // a sim store with no latency and the host engine; new_queue adds a queue.
  void open_cache(const CtrlParams& p) {
    make_cache(p, &planes);
    ASSERT_EQ(join_rank(planes.ctrl, 0, deadline_after_ms(10000)), Result::kOk) << last_error();
    QueueParts parts;
    parts.shard_bytes = p.slot_bytes;
    parts.shards_per_block = p.shards_per_block;
    open_below_queue(std::move(parts));
  }
};

}  // namespace ucm::test
