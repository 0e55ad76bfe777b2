// The C API from several application threads at once, under mpirun: each
// rank's threads submit loads and dumps, touch, look up and read stats on one
// cache concurrently (with the cache's own dispatcher, copier and store
// threads running), and the cache is finalized once they are joined. Every
// loaded byte is verified. This is the test the TSan + MPI stage of run.sh
// exists for: it puts the api layer's threads side by side.
#include <algorithm>
#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "mpi/mpi_test.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

using ApiThreads = MpiTest;

constexpr int kThreads = 4;
constexpr int kRounds = 12;
constexpr int kPerTask = 6;

// One application thread's work. Thread t of every rank runs the same
// sequence (seeded by t), so loads are node-collective in meaning; threads
// of one rank overlap on some blocks, so they also wait on each other's keys.
void app_thread(ucm_cache_t cache, int t, std::atomic<int>* failures) {
  std::mt19937_64 rng(1000 + t);
  auto check = [&](ucm_result_t r, const char* what) {
    if (r == UCM_OK) return true;
    failures->fetch_add(1);
    ADD_FAILURE() << "thread " << t << ": " << what << ": " << ucm_result_string(r) << ": " << ucm_last_error(cache);
    return false;
  };
  for (int round = 0; round < kRounds; ++round) {
    // A load: kPerTask distinct blocks out of 24 shared by all threads.
    LoadBatch load;
    std::vector<uint64_t> used;
    while (load.entries.size() < kPerTask) {
      const uint64_t b = 100 + rng() % 24;
      if (std::find(used.begin(), used.end(), b) != used.end()) continue;
      used.push_back(b);
      load.add(ukey(b, static_cast<uint32_t>(rng() % 8)));
    }
    ucm_task_t lt = 0;
    if (!check(ucm_load_task(cache, load.entries.data(), load.entries.size(), &lt), "ucm_load_task")) return;

    // A dump of this thread's own blocks while the load runs (sim content,
    // so a later load of them verifies the same way).
    std::vector<ucm_dump_entry_t> dumps;
    std::vector<std::vector<uint8_t>> src(kPerTask, std::vector<uint8_t>(kTaskShard));
    for (int i = 0; i < kPerTask; ++i) {
      const ucm_key_t k = ukey(10000 + t * 1000 + round * kPerTask + i, static_cast<uint32_t>(i % 8));
      sim_fill(ikey(k), src[i].data(), kTaskShard);
      dumps.push_back({k, src[i].data()});
    }
    ucm_task_t dt = 0;
    if (!check(ucm_dump_task(cache, dumps.data(), dumps.size(), &dt), "ucm_dump_task")) return;

    // Touch, lookup and stats while both are in flight.
    std::vector<ucm_block_t> blocks;
    for (uint64_t b : used) blocks.push_back(ublock(b));
    if (!check(ucm_touch(cache, blocks.data(), blocks.size()), "ucm_touch")) return;
    std::vector<ucm_key_t> keys;
    for (const auto& e : load.entries) keys.push_back(e.key);
    std::vector<uint8_t> where(keys.size(), 0xff);
    if (!check(ucm_lookup(cache, keys.data(), keys.size(), where.data()), "ucm_lookup")) return;
    for (uint8_t w : where)
      if (w != UCM_WHERE_CACHE && w != UCM_WHERE_BACKEND) {
        failures->fetch_add(1);
        ADD_FAILURE() << "thread " << t << ": the sim store has every key, lookup said " << int{w};
      }
    ucm_stats_t rs{}, ns{};
    rs.struct_bytes = ns.struct_bytes = sizeof(ucm_stats_t);
    if (!check(ucm_cache_stats(cache, &rs, &ns), "ucm_cache_stats")) return;

    // Finish the dump by polling, the load by waiting.
    int done = 0;
    const uint64_t until = now_ns() + uint64_t{kTaskWaitMs} * 1000000;
    ucm_result_t dr = UCM_OK;
    while (!done && now_ns() < until) {
      dr = ucm_task_test(cache, dt, &done);
      if (dr != UCM_OK) break;
      if (!done) usleep(200);
    }
    if (!check(dr, "ucm_task_test(dump)")) return;
    if (!done) {
      failures->fetch_add(1);
      ADD_FAILURE() << "thread " << t << ": a dump did not finish in " << kTaskWaitMs << " ms";
      return;
    }
    if (!check(ucm_task_wait(cache, lt, kTaskWaitMs), "ucm_task_wait(load)")) return;
    for (size_t i = 0; i < load.entries.size(); ++i)
      if (load.verify(i) != kTaskShard) {
        failures->fetch_add(1);
        ADD_FAILURE() << "thread " << t << " round " << round << ": entry " << i << " differs at byte " << load.verify(i);
      }
    // What was dumped is found again.
    std::vector<ucm_key_t> dumped;
    for (const auto& d : dumps) dumped.push_back(d.key);
    std::vector<uint8_t> dwhere(dumped.size(), 0xff);
    if (!check(ucm_lookup(cache, dumped.data(), dumped.size(), dwhere.data()), "ucm_lookup(dumped)")) return;
    for (uint8_t w : dwhere)
      if (w == UCM_WHERE_NONE) {
        failures->fetch_add(1);
        ADD_FAILURE() << "thread " << t << ": a dumped key is nowhere";
      }
  }
}

TEST_F(ApiThreads, AppThreadsShareOneCacheThenFinalizeAfterJoiningThem) {
  // 64 slots for 24 shared blocks and the dumps: evictions happen too.
  ucm_config_t cfg = task_config(64, "sim:latency_us=100,max_inflight=16,workers=2");
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(app_thread, cache, t, &failures);
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s = node_stats(cache);
  EXPECT_EQ(s.failed_shards, 0u);
  EXPECT_EQ(s.tasks, uint64_t{2} * kThreads * kRounds * world_size()) << "a load and a dump per thread and round";
  // One write per dumped key per node, or more where a key was evicted before
  // another rank dumped it too.
  EXPECT_GE(s.dumps, uint64_t{kThreads} * kRounds * kPerTask);
  EXPECT_LE(s.dumps, uint64_t{kThreads} * kRounds * kPerTask * world_size());
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
  EXPECT_EQ(cache, nullptr);
}

}  // namespace
}  // namespace ucm::test
