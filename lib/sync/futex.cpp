#include "sync/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include "common/time.h"

namespace ucm {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "futex words must be plain 32-bit atomics");

FutexResult futex_wait(const std::atomic<uint32_t>* word, uint32_t expected, uint64_t deadline_ns) {
  // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC timeout, so slices and
  // retries never stretch the caller's bound.
  timespec ts{};
  timespec* tsp = nullptr;
  if (deadline_ns != kNoDeadline) {
    ts.tv_sec = static_cast<time_t>(deadline_ns / 1000000000ull);
    ts.tv_nsec = static_cast<long>(deadline_ns % 1000000000ull);
    tsp = &ts;
  }
  long rc = syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAIT_BITSET, expected, tsp,
                    nullptr, FUTEX_BITSET_MATCH_ANY);
  if (rc == 0) return FutexResult::kWoken;
  switch (errno) {
    case EAGAIN: return FutexResult::kValueChanged;
    case ETIMEDOUT: return FutexResult::kTimedOut;
    case EINTR: return FutexResult::kInterrupted;
    default: return FutexResult::kWoken;  // treat as spurious: the caller re-reads
  }
}

int futex_wake(const std::atomic<uint32_t>* word, int n) {
  long rc = syscall(SYS_futex, reinterpret_cast<const uint32_t*>(word), FUTEX_WAKE, n, nullptr, nullptr, 0);
  return rc < 0 ? 0 : static_cast<int>(rc);
}

}  // namespace ucm
