// A store that hangs chosen keys (the sim store's hang_keys), under mpirun:
// a hung load fails its task at the task's deadline and frees the rank's I/O
// depth; tasks that do not contain the hung key finish on their own; a load
// that completes after its deadline writes no wrong byte anywhere and leaks
// nothing. Each test asserts the protocol: the result and message a failed
// task promises, and that nothing fails before its deadline; a call that does
// not return at all is caught by a hang guard (common/hang_guard.h), never by
// a bound on how fast it was.
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../common/ctrl_check.h"
#include "api/cache.h"
#include "mpi/cache_fixture.h"
#include "mpi/mpi_test.h"
#include "mpi/store_dir.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

using Hang = CacheTest;

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
  cfg.timeout_ms = 1500;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
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
  // A wait with no bound returns once the task's deadline fails it, and not
  // before: the task's deadline is timeout_ms after its submission.
  const ucm_result_t ra = wait_guarded(cache, ta, "the task with the hung key");
  const uint64_t a_ms = ms_since(t0);
  const std::string a_msg = msg(cache);
  EXPECT_EQ(ra, UCM_ERR_TIMEOUT) << a_msg;
  EXPECT_TRUE(at_task_deadline(a_msg)) << a_msg;
  EXPECT_GE(a_ms, cfg.timeout_ms) << "the task failed before its deadline: " << a_msg;
  // C ends by its own deadline: completed, or failed at that deadline.
  const ucm_result_t rc = wait_guarded(cache, tc, "an unrelated task (C)");
  const std::string c_msg = msg(cache);
  EXPECT_TRUE(rc == UCM_OK || rc == UCM_ERR_TIMEOUT) << rc << ": " << c_msg;
  if (rc == UCM_ERR_TIMEOUT) {
    EXPECT_TRUE(at_task_deadline(c_msg)) << c_msg;
  }
  // A later, unrelated task on every rank completes.
  LoadBatch b;
  for (int i = 0; i < n; ++i) b.add(ukey(920, static_cast<uint32_t>(i)));
  EXPECT_EQ(load_guarded(cache, b, "a later, unrelated task"), UCM_OK) << msg(cache);
  for (size_t i = 0; i < b.entries.size(); ++i) EXPECT_EQ(b.verify(i), kTaskShard) << "entry " << i;
  expect_no_wrong_byte(a, "A");
  expect_no_wrong_byte(cb, "C");
  if (rc == UCM_OK) {
    for (size_t i = 0; i < cb.entries.size(); ++i) EXPECT_EQ(cb.verify(i), kTaskShard) << "entry " << i;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  expect_cache_sound(cache, false);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// The default io_depth: only the task with the hung key waits for it.
TEST_F(Hang, AnUnrelatedTaskIsNotHeldBehindAHungKey) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=1000,hang_keys=940.0");
  cfg.timeout_ms = 3000;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  LoadBatch one;
  one.add(ukey(940, 0));
  LoadBatch two;
  for (uint32_t s = 0; s < 16; ++s) two.add(ukey(941 + s / 8, s % 8));
  MPI_Barrier(MPI_COMM_WORLD);
  const uint64_t t0 = now_ns();
  ucm_task_t t1 = 0, t2 = 0;
  ASSERT_EQ(ucm_load_task(cache, one.entries.data(), one.entries.size(), &t1), UCM_OK) << msg(cache);
  ASSERT_EQ(ucm_load_task(cache, two.entries.data(), two.entries.size(), &t2), UCM_OK) << msg(cache);
  // Task 2 completes while task 1 still waits for its hung key: the order
  // says it was not held behind that key (task 1 ends only at its deadline,
  // 3 s: ~200 times the 16 loads' work, a grace no scheduling delay reaches).
  EXPECT_EQ(wait_guarded(cache, t2, "the 16-shard task beside a hung key"), UCM_OK) << msg(cache);
  const uint64_t two_ms = ms_since(t0);
  int one_done = -1;
  EXPECT_EQ(ucm_task_test(cache, t1, &one_done), UCM_OK) << msg(cache);
  EXPECT_EQ(one_done, 0) << "the task with the hung key ended before the task beside it (" << two_ms << " ms)";
  for (size_t i = 0; i < two.entries.size(); ++i) EXPECT_EQ(two.verify(i), kTaskShard) << "entry " << i;
  EXPECT_EQ(wait_guarded(cache, t1, "the task with the hung key"), UCM_ERR_TIMEOUT) << msg(cache);
  expect_no_wrong_byte(one, "task 1");
  std::printf("rank %d: the 16-shard task finished in %llu ms beside a hung key (deadline %u ms)\n", world_rank(),
              static_cast<unsigned long long>(two_ms), cfg.timeout_ms);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// io_depth 1 and a hung key owned by every rank: each rank's only place is
// held by a load the store never answers. A quarter of the task's time in
// (timeout_ms 2000: 500 ms), that load counts as stuck and gives its place to
// the next: a task of other keys completes. Before, io_depth was a hard
// bound, and that task ended with UCM_ERR_TIMEOUT at its own deadline.
TEST_F(Hang, LoadsThatHangGiveTheirPlaceToOthersAfterAQuarterOfTheirTime) {
  const int n = world_size();
  std::string hung = "sim:latency_us=1000,hang_keys=";
  for (int r = 0; r < n; ++r) hung += (r > 0 ? "+" : "") + std::to_string(960 + r) + ".0";
  ucm_config_t cfg = task_config(64, hung.c_str());
  cfg.io_depth = 1;
  cfg.timeout_ms = 2000;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  LoadBatch h;  // rank r owns position r: key 960 + r, hung
  for (int r = 0; r < n; ++r) h.add(ukey(960 + static_cast<uint64_t>(r), 0));
  LoadBatch c;  // other keys, one per rank's stride
  for (int r = 0; r < n; ++r) c.add(ukey(970, static_cast<uint32_t>(r)));
  MPI_Barrier(MPI_COMM_WORLD);
  ucm_task_t th = 0, tc = 0;
  ASSERT_EQ(ucm_load_task(cache, h.entries.data(), h.entries.size(), &th), UCM_OK) << msg(cache);
  ASSERT_EQ(ucm_load_task(cache, c.entries.data(), c.entries.size(), &tc), UCM_OK) << msg(cache);
  EXPECT_EQ(wait_guarded(cache, tc, "the task beside loads that hang"), UCM_OK) << msg(cache);
  for (size_t i = 0; i < c.entries.size(); ++i) EXPECT_EQ(c.verify(i), kTaskShard) << "entry " << i;
  const ucm_result_t rh = wait_guarded(cache, th, "the task of the hung keys");
  EXPECT_EQ(rh, UCM_ERR_TIMEOUT) << msg(cache);
  expect_no_wrong_byte(h, "the hung task");
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// A load past its deadline completes later, after the key was loaded again
// into another slot: no byte of any slot is wrong, nothing leaks.
TEST_F(Hang, ALateCompletionWritesNoWrongByteAndLeaksNothing) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=1000,hang_keys=950.0,hang_ms=2200");
  cfg.timeout_ms = 1000;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  SimBackend* sim = sim_of(cache);
  ASSERT_NE(sim, nullptr);
  LoadBatch a;
  a.add(ukey(950, 0));
  MPI_Barrier(MPI_COMM_WORLD);
  const uint64_t t0 = now_ns();
  EXPECT_EQ(load_guarded(cache, a, "the hung key"), UCM_ERR_TIMEOUT) << msg(cache);
  EXPECT_GE(ms_since(t0), cfg.timeout_ms) << "failed before the task's deadline: " << msg(cache);
  expect_no_wrong_byte(a, "A");
  // The store answers now; the first load is still in flight in it.
  sim->clear_faults();
  MPI_Barrier(MPI_COMM_WORLD);
  LoadBatch again;
  again.add(ukey(950, 0));
  again.add(ukey(951, 0));
  EXPECT_EQ(load_guarded(cache, again, "the key again, beside another"), UCM_OK) << msg(cache);
  for (size_t i = 0; i < again.entries.size(); ++i) EXPECT_EQ(again.verify(i), kTaskShard) << "entry " << i;
  // Every load that expired here completes late, once (after hang_ms).
  LoadQueue* q = impl_of(cache)->queue();
  eventually("the late completion of every expired load", [&] { return q->late_completions() + q->cancelled_ios() >= q->expired_ios(); });
  EXPECT_EQ(q->late_completions() + q->cancelled_ios(), q->expired_ios());
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
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// A write-through that the store does not complete by the task's deadline
// fails the dump (the bytes are not known to be in the store); its late
// completion is dropped; once the store answers, the next dump writes again.
TEST_F(Hang, AHungWriteThroughFailsItsDumpAtTheDeadline) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=1000,hang_keys=970.0,hang_dumps=1,hang_ms=2200");
  cfg.timeout_ms = 1000;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  SimBackend* sim = sim_of(cache);
  ASSERT_NE(sim, nullptr);
  const ucm_key_t key = ukey(970, 0);
  std::vector<uint8_t> src(kTaskShard);
  sim_fill(ikey(key), src.data(), src.size());
  ucm_dump_entry_t e{key, src.data()};
  MPI_Barrier(MPI_COMM_WORLD);
  // Rank 0 dumps first and writes; the others dump later, so that the write
  // they wait for fails at rank 0's deadline, before their own.
  if (world_rank() != 0) usleep(300'000);
  const uint64_t t0 = now_ns();
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_dump_task(cache, &e, 1, &t), UCM_OK) << msg(cache);
  const ucm_result_t r = wait_guarded(cache, t, "a dump whose write-through hangs");
  const uint64_t ms = ms_since(t0);
  const std::string m = msg(cache);
  // The writer's entry times out at the task's deadline, not before; a peer
  // that waited for that write hears it failed.
  EXPECT_TRUE(r == UCM_ERR_TIMEOUT || r == UCM_ERR_BACKEND) << r << ": " << m;
  if (r == UCM_ERR_TIMEOUT) {
    EXPECT_TRUE(at_task_deadline(m)) << m;
    EXPECT_GE(ms, cfg.timeout_ms) << "failed before the task's deadline: " << m;
  } else {  // the peer hears that the write did not end in time, not that the store refused it
    EXPECT_NE(m.find("deadline"), std::string::npos) << m;
  }
  int timed_out = r == UCM_ERR_TIMEOUT ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &timed_out, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_GE(timed_out, 1) << "the writer's own entry";
  sim->clear_faults();
  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_EQ(ucm_dump_task(cache, &e, 1, &t), UCM_OK) << msg(cache);
  EXPECT_EQ(ucm_task_wait(cache, t, kTaskWaitMs), UCM_OK) << msg(cache);
  LoadQueue* q = impl_of(cache)->queue();
  eventually("the late completion of the expired write", [&] { return q->late_completions() + q->cancelled_ios() >= q->expired_ios(); });
  EXPECT_EQ(q->late_completions() + q->cancelled_ios(), q->expired_ios());
  MPI_Barrier(MPI_COMM_WORLD);
  expect_cache_sound(cache, true);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// Holds every touch of this process's data plane in the kernel: a
// userfaultfd nobody serves, registered over every slot in minor-fault mode
// after this process's page-table entries for the slots were dropped (the
// node's pages stay). A read() into a slot then sleeps in the kernel, as on a
// hard-mounted NFS that stopped answering, until the fd closes.
struct KernelHang {
  int fd = -1;
  std::string why_not;
  explicit KernelHang(ucm_cache_t cache) {
    fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
    if (fd < 0) {
      why_not = std::string("userfaultfd: ") + std::strerror(errno);
      return;
    }
    uffdio_api api{};
    api.api = UFFD_API;
    api.features = UFFD_FEATURE_MINOR_SHMEM;
    if (ioctl(fd, UFFDIO_API, &api) != 0) {
      why_not = std::string("UFFDIO_API with MINOR_SHMEM: ") + std::strerror(errno);
      return;
    }
    CacheBuffer* b = impl_of(cache)->buffer();
    const uint64_t bytes = b->ctrl().slot_bytes();
    for (uint32_t i = 0; i < b->ctrl().total_slots(); ++i) {
      uffdio_register r{};
      r.range.start = reinterpret_cast<uintptr_t>(b->data_at(i));
      r.range.len = bytes;
      r.mode = UFFDIO_REGISTER_MODE_MINOR;
      if (madvise(b->data_at(i), bytes, MADV_DONTNEED) != 0 || ioctl(fd, UFFDIO_REGISTER, &r) != 0) {
        why_not = std::string("UFFDIO_REGISTER: ") + std::strerror(errno);
        return;
      }
    }
  }
  bool armed() const { return why_not.empty(); }
  void release() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  ~KernelHang() { release(); }
};

// Writes key's sim content into the store through a dump task.
void dump_shard(ucm_cache_t cache, const ucm_key_t& key) {
  std::vector<uint8_t> src(kTaskShard);
  sim_fill(ikey(key), src.data(), src.size());
  ucm_dump_entry_t e{key, src.data()};
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_dump_task(cache, &e, 1, &t), UCM_OK) << msg(cache);
  EXPECT_EQ(ucm_task_wait(cache, t, kTaskWaitMs), UCM_OK) << msg(cache);
}

// A store whose read never returns from the kernel: finalize still returns
// (after giving the I/O threads timeout_ms), says how many it left behind, and
// the process goes on (and exits) cleanly; the late write, once the kernel
// lets it go, faults instead of landing in the cache.
TEST_F(Hang, FinalizeIsBoundedWhenTheStoreIsStuckInTheKernel) {
  StoreDir store_dir("hang-test");
  const std::string spec = store_dir.spec() + ",direct=off";
  const ucm_key_t key = ukey(960 + static_cast<uint64_t>(world_rank()), 0);
  {  // The store holds the shard.
    ucm_config_t cfg = task_config(64, spec.c_str());
    ASSERT_NO_FATAL_FAILURE(init(cfg));
    ASSERT_NO_FATAL_FAILURE(dump_shard(cache_, key));
    ASSERT_EQ(finalize(), UCM_OK) << msg(nullptr);
  }
  ucm_config_t cfg = task_config(64, spec.c_str());
  cfg.timeout_ms = 1000;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  Backend* store = impl_of(cache)->backend();
  KernelHang hang(cache);
  int armed = hang.armed() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &armed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!armed) {
    EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
    GTEST_SKIP() << "no userfaultfd to hold a read in the kernel: " << hang.why_not;
  }
  const uint64_t before = Cache::io_threads_left_behind();
  LoadBatch b;
  b.add(key);
  // The task fails at its deadline; the store's read stays in the kernel.
  EXPECT_EQ(load_guarded(cache, b, "a read held in the kernel"), UCM_ERR_TIMEOUT) << msg(cache);
  EXPECT_TRUE(b.untouched(0));
  const bool held = store->counters().inflight_loads == 1;
  EXPECT_TRUE(held) << "the store's read returned: nothing held it in the kernel";
  const uint64_t f0 = now_ns();
  const ucm_result_t fin = finalize();  // after a barrier: f0 is before it, so fin_ms is no less
  const uint64_t fin_ms = ms_since(f0);
  const std::string fin_msg = msg(nullptr);
  EXPECT_EQ(cache, nullptr);
  EXPECT_GE(fin_ms, cfg.timeout_ms) << "gave up on the I/O thread before its timeout_ms: " << fin_msg;
  EXPECT_EQ(fin, UCM_ERR_TIMEOUT) << fin_msg;
  EXPECT_NE(fin_msg.find("1 of the store's I/O thread(s) were still in the kernel"), std::string::npos) << fin_msg;
  EXPECT_EQ(Cache::io_threads_left_behind(), before + 1);
  if (!held || Cache::io_threads_left_behind() != before + 1) return;  // the store object is gone
  // The kernel lets the read go: it faults on the fenced-off slot (EFAULT),
  // and the detached thread ends without touching anything (the store object
  // it returns into is kept).
  hang.release();
  // Both counts at once: the ring engine counts a read out of the kernel as it
  // lands, and its failure only after its checks.
  EXPECT_TRUE(eventually("the detached read's return", [&] {
    const BackendCounters c = store->counters();
    return c.inflight_loads == 0 && c.loads == 1;
  }));
  EXPECT_EQ(store->counters().load_failures, 1u) << "the late read did not fail (did it land somewhere?)";
  std::printf("rank %d: finalize returned in %llu ms with a read stuck in the kernel (timeout_ms %u)\n", world_rank(),
              static_cast<unsigned long long>(fin_ms), cfg.timeout_ms);
}


// One bound for the whole of finalize, shared by its steps: a peer that does
// not come uses up timeout_ms, and then a store read stuck in the kernel gets
// what is left of it (nothing), not a second timeout_ms. The result says both
// what the rank waited for in vain (the peer) and what it left behind (the
// stuck I/O thread): a user told only of the peer would not know a thread of
// this process is still in the kernel.
TEST_F(Hang, FinalizeWithAnAbsentPeerAndAStuckStoreSaysBothWithinOneTimeout) {
  if (world_size() < 2) GTEST_SKIP() << "needs a peer that comes late";
  StoreDir store_dir("hang-both");
  const std::string spec = store_dir.spec() + ",direct=off";
  const ucm_key_t key = ukey(970, 0);
  {  // The store holds the shard.
    ucm_config_t cfg = task_config(64, spec.c_str());
    ucm_cache_t cache = nullptr;
    ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << msg(nullptr);
    if (world_rank() == 0) {
      ASSERT_NO_FATAL_FAILURE(dump_shard(cache, key));
    }
    MPI_Barrier(MPI_COMM_WORLD);
    ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << msg(nullptr);
  }
  ucm_config_t cfg = task_config(64, spec.c_str());
  cfg.timeout_ms = 1500;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << msg(nullptr);
  Backend* store = impl_of(cache)->backend();
  int armed = 1;
  std::unique_ptr<KernelHang> hang;
  std::string why_not;
  if (world_rank() == 0) {  // only rank 0's read is held in the kernel
    hang = std::make_unique<KernelHang>(cache);
    armed = hang->armed() ? 1 : 0;
    why_not = hang->why_not;
  }
  MPI_Allreduce(MPI_IN_PLACE, &armed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!armed) {
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK) << msg(nullptr);
    GTEST_SKIP() << "no userfaultfd to hold a read in the kernel: " << why_not;
  }
  const uint64_t before = Cache::io_threads_left_behind();
  if (world_rank() == 0) {
    LoadBatch b;
    b.add(key);
    EXPECT_EQ(load_guarded(cache, b, "a read held in the kernel"), UCM_ERR_TIMEOUT) << msg(cache);
    EXPECT_EQ(store->counters().inflight_loads, 1u) << "the store's read returned: nothing held it in the kernel";
    // The peers finalize only once rank 0's finalize has returned: rank 0
    // waits for them in vain until its deadline.
    ucm_result_t fin = UCM_OK;
    {
      HangGuard g("ucm_cache_finalize with an absent peer and a read stuck in the kernel");
      fin = ucm_cache_finalize(&cache);
    }
    const std::string fin_msg = msg(nullptr);
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ(fin, UCM_ERR_TIMEOUT) << fin_msg;
    EXPECT_NE(fin_msg.find("local rank(s) 1"), std::string::npos) << "the absent peer is not named: " << fin_msg;
    EXPECT_NE(fin_msg.find("1 of the store's I/O thread(s) were still in the kernel"), std::string::npos)
        << "the stuck I/O thread is not reported: " << fin_msg;
    EXPECT_EQ(Cache::io_threads_left_behind(), before + 1);
    // Let the read go: it faults on the fenced-off slot, and the detached
    // thread ends without touching anything.
    hang->release();
    EXPECT_TRUE(eventually("the detached read's return", [&] { return store->counters().inflight_loads == 0; }));
  } else {
    MPI_Barrier(MPI_COMM_WORLD);  // rank 0's finalize has returned
    // Rank 0 departed before us: the remaining ranks meet each other.
    EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK) << msg(nullptr);
  }
}

// A store stuck in a synchronous call (the sim store's hang_sync: exists()
// and touch() of a hung key block): ucm_lookup returns UCM_ERR_TIMEOUT at
// timeout_ms with every key it could answer answered and the rest
// UCM_WHERE_ERROR, naming the first unanswered key; ucm_touch marks the
// cache and returns without waiting for the store's touch; and the cache
// keeps answering other keys while the stuck call is still in the store.
TEST_F(Hang, ALookupAndATouchThatTheStoreHoldsReturnWithoutIt) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0,hang_keys=9.0,hang_sync=1");
  cfg.timeout_ms = 500;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t cache = cache_;
  SimBackend* sim = sim_of(cache);
  ASSERT_NE(sim, nullptr);
  const ucm_key_t keys[3] = {ukey(8, 0), ukey(9, 0), ukey(10, 0)};
  uint8_t where[3] = {0xee, 0xee, 0xee};
  const uint64_t t0 = now_ns();
  ucm_result_t r = UCM_OK;
  {
    HangGuard g("ucm_lookup of a key the store holds in exists()");
    r = ucm_lookup(cache, keys, 3, where);
  }
  const uint64_t took_ms = ms_since(t0);
  const std::string why = msg(cache);
  EXPECT_EQ(r, UCM_ERR_TIMEOUT) << why;
  EXPECT_GE(took_ms, cfg.timeout_ms) << "gave up on the store before timeout_ms: " << why;
  EXPECT_EQ(where[0], UCM_WHERE_BACKEND) << "the key answered before the stuck one";
  EXPECT_EQ(where[1], UCM_WHERE_ERROR);
  EXPECT_EQ(where[2], UCM_WHERE_ERROR) << "a key the store never got to";
  EXPECT_TRUE(why.find("2 of 3 keys") != std::string::npos) << why;
  const std::string first = "key 1 (block " + key_hex(keys[1]).substr(0, 32) + " shard 0)";
  EXPECT_TRUE(why.find(first) != std::string::npos) << "wants " << first << ": " << why;
  EXPECT_TRUE(why.find("timeout_ms 500") != std::string::npos) << why;
  // The stuck call holds one store thread; another answers.
  uint8_t w8 = 0xee;
  {
    HangGuard g("ucm_lookup beside a store call still stuck");
    EXPECT_EQ(ucm_lookup(cache, &keys[0], 1, &w8), UCM_OK) << msg(cache);
  }
  EXPECT_EQ(w8, UCM_WHERE_BACKEND);
  {
    HangGuard g("ucm_touch of a block the store holds in touch()");
    EXPECT_EQ(ucm_touch(cache, &keys[1].block, 1), UCM_OK) << msg(cache);
    EXPECT_EQ(ucm_touch(cache, &keys[2].block, 1), UCM_OK) << msg(cache);
  }
  EXPECT_TRUE(sim->touched_blocks().empty()) << "the store's touch of the hung block returned while hung";
  sim->clear_faults();
  const std::vector<BlockId> want = {ikey(keys[1]).block, ikey(keys[2]).block};
  EXPECT_TRUE(eventually("the store's touches once it answers", [&] { return sim->touched_blocks() == want; }));
  EXPECT_TRUE(eventually("the store's calls to return", [&] { return sim->sync_calls_held() == 0; }));
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// A store call still in the store when finalize's deadline comes (the sim
// store holds exists() of a hung key until its shutdown, which comes after):
// the lookup waiting for it returns UCM_ERR_FINALIZED as finalize begins;
// finalize gives the store-call thread timeout_ms, then detaches it, keeps the
// store for it and says so (UCM_ERR_TIMEOUT); the thread returns into the
// kept store without harm.
TEST_F(Hang, FinalizeDetachesAStoreCallStuckPastItsDeadlineAndKeepsTheStore) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0,hang_keys=9.0,hang_sync=1");
  cfg.timeout_ms = 1000;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  const ucm_cache_t h = cache;
  SimBackend* sim = sim_of(h);
  ASSERT_NE(sim, nullptr);
  const ucm_key_t key = ukey(9, 0);
  std::atomic<int> looked{UCM_OK};
  std::thread asker([&] {
    uint8_t where = 0;
    looked.store(ucm_lookup(h, &key, 1, &where));
  });
  EXPECT_TRUE(eventually("the lookup entering the store", [&] { return sim->sync_calls_held() == 1; }));
  MPI_Barrier(MPI_COMM_WORLD);
  const uint64_t before = Cache::io_threads_left_behind();
  const Finalized fin = finalize_timed(&cache, "beside a store call stuck in the store");
  asker.join();
  EXPECT_EQ(looked.load(), UCM_ERR_FINALIZED) << "the waiting lookup is woken by finalize";
  EXPECT_GE(fin.ms, cfg.timeout_ms) << "gave up on the store-call thread before its timeout_ms: " << fin.message;
  EXPECT_EQ(fin.result, UCM_ERR_TIMEOUT) << fin.message;
  EXPECT_TRUE(fin.message.find("1 thread(s) of the store's synchronous calls") != std::string::npos) << fin.message;
  EXPECT_EQ(Cache::io_threads_left_behind(), before + 1) << fin.message;
  // The kept store lets its call go; the detached thread returns into it.
  sim->clear_faults();
  EXPECT_TRUE(eventually("the detached call's return", [&] { return sim->sync_calls_held() == 0; }));
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace ucm::test
