// Recovery never hangs: the recovery lock names its holder by pid *and* start
// time, so a dead holder whose pid now belongs to another process is still
// dead; every wait in recovery ends at its caller's deadline, so a live but
// stopped holder (a debugger) gives waiters kTimeout; poll mode's wait loop is
// bounded the same way. Real processes, a real SIGKILL, a real SIGSTOP and a
// really reused pid (through /proc/sys/kernel/ns_last_pid, as root).
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "common/hang_guard.h"
#include "common/mp_util.h"
#include "common/test_util.h"
#include "ctrl/recovery.h"
#include "sync/shared_lock.h"

namespace ucm::test {
namespace {

constexpr uint64_t kBoundMs = 1000;  // the deadline every call under test gets

// The bound of every other wait here: a hang, not slowness. The tests assert
// each call's outcome at its deadline (kTimeout, and never before it), not how
// soon after the deadline a loaded machine let it return.
uint64_t deadline_ms() { return hang_ms(20); }

void sleep_forever() {
  for (;;) pause();
}

void join_as(const TestCache& parent, uint32_t rank, TestCache* mine) {
  attach_copy(parent, mine);
  if (::testing::Test::HasFatalFailure()) _exit(100);
  if (const Result r = join_rank_retrying(mine->ctrl, rank, deadline_after_ms(deadline_ms())); r != Result::kOk) {
    ADD_FAILURE() << "join as rank " << rank << ": " << result_name(r) << ": " << last_error();
    _exit(100);
  }
}

struct Outcome {
  std::atomic<int32_t> result{-1};
  std::atomic<uint64_t> elapsed_ns{0};
  char error[512] = {};

  void record(Result r, uint64_t t0) {
    elapsed_ns.store(now_ns() - t0);
    std::snprintf(error, sizeof(error), "%s", last_error().c_str());
    result.store(static_cast<int32_t>(r));
  }
  double ms() const { return static_cast<double>(elapsed_ns.load()) / 1e6; }
};

struct RecoveryShared {
  ShmSignal locked;       // the doomed rank holds bucket b
  ShmSignal recovering;   // the recovery-lock holder holds it
  ShmSignal joined;       // the recoverer has joined (joining takes the recovery lock)
  ShmSignal go;           // the parent lets the recoverer start
  Outcome lock_bucket;
  Outcome reap;
  Outcome wait;
};

// /proc/sys/kernel/ns_last_pid, the pid the kernel handed out last. Writing it
// makes the next fork() get the value + 1. The destructor leaves the counter
// no lower than it found it nor than any pid this test saw, so the kernel goes
// on from where it would have been.
class LastPid {
 public:
  LastPid() {
    start_ = read();
    ok_ = start_ > 0 && write(start_);
    highest_ = start_;
  }
  ~LastPid() {
    const int32_t now = read();
    if (ok_) (void)write(std::max({now, highest_, start_}));
  }
  LastPid(const LastPid&) = delete;
  LastPid& operator=(const LastPid&) = delete;

  bool usable() const { return ok_; }
  void saw(int32_t pid) { highest_ = std::max(highest_, pid); }
  bool set(int32_t v) { return write(v); }

 private:
  static constexpr const char* kPath = "/proc/sys/kernel/ns_last_pid";
  static int32_t read() {
    const int fd = ::open(kPath, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[32] = {};
    const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
    ::close(fd);
    return n > 0 ? static_cast<int32_t>(std::strtol(buf, nullptr, 10)) : -1;
  }
  static bool write(int32_t v) {
    const int fd = ::open(kPath, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[32];
    const int len = std::snprintf(buf, sizeof(buf), "%d", v);
    const bool ok = ::write(fd, buf, static_cast<size_t>(len)) == len;
    ::close(fd);
    return ok;
  }
  int32_t start_ = -1;
  int32_t highest_ = -1;
  bool ok_ = false;
};

// Clock ticks since boot, as /proc/<pid>/stat counts a start time.
uint64_t boot_ticks() {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  const uint64_t hz = static_cast<uint64_t>(sysconf(_SC_CLK_TCK));
  return static_cast<uint64_t>(ts.tv_sec) * hz + static_cast<uint64_t>(ts.tv_nsec) / (1000000000ull / hz);
}

// Waits (bounded) until the tick count is past `ticks`.
bool wait_for_tick_after(uint64_t ticks) {
  const uint64_t deadline = deadline_after_ms(deadline_ms());
  while (boot_ticks() <= ticks + 1) {
    if (now_ns() >= deadline) return false;
    usleep(1000);
  }
  return true;
}

// Rank 1 joins, takes bucket b's lock and is SIGKILLed holding it.
void kill_rank_holding_bucket(const TestCache& tc, uint32_t b, RecoveryShared* sh, Children* ch) {
  const pid_t doomed = ch->spawn([&] {
    TestCache mine;
    join_as(tc, 1, &mine);
    uint32_t dead = 0;
    ASSERT_EQ(shared_lock(&mine.ctrl.bucket(b).lock, holder_id(1), deadline_after_ms(deadline_ms()),
                          lock_policy_for(mine.ctrl, 50'000'000), &dead),
              Result::kOk);
    sh->locked.set(1);
    sleep_forever();
  });
  ASSERT_TRUE(sh->locked.wait_ge(1, deadline_after_ms(deadline_ms())));
  ch->kill_now(doomed);
}

// A process (not a rank) that takes the recovery lock and keeps it.
pid_t spawn_recovery_holder(const TestCache& tc, RecoveryShared* sh, Children* ch) {
  const pid_t p = ch->spawn([&] {
    BufferCtrl mine;
    ASSERT_EQ(BufferCtrl::attach(tc.ctrl.fd(), nullptr, &mine), Result::kOk) << last_error();
    ASSERT_EQ(lock_recovery(mine, deadline_after_ms(deadline_ms())), Result::kOk) << last_error();
    sh->recovering.set(1);
    sleep_forever();
  });
  EXPECT_TRUE(sh->recovering.wait_ge(1, deadline_after_ms(deadline_ms())));
  return p;
}

// Rank 0 in a child: joins, waits for `go`, then lock_bucket(b) and
// reap_dead_ranks, each with a deadline kBoundMs away; the parent bounds the
// child.
pid_t spawn_recoverer(const TestCache& tc, uint32_t b, RecoveryShared* sh, Children* ch) {
  const pid_t p = ch->spawn([&] {
    TestCache mine;
    join_as(tc, 0, &mine);
    sh->joined.set(1);
    ASSERT_TRUE(sh->go.wait_ge(1, deadline_after_ms(deadline_ms())));
    uint64_t t0 = now_ns();
    Result r = lock_bucket(mine.ctrl, 0, b, 50'000'000, t0 + kBoundMs * 1000000ull);
    sh->lock_bucket.record(r, t0);
    if (r == Result::kOk) shared_unlock(&mine.ctrl.bucket(b).lock);
    t0 = now_ns();
    uint32_t reaped = 0;
    r = reap_dead_ranks(mine.ctrl, 0, &reaped, t0 + kBoundMs * 1000000ull);
    sh->reap.record(r, t0);
    mine.ctrl.leave(0);
  });
  EXPECT_TRUE(sh->joined.wait_ge(1, deadline_after_ms(deadline_ms())));
  return p;
}

TEST(BoundedRecovery, ARecoveryLockHolderWhosePidIsTakenByAnotherProcessIsDead) {
  LastPid last_pid;
  if (!last_pid.usable()) GTEST_SKIP() << "cannot write /proc/sys/kernel/ns_last_pid (needs root)";
  TestCache tc;
  make_cache(params(64, 8, 256), &tc);
  Shared<RecoveryShared> sh;
  const uint32_t b = 5;
  Children ch;
  kill_rank_holding_bucket(tc, b, sh.get(), &ch);
  if (HasFatalFailure()) return;
  const pid_t recoverer = spawn_recoverer(tc, b, sh.get(), &ch);

  // The recovery lock's holder dies holding it...
  const pid_t holder = spawn_recovery_holder(tc, sh.get(), &ch);
  last_pid.saw(holder);
  const uint64_t holder_ticks = read_start_ticks(holder, nullptr);
  ASSERT_NE(holder_ticks, 0u);
  ch.kill_now(holder);
  // Start times count clock ticks (10 ms): a process that reuses the pid in
  // the holder's own tick is indistinguishable from it, here as in /proc.
  // Reuse it in a later tick, as any real reuse (a wrap of the pid space) is.
  ASSERT_TRUE(wait_for_tick_after(holder_ticks)) << "the boot clock did not pass tick " << holder_ticks;
  EXPECT_EQ(recovery_lock_holder(tc.ctrl), holder) << "the lock still names the dead holder";

  // ... and its pid goes to another process, which lives on.
  pid_t reuser = -1;
  for (int attempt = 0; attempt < 200 && reuser != holder; ++attempt) {
    if (reuser > 0) ch.kill_now(reuser);
    ASSERT_TRUE(last_pid.set(holder - 1));
    reuser = ch.spawn([] { sleep_forever(); });
    last_pid.saw(reuser);
  }
  if (reuser != holder) GTEST_SKIP() << "pid " << holder << " could not be handed out again in 200 forks";
  std::printf("pid %d: recovery-lock holder, SIGKILLed; now a live sleeper\n", static_cast<int>(holder));

  sh->go.set(1);
  ASSERT_EQ(ch.wait(recoverer, deadline_ms()), 0)
      << "hung: recovery blocked on a recovery lock whose holder pid " << holder << " now names a live stranger";
  EXPECT_EQ(sh->lock_bucket.result.load(), static_cast<int32_t>(Result::kOk)) << sh->lock_bucket.error;
  EXPECT_EQ(sh->reap.result.load(), static_cast<int32_t>(Result::kOk)) << sh->reap.error;
  std::printf("lock_bucket stole the recovery lock from dead pid %d and reaped rank 1 in %.1f ms\n",
              static_cast<int>(holder), sh->lock_bucket.ms());
  EXPECT_EQ(recovery_lock_holder(tc.ctrl), 0) << "released after the reap";
}

TEST(BoundedRecovery, AStoppedRecoveryLockHolderGivesWaitersATimeoutAtTheirDeadline) {
  TestCache tc;
  make_cache(params(64, 8, 256), &tc);
  Shared<RecoveryShared> sh;
  const uint32_t b = 9;
  Children ch;
  kill_rank_holding_bucket(tc, b, sh.get(), &ch);
  if (HasFatalFailure()) return;
  const pid_t recoverer = spawn_recoverer(tc, b, sh.get(), &ch);
  const pid_t holder = spawn_recovery_holder(tc, sh.get(), &ch);
  ASSERT_EQ(::kill(holder, SIGSTOP), 0);  // a debugger's breakpoint; Children SIGKILLs it at the end
  sh->go.set(1);
  ASSERT_EQ(ch.wait(recoverer, deadline_ms()), 0)
      << "hung: a recovery-lock holder that is stopped, not dead, hung its waiters past their deadline";
  for (const Outcome* o : {&sh->lock_bucket, &sh->reap}) {
    EXPECT_EQ(o->result.load(), static_cast<int32_t>(Result::kTimeout)) << o->error;
    EXPECT_GE(o->ms(), static_cast<double>(kBoundMs) - 1.0);
  }
  std::printf("with the recovery lock held by stopped pid %d: lock_bucket kTimeout after %.1f ms, reap after %.1f ms "
              "(bound %" PRIu64 " ms): %s\n",
              static_cast<int>(holder), sh->lock_bucket.ms(), sh->reap.ms(), kBoundMs, sh->reap.error);
  EXPECT_NE(std::strstr(sh->reap.error, "recovery lock"), nullptr) << sh->reap.error;
}

TEST(BoundedRecovery, PollModeWaitEndsAtItsDeadlineWhileAStoppedRankHoldsTheBucket) {
  TestCache tc;
  make_cache(params(64, 8, 256), &tc);
  Shared<RecoveryShared> sh;
  const Key K = key(31, 2);
  const uint32_t b = bucket_of(K, tc.ctrl.bucket_mask());
  Children ch;
  // Rank 1 owns K's load, then takes K's bucket lock, and is stopped.
  const pid_t owner = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 1, &mine);
    CacheOptions o;
    o.rank = 1;
    CacheBuffer cb(&mine.ctrl, &mine.data, o);
    GetResult g;
    ASSERT_EQ(cb.get(K, &g), Result::kOk) << last_error();
    ASSERT_EQ(g.kind, GetKind::kOwner);
    ASSERT_TRUE(shared_try_lock(&mine.ctrl.bucket(b).lock, holder_id(1)));
    sh->locked.set(1);
    sleep_forever();
  });
  ASSERT_TRUE(sh->locked.wait_ge(1, deadline_after_ms(deadline_ms())));
  ASSERT_EQ(::kill(owner, SIGSTOP), 0);

  const pid_t waiter = ch.spawn([&] {
    TestCache mine;
    join_as(tc, 2, &mine);
    CacheOptions o;
    o.rank = 2;
    o.wait = WaitMode::kPoll;
    o.poll_interval_ms = 5;
    CacheBuffer cb(&mine.ctrl, &mine.data, o);
    GetResult g;
    ASSERT_EQ(cb.get(K, &g), Result::kOk) << last_error();
    ASSERT_EQ(g.kind, GetKind::kWaiter);
    const uint64_t t0 = now_ns();
    uint32_t w = 0;
    const Result r = cb.wait_for_change(g.slot, g.word, t0 + kBoundMs * 1000000ull, &w);
    sh->wait.record(r, t0);
    cb.release(g.slot);
    mine.ctrl.leave(2);
  });
  ASSERT_EQ(ch.wait(waiter, deadline_ms()), 0)
      << "hung: a poll-mode wait hung on a bucket lock held by a stopped (live) rank";
  EXPECT_EQ(sh->wait.result.load(), static_cast<int32_t>(Result::kTimeout)) << sh->wait.error;
  EXPECT_GE(sh->wait.ms(), static_cast<double>(kBoundMs) - 1.0) << "timed out before its deadline";
  std::printf("poll-mode wait: kTimeout after %.1f ms (bound %" PRIu64 " ms)\n", sh->wait.ms(), kBoundMs);
}

}  // namespace
}  // namespace ucm::test
