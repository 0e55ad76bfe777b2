// One rank's load path in this process, its queue not started (the test
// submits first if it needs tasks pending when the dispatcher starts): the
// name prealloc_window_test.cpp uses for QueuePath (queue/queue_fixture.h),
// the one load-path fixture of the tests.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/sim_content.h"
#include "common/test_util.h"
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
  // Every task's destinations, alive until the end (the outer vector moves
  // its buffers when it grows; their bytes stay where they are).
  std::vector<std::vector<uint8_t>> dst;
  // A load task of one shard of each of n blocks from first_block, into
  // fresh destinations of shard_bytes.
  std::shared_ptr<Task> load_task(uint64_t first_block, uint32_t n, uint32_t shard, uint64_t shard_bytes) {
    std::vector<TaskEntry> es(n);
    for (uint32_t i = 0; i < n; ++i) {
      dst.emplace_back(shard_bytes);
      es[i].key = key(first_block + i, shard);
      es[i].dst = dst.back().data();
    }
    return std::make_shared<Task>(1, TaskKind::kLoad, std::move(es), deadline_after_ms(20000));
  }
  // Waits (bounded) for t: it succeeds, and every byte is the sim store's.
  void finish_verified(const std::shared_ptr<Task>& t, uint64_t shard_bytes) {
    ASSERT_TRUE(t->wait_until(deadline_after_ms(20000)));
    ASSERT_EQ(t->result(), Result::kOk) << t->error();
    for (const TaskEntry& e : t->entries()) EXPECT_EQ(sim_verify(e.key, e.dst, shard_bytes), shard_bytes);
  }
};

}  // namespace ucm::test
