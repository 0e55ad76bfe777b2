// Helpers for tests that fork real processes around one node cache: objects in
// an anonymous MAP_SHARED mapping (made before fork, the same bytes in parent
// and children), futex-backed signals and a barrier that work across those
// processes, a RAII set of children that never outlives the test, shard
// contents derived from the key, and joining a rank whose record a dead
// process may still hold.
//
// Nothing here mocks the library: the cache is the real control and data
// plane (test_util.h), the children re-attach through its fds, and deadlines
// exist only to turn a hang into a failure.
#pragma once

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sync/spin.h"

#include "common/test_util.h"
#include "ctrl/recovery.h"
#include "sync/futex.h"
#include "sync/process_identity.h"

namespace ucm::test {

// One T in an anonymous shared mapping. Create it before fork(); T must be
// usable from several processes at once (atomics, fixed-size arrays).
template <class T>
class Shared {
 public:
  Shared() {
    void* m = mmap(nullptr, bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
      std::perror("mmap(MAP_SHARED | MAP_ANONYMOUS)");
      std::abort();
    }
    p_ = new (m) T();
  }
  ~Shared() {
    p_->~T();
    munmap(p_, bytes());
  }
  Shared(const Shared&) = delete;
  Shared& operator=(const Shared&) = delete;

  T* operator->() const { return p_; }
  T& operator*() const { return *p_; }
  T* get() const { return p_; }

 private:
  static size_t bytes() { return (sizeof(T) + 4095) & ~size_t{4095}; }
  T* p_ = nullptr;
};


// A counter that only grows; waiters block (spin, then futex) until it
// reaches a target. post() stores, then wakes: a waiter that read the old value
// and sleeps on it returns at once.
struct ShmSignal {
  std::atomic<uint32_t> value{0};

  void set(uint32_t v) {
    value.store(v, std::memory_order_release);
    futex_wake(&value, kWakeAll);
  }
  void add(uint32_t n = 1) {
    value.fetch_add(n, std::memory_order_acq_rel);
    futex_wake(&value, kWakeAll);
  }
  uint32_t get() const { return value.load(std::memory_order_acquire); }

  // True once value >= target; false at the deadline (absolute ns).
  bool wait_ge(uint32_t target, uint64_t deadline_ns, int spins = 2000) const {
    for (int i = 0; i < spins; ++i) {
      if (value.load(std::memory_order_acquire) >= target) return true;
      cpu_relax();
    }
    for (;;) {
      const uint32_t v = value.load(std::memory_order_acquire);
      if (v >= target) return true;
      const uint64_t now = now_ns();
      if (now >= deadline_ns) return false;
      (void)futex_wait(&value, v, std::min<uint64_t>(deadline_ns, now + 20'000'000ull));
    }
  }
};

// A reusable barrier for a fixed number of processes.
struct ShmBarrier {
  std::atomic<uint32_t> arrived{0};
  std::atomic<uint32_t> generation{0};
  uint32_t parties = 0;

  // False at the deadline (a party died or hangs), or once *abort != 0.
  bool wait(uint64_t deadline_ns, const std::atomic<uint32_t>* abort = nullptr) {
    const uint32_t g = generation.load(std::memory_order_acquire);
    if (arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == parties) {
      arrived.store(0, std::memory_order_relaxed);
      generation.fetch_add(1, std::memory_order_acq_rel);
      futex_wake(&generation, kWakeAll);
      return true;
    }
    for (int i = 0; i < 2000; ++i) {
      if (generation.load(std::memory_order_acquire) != g) return true;
      cpu_relax();
    }
    while (generation.load(std::memory_order_acquire) == g) {
      const uint64_t now = now_ns();
      if (now >= deadline_ns || (abort && abort->load(std::memory_order_acquire))) return false;
      (void)futex_wait(&generation, g, std::min<uint64_t>(deadline_ns, now + 20'000'000ull));
    }
    return true;
  }
};

// The first failure message of any process, for the parent to report.
struct ShmError {
  std::atomic<uint32_t> count{0};
  std::atomic<uint32_t> written{0};
  char text[1024] = {};

  void report(const char* fmt, ...) __attribute__((format(printf, 2, 3))) {
    char buf[sizeof(text)];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    std::fprintf(stderr, "[pid %d] FAILURE: %s\n", static_cast<int>(getpid()), buf);
    if (count.fetch_add(1, std::memory_order_acq_rel) == 0) {
      std::memcpy(text, buf, sizeof(buf));
      written.store(1, std::memory_order_release);
    }
  }
  bool any() const { return count.load(std::memory_order_acquire) != 0; }
  std::string first() const {
    if (!written.load(std::memory_order_acquire)) return any() ? "(being written)" : "";
    return std::string(text, strnlen(text, sizeof(text)));
  }
};

// Children forked by one test. Whatever happens in the test, the destructor
// SIGKILLs and reaps every child still running: no orphan outlives it.
class Children {
 public:
  Children() = default;
  ~Children() { kill_all(); }
  Children(const Children&) = delete;
  Children& operator=(const Children&) = delete;

  // Runs body() in a child; the exit code is 0, or 100 after a gtest failure
  // inside it (fork_child in test_util.h).
  pid_t spawn(const std::function<void()>& body) {
    const pid_t pid = fork_child([&body] {
      body();
      return 0;
    });
    if (pid > 0) pids_.push_back(pid);
    return pid;
  }

  // Exit code, 128 + signal, or -1 if it was still running at the deadline
  // (then it has been killed).
  int wait(pid_t pid, uint64_t timeout_ms) {
    const int rc = wait_child(pid, timeout_ms);
    forget(pid);
    return rc;
  }

  // SIGKILLs pid and reaps it.
  void kill_now(pid_t pid) {
    ::kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    forget(pid);
  }

  void kill_all() {
    for (pid_t p : pids_) {
      ::kill(p, SIGKILL);
      int status = 0;
      waitpid(p, &status, 0);
    }
    pids_.clear();
  }

 private:
  void forget(pid_t pid) {
    for (size_t i = 0; i < pids_.size(); ++i)
      if (pids_[i] == pid) {
        pids_.erase(pids_.begin() + static_cast<long>(i));
        return;
      }
  }
  std::vector<pid_t> pids_;
};

// The one-letter /proc state of a process (R, S, Z, ...), '?' if gone.
inline char proc_state(pid_t pid) {
  char st = '?';
  if (read_start_ticks(pid, &st) == 0) return '?';
  return st;
}

// ---- shard contents ----------------------------------------------------------

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The 8 bytes at word index w of key k's shard: a function of (block, shard,
// offset), so every byte read can be checked.
inline uint64_t pattern_word(const Key& k, uint64_t w) {
  return mix64(k.block.lo ^ mix64(k.block.hi ^ (uint64_t{k.shard} << 40) ^ w));
}

inline void fill_pattern(void* dst, uint64_t bytes, const Key& k, uint64_t from = 0, uint64_t to = UINT64_MAX) {
  auto* p = static_cast<uint64_t*>(dst);
  const uint64_t n = bytes / 8;
  to = std::min(to, n);
  for (uint64_t w = from; w < to; ++w) p[w] = pattern_word(k, w);
}

// Returns the first bad word index, or -1 if the whole shard is k's.
inline int64_t check_pattern(const void* src, uint64_t bytes, const Key& k) {
  const auto* p = static_cast<const uint64_t*>(src);
  for (uint64_t w = 0; w < bytes / 8; ++w)
    if (p[w] != pattern_word(k, w)) return static_cast<int64_t>(w);
  return -1;
}

// ---- ranks -------------------------------------------------------------------

// Joins local rank r; if the record still names a dead process, reaps (as r,
// which is what a replacement process does) and joins again.
inline Result join_rank_retrying(const BufferCtrl& c, uint32_t r, uint64_t deadline_ns) {
  for (;;) {
    // ucm::join_rank adopts a dead predecessor's record and cleans up after it.
    const Result j = ucm::join_rank(c, r, deadline_ns);
    if (j != Result::kBadState || now_ns() >= deadline_ns) return j;
    usleep(1000);  // a live process still holds it (it may be exiting)
  }
}

// A seed from UCM_TEST_SEED, else a fresh one; tests print it.
inline uint64_t test_seed() {
  if (const char* s = std::getenv("UCM_TEST_SEED"); s && *s) return std::strtoull(s, nullptr, 0);
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd();
}

}  // namespace ucm::test
