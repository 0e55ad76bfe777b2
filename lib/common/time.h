// Monotonic time and deadlines. Deadlines are absolute CLOCK_MONOTONIC
// nanoseconds so that retries and slices never stretch a bound.
#pragma once

#include <time.h>

#include <cstdint>

namespace ucm {

inline uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// CPU time consumed by the calling thread, in nanoseconds.
inline uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// CPU time consumed by the whole process, in nanoseconds.
inline uint64_t process_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

constexpr uint64_t kNoDeadline = UINT64_MAX;

// Sleeps ns nanoseconds, resuming after signals.
inline void sleep_for_ns(uint64_t ns) {
  timespec ts{static_cast<time_t>(ns / 1000000000ull), static_cast<long>(ns % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

// now + ms; a sum too large for the clock (ms near UINT64_MAX / 1e6, or
// INT64_MAX passed as a timeout) saturates to kNoDeadline: no bound.
// `ms` after `now` (a now_ns() the caller read already), kNoDeadline past the clock's end.
inline uint64_t deadline_after_ms(uint64_t ms, uint64_t now) {
  if (ms > (kNoDeadline - now) / 1000000ull) return kNoDeadline;
  return now + ms * 1000000ull;
}
inline uint64_t deadline_after_ms(uint64_t ms) { return deadline_after_ms(ms, now_ns()); }

}  // namespace ucm
