// The load path through the real queues under mpirun: scenario A free-running
// (owner loads per rank), scenario E (the idle window's prealloc taken over by
// the next task), random tasks from several app threads checked byte for
// byte, and every kind of bad input.
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "mpi/cache_fixture.h"
#include "mpi/mpi_test.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

using Queue = CacheTest;

// ---- scenario A through the queues ------------------------------------------------

// Every rank sleeps until one instant that rank 0 picks, so that the ranks'
// dispatchers start the task together (a start line, not a timing assertion).
void start_together() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  int64_t at_ns = static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec + 30'000'000;
  MPI_Bcast(&at_ns, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  timespec at{static_cast<time_t>(at_ns / 1000000000), static_cast<long>(at_ns % 1000000000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, nullptr) != 0) {
  }
}

// One 12-shard task (12 blocks, shard 2) on every rank; returns each rank's
// owner loads for it. *window_ns (if given): from the first rank's submission
// to the last rank's completion, on the node's monotonic clock. A rank defers
// a peer's stride until the peer serves it or its owner_grace runs out, and
// it serves its own stride before it completes; so when the whole window is
// shorter than the grace, the protocol alone decides who owns what.
std::vector<uint64_t> twelve_shard_task(ucm_order_t order, uint64_t first_block, uint32_t io_depth = 1,
                                        uint64_t skew_us = 0, uint32_t owner_grace_us = 1000,
                                        uint64_t* window_ns = nullptr) {
  // io_depth 1 paces each dispatcher at one owned load per backend latency, so
  // a rank that starts a little early cannot run through its peers' strides
  // before they start: the free-running queues then keep the seed's lockstep
  // as long as the ranks start within one latency (20 ms) of each other.
  ucm_config_t cfg = task_config(256, "sim:latency_us=20000,max_inflight=64");
  cfg.order = order;
  cfg.io_depth = io_depth;
  cfg.prealloc = 0;
  cfg.owner_grace_us = owner_grace_us;
  ucm_cache_t cache = nullptr;
  EXPECT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  if (!cache) return {};
  LoadBatch b;
  for (uint64_t i = 0; i < 12; ++i) b.add(ukey(first_block + i, 2));
  start_together();
  if (skew_us) usleep(static_cast<useconds_t>(skew_us * world_rank()));  // ranks arrive one after another
  const uint64_t submitted = now_ns();
  EXPECT_EQ(load_and_wait(cache, b), UCM_OK) << ucm_last_error(cache);
  const uint64_t completed = now_ns();
  for (size_t i = 0; i < b.entries.size(); ++i) EXPECT_EQ(b.verify(i), kTaskShard) << "entry " << i;
  MPI_Barrier(MPI_COMM_WORLD);
  const std::vector<uint64_t> per_rank = allgather_u64(rank_stats(cache).owner_loads);
  const std::vector<uint64_t> starts = allgather_u64(submitted), ends = allgather_u64(completed);
  if (window_ns) *window_ns = *std::max_element(ends.begin(), ends.end()) - *std::min_element(starts.begin(), starts.end());
  const ucm_stats_t node = node_stats(cache);
  EXPECT_EQ(node.owner_loads, 12u) << "each shard loaded once per node";
  EXPECT_EQ(node.failed_shards, 0u);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
  if (world_rank() == 0) {
    std::printf("[ScenarioA %s, io_depth %u, skew %llu us] owner loads per rank:",
                order == UCM_ORDER_ROTATE ? "rotate" : "natural", io_depth, static_cast<unsigned long long>(skew_us));
    for (uint64_t v : per_rank) std::printf(" %llu", static_cast<unsigned long long>(v));
    std::printf(" (node %llu)\n", static_cast<unsigned long long>(node.owner_loads));
  }
  return per_rank;
}

// The grace the two tests below give: the most the config allows (10 s).
constexpr uint32_t kLongGraceUs = 10'000'000;

// The protocol's promise holds only for ranks that arrive within the grace:
// past it, taking a late peer's stride is the protocol too. A window that
// long is the machine (a rank descheduled for 10 s), not the code: the test
// says so and skips rather than judge the protocol on it. Never a timing
// assertion: no outcome is asserted on how fast anything ran.
bool window_within_grace(uint64_t window_ns) {
  return window_ns < uint64_t{kLongGraceUs} * 1000;
}

TEST_F(Queue, ScenarioARotationGivesEveryRankAnEqualShareOfOwnerLoads) {
  // Seed scenario A: each rank owns its stride. A peer's stride waits for that
  // peer for owner_grace; with the default 1 ms a rank that a loaded CI machine
  // started later than that lost its share (rank 1 owned 12 of 12). So the
  // grace is 10 s, and the shares are asserted only when every rank took part
  // inside it (window_within_grace): then nothing but the protocol decides.
  // The free-running balance at the default grace is a benchmark figure (ucm_bench).
  const int n = world_size();
  if (12 % n != 0) GTEST_SKIP() << "12 shards do not split evenly over " << n << " ranks";
  uint64_t window = 0;
  const std::vector<uint64_t> per_rank = twelve_shard_task(UCM_ORDER_ROTATE, 7000, 1, 0, kLongGraceUs, &window);
  if (!window_within_grace(window))
    GTEST_SKIP() << "the ranks took part over " << window / 1000000 << " ms, past the 10 s grace";
  ASSERT_EQ(per_rank.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) EXPECT_EQ(per_rank[r], static_cast<uint64_t>(12 / n)) << "rank " << r;
}

TEST_F(Queue, UnpacedRanksArrivingSkewedStillOwnAnEqualShare) {
  // No pacing (io_depth 16) and each rank 200 us after the previous: the
  // first to arrive leaves its peers' strides to them for owner_grace, so
  // ownership stays 1/n each instead of collapsing onto the earliest rank.
  // The protocol, not the scheduler: shares are asserted when every rank took
  // part inside the 10 s grace (a sanitizer build under 1 ms of grace once
  // saw a rank arrive after its share was taken).
  const int n = world_size();
  if (12 % n != 0) GTEST_SKIP() << "12 shards do not split evenly over " << n << " ranks";
  uint64_t window = 0;
  const std::vector<uint64_t> per_rank = twelve_shard_task(UCM_ORDER_ROTATE, 7400, 16, 200, kLongGraceUs, &window);
  if (!window_within_grace(window))
    GTEST_SKIP() << "the ranks took part over " << window / 1000000 << " ms, past the 10 s grace";
  ASSERT_EQ(per_rank.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) EXPECT_EQ(per_rank[r], static_cast<uint64_t>(12 / n)) << "rank " << r;
}

// Every rank submits one task of more keys than the cache has slots. Each
// rank's dispatcher took its own stride first and filled its share of the
// cache; a slot it loaded is protected until every rank has taken it, and
// the others would take it only after their own strides, which needed the
// slots this rank's loads held: every rank backed off until the grace ran
// out (14 s for 64 shards over 8 slots on 2 ranks, each shard loaded twice;
// with 160 the task ended UCM_ERR_NO_SPACE at timeout_ms). With a grace far
// past the task's deadline, that was the deadline's UCM_ERR_NO_SPACE. A
// dispatcher that finds no space now first takes the task's shards that
// other ranks serve: each shard is loaded once per node and the task ends OK.
TEST_F(Queue, ATaskLargerThanTheCacheOnEveryRankLoadsEachShardOncePerNode) {
  if (world_size() < 2) GTEST_SKIP() << "protection waits only for other ranks";
  ucm_config_t cfg = task_config(8, "sim:latency_us=0");
  cfg.reserved_slots = 0;
  cfg.prealloc = 0;
  cfg.protect_grace_ms = 600000;  // the most: only a take ends protection within the task
  cfg.timeout_ms = 20000;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  LoadBatch b;
  for (uint64_t i = 0; i < 64; ++i) b.add(ukey(9100 + i, 0));
  MPI_Barrier(MPI_COMM_WORLD);
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t), UCM_OK) << msg(cache);
  EXPECT_EQ(wait_guarded(cache, t, "a task of 64 shards over 8 slots"), UCM_OK) << msg(cache);
  for (size_t i = 0; i < b.entries.size(); ++i) EXPECT_EQ(b.verify(i), kTaskShard) << "entry " << i;
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(node_stats(cache).owner_loads, 64u) << "each shard loaded once per node";
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Queue, ScenarioANaturalOrderStillLoadsEachShardOnce) {
  // The legacy order: the node total is still 12; who owns what is a race
  // (reported, not asserted). Also reported: both orders with unpaced
  // dispatchers (io_depth 16), where an early rank may own far more than 1/n.
  auto total = [](const std::vector<uint64_t>& v) {
    uint64_t t = 0;
    for (uint64_t x : v) t += x;
    return t;
  };
  EXPECT_EQ(total(twelve_shard_task(UCM_ORDER_NATURAL, 7100)), 12u);
  EXPECT_EQ(total(twelve_shard_task(UCM_ORDER_NATURAL, 7200, 16)), 12u);
  EXPECT_EQ(total(twelve_shard_task(UCM_ORDER_ROTATE, 7300, 16)), 12u);
}

// ---- scenario E through the queue -------------------------------------------------

struct PreallocRun {
  uint64_t made_after_task1 = 0;  // node prealloc_made, counted from before task 1
  uint64_t used_by_task2 = 0;     // node prealloc_used during task 2
  uint64_t evictions_by_task2 = 0;
};

PreallocRun prealloc_scenario(int prealloc, uint64_t base) {
  PreallocRun out;
  // 16 regular slots, 16 reserved; 8 shards per block.
  ucm_config_t cfg = task_config(16, "sim:latency_us=500");
  cfg.prealloc = prealloc;
  ucm_cache_t cache = nullptr;
  EXPECT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  if (!cache) return out;

  // Fill the regular pool with the last shard of 16 blocks (no shard 8 to
  // prealloc after it).
  LoadBatch fill;
  for (uint64_t i = 0; i < 16; ++i) fill.add(ukey(base + 100 + i, 7));
  EXPECT_EQ(load_and_wait(cache, fill), UCM_OK) << ucm_last_error(cache);
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s0 = node_stats(cache);
  MPI_Barrier(MPI_COMM_WORLD);  // everyone has read s0 before anyone preallocates

  // Task 1: B0.s, B1.s, B2.s. Its idle window preallocates (Bi, s+1).
  const uint32_t s = 2;
  LoadBatch t1;
  for (uint64_t i = 0; i < 3; ++i) t1.add(ukey(base + i, s));
  EXPECT_EQ(load_and_wait(cache, t1), UCM_OK) << ucm_last_error(cache);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(t1.verify(i), kTaskShard);
  MPI_Barrier(MPI_COMM_WORLD);
  // The idle window runs on the dispatchers; give it a generous bound.
  const uint64_t until = now_ns() + 10'000'000'000ull;
  while (prealloc && node_stats(cache).prealloc_made - s0.prealloc_made < 3 && now_ns() < until) usleep(1000);
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s1 = node_stats(cache);
  out.made_after_task1 = s1.prealloc_made - s0.prealloc_made;
  MPI_Barrier(MPI_COMM_WORLD);

  // Task 2: (Bi, s+1).
  LoadBatch t2;
  for (uint64_t i = 0; i < 3; ++i) t2.add(ukey(base + i, s + 1));
  EXPECT_EQ(load_and_wait(cache, t2), UCM_OK) << ucm_last_error(cache);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(t2.verify(i), kTaskShard);
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s2 = node_stats(cache);
  out.used_by_task2 = s2.prealloc_used - s1.prealloc_used;
  out.evictions_by_task2 = s2.evictions - s1.evictions;
  EXPECT_EQ(s2.failed_shards, 0u);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
  return out;
}

TEST_F(Queue, ScenarioEIdleWindowPreallocIsTakenOverByTheNextTaskWithoutEviction) {
  const PreallocRun on = prealloc_scenario(1, 8000);
  EXPECT_EQ(on.made_after_task1, 3u) << "(B0,s+1), (B1,s+1), (B2,s+1) and nothing else";
  EXPECT_EQ(on.used_by_task2, 3u) << "the next task takes the three idle slots over";
  EXPECT_EQ(on.evictions_by_task2, 0u) << "and finds no victim for them";
}

TEST_F(Queue, ScenarioEWithoutPreallocTheNextTaskEvicts) {
  const PreallocRun off = prealloc_scenario(0, 8100);
  EXPECT_EQ(off.made_after_task1, 0u);
  EXPECT_EQ(off.used_by_task2, 0u);
  EXPECT_EQ(off.evictions_by_task2, 3u) << "the regular pool is full: each new key needs a victim";
}

// ---- random tasks from several app threads ------------------------------------------

struct RandomRun {
  uint64_t entries_per_rank = 0;
  std::set<std::pair<uint64_t, uint32_t>> unique;  // (block, shard) requested by this rank
  std::atomic<uint32_t> bad_bytes{0};
  std::atomic<uint32_t> failed{0};
  std::string first_error;
};

// Two app threads per rank; in each of `rounds` rounds every thread submits
// three tasks at once and finishes them in a shuffled order, polling with
// ucm_task_test. Every rank draws the same tasks (node-collective).
void random_tasks(ucm_cache_t cache, int rounds, uint64_t blocks, int max_entries, RandomRun* run) {
  constexpr int kThreads = 2;
  constexpr int kTasksAtOnce = 3;
  std::mutex mu;
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::thread> threads;
    for (int th = 0; th < kThreads; ++th) {
      threads.emplace_back([&, th] {
        std::mt19937_64 rng(static_cast<uint64_t>(round) * 1000 + static_cast<uint64_t>(th));
        std::vector<LoadBatch> batches(kTasksAtOnce);
        std::vector<ucm_task_t> ids(kTasksAtOnce, 0);
        for (int t = 0; t < kTasksAtOnce; ++t) {
          const int n = 4 + static_cast<int>(rng() % static_cast<uint64_t>(max_entries - 3));
          std::set<uint64_t> used;
          while (static_cast<int>(batches[t].entries.size()) < n) {
            const uint64_t b = 20000 + rng() % blocks;
            const uint32_t s = static_cast<uint32_t>(rng() % 8);
            if (used.insert(b).second) batches[t].add(ukey(b, s));  // one shard per block, as a task has
          }
          const ucm_result_t r = ucm_load_task(cache, batches[t].entries.data(), batches[t].entries.size(), &ids[t]);
          if (r != UCM_OK) {
            std::lock_guard<std::mutex> g(mu);
            run->failed++;
            if (run->first_error.empty()) run->first_error = ucm_last_error(cache);
            ids[t] = 0;
          }
        }
        // Finish them in any order: a shuffled poll over ucm_task_test.
        std::vector<int> pending;
        for (int t = 0; t < kTasksAtOnce; ++t)
          if (ids[t]) pending.push_back(t);
        std::shuffle(pending.begin(), pending.end(), rng);
        const uint64_t until = now_ns() + static_cast<uint64_t>(kTaskWaitMs) * 1000000ull;
        while (!pending.empty() && now_ns() < until) {
          for (size_t p = 0; p < pending.size();) {
            const int t = pending[p];
            int done = 0;
            const ucm_result_t r = ucm_task_test(cache, ids[t], &done);
            if (!done && r == UCM_OK) {
              ++p;
              continue;
            }
            if (r != UCM_OK) {
              std::lock_guard<std::mutex> g(mu);
              run->failed++;
              if (run->first_error.empty()) run->first_error = ucm_last_error(cache);
            }
            for (size_t i = 0; i < batches[t].entries.size(); ++i)
              if (batches[t].verify(i) != kTaskShard) run->bad_bytes++;
            pending.erase(pending.begin() + static_cast<long>(p));
          }
          usleep(200);
        }
        if (!pending.empty()) run->failed += static_cast<uint32_t>(pending.size());
        std::lock_guard<std::mutex> g(mu);
        for (const LoadBatch& b : batches)
          for (const ucm_load_entry_t& e : b.entries) {
            const Key k = ikey(e.key);
            run->unique.insert({k.block.lo, k.shard});
            run->entries_per_rank++;
          }
      });
    }
    for (auto& t : threads) t.join();
    MPI_Barrier(MPI_COMM_WORLD);  // keeps the ranks within one round of each other
  }
}

TEST_F(Queue, RandomTasksFromTwoThreadsPerRankLoadEachKeyOncePerNode) {
  // A cache that holds every key: each unique key is loaded exactly once.
  ucm_config_t cfg = task_config(1024, "sim:latency_us=300,max_inflight=32");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  RandomRun run;
  random_tasks(cache, 4, 48, 16, &run);  // 48 blocks x 8 shards = 384 keys < 1024 slots
  EXPECT_EQ(run.failed.load(), 0u) << run.first_error;
  EXPECT_EQ(run.bad_bytes.load(), 0u) << "entries whose bytes are not the sim content";
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s = node_stats(cache);
  EXPECT_EQ(s.owner_loads, run.unique.size()) << "every unique key loaded once per node";
  EXPECT_EQ(s.evictions, 0u);
  EXPECT_EQ(s.failed_shards, 0u);
  EXPECT_EQ(s.bytes_to_device, run.entries_per_rank * kTaskShard * static_cast<uint64_t>(world_size()));
  if (world_rank() == 0)
    std::printf("[Random big] %llu entries per rank, %zu unique keys, node owner loads %llu, hits %llu, waits %llu\n",
                static_cast<unsigned long long>(run.entries_per_rank), run.unique.size(),
                static_cast<unsigned long long>(s.owner_loads), static_cast<unsigned long long>(s.hits),
                static_cast<unsigned long long>(s.waits));
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Queue, RandomTasksOverASmallCacheAreByteExactAndShareLoads) {
  // A key space larger than the cache: evictions, reloads; still every byte
  // right, and the node loads no more than one rank asked for (not once per rank).
  ucm_config_t cfg = task_config(96, "sim:latency_us=300,max_inflight=32");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  RandomRun run;
  // 24 blocks x 8 shards = 192 keys over 96 slots; a round (2 threads x 3
  // tasks x 4..8 entries) asks for at most 48 keys, so the ranks, kept within
  // one round of each other, share each load instead of evicting the keys
  // their peers are about to ask for.
  random_tasks(cache, 6, 24, 8, &run);
  EXPECT_EQ(run.failed.load(), 0u) << run.first_error;
  EXPECT_EQ(run.bad_bytes.load(), 0u);
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s = node_stats(cache);
  EXPECT_LE(s.owner_loads, run.entries_per_rank);
  EXPECT_GT(s.evictions, 0u) << "the key space is larger than the cache";
  EXPECT_EQ(s.failed_shards, 0u);
  if (world_rank() == 0)
    std::printf("[Random small] %llu entries per rank, node owner loads %llu, evictions %llu, no_space %llu\n",
                static_cast<unsigned long long>(run.entries_per_rank), static_cast<unsigned long long>(s.owner_loads),
                static_cast<unsigned long long>(s.evictions), static_cast<unsigned long long>(s.no_space));
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// ---- bad input --------------------------------------------------------------------

bool mentions(const char* msg, const std::string& what) { return msg && std::string(msg).find(what) != std::string::npos; }

// A good one-entry task right after: the cache stayed usable.
void expect_usable(ucm_cache_t cache, uint64_t block) {
  LoadBatch b;
  b.add(ukey(block, 1));
  EXPECT_EQ(load_and_wait(cache, b), UCM_OK) << ucm_last_error(cache);
  EXPECT_EQ(b.verify(0), kTaskShard);
}

// The inline path (queue/load_queue.h): a task whose every entry is a hit is
// copied by the calling thread, so it is done when ucm_load_task returns:
// ucm_task_test says so at once, the bytes are right, and the rank counts it
// in inline_tasks (with its hits and bytes). A task with one entry that is
// not a hit takes the queue's way, whole, and completes byte-exact.
TEST_F(Queue, AWarmTaskIsCopiedByTheCallingThreadAndDoneWhenItReturns) {
  ucm_config_t cfg = task_config(256, "sim:latency_us=100");
  cfg.prealloc = 0;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  // Each rank its own keys: a peer's load would make this rank's cold task a
  // hit too (the inline path then takes it, rightly).
  const uint64_t base = 9500 + 5 * static_cast<uint64_t>(world_rank());
  LoadBatch cold;
  for (uint64_t i = 0; i < 40; ++i) cold.add(ukey(base + i / 8, static_cast<uint32_t>(i % 8)));
  ASSERT_EQ(load_and_wait(cache, cold), UCM_OK) << ucm_last_error(cache);
    const ucm_stats_t before = rank_stats(cache);
  EXPECT_EQ(before.inline_tasks, 0u) << "the cold task missed";
  for (uint32_t n : {1u, 40u}) {
    LoadBatch warm;
    for (uint64_t i = 0; i < n; ++i) warm.add(ukey(base + i / 8, static_cast<uint32_t>(i % 8)));
    ucm_task_t t = 0;
    ASSERT_EQ(ucm_load_task(cache, warm.entries.data(), warm.entries.size(), &t), UCM_OK) << ucm_last_error(cache);
    for (size_t i = 0; i < warm.entries.size(); ++i) EXPECT_EQ(warm.verify(i), kTaskShard) << "entry " << i;
    int done = 0;
    EXPECT_EQ(ucm_task_test(cache, t, &done), UCM_OK) << ucm_last_error(cache);
    EXPECT_EQ(done, 1) << n << " hits: done when ucm_load_task returned";
  }
  const ucm_stats_t after = rank_stats(cache);
  EXPECT_EQ(after.inline_tasks, 2u);
  EXPECT_EQ(after.tasks, before.tasks + 2);
  EXPECT_EQ(after.hits, before.hits + 41);
  EXPECT_EQ(after.bytes_to_device, before.bytes_to_device + 41 * kTaskShard);
  // One entry not in the cache: the whole task is queued, and completes.
  LoadBatch mixed;
  for (uint64_t i = 0; i < 8; ++i) mixed.add(ukey(base, static_cast<uint32_t>(i)));
  mixed.entries[5].key = ukey(9600 + static_cast<uint64_t>(world_rank()), 5);  // each rank its own miss
  ASSERT_EQ(load_and_wait(cache, mixed), UCM_OK) << ucm_last_error(cache);
  for (size_t i = 0; i < mixed.entries.size(); ++i) EXPECT_EQ(mixed.verify(i), kTaskShard) << "entry " << i;
  const ucm_stats_t last = rank_stats(cache);
  EXPECT_EQ(last.inline_tasks, 2u);
  EXPECT_EQ(last.hits, after.hits + 7) << "the hits are counted once, by the queue";
  EXPECT_EQ(last.owner_loads, after.owner_loads + 1);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// Duplicate keys are found without a map (api/task_api.cpp): also past the
// 64 entries kept on the stack, and the first bad entry in entry order is
// the error, whatever its kind.
TEST_F(Queue, ARepeatedKeyNamesTheFirstRepeatAndTheEntryItRepeats) {
  ucm_config_t cfg = task_config(256, "sim:latency_us=100");
  cfg.max_task_entries = 200;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  ucm_task_t t = 777;
  auto batch = [](uint64_t n) {
    LoadBatch b;
    for (uint64_t i = 0; i < n; ++i) b.add(ukey(9700 + i / 8, static_cast<uint32_t>(i % 8)));
    return b;
  };
  {
    // 150 entries: 120 and 99 both repeat entry 40; 99 comes first.
    LoadBatch b = batch(150);
    b.entries[120].key = b.entries[40].key;
    b.entries[99].key = b.entries[40].key;
    EXPECT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t), UCM_ERR_DUPLICATE_KEY);
    const std::string want = "entry 99 repeats the key of entry 40 (block " +
                             key_hex(b.entries[40].key).substr(0, 32) + " shard 0)";
    EXPECT_TRUE(mentions(ucm_last_error(cache), want)) << ucm_last_error(cache) << " (want: " << want << ")";
  }
  {
    // Every entry the same key: entry 1 repeats entry 0.
    LoadBatch b = batch(100);
    for (auto& e : b.entries) e.key = b.entries[0].key;
    EXPECT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t), UCM_ERR_DUPLICATE_KEY);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "entry 1 repeats the key of entry 0")) << ucm_last_error(cache);
  }
  {
    // A NULL dst in entry 2 comes before entry 3's repeat of entry 1 ...
    LoadBatch b = batch(6);
    b.entries[3].key = b.entries[1].key;
    b.entries[2].dst = nullptr;
    EXPECT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t), UCM_ERR_NULL_POINTER);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "entry 2: dst is NULL")) << ucm_last_error(cache);
    // ... and after it in entry 4.
    b.entries[2].dst = b.dst[2].data();
    b.entries[4].dst = nullptr;
    EXPECT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t), UCM_ERR_DUPLICATE_KEY);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "entry 3 repeats the key of entry 1")) << ucm_last_error(cache);
    // The same shard of another block is another key.
    b.entries[4].dst = b.dst[4].data();
    b.entries[3].key = ukey(9800, b.entries[1].key.shard);
    EXPECT_EQ(load_and_wait(cache, b), UCM_OK) << ucm_last_error(cache);
  }
  EXPECT_EQ(rank_stats(cache).tasks, 1u) << "only the good task was submitted";
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Queue, BadInputIsItsOwnResultWithAMessageAndChangesNothing) {
  // The last rank is a scheduler (control plane only).
  const bool scheduler = world_rank() == world_size() - 1;
  ucm_config_t cfg = task_config(64, "sim:latency_us=100");
  cfg.max_task_entries = 32;
  if (scheduler) cfg.device_id = UCM_DEVICE_NONE;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  LoadBatch good;
  for (uint64_t i = 0; i < 4; ++i) good.add(ukey(9000 + i, 0));
  ucm_task_t t = 12345;

  if (scheduler) {
    EXPECT_EQ(ucm_load_task(cache, good.entries.data(), good.entries.size(), &t), UCM_ERR_BAD_STATE);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "scheduler rank")) << ucm_last_error(cache);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "device_id -1")) << ucm_last_error(cache);
    std::vector<ucm_dump_entry_t> d{{ukey(9000, 0), good.dst[0].data()}};
    EXPECT_EQ(ucm_dump_task(cache, d.data(), d.size(), &t), UCM_ERR_BAD_STATE);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "dump")) << ucm_last_error(cache);
    EXPECT_EQ(t, 12345u) << "no handle written on failure";
  } else {
    // NULL entries.
    EXPECT_EQ(ucm_load_task(cache, nullptr, 3, &t), UCM_ERR_NULL_POINTER);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "entries is NULL (n = 3)")) << ucm_last_error(cache);
    // A NULL dst in entry 2.
    {
      LoadBatch b = good;
      for (size_t i = 0; i < b.entries.size(); ++i) b.entries[i].dst = b.dst[i].data();
      b.entries[2].dst = nullptr;
      EXPECT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t), UCM_ERR_NULL_POINTER);
      EXPECT_TRUE(mentions(ucm_last_error(cache), "entry 2: dst is NULL")) << ucm_last_error(cache);
    }
    // A NULL src in a dump.
    {
      std::vector<ucm_dump_entry_t> d{{ukey(9100, 0), good.dst[0].data()}, {ukey(9101, 0), nullptr}};
      EXPECT_EQ(ucm_dump_task(cache, d.data(), d.size(), &t), UCM_ERR_NULL_POINTER);
      EXPECT_TRUE(mentions(ucm_last_error(cache), "entry 1: src is NULL")) << ucm_last_error(cache);
    }
    // A NULL task output.
    EXPECT_EQ(ucm_load_task(cache, good.entries.data(), good.entries.size(), nullptr), UCM_ERR_NULL_POINTER);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "task (the output handle) is NULL")) << ucm_last_error(cache);
    // A shard index out of range in entry 3.
    {
      std::vector<ucm_load_entry_t> es(good.entries);
      for (size_t i = 0; i < es.size(); ++i) es[i].dst = good.dst[i].data();
      es[3].key.shard = 9;
      EXPECT_EQ(ucm_load_task(cache, es.data(), es.size(), &t), UCM_ERR_OUT_OF_RANGE);
      EXPECT_TRUE(mentions(ucm_last_error(cache), "shard 9 >= shards_per_block 8 in entry 3")) << ucm_last_error(cache);
      es[3].key.shard = 8;  // the first bad value
      EXPECT_EQ(ucm_load_task(cache, es.data(), es.size(), &t), UCM_ERR_OUT_OF_RANGE);
      EXPECT_TRUE(mentions(ucm_last_error(cache), "shard 8 >= shards_per_block 8")) << ucm_last_error(cache);
    }
    // n = 0.
    EXPECT_EQ(ucm_load_task(cache, good.entries.data(), 0, &t), UCM_ERR_EMPTY);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "n is 0")) << ucm_last_error(cache);
    // n above max_task_entries.
    {
      LoadBatch big;
      for (uint64_t i = 0; i < 33; ++i) big.add(ukey(9200 + i, 0));
      EXPECT_EQ(ucm_load_task(cache, big.entries.data(), big.entries.size(), &t), UCM_ERR_TOO_LARGE);
      EXPECT_TRUE(mentions(ucm_last_error(cache), "n 33 > max_task_entries 32")) << ucm_last_error(cache);
    }
    // The same key twice (entries 1 and 3).
    {
      LoadBatch b;
      b.add(ukey(9300, 1));
      b.add(ukey(9301, 1));
      b.add(ukey(9302, 1));
      b.add(ukey(9301, 1));
      EXPECT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t), UCM_ERR_DUPLICATE_KEY);
      const std::string want = "entry 3 repeats the key of entry 1 (block " + key_hex(ukey(9301, 1)).substr(0, 32) +
                               " shard 1)";
      EXPECT_TRUE(mentions(ucm_last_error(cache), want)) << ucm_last_error(cache) << " (want: " << want << ")";
    }
    EXPECT_EQ(t, 12345u) << "no handle written on failure";
    const ucm_stats_t s = rank_stats(cache);
    EXPECT_EQ(s.tasks, 0u) << "nothing was submitted";
    // An unknown task handle, for wait and test.
    EXPECT_EQ(ucm_task_wait(cache, 987654321, 0), UCM_ERR_UNKNOWN_TASK);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "task 987654321 is not a task of this cache")) << ucm_last_error(cache);
    int done = 7;
    EXPECT_EQ(ucm_task_test(cache, 987654322, &done), UCM_ERR_UNKNOWN_TASK);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "task 987654322")) << ucm_last_error(cache);
    // A handle waited for twice.
    ucm_task_t once = 0;
    ASSERT_EQ(ucm_load_task(cache, good.entries.data(), good.entries.size(), &once), UCM_OK) << ucm_last_error(cache);
    EXPECT_EQ(ucm_task_wait(cache, once, kTaskWaitMs), UCM_OK) << ucm_last_error(cache);
    EXPECT_EQ(ucm_task_wait(cache, once, 0), UCM_ERR_UNKNOWN_TASK);
    EXPECT_TRUE(mentions(ucm_last_error(cache), "already waited for")) << ucm_last_error(cache);
    EXPECT_EQ(ucm_task_test(cache, once, &done), UCM_ERR_UNKNOWN_TASK);
    for (size_t i = 0; i < good.entries.size(); ++i) EXPECT_EQ(good.verify(i), kTaskShard);
    // A NULL done flag.
    EXPECT_EQ(ucm_task_test(cache, once, nullptr), UCM_ERR_NULL_POINTER);
    expect_usable(cache, 9400 + static_cast<uint64_t>(world_rank()));
  }
  // Also on the scheduler: unknown tasks and bad lookups.
  EXPECT_EQ(ucm_task_wait(cache, 55, 0), UCM_ERR_UNKNOWN_TASK);
  MPI_Barrier(MPI_COMM_WORLD);
  ucm_cache_t stale = cache;
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK);
  EXPECT_EQ(cache, nullptr);
  // A call after finalize: the stale handle.
  EXPECT_EQ(ucm_load_task(stale, good.entries.data(), good.entries.size(), &t), UCM_ERR_FINALIZED);
  EXPECT_TRUE(mentions(ucm_last_error(stale), "was finalized")) << ucm_last_error(stale);
  EXPECT_EQ(ucm_task_wait(stale, 1, 0), UCM_ERR_FINALIZED);
  EXPECT_EQ(ucm_cache_finalize(&stale), UCM_ERR_FINALIZED);
  // A pointer that never was a handle.
  int junk = 0;
  EXPECT_EQ(ucm_load_task(reinterpret_cast<ucm_cache_t>(&junk), good.entries.data(), good.entries.size(), &t),
            UCM_ERR_BAD_HANDLE);
  EXPECT_TRUE(mentions(ucm_last_error(nullptr), "is not a cache handle")) << ucm_last_error(nullptr);
  EXPECT_EQ(ucm_load_task(nullptr, good.entries.data(), good.entries.size(), &t), UCM_ERR_BAD_HANDLE);
  EXPECT_EQ(t, 12345u);

  // A fresh cache works after all that.
  ucm_config_t cfg2 = task_config(64, "sim:latency_us=100");
  ASSERT_NO_FATAL_FAILURE(init(cfg2));
  expect_usable(cache, 9500);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

}  // namespace
}  // namespace ucm::test
