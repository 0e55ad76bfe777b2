// The C boundary under mpirun: calls that overlap ucm_cache_finalize on other
// threads, blocked waits that finalize wakes, timeouts too large to add to a
// clock, sizes bounded before anything is allocated, exceptions turned into
// results (a real thread-creation failure, from a pids cgroup), argument
// errors that still go through the collective init, and one code per mistake.
#include <fcntl.h>
#include <ftw.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/log_capture.h"
#include "mpi/cache_fixture.h"
#include "mpi/mpi_test.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

using Api = CacheTest;

constexpr uint64_t kHangBlock = 7;  // its shard 0 never loads (the sim store's hang fault)

bool contains(const std::string& s, const char* needle) { return s.find(needle) != std::string::npos; }

// One thread that calls `call` until it fails, then keeps the failure.
struct Hammer {
  std::atomic<bool> started{false};
  std::atomic<uint64_t> calls{0};
  std::atomic<int> last{UCM_OK};
  std::thread th;

  template <typename Call>
  void start(Call call) {
    th = std::thread([this, call]() mutable {
      started.store(true);
      for (;;) {
        const ucm_result_t r = call();
        if (r != UCM_OK) {
          last.store(r);
          return;
        }
        calls.fetch_add(1);
      }
    });
  }
};

TEST_F(Api, CallsOnOtherThreadsDuringFinalizeAreSafeAndBlockedWaitsReturnFinalized) {
  char spec[128];
  std::snprintf(spec, sizeof(spec), "sim:latency_us=0,hang_keys=%" PRIu64 ".0", kHangBlock);
  ucm_config_t cfg = task_config(64, spec);
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  const ucm_cache_t h = cache;  // every thread's own copy; finalize clears `cache`

  // Two waits that can only end by finalize: the task's shard never loads.
  LoadBatch hung[2];
  ucm_task_t hung_task[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    hung[i].add(ukey(kHangBlock, 0));
    hung[i].add(ukey(100 + static_cast<uint64_t>(i), 1));
    ASSERT_EQ(ucm_load_task(h, hung[i].entries.data(), hung[i].entries.size(), &hung_task[i]), UCM_OK) << msg(h);
  }
  std::atomic<int> waited[2] = {UCM_OK, UCM_OK};
  std::atomic<int> waiting{0};
  std::thread waiters[2];
  const int64_t forever[2] = {-1, INT64_MAX};
  for (int i = 0; i < 2; ++i) {
    waiters[i] = std::thread([&, i] {
      waiting.fetch_add(1);
      waited[i].store(ucm_task_wait(h, hung_task[i], forever[i]));
    });
  }

  std::vector<ucm_block_t> blocks;
  for (uint64_t b = 0; b < 8; ++b) blocks.push_back(ublock(b));
  std::vector<ucm_key_t> keys;
  for (uint64_t b = 0; b < 8; ++b) keys.push_back(ukey(b, 2));

  Hammer touch, stats, lookup, load, info, error;
  touch.start([&] { return ucm_touch(h, blocks.data(), blocks.size()); });
  stats.start([&] {
    ucm_stats_t mine{}, node{};
    mine.struct_bytes = node.struct_bytes = sizeof(ucm_stats_t);
    return ucm_cache_stats(h, &mine, &node);
  });
  lookup.start([&] {
    uint8_t where[8];
    return ucm_lookup(h, keys.data(), keys.size(), where);
  });
  load.start([&, round = uint64_t{0}]() mutable {
    LoadBatch b;
    for (uint64_t k = 0; k < 4; ++k) b.add(ukey(1000 + (round * 4 + k) % 48, 3));
    ++round;
    return load_and_wait(h, b, -1);
  });
  info.start([&] {
    ucm_cache_info_t in{};
    in.struct_bytes = sizeof(in);
    return ucm_cache_info(h, &in);
  });
  // ucm_last_error has no result: it reads the handle's message until that
  // says the handle was finalized.
  error.start([&] { return std::strstr(ucm_last_error(h), "was finalized") ? UCM_ERR_FINALIZED : UCM_OK; });
  Hammer* const all[] = {&touch, &stats, &lookup, &load, &info, &error};

  // Every thread is under way (the two waits are entered or about to be).
  // The loads queue up behind the hung shard (the copier waits for it), so
  // their first wait is a third that only finalize ends.
  ASSERT_TRUE(eventually("every thread under way", [&] {
    for (Hammer* x : all)
      if (x != &load && x->calls.load() == 0 && x->last.load() == UCM_OK) return false;
    return load.started.load() && waiting.load() == 2;
  }));
  usleep(20000);  // lets the waits block; correct either way

  {
    HangGuard g("ucm_cache_finalize, and every thread that was in a call on the cache");
    EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK) << msg(nullptr);
    EXPECT_EQ(cache, nullptr);
    for (auto& w : waiters) w.join();
    for (Hammer* x : all) x->th.join();
  }

  for (int i = 0; i < 2; ++i) EXPECT_EQ(waited[i].load(), UCM_ERR_FINALIZED) << "wait " << i;
  const char* names[] = {"touch", "stats", "lookup", "load", "info", "last_error"};
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(all[i]->last.load(), UCM_ERR_FINALIZED) << names[i] << " after " << all[i]->calls.load() << " calls";
    if (all[i] != &load) {
      EXPECT_GT(all[i]->calls.load(), 0u) << names[i];
    }
  }
  // The destinations of the tasks that finalize abandoned were never written.
  for (auto& b : hung) EXPECT_TRUE(b.untouched(0));
  EXPECT_EQ(ucm_touch(h, blocks.data(), blocks.size()), UCM_ERR_FINALIZED);
  EXPECT_TRUE(contains(ucm_last_error(h), "finalized")) << ucm_last_error(h);
  int done = 0;
  EXPECT_EQ(ucm_task_test(h, hung_task[0], &done), UCM_ERR_FINALIZED);
}

// Finalize racing tasks that the calling threads copy themselves (the inline
// path: every entry a hit). Each thread loops over warm tasks and checks its
// bytes; finalize ends every loop with UCM_ERR_FINALIZED, never a crash or a
// hang, and (under TSan) without a race between a thread's copy and the
// teardown: the call's reference on the cache keeps it alive until the copy
// is done.
TEST_F(Api, FinalizeRacingTasksCopiedOnTheCallingThreadsIsSafe) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  cfg.prealloc = 0;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  const ucm_cache_t h = cache;
  LoadBatch cold;
  for (uint64_t k = 0; k < 16; ++k) cold.add(ukey(2000 + k / 8, static_cast<uint32_t>(k % 8)));
  ASSERT_EQ(load_and_wait(h, cold), UCM_OK) << msg(h);
  MPI_Barrier(MPI_COMM_WORLD);  // every key Ready on every rank
  std::atomic<uint64_t> wrong{0};
  Hammer hammers[3];
  for (int i = 0; i < 3; ++i) {
    hammers[i].start([&, i, round = uint64_t{0}]() mutable {
      LoadBatch b;
      for (uint64_t k = 0; k < 4; ++k) {
        const uint64_t j = (round * 4 + k + static_cast<uint64_t>(i)) % 16;
        b.add(ukey(2000 + j / 8, static_cast<uint32_t>(j % 8)));
      }
      ++round;
      const ucm_result_t r = load_and_wait(h, b, -1);
      if (r == UCM_OK)
        for (size_t e = 0; e < b.entries.size(); ++e)
          if (b.verify(e) != kTaskShard) wrong.fetch_add(1);
      return r;
    });
  }
  ASSERT_TRUE(eventually("ten tasks on every thread", [&] {
    for (Hammer& x : hammers)
      if (x.calls.load() < 10 && x.last.load() == UCM_OK) return false;
    return true;
  }));
  ucm_stats_t mine{};
  mine.struct_bytes = sizeof(mine);
  ASSERT_EQ(ucm_cache_stats(h, &mine, nullptr), UCM_OK) << msg(h);
  EXPECT_GE(mine.inline_tasks, 30u) << "the warm tasks were copied on the calling threads";
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK) << msg(nullptr);
  for (Hammer& x : hammers) x.th.join();
  for (Hammer& x : hammers) EXPECT_EQ(x.last.load(), UCM_ERR_FINALIZED) << "after " << x.calls.load() << " tasks";
  EXPECT_EQ(wrong.load(), 0u) << "every task that said OK had its bytes";
}

// A destination whose first touch sleeps in the kernel: one anonymous page
// registered with a userfaultfd that nobody serves (missing-page mode), as an
// app buffer on a swapped-out or remote page might. Closing the fd lets the
// touch go (the page is then allocated as usual).
struct HeldPage {
  int fd = -1;
  void* page = MAP_FAILED;
  std::string why_not;
  explicit HeldPage(size_t bytes) : bytes_(bytes) {
    page = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    fd = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
    uffdio_api api{};
    api.api = UFFD_API;
    uffdio_register r{};
    r.range.start = reinterpret_cast<uintptr_t>(page);
    r.range.len = bytes;
    r.mode = UFFDIO_REGISTER_MODE_MISSING;
    if (page == MAP_FAILED || fd < 0 || ioctl(fd, UFFDIO_API, &api) != 0 || ioctl(fd, UFFDIO_REGISTER, &r) != 0)
      why_not = std::string("userfaultfd over an anonymous page: ") + std::strerror(errno);
  }
  bool armed() const { return why_not.empty(); }
  // True once a thread sleeps in a fault on the page (its message is queued).
  bool faulted() const {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) == 1;
  }
  void release() {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  ~HeldPage() {
    release();
    if (page != MAP_FAILED) munmap(page, bytes_);
  }
  size_t bytes_;
};

// A call held in the kernel past finalize's bound: a load of a cached shard,
// copied on the calling thread, into a destination whose page fault never
// ends. Finalize still meets the peers, returns UCM_ERR_TIMEOUT naming the
// call, and leaves the cache allocated under it; the call returns once the
// fault does.
TEST_F(Api, ACallStuckPastFinalizesBoundKeepsTheCacheAllocatedUnderIt) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  cfg.timeout_ms = 1000;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  const ucm_cache_t h = cache;
  const ucm_key_t key = ukey(9, 0);
  LoadBatch warm;
  warm.add(key);
  ASSERT_EQ(load_and_wait(cache, warm), UCM_OK) << msg(cache);  // cached: the next load is copied inline
  HeldPage held(cfg.shard_bytes);
  int armed = held.armed() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &armed, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!armed) {
    EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
    GTEST_SKIP() << "no userfaultfd to hold a copy in the kernel: " << held.why_not;
  }
  MPI_Barrier(MPI_COMM_WORLD);

  std::atomic<bool> returned{false};
  std::atomic<int> loaded{UCM_OK};
  std::thread stuck([&] {
    ucm_load_entry_t e{key, held.page};
    ucm_task_t t = 0;
    loaded.store(ucm_load_task(h, &e, 1, &t));
    returned.store(true);
  });
  EXPECT_TRUE(eventually("the inline copy's fault", [&] { return held.faulted() || returned.load(); }));
  EXPECT_FALSE(returned.load()) << "the copy into the held page returned";

  const Finalized fin = finalize_timed(&cache, "beside a call stuck in the kernel");
  EXPECT_EQ(cache, nullptr);
  // It gave the stuck call its whole timeout_ms, not less.
  EXPECT_GE(fin.ms, cfg.timeout_ms) << fin.message;
  held.release();  // the fault ends: the call returns, on the cache it started on
  stuck.join();
  EXPECT_EQ(ucm_touch(h, &key.block, 1), UCM_ERR_FINALIZED);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(fin.result, UCM_ERR_TIMEOUT) << fin.message;
  EXPECT_TRUE(contains(fin.message, "1 call(s) on other threads were still running 1000 ms")) << fin.message;
  EXPECT_TRUE(contains(fin.message, "not freed under them")) << fin.message;
  EXPECT_EQ(loaded.load(), UCM_OK) << "the copy began before finalize: it completes";
}

// timeout_ms bounds init's waits for peers too; at its smallest (1 ms),
// with the ranks arriving a few ms apart, some waits time out. Every rank
// must still end init with the same result (a rank that says OK beside one
// that failed would wait in finalize for a peer that never comes), finalize
// what it got, and leave nothing behind: a sane init after it works.
TEST_F(Api, InitWithTheSmallestTimeoutEndsTheSameOnEveryRank) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  cfg.timeout_ms = 1;
  const int n = world_size();
  for (int round = 0; round < 6; ++round) {
    // Round 0 together; later rounds with one rank (another each round) late.
    MPI_Barrier(MPI_COMM_WORLD);
    if (round > 0 && world_rank() == round % n) std::this_thread::sleep_for(std::chrono::milliseconds(3 * round));
    ucm_result_t r = UCM_OK;
    {
      HangGuard g("ucm_cache_init with timeout_ms 1");
      r = ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache_);
    }
    const std::string why = msg(nullptr);
    std::vector<int> all(static_cast<size_t>(n));
    const int mine = static_cast<int>(r);
    MPI_Allgather(&mine, 1, MPI_INT, all.data(), 1, MPI_INT, MPI_COMM_WORLD);
    for (int i = 0; i < n; ++i)
      EXPECT_EQ(all[static_cast<size_t>(i)], mine) << "round " << round << ": rank " << i << " ended init with "
                                                   << all[static_cast<size_t>(i)] << ", this rank with " << mine
                                                   << " (" << why << ")";
    EXPECT_EQ(r == UCM_OK, cache_ != nullptr) << "round " << round << ": " << why;
    if (r != UCM_OK) {
      // Before: "sending plane fds to a peer: Broken pipe" (UCM_ERR_SYSTEM)
      // when a peer gave up first, and timeouts that named no bound.
      EXPECT_EQ(r, UCM_ERR_TIMEOUT) << "round " << round << ": " << why;
      EXPECT_TRUE(contains(why, "(timeout_ms 1 bounds each step of init)")) << why;
    }
    if (cache_ != nullptr) {
      HangGuard g("ucm_cache_finalize with timeout_ms 1");
      (void)ucm_cache_finalize(&cache_);
    }
    EXPECT_EQ(cache_, nullptr);
  }
  ucm_config_t sane = task_config(64, "sim:latency_us=0");
  ASSERT_NO_FATAL_FAILURE(init(sane));
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// Finalize while a task runs (one shard hung in the store, its peers' and
// its own other shards copied or waited on) is a finalize like any other:
// the task is abandoned, what its entries held is given back by the queue as
// it stops, and a successful finalize prints nothing.
TEST_F(Api, FinalizeWithTasksRunningPrintsNoWarning) {
  char spec[128];
  std::snprintf(spec, sizeof(spec), "sim:latency_us=0,hang_keys=%" PRIu64 ".0", kHangBlock);
  ucm_config_t cfg = task_config(64, spec);
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  // Entry 0 never loads; the others are loaded or waited for meanwhile.
  LoadBatch b;
  b.add(ukey(kHangBlock, 0));
  for (uint64_t i = 0; i < 8; ++i) b.add(ukey(300 + i, 0));
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t), UCM_OK) << msg(cache);
  ASSERT_TRUE(eventually("the node's loads of the task's other shards",
                         [&] { return node_stats(cache).owner_loads >= 8; }));
  MPI_Barrier(MPI_COMM_WORLD);
  size_t warnings = 0;
  std::string first;
  {
    LogCapture logs;
    EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
    warnings = logs.warnings();
    first = logs.first_lines();
  }
  EXPECT_EQ(warnings, 0u) << first;
}

// A forked child inherits the cache's handle and memory but none of its
// threads (a Python DataLoader worker forked from a rank, say). Every call it
// makes on the handle is UCM_ERR_BAD_STATE naming the fork, at once: a task
// would wait for a dispatcher that is not there, and a finalize would depart
// for the parent. The parent's cache goes on as if nothing happened.
TEST_F(Api, AForkedChildIsRefusedOnTheParentsCacheAndLeavesItAlone) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  LoadBatch warm;
  warm.add(ukey(40, 0));
  ASSERT_EQ(load_and_wait(cache, warm), UCM_OK) << msg(cache);
  const pid_t child = fork();
  ASSERT_GE(child, 0) << std::strerror(errno);
  if (child == 0) {
    // Nothing here may block: alarm() ends a child that hangs.
    alarm(static_cast<unsigned>(hang_seconds()));
    int bad = 0;
    auto refused = [&](ucm_result_t r) {
      if (r != UCM_ERR_BAD_STATE || !contains(ucm_last_error(cache), "forked child")) {
        std::fprintf(stderr, "child: result %d: %s\n", r, ucm_last_error(cache));
        ++bad;
      }
    };
    LoadBatch b;
    b.add(ukey(40, 0));  // cached: the inline path would copy it on this thread
    b.add(ukey(41, 0));
    ucm_task_t t = 0;
    refused(ucm_load_task(cache, b.entries.data(), b.entries.size(), &t));
    refused(ucm_task_wait(cache, 1, 1000));
    uint8_t where = 0;
    refused(ucm_lookup(cache, &b.entries[0].key, 1, &where));
    refused(ucm_touch(cache, &b.entries[0].key.block, 1));
    ucm_cache_t copy = cache;
    refused(ucm_cache_finalize(&copy));
    _exit(bad == 0 && copy == cache ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  LoadBatch again;
  again.add(ukey(40, 0));
  again.add(ukey(42, 0));
  EXPECT_EQ(load_and_wait(cache, again), UCM_OK) << msg(cache);
  EXPECT_EQ(again.verify(0), kTaskShard);
  EXPECT_EQ(again.verify(1), kTaskShard);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);  // every peer is still there: none was departed for
}

TEST_F(Api, AWaitWithATimeoutTooLargeForTheClockHasNoBound) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=100000");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  // Each load takes 100 ms in the store, so a wait that times out at once is seen.
  const int64_t timeouts[] = {INT64_MAX, INT64_MAX / 1000, int64_t{1} << 44, int64_t{18446744073709}};
  uint64_t block = 1;
  for (int64_t t : timeouts) {
    LoadBatch b;
    b.add(ukey(block++, static_cast<uint32_t>(world_rank()) % 8));
    ucm_task_t task = 0;
    ASSERT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &task), UCM_OK) << msg(cache);
    EXPECT_EQ(ucm_task_wait(cache, task, t), UCM_OK) << "timeout_ms " << t << ": " << msg(cache);
    EXPECT_EQ(b.verify(0), kTaskShard);
  }
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Api, SizesAreBoundedBeforeAnythingIsAllocated) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  ucm_block_t block = ublock(1);
  EXPECT_EQ(ucm_touch(cache, &block, SIZE_MAX), UCM_ERR_TOO_LARGE);
  EXPECT_TRUE(contains(msg(cache), "n 18446744073709551615 > max_task_entries 64")) << msg(cache);
  EXPECT_EQ(ucm_touch(cache, &block, cfg.max_task_entries + 1), UCM_ERR_TOO_LARGE);
  ucm_key_t key = ukey(1, 0);
  uint8_t where = 0;
  EXPECT_EQ(ucm_lookup(cache, &key, SIZE_MAX, &where), UCM_ERR_TOO_LARGE);
  EXPECT_TRUE(contains(msg(cache), "n 18446744073709551615 > max_task_entries 64")) << msg(cache);
  ucm_load_entry_t le{key, &where};
  ucm_task_t task = 0;
  EXPECT_EQ(ucm_load_task(cache, &le, SIZE_MAX, &task), UCM_ERR_TOO_LARGE);
  // The cache is still usable.
  EXPECT_EQ(ucm_touch(cache, &block, 1), UCM_OK) << msg(cache);
  EXPECT_EQ(ucm_lookup(cache, &key, 1, &where), UCM_OK) << msg(cache);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Api, ANonZeroReservedFieldInAKeyIsRefusedNamingTheEntry) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  LoadBatch b;
  b.add(ukey(1, 0));
  b.add(ukey(2, 0));
  b.entries[1].key.reserved = 7;
  ucm_task_t task = 0;
  EXPECT_EQ(ucm_load_task(cache, b.entries.data(), b.entries.size(), &task), UCM_ERR_INVALID_ARG);
  EXPECT_TRUE(contains(msg(cache), "entry 1: key.reserved 7 != 0")) << msg(cache);
  EXPECT_TRUE(b.untouched(0));

  std::vector<uint8_t> src(kTaskShard, 1);
  ucm_dump_entry_t d{ukey(3, 0), src.data()};
  d.key.reserved = 0x80000000u;
  EXPECT_EQ(ucm_dump_task(cache, &d, 1, &task), UCM_ERR_INVALID_ARG);
  EXPECT_TRUE(contains(msg(cache), "entry 0: key.reserved 2147483648 != 0")) << msg(cache);

  ucm_key_t keys[3] = {ukey(1, 0), ukey(2, 0), ukey(3, 0)};
  keys[2].reserved = 1;
  uint8_t where[3] = {};
  EXPECT_EQ(ucm_lookup(cache, keys, 3, where), UCM_ERR_INVALID_ARG);
  EXPECT_TRUE(contains(msg(cache), "key 2: key.reserved 1 != 0")) << msg(cache);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// [begin, end) of the first mapping of this process whose /proc/self/maps
// line names `name` (the cache's memfds), or {nullptr, nullptr}.
std::pair<uint8_t*, uint8_t*> own_mapping(const char* name) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    if (!contains(line, name)) continue;
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &begin, &end) != 2) break;
    return {reinterpret_cast<uint8_t*>(begin), reinterpret_cast<uint8_t*>(end)};
  }
  return {nullptr, nullptr};
}

// A dst inside the cache's own shared memory (found in /proc/self/maps) made
// the host engine copy a shard over the slots every rank of the node reads:
// the next load of the key in slot 0 brought another key's bytes. A src there
// stored the control region's bytes under a key. Both are refused, naming the
// entry and the region, and nothing changes.
TEST_F(Api, ABufferInTheCachesOwnMemoryIsRefusedNamingTheEntry) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  LoadBatch a;
  a.add(ukey(1, 0));
  ASSERT_EQ(load_and_wait(cache, a), UCM_OK) << msg(cache);
  const auto [data, data_end] = own_mapping("memfd:ucmcache-data");
  const auto [ctrl, ctrl_end] = own_mapping("memfd:ucmcache-ctrl");
  ASSERT_NE(data, nullptr);
  ASSERT_NE(ctrl, nullptr);
  ASSERT_GE(static_cast<uint64_t>(data_end - data), 2 * kTaskShard);
  ASSERT_GE(static_cast<uint64_t>(ctrl_end - ctrl), kTaskShard);
  MPI_Barrier(MPI_COMM_WORLD);  // every rank has key 1 before any rank tries

  LoadBatch b;
  b.add(ukey(2, 0));
  b.add(ukey(3, 0));
  b.entries[1].dst = data + 100;  // across slots 0 and 1
  ucm_task_t t = 0;
  ucm_result_t r = ucm_load_task(cache, b.entries.data(), b.entries.size(), &t);
  if (r == UCM_OK) (void)wait_guarded(cache, t, "a load into the data plane");
  EXPECT_EQ(r, UCM_ERR_INVALID_ARG);
  EXPECT_TRUE(contains(msg(cache), "entry 1: dst")) << msg(cache);
  EXPECT_TRUE(contains(msg(cache), "data segment 0")) << msg(cache);
  EXPECT_TRUE(b.untouched(0));

  ucm_dump_entry_t d{ukey(4, 0), ctrl};
  r = ucm_dump_task(cache, &d, 1, &t);
  if (r == UCM_OK) (void)wait_guarded(cache, t, "a dump from the control region");
  EXPECT_EQ(r, UCM_ERR_INVALID_ARG);
  EXPECT_TRUE(contains(msg(cache), "entry 0: src")) << msg(cache);
  EXPECT_TRUE(contains(msg(cache), "control region")) << msg(cache);

  // Nothing changed: key 1 still brings its own bytes.
  MPI_Barrier(MPI_COMM_WORLD);
  LoadBatch again;
  again.add(ukey(1, 0));
  EXPECT_EQ(load_and_wait(cache, again), UCM_OK) << msg(cache);
  EXPECT_EQ(again.verify(0), kTaskShard);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// Two entries of one load whose dsts share a byte: the copier wrote both,
// in whichever order it took them, so one key's shard held the other's bytes
// there and nothing said so. Refused at submit, naming both entries, with
// nothing written; in any order of the entries. A dump may read one src for
// several keys (nothing is written to it).
TEST_F(Api, ALoadWhoseDestinationsOverlapIsRefusedNamingBothEntries) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  std::vector<uint8_t> buf(4 * kTaskShard, 0xee);
  ucm_load_entry_t e[3] = {{ukey(1, 0), buf.data() + 2 * kTaskShard},
                           {ukey(2, 0), buf.data()},
                           {ukey(3, 0), buf.data() + 3 * kTaskShard - 1}};  // one byte into entry 0's
  ucm_task_t t = 0;
  ucm_result_t r = ucm_load_task(cache, e, 3, &t);
  if (r == UCM_OK) (void)wait_guarded(cache, t, "a load into overlapping dsts");
  EXPECT_EQ(r, UCM_ERR_INVALID_ARG);
  EXPECT_TRUE(contains(msg(cache), "entry 2: dst")) << msg(cache);
  EXPECT_TRUE(contains(msg(cache), "entry 0's dst")) << msg(cache);
  e[2].dst = buf.data();  // the same dst as entry 1
  r = ucm_load_task(cache, e, 3, &t);
  if (r == UCM_OK) (void)wait_guarded(cache, t, "a load into one dst twice");
  EXPECT_EQ(r, UCM_ERR_INVALID_ARG);
  EXPECT_TRUE(contains(msg(cache), "entry 1's dst")) << msg(cache);
  for (uint8_t b : buf) ASSERT_EQ(b, 0xee) << "a refused load wrote its dsts";

  // Adjacent dsts share no byte: the same keys load, each its own bytes.
  MPI_Barrier(MPI_COMM_WORLD);
  e[2].dst = buf.data() + 3 * kTaskShard;
  ASSERT_EQ(ucm_load_task(cache, e, 3, &t), UCM_OK) << msg(cache);
  ASSERT_EQ(wait_guarded(cache, t, "a load into adjacent dsts"), UCM_OK) << msg(cache);
  for (const auto& x : e) EXPECT_EQ(sim_verify(ikey(x.key), x.dst, kTaskShard), kTaskShard);
  std::vector<uint8_t> src(kTaskShard, 0x5a);
  const ucm_dump_entry_t d[2] = {{ukey(100 + static_cast<uint64_t>(world_rank()), 0), src.data()},
                                 {ukey(200 + static_cast<uint64_t>(world_rank()), 0), src.data()}};
  ASSERT_EQ(ucm_dump_task(cache, d, 2, &t), UCM_OK) << msg(cache);
  EXPECT_EQ(wait_guarded(cache, t, "a dump of one src under two keys"), UCM_OK) << msg(cache);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Api, ANullRequiredPointerIsNullPointerEverywhere) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  EXPECT_EQ(ucm_config_init(nullptr), UCM_ERR_NULL_POINTER);
  EXPECT_TRUE(contains(ucm_config_error(), "config is NULL")) << ucm_config_error();
  EXPECT_EQ(ucm_config_check(nullptr), UCM_ERR_NULL_POINTER);
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  EXPECT_EQ(ucm_cache_info(cache, nullptr), UCM_ERR_NULL_POINTER);
  EXPECT_TRUE(contains(msg(cache), "info is NULL")) << msg(cache);
  int* no_flag = nullptr;
  EXPECT_EQ(ucm_task_test(cache, 1, no_flag), UCM_ERR_NULL_POINTER);
  // Every call that takes an array or an output, in one place.
  ucm_task_t t = 0;
  EXPECT_EQ(ucm_load_task(cache, nullptr, 1, &t), UCM_ERR_NULL_POINTER) << msg(cache);
  EXPECT_EQ(ucm_dump_task(cache, nullptr, 1, &t), UCM_ERR_NULL_POINTER) << msg(cache);
  uint8_t byte = 0;
  ucm_dump_entry_t d{};
  d.src = &byte;
  EXPECT_EQ(ucm_dump_task(cache, &d, 1, nullptr), UCM_ERR_NULL_POINTER) << msg(cache);
  EXPECT_EQ(ucm_touch(cache, nullptr, 1), UCM_ERR_NULL_POINTER) << msg(cache);
  ucm_key_t k{};
  uint8_t where = 0;
  EXPECT_EQ(ucm_lookup(cache, nullptr, 1, &where), UCM_ERR_NULL_POINTER) << msg(cache);
  EXPECT_EQ(ucm_lookup(cache, &k, 1, nullptr), UCM_ERR_NULL_POINTER) << msg(cache);
  EXPECT_EQ(ucm_get_version(nullptr), UCM_ERR_NULL_POINTER);
  EXPECT_EQ(ucm_cache_finalize(nullptr), UCM_ERR_NULL_POINTER);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// The rank that passes NULL still joins init's collective steps, so its peers
// fail with its error instead of waiting for it.
TEST_F(Api, ANullOutputOnOneRankFailsInitOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int bad = world_size() - 1;
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  ucm_cache_t cache = nullptr;
  ucm_result_t r = UCM_OK;
  {
    HangGuard g("ucm_cache_init with a NULL output on rank " + std::to_string(bad));
    r = ucm_cache_init(MPI_COMM_WORLD, &cfg, world_rank() == bad ? nullptr : &cache);
  }
  EXPECT_EQ(r, UCM_ERR_NULL_POINTER) << msg(nullptr);
  EXPECT_EQ(cache, nullptr);
  const std::string e = msg(nullptr);
  EXPECT_TRUE(contains(e, "cache (the output handle) is NULL")) << e;
  if (world_rank() != bad) {
    EXPECT_TRUE(contains(e, ("rank " + std::to_string(bad)).c_str())) << e;
  }

  // So does a NULL config.
  const ucm_result_t r2 = ucm_cache_init(MPI_COMM_WORLD, world_rank() == bad ? nullptr : &cfg, &cache);
  EXPECT_EQ(r2, UCM_ERR_NULL_POINTER) << msg(nullptr);
  EXPECT_EQ(cache, nullptr);
  EXPECT_TRUE(contains(msg(nullptr), "config is NULL")) << msg(nullptr);

  // Nothing was left half-built: the next init works.
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << msg(nullptr);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK) << msg(nullptr);
}

// This process in a fresh pids cgroup (v1) that admits no more tasks than it
// has: creating a thread then fails with EAGAIN, as under a pids limit. The
// destructor puts the process back and removes the cgroup.
class PidsLimit {
 public:
  bool enter(std::string* why) {
    std::ifstream f("/proc/self/cgroup");
    std::string line;
    while (std::getline(f, line)) {
      const size_t p = line.find(":pids:");
      if (p != std::string::npos) home_ = kRoot + line.substr(p + 6);
    }
    if (home_.empty()) return *why = "no pids cgroup (v1) for this process", false;
    dir_ = home_ + "/ucm-api-test-" + std::to_string(getpid());
    if (mkdir(dir_.c_str(), 0755) != 0) {
      *why = "cannot create " + dir_ + ": " + std::strerror(errno);
      dir_.clear();
      return false;
    }
    if (!write(dir_ + "/cgroup.procs", std::to_string(getpid()))) return *why = "cannot join " + dir_, false;
    moved_ = true;
    std::ifstream cur(dir_ + "/pids.current");
    long n = 0;
    cur >> n;
    if (n <= 0 || !write(dir_ + "/pids.max", std::to_string(n))) return *why = "cannot limit " + dir_, false;
    return true;
  }
  ~PidsLimit() {
    if (dir_.empty()) return;
    (void)write(dir_ + "/pids.max", "max");
    if (moved_) (void)write(home_ + "/cgroup.procs", std::to_string(getpid()));
    rmdir(dir_.c_str());
  }

 private:
  static bool write(const std::string& path, const std::string& v) {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return false;
    const bool wrote = std::fputs(v.c_str(), f) >= 0;
    return std::fclose(f) == 0 && wrote;
  }
  static constexpr const char* kRoot = "/sys/fs/cgroup/pids";
  std::string home_, dir_;
  bool moved_ = false;
};

TEST_F(Api, AThreadThatCannotBeCreatedOnOneRankIsASystemErrorOnEveryRank) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const int bad = world_size() - 1;
  ucm_config_t cfg = task_config(64, "sim:latency_us=0,workers=2");
  std::string why;
  PidsLimit limit;
  int can = 1;
  if (world_rank() == bad) can = limit.enter(&why) ? 1 : 0;
  MPI_Bcast(&can, 1, MPI_INT, bad, MPI_COMM_WORLD);
  if (!can) {
    if (world_rank() == bad) GTEST_SKIP() << why;
    GTEST_SKIP() << "rank " << bad << " cannot set a pids limit";
  }
  ucm_cache_t cache = nullptr;
  const ucm_result_t r = ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache);
  EXPECT_EQ(r, UCM_ERR_SYSTEM) << msg(nullptr);
  EXPECT_EQ(cache, nullptr);
  const std::string e = msg(nullptr);
  EXPECT_TRUE(contains(e, "thread")) << e;
  EXPECT_TRUE(contains(e, "Resource temporarily unavailable")) << e;
  if (world_rank() != bad) {
    EXPECT_TRUE(contains(e, ("rank " + std::to_string(bad)).c_str())) << e;
  }
}

}  // namespace
}  // namespace ucm::test
