// A store that hangs chosen keys (the sim store's hang_keys), under mpirun:
// a hung load fails its task at the task's deadline and frees the rank's I/O
// depth; tasks that do not contain the hung key finish on their own; a load
// that completes after its deadline writes no wrong byte anywhere and leaks
// nothing. Every wait is checked against its bound, with slack for a loaded
// machine.
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "../common/ctrl_check.h"
#include "api/cache.h"
#include "mpi/mpi_test.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

using Hang = MpiTest;

constexpr uint64_t kSlackMs = 5000;  // a loaded 2-core machine, 4 ranks

std::string msg(ucm_cache_t c) { return ucm_last_error(c); }
uint64_t ms_since(uint64_t t0) { return (now_ns() - t0) / 1000000; }

// Each entry's destination holds either its key's bytes or nothing at all.
void expect_no_wrong_byte(const LoadBatch& b, const char* what) {
  for (size_t i = 0; i < b.entries.size(); ++i)
    EXPECT_TRUE(b.verify(i) == kTaskShard || b.untouched(i)) << what << " entry " << i << ": wrong byte at "
                                                             << b.verify(i);
}

// Every Ready slot holds exactly its key's bytes; with `quiet`, nothing is
// pinned or loading either (call with every rank at a barrier).
void expect_cache_sound(ucm_cache_t cache, bool quiet) {
  Cache* c = impl_of(cache);
  ASSERT_NE(c, nullptr);
  const BufferCtrl& ctrl = c->buffer()->ctrl();
  for (uint32_t i = 0; i < ctrl.total_slots(); ++i) {
    const uint32_t w = ctrl.slot(i).word.load(std::memory_order_acquire);
    const Key k = slot_key(ctrl, i);
    if (word_state(w) != State::kReady || k.shard == kEmptyShard) continue;
    EXPECT_EQ(sim_verify(k, c->buffer()->data_at(i), kTaskShard), kTaskShard) << "slot " << i << " " << key_str(k);
  }
  if (quiet) {
    QuiescentOptions o;
    EXPECT_EQ(check_quiescent(ctrl, nullptr, o), "");
  }
}

// io_depth 1: a load that never returns fills the rank's I/O depth.
TEST_F(Hang, AHungLoadFailsAtTheDeadlineAndFreesTheRank) {
  const int n = world_size();
  ucm_config_t cfg = task_config(64, "sim:latency_us=1000,hang_keys=900.0");
  cfg.io_depth = 1;
  cfg.timeout_ms = 3000;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << msg(nullptr);
  // A: rank 0 owns positions 0 (the hung key) and n (then stuck behind it).
  LoadBatch a;
  for (int i = 0; i <= n; ++i) a.add(ukey(900, static_cast<uint32_t>(i)));
  // C: an unrelated task whose position 0 is rank 0's too.
  LoadBatch cb;
  for (int i = 0; i < n; ++i) cb.add(ukey(910, static_cast<uint32_t>(i)));
  MPI_Barrier(MPI_COMM_WORLD);
  const uint64_t t0 = now_ns();
  ucm_task_t ta = 0, tc = 0;
  ASSERT_EQ(ucm_load_task(cache, a.entries.data(), a.entries.size(), &ta), UCM_OK) << msg(cache);
  ASSERT_EQ(ucm_load_task(cache, cb.entries.data(), cb.entries.size(), &tc), UCM_OK) << msg(cache);
  // A wait with no bound returns once the task's deadline fails it.
  std::atomic<int> a_result{-1};
  std::atomic<uint64_t> a_ms{0};
  std::thread waiter([&] {
    a_result.store(ucm_task_wait(cache, ta, -1));
    a_ms.store(ms_since(t0));
  });
  const uint64_t bound = cfg.timeout_ms + kSlackMs;
  while (a_result.load() < 0 && ms_since(t0) < bound) usleep(2000);
  const bool a_returned = a_result.load() >= 0;
  EXPECT_TRUE(a_returned) << "ucm_task_wait(-1) on the task with the hung key still blocked after " << bound << " ms";
  EXPECT_EQ(a_result.load(), UCM_ERR_TIMEOUT);
  if (a_returned) {
    EXPECT_LE(a_ms.load(), bound);
  }
  // C completes or fails within its own deadline.
  const uint64_t c0 = now_ns();
  const ucm_result_t rc = ucm_task_wait(cache, tc, static_cast<int64_t>(bound));
  EXPECT_TRUE(rc == UCM_OK || rc == UCM_ERR_TIMEOUT) << rc << ": " << msg(cache);
  EXPECT_LE(ms_since(c0), bound);
  // A later, unrelated task on every rank completes.
  LoadBatch b;
  for (int i = 0; i < n; ++i) b.add(ukey(920, static_cast<uint32_t>(i)));
  EXPECT_EQ(load_and_wait(cache, b, static_cast<int64_t>(bound)), UCM_OK) << msg(cache);
  for (size_t i = 0; i < b.entries.size(); ++i) EXPECT_EQ(b.verify(i), kTaskShard) << "entry " << i;
  expect_no_wrong_byte(a, "A");
  expect_no_wrong_byte(cb, "C");
  if (rc == UCM_OK) {
    for (size_t i = 0; i < cb.entries.size(); ++i) EXPECT_EQ(cb.verify(i), kTaskShard) << "entry " << i;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_cache_sound(cache, false);
  MPI_Barrier(MPI_COMM_WORLD);
  const uint64_t f0 = now_ns();
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK) << msg(nullptr);
  EXPECT_LE(ms_since(f0), bound);
  waiter.join();  // if it was still blocked, ucm_cache_finalize woke it
}

// The default io_depth: only the task with the hung key waits for it.
TEST_F(Hang, AnUnrelatedTaskIsNotHeldBehindAHungKey) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=1000,hang_keys=940.0");
  cfg.timeout_ms = 8000;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << msg(nullptr);
  LoadBatch one;
  one.add(ukey(940, 0));
  LoadBatch two;
  for (uint32_t s = 0; s < 16; ++s) two.add(ukey(941 + s / 8, s % 8));
  MPI_Barrier(MPI_COMM_WORLD);
  const uint64_t t0 = now_ns();
  ucm_task_t t1 = 0, t2 = 0;
  ASSERT_EQ(ucm_load_task(cache, one.entries.data(), one.entries.size(), &t1), UCM_OK) << msg(cache);
  ASSERT_EQ(ucm_load_task(cache, two.entries.data(), two.entries.size(), &t2), UCM_OK) << msg(cache);
  // Done long before task 1's deadline: half of it, on a loaded machine.
  EXPECT_EQ(ucm_task_wait(cache, t2, cfg.timeout_ms / 2), UCM_OK) << msg(cache);
  const uint64_t two_ms = ms_since(t0);
  EXPECT_LT(two_ms, cfg.timeout_ms / 2);
  for (size_t i = 0; i < two.entries.size(); ++i) EXPECT_EQ(two.verify(i), kTaskShard) << "entry " << i;
  EXPECT_EQ(ucm_task_wait(cache, t1, static_cast<int64_t>(cfg.timeout_ms + kSlackMs)), UCM_ERR_TIMEOUT)
      << msg(cache);
  expect_no_wrong_byte(one, "task 1");
  std::printf("rank %d: the 16-shard task finished in %llu ms beside a hung key (deadline %u ms)\n", world_rank(),
              static_cast<unsigned long long>(two_ms), cfg.timeout_ms);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK) << msg(nullptr);
}

// A load past its deadline completes later, after the key was loaded again
// into another slot: no byte of any slot is wrong, nothing leaks.
TEST_F(Hang, ALateCompletionWritesNoWrongByteAndLeaksNothing) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=1000,hang_keys=950.0,hang_ms=3500");
  cfg.timeout_ms = 1500;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << msg(nullptr);
  SimBackend* sim = sim_of(cache);
  ASSERT_NE(sim, nullptr);
  LoadBatch a;
  a.add(ukey(950, 0));
  MPI_Barrier(MPI_COMM_WORLD);
  const uint64_t t0 = now_ns();
  EXPECT_EQ(load_and_wait(cache, a, static_cast<int64_t>(cfg.timeout_ms + kSlackMs)), UCM_ERR_TIMEOUT) << msg(cache);
  EXPECT_LE(ms_since(t0), cfg.timeout_ms + kSlackMs);
  expect_no_wrong_byte(a, "A");
  // The store answers now; the first load is still in flight in it.
  sim->clear_faults();
  MPI_Barrier(MPI_COMM_WORLD);
  LoadBatch again;
  again.add(ukey(950, 0));
  again.add(ukey(951, 0));
  EXPECT_EQ(load_and_wait(cache, again, static_cast<int64_t>(cfg.timeout_ms + kSlackMs)), UCM_OK) << msg(cache);
  for (size_t i = 0; i < again.entries.size(); ++i) EXPECT_EQ(again.verify(i), kTaskShard) << "entry " << i;
  // Every load that expired here completes late, once (bounded by hang_ms).
  LoadQueue* q = impl_of(cache)->queue();
  const uint64_t w0 = now_ns();
  while (q->late_completions() < q->expired_ios() && ms_since(w0) < 3500 + kSlackMs) usleep(2000);
  EXPECT_EQ(q->late_completions(), q->expired_ios());
  uint64_t late = q->late_completions();
  MPI_Allreduce(MPI_IN_PLACE, &late, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_GE(late, 1u) << "the owner's hung load expired and completed late";
  MPI_Barrier(MPI_COMM_WORLD);
  expect_cache_sound(cache, true);
  MPI_Barrier(MPI_COMM_WORLD);
  // The key still loads right, from whichever slot holds it.
  LoadBatch last;
  last.add(ukey(950, 0));
  EXPECT_EQ(load_and_wait(cache, last), UCM_OK) << msg(cache);
  EXPECT_EQ(last.verify(0), kTaskShard);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK) << msg(nullptr);
}

}  // namespace
}  // namespace ucm::test
