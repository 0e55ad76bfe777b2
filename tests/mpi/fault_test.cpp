// Faults on the load path under mpirun: a store that fails chosen keys, a
// store that fails a fraction of all loads (retried and taken over), and a
// cache whose every slot a peer pins (back-pressure, then UCM_ERR_NO_SPACE).
// A rank SIGKILLed while it owns loads is tested in the mp suite
// (tests/mp/queue_kill_test.cpp, forked ranks), and at the C API under
// `mpirun --enable-recovery` by mpi-kill-mid-task (kill_mid_task.c): a gtest
// binary cannot lose a rank, since its MPI_Finalize would wait for it.
#include <cstdio>
#include <string>
#include <vector>

#include <thread>

#include <gtest/gtest.h>

#include "mpi/cache_fixture.h"
#include "mpi/mpi_test.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

using Fault = CacheTest;

TEST_F(Fault, FailedKeysAreABackendErrorNamingThemAndEveryOtherEntryLands) {
  // Blocks 40003 and 40007, shard 1, always fail.
  ucm_config_t cfg = task_config(128, "sim:latency_us=200,fail_keys=40003.1+40007.1");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  LoadBatch b;
  for (uint64_t i = 0; i < 10; ++i) b.add(ukey(40000 + i, 1));
  EXPECT_EQ(load_and_wait(cache, b), UCM_ERR_BACKEND);
  const std::string err = ucm_last_error(cache);
  EXPECT_NE(err.find(key_hex(ukey(40003, 1))), std::string::npos) << err;
  EXPECT_NE(err.find(key_hex(ukey(40007, 1))), std::string::npos) << err;
  EXPECT_NE(err.find("2 of 10 entries failed"), std::string::npos) << err;
  for (size_t i = 0; i < b.entries.size(); ++i) {
    if (i == 3 || i == 7) {
      EXPECT_TRUE(b.untouched(i)) << "entry " << i << " failed: its destination is not written";
    } else {
      EXPECT_EQ(b.verify(i), kTaskShard) << "entry " << i;
      EXPECT_EQ(err.find(key_hex(b.entries[i].key)), std::string::npos) << "entry " << i << " did not fail: " << err;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s = node_stats(cache);
  EXPECT_GT(s.load_failures, 0u);
  EXPECT_EQ(s.failed_shards, 2u * static_cast<uint64_t>(world_size())) << "each rank failed the two keys";

  // The cache stays usable; a task without the bad keys is fine.
  LoadBatch good;
  for (uint64_t i = 0; i < 3; ++i) good.add(ukey(40000 + i, 1));
  good.add(ukey(40003, 2));  // the same block, another shard
  EXPECT_EQ(load_and_wait(cache, good), UCM_OK) << ucm_last_error(cache);
  for (size_t i = 0; i < good.entries.size(); ++i) EXPECT_EQ(good.verify(i), kTaskShard) << "entry " << i;
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// ucm_last_error(cache) after a failed call gives that call's message, also
// when another thread's call on the same cache failed in between (the Python
// module reads a failed task's message, and its failed keys, that way).
// Step-synchronized: A's task fails, then B's call fails, then both read.
TEST_F(Fault, EachThreadReadsTheMessageOfItsOwnFailedCall) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0,fail_keys=40103.1");
  cfg.load_retries = 0;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t cache = cache_;
  LoadBatch a;
  a.add(ukey(40103, 1));
  EXPECT_EQ(load_and_wait(cache, a), UCM_ERR_BACKEND);  // thread A: this one
  std::string b_msg;
  std::thread b([&] {
    LoadBatch bad;
    bad.add(ukey(40104, 999));  // shard 999 >= shards_per_block
    ucm_task_t t = 0;
    EXPECT_EQ(ucm_load_task(cache, bad.entries.data(), 1, &t), UCM_ERR_OUT_OF_RANGE);
    b_msg = ucm_last_error(cache);
  });
  b.join();
  const std::string a_msg = ucm_last_error(cache);
  EXPECT_NE(a_msg.find(key_hex(ukey(40103, 1))), std::string::npos) << "thread A read: " << a_msg;
  EXPECT_NE(b_msg.find("shard 999 >= shards_per_block"), std::string::npos) << "thread B read: " << b_msg;
  // A thread that made no failed call on the cache reads the cache's last.
  std::string c_msg;
  std::thread c([&] { c_msg = ucm_last_error(cache); });
  c.join();
  EXPECT_EQ(c_msg, b_msg);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Fault, AFractionOfFailedLoadsIsRetriedAndNothingWrongEverLands) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=200,fail_fraction=0.3,seed=7");
  cfg.load_retries = 3;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  constexpr int kTasks = 8;
  constexpr int kEntries = 8;
  int ok_tasks = 0, backend_tasks = 0, other = 0;
  uint64_t landed = 0, untouched = 0, garbage = 0;
  std::string other_error;
  for (int t = 0; t < kTasks; ++t) {
    LoadBatch b;
    for (int i = 0; i < kEntries; ++i) b.add(ukey(41000 + static_cast<uint64_t>(t * kEntries + i), 4));
    const ucm_result_t r = load_and_wait(cache, b);
    if (r == UCM_OK) ++ok_tasks;
    else if (r == UCM_ERR_BACKEND) ++backend_tasks;
    else if (++other == 1) other_error = ucm_last_error(cache);
    for (size_t i = 0; i < b.entries.size(); ++i) {
      if (b.verify(i) == kTaskShard) ++landed;
      else if (b.untouched(i)) ++untouched;
      else ++garbage;
    }
    if (r == UCM_OK) {
      for (size_t i = 0; i < b.entries.size(); ++i) EXPECT_EQ(b.verify(i), kTaskShard) << "task " << t << " entry " << i;
    }
  }
  EXPECT_EQ(other, 0) << "a failure is UCM_ERR_BACKEND, never anything else: " << other_error;
  EXPECT_EQ(garbage, 0u) << "every destination holds its key's bytes or was never written";
  EXPECT_GT(ok_tasks, kTasks / 2) << "retries and takeovers carry most tasks through";
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s = node_stats(cache);
  EXPECT_GT(s.load_failures, 0u) << "the store did fail loads";
  EXPECT_GT(s.takeovers, 0u) << "failed loads were taken over";
  std::printf("[FailFraction] rank %d: %d ok, %d backend errors; %llu entries landed, %llu not written; node: %llu "
              "loads, %llu failed, %llu takeovers\n",
              world_rank(), ok_tasks, backend_tasks, static_cast<unsigned long long>(landed),
              static_cast<unsigned long long>(untouched), static_cast<unsigned long long>(s.owner_loads),
              static_cast<unsigned long long>(s.load_failures), static_cast<unsigned long long>(s.takeovers));
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Fault, AWaitThatTimesOutKeepsTheTaskAndFinalizeEndsAHungLoad) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=100");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  SimBackend* sim = sim_of(cache);
  ASSERT_NE(sim, nullptr);
  sim->hang_key(ikey(ukey(43000, 1)));  // whichever rank owns it, its load never completes
  LoadBatch b;
  b.add(ukey(43000, 1));
  b.add(ukey(43001, 1));
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t), UCM_OK) << ucm_last_error(cache);
  EXPECT_EQ(ucm_task_wait(cache, t, 50), UCM_ERR_TIMEOUT);
  EXPECT_NE(std::string(ucm_last_error(cache)).find("still running after 50 ms"), std::string::npos)
      << ucm_last_error(cache);
  int done = 1;
  EXPECT_EQ(ucm_task_test(cache, t, &done), UCM_OK) << "a timed-out wait leaves the handle valid";
  EXPECT_EQ(done, 0);
  // Finalize with the task and the hung load in flight: it returns (under the
  // hang guard), and the store completes the hung request (into a slot that
  // still exists).
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
  EXPECT_EQ(ucm_task_wait(cache, t, 0), UCM_ERR_BAD_HANDLE) << "the handle is gone with the cache";
}

TEST_F(Fault, ACacheFullOfAPeersPinsGivesBackPressureThenNoSpaceAndRecovers) {
  // A short task deadline (timeout_ms also bounds init: keep it sane).
  ucm_config_t cfg = task_config(16, "sim:latency_us=100");
  cfg.timeout_ms = 3000;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  ASSERT_EQ(ucm_cache_info(cache, &info), UCM_OK);
  const bool holder = world_rank() == 0;
  CacheBuffer* cb = impl_of(cache)->buffer();
  std::vector<uint32_t> pinned;
  if (holder) {
    // Rank 0 fills every regular slot and keeps its pins (as a copier that
    // never finishes would).
    for (uint32_t i = 0; i < info.regular_slots; ++i) {
      const ucm_key_t k = ukey(42000 + i, 0);
      GetResult g;
      ASSERT_EQ(cb->get(ikey(k), &g), Result::kOk) << last_error();
      ASSERT_EQ(g.kind, GetKind::kOwner);
      sim_fill(ikey(k), cb->data_at(g.slot), kTaskShard);
      ASSERT_EQ(cb->mark_ready(g.slot), Result::kOk) << last_error();
      pinned.push_back(g.slot);
    }
    GetResult g;
    EXPECT_EQ(cb->get(ikey(ukey(42999, 0)), &g), Result::kNoSpace) << "every regular slot is pinned";
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t before = rank_stats(cache);
  if (!holder) {
    LoadBatch b;
    b.add(ukey(42500, 1));
    b.add(ukey(42501, 1));
    ucm_task_t t = 0;
    ASSERT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t), UCM_OK) << ucm_last_error(cache);
    EXPECT_EQ(ucm_task_wait(cache, t, kTaskWaitMs), UCM_ERR_NO_SPACE) << ucm_last_error(cache);
    const std::string err = ucm_last_error(cache);
    EXPECT_NE(err.find("no free cache slot before the task's deadline"), std::string::npos) << err;
    EXPECT_TRUE(b.untouched(0));
    EXPECT_TRUE(b.untouched(1));
    const ucm_stats_t after = rank_stats(cache);
    EXPECT_GT(after.no_space - before.no_space, 2u) << "the dispatcher retried (back-pressure) before giving up";
    EXPECT_EQ(after.failed_shards - before.failed_shards, 2u);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (holder)
    for (uint32_t s : pinned) cb->release(s);
  MPI_Barrier(MPI_COMM_WORLD);

  // Usable again: a formerly pinned key hits, new keys find victims.
  LoadBatch b;
  b.add(ukey(42000, 0));
  b.add(ukey(42500, 1));
  b.add(ukey(42600, 3));
  EXPECT_EQ(load_and_wait(cache, b), UCM_OK) << ucm_last_error(cache);
  for (size_t i = 0; i < b.entries.size(); ++i) EXPECT_EQ(b.verify(i), kTaskShard) << "entry " << i;
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

}  // namespace
}  // namespace ucm::test
