// Fan-out (UCM_FANOUT=mpi) under mpirun, on the host engine: the protocol of
// queue/fanout.h over the MPI seam (boot/coll_mpi.cpp). Every rank submits the
// same tasks in the same order (the mode's contract) unless a test says
// otherwise. The binary runs with MPI_THREAD_MULTIPLE (mpi_main.cpp).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "mpi/mpi_test.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

using Fanout = MpiTest;

ucm_config_t fanout_config(uint64_t slots, const char* backend, ucm_fanout_t mode = UCM_FANOUT_MPI) {
  ucm_config_t c = task_config(slots, backend);
  c.copy_engine = UCM_COPY_ENGINE_HOST;
  c.max_task_entries = 256;
  c.fanout = mode;
  return c;
}

int local_size_of(ucm_cache_t cache) {
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  EXPECT_EQ(ucm_cache_info(cache, &info), UCM_OK) << ucm_last_error(cache);
  return info.local_size;
}

int local_rank_of(ucm_cache_t cache) {
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  EXPECT_EQ(ucm_cache_info(cache, &info), UCM_OK) << ucm_last_error(cache);
  return info.local_rank;
}

// The paired-task cases' start: fan-out over a sim store of 50 us latency.
// False where the case cannot run: init failed (a failure, recorded) or the
// node has one local rank (the cache is finalized; the caller skips).
bool open_paired(ucm_cache_t* cache, int* n, int* me) {
  ucm_config_t cfg = fanout_config(128, "sim:latency_us=50");
  const ucm_result_t r = ucm_cache_init(MPI_COMM_WORLD, &cfg, cache);
  EXPECT_EQ(r, UCM_OK) << ucm_last_error(nullptr);
  if (r != UCM_OK) return false;
  *n = local_size_of(*cache);
  *me = local_rank_of(*cache);
  if (*n >= 2) return true;
  EXPECT_EQ(ucm_cache_finalize(cache), UCM_OK);
  return false;
}

LoadBatch keys_batch(uint64_t first_block, uint64_t n) {
  LoadBatch b;
  for (uint64_t i = 0; i < n; ++i) b.add(ukey(first_block + i / 8, static_cast<uint32_t>(i % 8)));
  return b;
}

void expect_exact(const LoadBatch& b) {
  for (size_t i = 0; i < b.entries.size(); ++i)
    EXPECT_EQ(b.verify(i), kTaskShard) << "entry " << i << " (" << key_hex(b.entries[i].key) << ") differs at that offset";
}

// One task of `kKeys` shards (two chunks of 64: the second chunk's loads
// overlap the first's broadcasts), cold and then warm, with fan-out and then
// without it, in the same run: every destination byte-exact; the node reads
// each shard from its host slots once with fan-out and once per rank without.
TEST_F(Fanout, OneHostReadPerShardPerNodeAgainstOnePerRank) {
  constexpr uint64_t kKeys = 100;
  uint64_t with_reads = 0, without_reads = 0;
  int n = 0;
  for (ucm_fanout_t mode : {UCM_FANOUT_MPI, UCM_FANOUT_OFF}) {
    ucm_config_t cfg = fanout_config(256, "sim:latency_us=50", mode);
    ucm_cache_t cache = nullptr;
    ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
    n = local_size_of(cache);
    const int me = local_rank_of(cache);
    ucm_cache_info_t info{};
    info.struct_bytes = sizeof(info);
    ASSERT_EQ(ucm_cache_info(cache, &info), UCM_OK);
    EXPECT_EQ(std::string(info.fanout).rfind(mode == UCM_FANOUT_MPI ? "mpi" : "off", 0), 0u) << info.fanout;
    for (int round = 0; round < 2; ++round) {  // cold, then warm
      LoadBatch b = keys_batch(70000, kKeys);
      ASSERT_EQ(load_and_wait(cache, b), UCM_OK) << ucm_last_error(cache);
      expect_exact(b);
    }
    MPI_Barrier(MPI_COMM_WORLD);  // every rank's tasks done before the node's counters are read
    const ucm_stats_t node = node_stats(cache);
    const ucm_stats_t mine = rank_stats(cache);
    EXPECT_EQ(mine.fanout_mode, static_cast<uint64_t>(mode));
    // The warm round is all hits: copied on the calling thread without
    // fan-out (the cold one too on a rank whose peers loaded every key
    // first), never with it (its turns are collective).
    if (mode == UCM_FANOUT_MPI) {
      EXPECT_EQ(mine.inline_tasks, 0u);
    } else {
      EXPECT_GE(mine.inline_tasks, 1u);
      EXPECT_LE(mine.inline_tasks, 2u);
    }
    EXPECT_EQ(node.owner_loads, kKeys) << "each shard loaded from the store once per node";
    if (mode == UCM_FANOUT_MPI) {
      with_reads = node.bytes_to_device;
      // Roots: entry i's is local rank i mod n, so each rank read about 1/n.
      uint64_t rooted = 0;
      for (uint64_t i = 0; i < kKeys; ++i) rooted += (i % static_cast<uint64_t>(n)) == static_cast<uint64_t>(me);
      EXPECT_EQ(mine.fanout_host_bytes, 2 * rooted * kTaskShard);
      EXPECT_EQ(mine.bytes_to_device, 2 * rooted * kTaskShard) << "a rank reads its rooted shards only";
      EXPECT_EQ(mine.fanout_bcast_bytes, 2 * (kKeys - rooted) * kTaskShard);
      EXPECT_EQ(mine.fanout_fallbacks, 0u);
      EXPECT_LE(rooted, kKeys / static_cast<uint64_t>(n) + 1);
      EXPECT_GE(rooted, kKeys / static_cast<uint64_t>(n));
    } else {
      without_reads = node.bytes_to_device;
      EXPECT_EQ(mine.fanout_host_bytes, 0u);
    }
    ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
  }
  EXPECT_EQ(with_reads, 2 * kKeys * kTaskShard) << "one host-slot read per shard per node, per round";
  EXPECT_EQ(without_reads, 2 * kKeys * kTaskShard * static_cast<uint64_t>(n)) << "one per rank without fan-out";
}

// The last rank submits other keys: every rank's task fails with
// UCM_ERR_BAD_STATE naming both tasks. A rank may have submitted one task
// more than the others, so the turns are not trusted again: fan-out is off on
// every rank from then on, and the next task is delivered by per-rank copies.
TEST_F(Fanout, DifferentTaskOnOneRankIsBadStateOnEveryRank) {
  ucm_cache_t cache = nullptr;
  int n = 0, me = 0;
  if (!open_paired(&cache, &n, &me)) GTEST_SKIP() << "needs 2 local ranks";
  LoadBatch odd = keys_batch(me == n - 1 ? 71100 : 71000, 12);
  EXPECT_EQ(load_and_wait(cache, odd), UCM_ERR_BAD_STATE);
  const std::string why = ucm_last_error(cache);
  EXPECT_NE(why.find("different tasks"), std::string::npos) << why;
  EXPECT_NE(why.find("local rank 0's task"), std::string::npos) << why;
  EXPECT_NE(why.find("local rank " + std::to_string(n - 1) + "'s task"), std::string::npos) << why;
  for (size_t i = 0; i < odd.entries.size(); ++i) EXPECT_TRUE(odd.untouched(i)) << "entry " << i;
  LoadBatch same = keys_batch(71200, 12);
  ASSERT_EQ(load_and_wait(cache, same), UCM_OK) << ucm_last_error(cache);
  expect_exact(same);
  EXPECT_EQ(rank_stats(cache).fanout_mismatches, 1u);
  EXPECT_EQ(rank_stats(cache).fanout_fallbacks, 1u) << "the next task ran as per-rank copies";
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  ASSERT_EQ(ucm_cache_info(cache, &info), UCM_OK);
  EXPECT_EQ(std::string(info.fanout).rfind("off since", 0), 0u) << info.fanout;
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
}

// One rank submits a task more than its peers: its extra task is paired with
// their next one, both fail with UCM_ERR_BAD_STATE, and no later task hangs or
// fails (fan-out is off from then on).
TEST_F(Fanout, ExtraTaskOnOneRankNeverUnpairsLaterTasks) {
  ucm_cache_t cache = nullptr;
  int n = 0, me = 0;
  if (!open_paired(&cache, &n, &me)) GTEST_SKIP() << "needs 2 local ranks";
  if (me == 0) {
    LoadBatch extra = keys_batch(71500, 4);
    EXPECT_EQ(load_and_wait(cache, extra), UCM_ERR_BAD_STATE) << ucm_last_error(cache);
  }
  for (int task = 0; task < 3; ++task) {
    LoadBatch b = keys_batch(71600 + 100 * task, 8);
    const ucm_result_t r = load_and_wait(cache, b);
    if (task == 0 && me != 0) {
      EXPECT_EQ(r, UCM_ERR_BAD_STATE) << ucm_last_error(cache);
      continue;
    }
    ASSERT_EQ(r, UCM_OK) << "task " << task << ": " << ucm_last_error(cache);
    expect_exact(b);
  }
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
}

// A load that one rank refuses (a repeated key) still takes that rank's turn:
// the others fail theirs naming the refusal, and the next task is paired.
TEST_F(Fanout, RefusedLoadStillTakesItsTurn) {
  ucm_cache_t cache = nullptr;
  int n = 0, me = 0;
  if (!open_paired(&cache, &n, &me)) GTEST_SKIP() << "needs 2 local ranks";
  LoadBatch b = keys_batch(72000, 6);
  if (me == 1) b.entries[5].key = b.entries[0].key;
  const ucm_result_t r = load_and_wait(cache, b);
  const std::string why = ucm_last_error(cache);
  if (me == 1) {
    EXPECT_EQ(r, UCM_ERR_DUPLICATE_KEY) << why;
  } else {
    EXPECT_EQ(r, UCM_ERR_BAD_STATE) << why;
    EXPECT_NE(why.find("local rank 1 refused its task"), std::string::npos) << why;
  }
  LoadBatch next = keys_batch(72100, 6);
  ASSERT_EQ(load_and_wait(cache, next), UCM_OK) << ucm_last_error(cache);
  expect_exact(next);
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
}

// A load refused because its rank holds max_unfinished_tasks unfinished
// tasks still takes that rank's turn: rank 0 finishes its first task, so
// only rank 1 is at the bound; rank 0's paired task fails naming the
// refusal, and the next task is paired and exact. Before, the refusal
// skipped the turn and unpaired every later task of the node.
TEST_F(Fanout, LoadRefusedAtTheTaskBoundStillTakesItsTurn) {
  constexpr uint64_t kShard = 64;
  constexpr uint32_t kBound = 200;
  ucm_config_t cfg = fanout_config(128, "sim:latency_us=0");
  cfg.shard_bytes = kShard;
  cfg.cache_bytes = 128 * kShard;
  cfg.max_unfinished_tasks = kBound;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  const int n = local_size_of(cache), me = local_rank_of(cache);
  if (n != 2) {
    EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
    GTEST_SKIP() << "the case pairs exactly 2 local ranks";
  }
  const ucm_key_t k = ukey(72500, 0);
  std::vector<uint8_t> buf;
  std::string refused;
  std::vector<ucm_task_t> tasks = submit_unwaited(cache, k, kShard, kBound, &buf, &refused);
  ASSERT_EQ(tasks.size(), size_t{kBound}) << refused;
  if (me == 0) {
    ASSERT_EQ(ucm_task_wait(cache, tasks.front(), 60000), UCM_OK) << ucm_last_error(cache);
    tasks.erase(tasks.begin());
  }
  // A 4-key load: rank 1 is at the bound, rank 0 is not.
  auto four_keys = [](uint64_t block, std::vector<uint8_t>* dst) {
    dst->assign(4 * kShard, 0xee);
    std::vector<ucm_load_entry_t> es;
    for (uint32_t s = 0; s < 4; ++s) es.push_back({ukey(block, s), dst->data() + s * kShard});
    return es;
  };
  std::vector<uint8_t> d1, d2;
  std::vector<ucm_load_entry_t> first = four_keys(72600, &d1);
  ucm_task_t t = 0;
  ucm_result_t r = ucm_load_task(cache, first.data(), first.size(), &t);
  if (r == UCM_OK) r = ucm_task_wait(cache, t, 60000);
  const std::string why = ucm_last_error(cache);
  if (me == 1) {
    EXPECT_EQ(r, UCM_ERR_BUSY) << why;
    EXPECT_NE(why.find(std::to_string(kBound) + " tasks"), std::string::npos) << why;
  } else {
    EXPECT_EQ(r, UCM_ERR_BAD_STATE) << why;
    EXPECT_NE(why.find("local rank 1 refused its task"), std::string::npos) << why;
  }
  size_t bad = 0;
  for (ucm_task_t x : tasks) bad += ucm_task_wait(cache, x, 60000) != UCM_OK;
  EXPECT_EQ(bad, 0u);
  std::vector<ucm_load_entry_t> next = four_keys(72700, &d2);
  r = ucm_load_task(cache, next.data(), next.size(), &t);
  if (r == UCM_OK) r = ucm_task_wait(cache, t, 60000);
  ASSERT_EQ(r, UCM_OK) << ucm_last_error(cache);
  for (uint32_t s = 0; s < 4; ++s)
    EXPECT_EQ(sim_verify(ikey(next[s].key), d2.data() + s * kShard, kShard), kShard) << "shard " << s;
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
}

// A shard whose load fails (the sim store fails it) is not broadcast: every
// rank gets UCM_ERR_BACKEND naming that key, its destination untouched on
// the ranks it was not loaded on, and every other entry delivered.
TEST_F(Fanout, FailedLoadFailsThatKeyOnEveryRank) {
  // Entry 5 is block 73000 shard 5 (keys_batch: 8 shards per block).
  ucm_config_t cfg = fanout_config(128, "sim:latency_us=50,fail_keys=73000.5");
  cfg.load_retries = 0;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  const int n = local_size_of(cache);
  const int me = local_rank_of(cache);
  LoadBatch b = keys_batch(73000, 16);
  EXPECT_EQ(load_and_wait(cache, b), UCM_ERR_BACKEND);
  const std::string why = ucm_last_error(cache);
  EXPECT_NE(why.find(key_hex(b.entries[5].key)), std::string::npos) << why;
  EXPECT_NE(why.find("1 of 16 entries failed"), std::string::npos) << why;
  for (size_t i = 0; i < b.entries.size(); ++i) {
    if (i == 5) {
      if (static_cast<int>(i % static_cast<size_t>(n)) != me) {
        EXPECT_TRUE(b.untouched(i)) << "not broadcast";
      }
      continue;
    }
    EXPECT_EQ(b.verify(i), kTaskShard) << "entry " << i;
  }
  EXPECT_EQ(node_stats(cache).owner_loads, 16u) << "one try of the failing key, once per node";
  // The cache and the turns stay usable.
  LoadBatch next = keys_batch(73100, 16);
  ASSERT_EQ(load_and_wait(cache, next), UCM_OK) << ucm_last_error(cache);
  expect_exact(next);
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
}

// A rank that stops calling (the test hook: local rank 1 does not post its
// broadcasts of turn 1 and falls back): its peers' broadcast passes its bound,
// they abort and fall back to per-rank copies from the host slots; every
// destination is still exact, the fallback is counted, and later tasks (per
// rank from then on) work.
TEST_F(Fanout, StalledRankFallsBackToPerRankCopies) {
  setenv("UCM_FANOUT_TEST_STALL", "1:1", 1);
  ucm_config_t cfg = fanout_config(128, "sim:latency_us=50");
  cfg.timeout_ms = 1500;  // the bound each collective step gets
  ucm_cache_t cache = nullptr;
  const ucm_result_t init = ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache);
  unsetenv("UCM_FANOUT_TEST_STALL");
  ASSERT_EQ(init, UCM_OK) << ucm_last_error(nullptr);
  const int n = local_size_of(cache);
  if (n < 2) {
    ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK);
    GTEST_SKIP() << "needs 2 local ranks";
  }
  LoadBatch b = keys_batch(74000, 24);
  ASSERT_EQ(load_and_wait(cache, b), UCM_OK) << ucm_last_error(cache);
  expect_exact(b);
  EXPECT_GE(rank_stats(cache).fanout_fallbacks, 1u);
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  ASSERT_EQ(ucm_cache_info(cache, &info), UCM_OK);
  EXPECT_EQ(std::string(info.fanout).rfind("off since", 0), 0u) << info.fanout;
  LoadBatch next = keys_batch(74100, 24);
  ASSERT_EQ(load_and_wait(cache, next), UCM_OK) << ucm_last_error(cache);
  expect_exact(next);
  EXPECT_GE(rank_stats(cache).fanout_fallbacks, 2u);
  // The stalled rank is done long before its peers' bound passes: meet first,
  // so that finalize's own bound (the same timeout_ms) starts together.
  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
}

// A load that hangs in every chunk: the task fails at its own deadline. Each
// chunk's loads ran as an internal task with a deadline of its own (a task
// timeout from when the chunk started), so a task of C chunks, each with a
// hung key, took about C / 2 timeouts (a session-20 audit: 1024 keys, 1 s
// timeout, 8-9 s; 2048 keys, 16 s); now every chunk ends with the task. The
// guard's bound is 10 timeouts (36 chunks took 18 or more). Every other entry
// is its key's bytes or untouched, and the cache stays usable.
TEST_F(Fanout, AHungLoadInEveryChunkFailsTheTaskAtItsDeadline) {
  constexpr uint64_t kChunks = 36;
  constexpr uint64_t kKeys = 64 * kChunks;
  constexpr uint64_t kTimeoutMs = 1500;
  // Entries 64 c and 64 c + 1 of each chunk c, rooted on local ranks 0 and 1
  // (so that at 2 ranks each waits for its own and neither gives up on a
  // collective first): block 1 + 8 c, shards 0 and 1 (keys_batch: 8 shards a
  // block; short numbers: the spec holds 511 characters).
  std::string hang;
  for (uint64_t c = 0; c < kChunks; ++c)
    for (uint32_t r = 0; r < 2; ++r) {
      if (!hang.empty()) hang += '+';
      hang += std::to_string(1 + 8 * c);
      hang += '.';
      hang += std::to_string(r);
    }
  // Hung loads keep their place in the sim store until it is destroyed (and a
  // peer that takes over an abandoned one hangs another): room for all of
  // them, so that the next task's loads are admitted.
  const std::string backend = "sim:latency_us=50,max_inflight=4096,hang_keys=" + hang;
  ASSERT_LT(backend.size(), sizeof(ucm_config_t{}.backend));
  ucm_config_t cfg = fanout_config(kKeys + 256, backend.c_str());
  cfg.max_task_entries = kKeys;
  cfg.load_retries = 0;
  cfg.timeout_ms = kTimeoutMs;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  if (local_size_of(cache) < 2) {
    ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK);
    GTEST_SKIP() << "needs 2 local ranks";
  }
  LoadBatch b = keys_batch(1, kKeys);
  {
    ucm_task_t t = 0;
    ASSERT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t), UCM_OK) << ucm_last_error(cache);
    HangGuard g("ucm_task_wait(-1) on a fan-out task with a hung load in each of its 36 chunks", 10 * kTimeoutMs / 1000.0);
    EXPECT_EQ(ucm_task_wait(cache, t, -1), UCM_ERR_TIMEOUT) << ucm_last_error(cache);
  }
  for (size_t i = 0; i < b.entries.size(); ++i)
    EXPECT_TRUE(b.verify(i) == kTaskShard || b.untouched(i)) << "entry " << i << ": wrong byte at " << b.verify(i);
  for (uint64_t c = 0; c < kChunks; ++c)
    for (uint32_t r = 0; r < 2; ++r) EXPECT_TRUE(b.untouched(64 * c + r)) << "hung entry " << r << " of chunk " << c;
  LoadBatch next = keys_batch(76000, 64);
  ASSERT_EQ(load_guarded(cache, next, "the next task"), UCM_OK) << ucm_last_error(cache);
  expect_exact(next);
  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
}

// Pretend nodes of 2 ranks (of 1 at -np 2... of 2 at -np 4): each node's
// ranks fan out among themselves only, one host read per shard per node.
TEST_F(Fanout, PretendNodesFanOutWithinEachNode) {
  const uint32_t per = world_size() >= 4 ? 2 : 1;
  ucm_config_t cfg = fanout_config(128, "sim:latency_us=50");
  cfg.ranks_per_node = per;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  ASSERT_EQ(local_size_of(cache), static_cast<int>(per));
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  ASSERT_EQ(ucm_cache_info(cache, &info), UCM_OK);
  EXPECT_NE(std::string(info.fanout).find("over " + std::to_string(per) + " local ranks"), std::string::npos)
      << info.fanout;
  LoadBatch b = keys_batch(75000, 40);
  ASSERT_EQ(load_and_wait(cache, b), UCM_OK) << ucm_last_error(cache);
  expect_exact(b);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(node_stats(cache).bytes_to_device, 40 * kTaskShard) << "one host read per shard per (pretend) node";
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
}

// Mode checks at init: fan-out over MPI broadcasts host buffers, NCCL needs
// the cuda engine; both refusals are the same error on every rank.
TEST_F(Fanout, InitRefusesNcclOnTheHostEngine) {
  ucm_config_t cfg = fanout_config(64, "sim:latency_us=50", UCM_FANOUT_NCCL);
  ucm_cache_t cache = nullptr;
  EXPECT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_ERR_UNSUPPORTED);
  const std::string why = ucm_last_error(nullptr);
  EXPECT_NE(why.find("UCM_FANOUT=nccl"), std::string::npos) << why;
  EXPECT_EQ(cache, nullptr);
}

}  // namespace
}  // namespace ucm::test
