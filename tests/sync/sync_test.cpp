// Futex wait/wake and the holder-naming shared lock, across real processes.
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/syscall.h>

#include <functional>

#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "common/time.h"
#include "sync/futex.h"
#include "sync/process_identity.h"
#include "sync/shared_lock.h"

namespace ucm::test {
namespace {

// A page shared with forked children.
template <typename T>
T* shared_page() {
  void* m = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(m, MAP_FAILED);
  return new (m) T();
}

TEST(Futex, WaitOnAStaleValueReturnsAtOnce) {
  std::atomic<uint32_t> w{5};
  EXPECT_EQ(futex_wait(&w, 4, deadline_after_ms(5000)), FutexResult::kValueChanged);
}

TEST(Futex, WaitTimesOutAtTheDeadline) {
  std::atomic<uint32_t> w{5};
  const uint64_t t0 = now_ns();
  EXPECT_EQ(futex_wait(&w, 5, t0 + 20'000'000), FutexResult::kTimedOut);
  EXPECT_GE(now_ns(), t0 + 20'000'000);
}

TEST(Futex, WakeReachesAnotherProcess) {
  auto* w = shared_page<std::atomic<uint32_t>>();
  pid_t child = fork_child([&] {
    while (w->load() == 0) futex_wait(w, 0, deadline_after_ms(10000));
    return w->load() == 1 ? 0 : 1;
  });
  usleep(20000);
  w->store(1);
  futex_wake(w, kWakeAll);
  EXPECT_EQ(wait_child(child, 10000), 0);
  munmap(w, 4096);
}

TEST(ProcessIdentity, SelfIsAliveAndAReapedChildIsNot) {
  EXPECT_TRUE(is_alive(self_identity()));
  ProcessIdentity other = self_identity();
  other.start_ticks += 1;
  EXPECT_FALSE(is_alive(other)) << "same pid, other start time: a reused pid";
  auto* id = shared_page<ProcessIdentity>();
  pid_t child = fork_child([&] {
    *id = self_identity();
    return 0;
  });
  ASSERT_EQ(wait_child(child, 10000), 0);
  EXPECT_EQ(id->pid, child);
  EXPECT_FALSE(is_alive(*id));
}

TEST(ProcessIdentity, AZombieIsDead) {
  auto* id = shared_page<ProcessIdentity>();
  pid_t child = fork_child([&] {
    *id = self_identity();
    return 0;
  });
  // Not reaped yet: a zombie until waitpid.
  while (read_start_ticks(child, nullptr) != 0) {
    char st = '?';
    read_start_ticks(child, &st);
    if (st == 'Z') break;
    usleep(1000);
  }
  // The leader shows Z as soon as the main thread is gone; the process is
  // dead once its last thread is (under TSan, its background thread ends a
  // moment after exit() began). Bounded: never sleeping to hope.
  const uint64_t until = deadline_after_ms(10000);
  while (is_alive(*id) && now_ns() < until) usleep(1000);
  EXPECT_FALSE(is_alive(*id));
  wait_child(child, 10000);
}

// A process whose main thread called pthread_exit shows 'Z' in /proc/<pid>/stat
// while its other threads still run: it is alive until the last thread ends.
TEST(ProcessIdentity, AProcessWhoseMainThreadExitedLivesWhileAnotherThreadRuns) {
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(go[1]);
    pthread_t t;
    pthread_create(
        &t, nullptr,
        [](void* fd) -> void* {
          char c;
          (void)!read(static_cast<int>(reinterpret_cast<intptr_t>(fd)), &c, 1);  // until the parent writes or dies
          _exit(0);
        },
        reinterpret_cast<void*>(static_cast<intptr_t>(go[0])));
    // What pthread_exit ends in, without unwinding through gtest's frames:
    // the exit of this one thread, not of the thread group.
    syscall(SYS_exit, 0);
  }
  close(go[0]);
  ProcessIdentity id;
  id.pid = child;
  char st = '?';
  const uint64_t deadline = deadline_after_ms(10000);
  while ((id.start_ticks = read_start_ticks(child, &st)) != 0 && st != 'Z' && now_ns() < deadline) usleep(1000);
  ASSERT_EQ(st, 'Z') << "the main thread of " << child << " never showed as exited";
  EXPECT_TRUE(is_alive(id)) << "a thread of pid " << child << " still runs";
  EXPECT_TRUE(pid_running(child));
  ASSERT_EQ(write(go[1], "x", 1), 1);
  close(go[1]);
  // Not reaped: every thread is gone, so it is dead, zombie or not.
  while (is_alive(id) && now_ns() < deadline) usleep(1000);
  EXPECT_FALSE(is_alive(id));
  EXPECT_FALSE(pid_running(child));
  EXPECT_EQ(wait_child(child, 10000), 0);
}

// Runs `body` in a child whose /proc is hidden (a tmpfs mounted over it in a
// private mount namespace); returns its exit code, or -1 when this machine
// does not allow that (not root, no user namespaces).
int with_proc_hidden(const std::function<int()>& body) {
  pid_t child = fork_child([&] {
    if (unshare(CLONE_NEWNS) != 0) return 77;
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 77;
    if (mount("none", "/proc", "tmpfs", 0, nullptr) != 0) return 77;
    return body();
  });
  const int rc = wait_child(child, 10000);
  return rc == 77 ? -1 : rc;
}

TEST(ProcessIdentity, WithoutProcAProcessCannotNameItselfAndPeersAreNotJudgedDead) {
  const ProcessIdentity parent = self_identity();
  pid_t gone = fork_child([] { return 0; });
  ASSERT_EQ(wait_child(gone, 10000), 0);
  const int rc = with_proc_hidden([&] {
    if (access("/proc/self/stat", R_OK) == 0) return 10;  // the mount did not hide it
    if (self_identity().start_ticks != 0) return 11;     // an identity made up of nothing
    if (!is_alive(parent)) return 12;                    // a live peer judged dead
    if (pid_running(gone)) return 13;                    // a gone pid judged running
    return 0;
  });
  if (rc < 0) GTEST_SKIP() << "cannot hide /proc in a mount namespace here (needs root)";
  EXPECT_EQ(rc, 0) << "10: /proc still visible, 11: self identity without /proc, 12: live parent judged dead, "
                      "13: reaped child judged running";
}

TEST(SharedLock, ExcludesAndTimesOut) {
  std::atomic<uint32_t> w{0};
  LockWaitPolicy pol;
  uint32_t dead = 0;
  ASSERT_EQ(shared_lock(&w, 3, kNoDeadline, pol, &dead), Result::kOk);
  EXPECT_EQ(lock_holder(w.load()), 3u);
  EXPECT_FALSE(shared_try_lock(&w, 4));
  EXPECT_EQ(shared_lock(&w, 4, now_ns() + 30'000'000, pol, &dead), Result::kTimeout);
  EXPECT_NE(last_error().find("held by id 3"), std::string::npos) << last_error();
  shared_unlock(&w);
  EXPECT_TRUE(shared_try_lock(&w, 4));
  shared_unlock(&w);
}

TEST(SharedLock, ContendedThreadsAllGetThrough) {
  std::atomic<uint32_t> w{0};
  uint64_t counter = 0;
  std::vector<std::thread> ts;
  for (uint32_t t = 1; t <= 4; ++t)
    ts.emplace_back([&, t] {
      LockWaitPolicy pol;
      for (int i = 0; i < 20000; ++i) {
        ASSERT_EQ(shared_lock(&w, t, kNoDeadline, pol, nullptr), Result::kOk);
        ++counter;
        shared_unlock(&w);
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(counter, 80000u);
  EXPECT_EQ(w.load(), 0u);
}

TEST(SharedLock, ADeadHolderIsReportedWithinASliceAndCanBeStolen) {
  struct Shared {
    std::atomic<uint32_t> lock{0};
    std::atomic<uint32_t> held{0};
  };
  auto* s = shared_page<Shared>();
  pid_t child = fork_child([&] {
    if (!shared_try_lock(&s->lock, 7)) return 1;
    s->held.store(1);
    pause();
    return 0;
  });
  while (s->held.load() == 0) usleep(1000);
  kill(child, SIGKILL);
  wait_child(child, 10000);

  LockWaitPolicy pol;
  pol.slice_ns = 20'000'000;
  pol.holder_alive = [](void*, uint32_t holder) { return holder != 7; };
  uint32_t dead = 0;
  const uint64_t t0 = now_ns();
  // kPeerDead, not the deadline's kTimeout: the dead holder was found first.
  EXPECT_EQ(shared_lock(&s->lock, 2, t0 + 5'000'000'000ull, pol, &dead), Result::kPeerDead);
  EXPECT_EQ(dead, 7u);
  EXPECT_TRUE(shared_lock_steal(&s->lock, 7, 2));
  EXPECT_EQ(lock_holder(s->lock.load()), 2u);
  EXPECT_FALSE(shared_lock_steal(&s->lock, 7, 3)) << "no longer held by the dead id";
  shared_unlock(&s->lock);
  munmap(s, 4096);
}

TEST(ProcessLock, AHolderIsNamedByPidAndStartTimeSoAReusedPidReadsDead) {
  const ProcessIdentity self = self_identity();
  ASSERT_NE(self.start_ticks, 0u) << "needs /proc";
  const uint64_t me = process_lock_tag(self.pid, self.start_ticks);
  // Our pid with another start time: a process that had this pid before us.
  const uint64_t earlier = process_lock_tag(self.pid, self.start_ticks - 1);
  EXPECT_TRUE(process_lock_holder_alive(me));
  EXPECT_FALSE(process_lock_holder_alive(earlier));
  EXPECT_EQ(process_lock_pid(earlier), self.pid);

  std::atomic<uint64_t> w{earlier};
  uint64_t dead = 0;
  const uint64_t t0 = now_ns();
  // kPeerDead, not the deadline's kTimeout: the dead holder was seen first.
  EXPECT_EQ(process_lock(&w, me, t0 + 5'000'000'000ull, 50'000'000, &dead), Result::kPeerDead);
  EXPECT_EQ(dead, earlier);
  EXPECT_TRUE(process_lock_steal(&w, dead, me));
  EXPECT_EQ(process_lock_pid(w.load()), self.pid);
  EXPECT_FALSE(process_lock_steal(&w, earlier, me)) << "only the named dead holder's lock is stolen";
  // Held by a live process (us): a waiter ends at its deadline.
  const uint64_t t1 = now_ns();
  EXPECT_EQ(process_lock(&w, process_lock_tag(self.pid + 1, 7), t1 + 30'000'000, 10'000'000, &dead), Result::kTimeout);
  EXPECT_GE(now_ns(), t1 + 30'000'000);
  process_unlock(&w);
  EXPECT_EQ(w.load(), 0u);
}

}  // namespace
}  // namespace ucm::test
