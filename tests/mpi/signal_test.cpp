// Signals with a handler and no SA_RESTART, as a profiler's SIGPROF or an
// application's timer brings them, interrupt the library's system calls on
// every one of its threads (the dispatcher's and copier's futex waits, the
// store's reads, writes, opens and io_uring waits, the store-call threads,
// the app thread's waits). Each call must resume: every task still ends
// right, and nothing fails or hangs. The storm is aimed at the library's
// threads and the test's own, not at MPI's (Open MPI's are not ours).
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/thread_names.h"
#include "mpi/cache_fixture.h"
#include "mpi/mpi_test.h"
#include "mpi/store_dir.h"
#include "mpi/task_util.h"
#include "ucm_build_config.h"

namespace ucm::test {
namespace {


std::atomic<uint64_t> g_handled{0};
void on_signal(int) { g_handled.fetch_add(1, std::memory_order_relaxed); }

// This process's threads named ucm-*, and `also` (a tid).
std::vector<pid_t> targets(pid_t also) {
  std::vector<pid_t> tids{also};
  for (const auto& [tid, name] : threads_named())
    if (name.rfind("ucm-", 0) == 0) tids.push_back(tid);
  return tids;
}

// SIGUSR2 with a handler that does nothing, without SA_RESTART, sent to one
// target after another, about every 100 us, until the storm ends.
class SignalStorm {
 public:
  SignalStorm() {
    struct sigaction sa {};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;  // no SA_RESTART: interrupted calls return EINTR
    sigaction(SIGUSR2, &sa, &old_);
    const pid_t me = static_cast<pid_t>(syscall(SYS_gettid));
    th_ = std::thread([this, me] {
      std::vector<pid_t> ts;
      for (size_t n = 0; !stop_.load(); ++n) {
        if (n % 64 == 0) ts = targets(me);  // the library's threads come and go
        if (syscall(SYS_tgkill, getpid(), ts[n % ts.size()], SIGUSR2) == 0) sent_.fetch_add(1);
        usleep(100);
      }
    });
  }
  ~SignalStorm() {
    end();
    // A signal sent to a thread that has not run since (a loaded machine)
    // is still pending on it: under the old disposition (SIGUSR2's default
    // ends the process) it would kill the rank in a later test. Ignoring
    // the signal discards every pending one; then the old action returns.
    struct sigaction ign {};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGUSR2, &ign, nullptr);
    sigaction(SIGUSR2, &old_, nullptr);
  }
  void end() {
    stop_.store(true);
    if (th_.joinable()) th_.join();
  }
  uint64_t sent() const { return sent_.load(); }

 private:
  struct sigaction old_ {};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> sent_{0};
  std::thread th_;
};

// Rounds of dumps, cold loads past the cache's size, lookups and touches on
// a posix store, under the storm. The same keys on every rank: loads are
// node-collective (each rank takes each shard before the cache may evict it).
void storm_rounds(ucm_cache_t cache, int round_count) {
  for (int round = 0; round < round_count; ++round) {
    std::vector<std::vector<uint8_t>> src(8, std::vector<uint8_t>(kTaskShard));
    std::vector<ucm_dump_entry_t> dumps;
    for (uint64_t i = 0; i < 8; ++i) {
      const ucm_key_t k = ukey(50000 + static_cast<uint64_t>(round) * 8 + i, 0);
      sim_fill(ikey(k), src[i].data(), kTaskShard);
      dumps.push_back({k, src[i].data()});
    }
    ucm_task_t t = 0;
    ASSERT_EQ(ucm_dump_task(cache, dumps.data(), dumps.size(), &t), UCM_OK) << msg(cache);
    ASSERT_EQ(wait_guarded(cache, t, "a dump under signals"), UCM_OK) << msg(cache);
    // The keys of four rounds back (32 dumped since): mostly evicted by now.
    const int back = round >= 4 ? round - 4 : round;
    LoadBatch b;
    for (uint64_t i = 0; i < 8; ++i) b.add(ukey(50000 + static_cast<uint64_t>(back) * 8 + i, 0));
    ASSERT_EQ(load_guarded(cache, b, "a load under signals"), UCM_OK) << msg(cache);
    for (size_t i = 0; i < b.entries.size(); ++i) ASSERT_EQ(b.verify(i), kTaskShard) << "round " << round << " entry " << i;
    std::vector<uint8_t> where(b.entries.size(), 0xee);
    std::vector<ucm_key_t> keys;
    for (const auto& e : b.entries) keys.push_back(e.key);
    ASSERT_EQ(ucm_lookup(cache, keys.data(), keys.size(), where.data()), UCM_OK) << msg(cache);
    for (uint8_t w : where) EXPECT_TRUE(w == UCM_WHERE_CACHE || w == UCM_WHERE_BACKEND) << int(w);
    ASSERT_EQ(ucm_touch(cache, &keys[0].block, 1), UCM_OK) << msg(cache);
  }
}

class Signals : public CacheTest {
 protected:
  void run_storm(const char* engine) {
    StoreDir dir("signals");
    const std::string spec = dir.spec() + ",engine=" + engine;
    ucm_config_t cfg = task_config(32, spec.c_str());
    uint64_t sent = 0;
    {
      // Init and finalize too: their socket, futex and MPI waits.
      SignalStorm storm;
      ASSERT_NO_FATAL_FAILURE(init(cfg));
      storm_rounds(cache_, 80);
      EXPECT_EQ(rank_stats(cache_).failed_shards, 0u);
      EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
      storm.end();
      sent = storm.sent();
    }
    EXPECT_GT(sent, 20u) << "the storm hardly ran";
    EXPECT_GT(g_handled.load(), 0u);
    std::printf("rank %d: engine=%s: %llu signals sent\n", world_rank(), engine,
                static_cast<unsigned long long>(sent));
  }
};

TEST_F(Signals, EveryCallResumesOnTheThreadPoolEngine) { run_storm("threads"); }

TEST_F(Signals, EveryCallResumesOnTheIoUringEngine) {
  if (!UCM_HAVE_URING) GTEST_SKIP() << "built without io_uring";
  run_storm("uring");
}

}  // namespace
}  // namespace ucm::test
