// The load path end to end under mpirun: real queues, the sim store, every
// byte verified.
#include <cstring>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_content.h"
#include "common/key.h"
#include "mpi/cache_fixture.h"
#include "mpi/mpi_test.h"
#include "mpi/task_util.h"
#include "ucmcache/ucm.h"

namespace ucm::test {
namespace {

constexpr uint64_t kShard = kTaskShard;

using Load = CacheTest;

TEST_F(Load, OneTaskOnEveryRankLoadsEachShardOncePerNode) {
  ucm_config_t cfg = task_config(256, "sim:latency_us=2000,max_inflight=64");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  constexpr int kN = 12;
  std::vector<std::vector<uint8_t>> dst(kN, std::vector<uint8_t>(kShard));
  std::vector<ucm_load_entry_t> es(kN);
  for (int i = 0; i < kN; ++i) es[i] = {ukey(500 + i, 2), dst[i].data()};
  MPI_Barrier(MPI_COMM_WORLD);
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_load_task(cache, es.data(), es.size(), &t), UCM_OK) << ucm_last_error(cache);
  ASSERT_EQ(ucm_task_wait(cache, t, 20000), UCM_OK) << ucm_last_error(cache);
  for (int i = 0; i < kN; ++i)
    EXPECT_EQ(sim_verify(ikey(es[i].key), dst[i].data(), kShard), kShard) << "entry " << i;
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s = node_stats(cache);
  EXPECT_EQ(s.owner_loads, static_cast<uint64_t>(kN)) << "one backend load per shard per node";
  EXPECT_EQ(s.bytes_to_device, static_cast<uint64_t>(kN) * kShard * world_size());
  EXPECT_EQ(ucm_task_wait(cache, t, 0), UCM_ERR_UNKNOWN_TASK) << "a task is waited for once";
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Load, RandomTasksOverAKeySpaceLargerThanTheCacheAreByteExact) {
  ucm_config_t cfg = task_config(48, "sim:latency_us=200,max_inflight=32");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  std::mt19937_64 rng(1234);  // the same sequence on every rank: node-collective tasks
  constexpr int kTasks = 40;
  for (int t = 0; t < kTasks; ++t) {
    const int n = 4 + static_cast<int>(rng() % 12);
    std::vector<ucm_load_entry_t> es;
    std::vector<std::vector<uint8_t>> dst(n, std::vector<uint8_t>(kShard, 0xee));
    std::vector<uint64_t> used;
    for (int i = 0; i < n; ++i) {
      uint64_t b;
      do b = rng() % 40;  // 40 blocks x 8 shards >> 48 slots
      while (std::find(used.begin(), used.end(), b) != used.end());
      used.push_back(b);
      es.push_back({ukey(b, static_cast<uint32_t>(rng() % 8)), dst[i].data()});
    }
    ucm_task_t id = 0;
    ASSERT_EQ(ucm_load_task(cache, es.data(), es.size(), &id), UCM_OK) << ucm_last_error(cache);
    ASSERT_EQ(ucm_task_wait(cache, id, 30000), UCM_OK) << ucm_last_error(cache);
    for (int i = 0; i < n; ++i)
      ASSERT_EQ(sim_verify(ikey(es[i].key), dst[i].data(), kShard), kShard) << "task " << t << " entry " << i;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s = node_stats(cache);
  EXPECT_EQ(s.failed_shards, 0u);
  EXPECT_GT(s.evictions, 0u) << "the key space is larger than the cache";
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

}  // namespace
}  // namespace ucm::test
