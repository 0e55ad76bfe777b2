// Task handles at the C boundary: a handle belongs to the cache that issued
// it (two caches in one process never answer for each other's tasks), and a
// task's result goes to exactly one of the calls that finish it, however many
// threads wait for or test the same task at once (ucm_base.h, ucm_task_wait).
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "mpi/cache_fixture.h"
#include "mpi/mpi_test.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

using TaskHandle = CacheTest;

// Two caches side by side in one process, each with a task of its own, both
// done: a wait on one cache with the other's handle is UCM_ERR_UNKNOWN_TASK
// and leaves both tasks for their own caches. Before handles were unique in
// the process, both caches numbered their tasks from 1: the wait on the
// wrong cache returned the other task's UCM_OK and retired it.
TEST_F(TaskHandle, ACacheDoesNotAnswerForAnotherCachesTask) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t other = nullptr;
  {
    HangGuard g("ucm_cache_init of a second cache");
    ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &other), UCM_OK) << msg(nullptr);
  }
  LoadBatch mine, theirs;
  mine.add(ukey(1, 0));
  theirs.add(ukey(2, 0));
  ucm_task_t tm = 0, tt = 0;
  ASSERT_EQ(ucm_load_task(cache_, mine.entries.data(), 1, &tm), UCM_OK) << msg(cache_);
  ASSERT_EQ(ucm_load_task(other, theirs.entries.data(), 1, &tt), UCM_OK) << msg(other);
  EXPECT_NE(tm, tt) << "two caches gave out the same task handle";

  EXPECT_EQ(ucm_task_wait(other, tm, kTaskWaitMs), UCM_ERR_UNKNOWN_TASK) << msg(other);
  int done = 7;
  EXPECT_EQ(ucm_task_test(cache_, tt, &done), UCM_ERR_UNKNOWN_TASK) << msg(cache_);
  // Each task is still its own cache's, with its bytes.
  EXPECT_EQ(ucm_task_wait(cache_, tm, kTaskWaitMs), UCM_OK) << msg(cache_);
  EXPECT_EQ(ucm_task_wait(other, tt, kTaskWaitMs), UCM_OK) << msg(other);
  EXPECT_EQ(mine.verify(0), kTaskShard);
  EXPECT_EQ(theirs.verify(0), kTaskShard);

  MPI_Barrier(MPI_COMM_WORLD);
  {
    HangGuard g("ucm_cache_finalize of the second cache");
    EXPECT_EQ(ucm_cache_finalize(&other), UCM_OK) << msg(nullptr);
  }
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

constexpr int kRacers = 4;

// What each of kRacers threads got from finishing one task.
struct RaceOutcome {
  int ok = 0, unknown = 0, other = 0;
  void count(ucm_result_t r) { (r == UCM_OK ? ok : r == UCM_ERR_UNKNOWN_TASK ? unknown : other)++; }
};

// A load that takes a while (the sim store's latency), so that every waiter
// is blocked in ucm_task_wait when it completes: one of them gets UCM_OK, the
// others UCM_ERR_UNKNOWN_TASK (the handle is retired by the first). Before,
// every waiter that was blocked returned UCM_OK.
TEST_F(TaskHandle, OfSeveralThreadsWaitingForOneTaskOneGetsItsResult) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=300000");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  LoadBatch b;
  b.add(ukey(10, 1));
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_load_task(cache_, b.entries.data(), 1, &t), UCM_OK) << msg(cache_);
  std::atomic<int> results[kRacers];
  std::vector<std::thread> waiters;
  for (int i = 0; i < kRacers; ++i)
    waiters.emplace_back([&, i] { results[i].store(ucm_task_wait(cache_, t, kTaskWaitMs)); });
  {
    HangGuard g("threads waiting for one task");
    for (auto& w : waiters) w.join();
  }
  RaceOutcome got;
  for (auto& r : results) got.count(static_cast<ucm_result_t>(r.load()));
  EXPECT_EQ(got.ok, 1);
  EXPECT_EQ(got.unknown, kRacers - 1);
  EXPECT_EQ(got.other, 0);
  EXPECT_EQ(b.verify(0), kTaskShard);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// Threads that poll one task with ucm_task_test: one sees it done with its
// result; the others see the handle retired (UCM_ERR_UNKNOWN_TASK) with
// *done = 0, never *done = 1 beside an error that is not the task's.
TEST_F(TaskHandle, OfSeveralThreadsTestingOneTaskOneGetsItDone) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=20000");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  for (int round = 0; round < 20; ++round) {
    LoadBatch b;
    b.add(ukey(100 + static_cast<uint64_t>(round), 2));
    ucm_task_t t = 0;
    ASSERT_EQ(ucm_load_task(cache_, b.entries.data(), 1, &t), UCM_OK) << msg(cache_);
    std::atomic<int> results[kRacers];
    std::atomic<int> done_on_error{0};
    std::vector<std::thread> testers;
    for (int i = 0; i < kRacers; ++i)
      testers.emplace_back([&, i] {
        for (;;) {
          int done = 0;
          const ucm_result_t r = ucm_task_test(cache_, t, &done);
          if (r == UCM_OK && !done) continue;
          if (r != UCM_OK && done) done_on_error.fetch_add(1);
          results[i].store(r);
          return;
        }
      });
    {
      HangGuard g("threads testing one task");
      for (auto& th : testers) th.join();
    }
    RaceOutcome got;
    for (auto& r : results) got.count(static_cast<ucm_result_t>(r.load()));
    EXPECT_EQ(got.ok, 1) << "round " << round;
    EXPECT_EQ(got.unknown, kRacers - 1) << "round " << round;
    EXPECT_EQ(done_on_error.load(), 0) << "round " << round;
    EXPECT_EQ(b.verify(0), kTaskShard);
  }
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// Tasks submitted and never finished (no ucm_task_wait or ucm_task_test
// that returned their result) are bounded by max_unfinished_tasks: the next
// submit is UCM_ERR_BUSY naming the bound, and finishing one makes room.
// Before, the task table grew without bound (each done task kept its
// entries): an app that never waited was ended by the OOM killer, 12 GiB in
// a minute. Once at the default bound (65536), once at a small one.
TEST_F(TaskHandle, TasksNeverFinishedAreBoundedWithBusyNamingTheBound) {
  constexpr uint64_t kShard = 64;  // each task a destination of its own: 4 MiB at the default
  for (const uint32_t bound : {65536u, 300u}) {
    ucm_config_t cfg = task_config(64, "sim:latency_us=0");
    cfg.shard_bytes = kShard;
    cfg.cache_bytes = 64 * kShard;
    if (bound != 65536u) cfg.max_unfinished_tasks = bound;
    ASSERT_NO_FATAL_FAILURE(init(cfg));
    const ucm_key_t k = ukey(1, 0);
    std::vector<uint8_t> buf;
    std::string refused;
    std::vector<ucm_task_t> tasks = submit_unwaited(cache_, k, kShard, bound + 1, &buf, &refused);
    EXPECT_EQ(tasks.size(), size_t{bound}) << refused;
    EXPECT_NE(refused.find("UCM_ERR_BUSY"), std::string::npos) << refused;
    EXPECT_NE(refused.find(std::to_string(bound) + " tasks"), std::string::npos) << refused;
    EXPECT_NE(refused.find("UCM_MAX_UNFINISHED_TASKS"), std::string::npos) << refused;
    ASSERT_FALSE(tasks.empty());
    ASSERT_EQ(ucm_task_wait(cache_, tasks.back(), 30000), UCM_OK) << msg(cache_);
    // Finishing one makes room: the next load goes into that task's destination.
    const ucm_load_entry_t e{k, buf.data() + (tasks.size() - 1) * kShard};
    ASSERT_EQ(ucm_load_task(cache_, &e, 1, &tasks.back()), UCM_OK) << msg(cache_);
    size_t bad = 0, wrong = 0;
    for (ucm_task_t x : tasks) bad += ucm_task_wait(cache_, x, 30000) != UCM_OK;
    for (size_t i = 0; i < tasks.size(); ++i) wrong += sim_verify(ikey(k), buf.data() + i * kShard, kShard) != kShard;
    EXPECT_EQ(bad, 0u);
    EXPECT_EQ(wrong, 0u);
    EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
  }
}

// Finalize clears the variable it was given: a second finalize through the
// same variable is UCM_ERR_BAD_HANDLE saying why it is NULL; through a copy
// of the handle, UCM_ERR_FINALIZED (ucm_base.h).
TEST_F(TaskHandle, ASecondFinalizeSaysTheHandleWasFinalized) {
  ASSERT_NO_FATAL_FAILURE(init(task_config(64, "sim:latency_us=0")));
  const ucm_cache_t copy = cache_;
  ASSERT_EQ(finalize(), UCM_OK) << msg(nullptr);
  ASSERT_EQ(cache_, nullptr);
  EXPECT_EQ(ucm_cache_finalize(&cache_), UCM_ERR_BAD_HANDLE);
  EXPECT_NE(std::string(ucm_last_error(nullptr)).find("finalized already"), std::string::npos) << msg(nullptr);
  ucm_cache_t again = copy;
  EXPECT_EQ(ucm_cache_finalize(&again), UCM_ERR_FINALIZED) << msg(nullptr);
}

}  // namespace
}  // namespace ucm::test
