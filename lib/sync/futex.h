// Cross-process futex wait/wake on 32-bit words in shared memory.
//
// Never the private futex flag: the words live in memfd mappings shared by several
// processes, and a private futex is keyed by (mm, address), so it would not wake
// another process. Never std::atomic::wait either: it is process-local.
//
// Protocol for a waiter: read the word; if the state it holds is not the one you
// need, futex_wait on exactly the value you read. A writer changes the word
// before it wakes, so a change between the read and the sleep makes the wait
// return at once (kValueChanged): no wake-up is ever lost.
#pragma once

#include <atomic>
#include <cstdint>

namespace ucm {

enum class FutexResult { kWoken, kValueChanged, kTimedOut, kInterrupted };

// Blocks while *word == expected, until woken or until the absolute
// CLOCK_MONOTONIC deadline (ns; kNoDeadline for none). Spurious returns are
// reported as kWoken: callers always re-read the word.
FutexResult futex_wait(const std::atomic<uint32_t>* word, uint32_t expected, uint64_t deadline_ns);

// Wakes up to n waiters blocked on word (n = INT32_MAX: all). Returns how many woke.
int futex_wake(const std::atomic<uint32_t>* word, int n);

constexpr int kWakeAll = 0x7fffffff;

}  // namespace ucm
