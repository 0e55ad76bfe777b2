#include "sync/shared_lock.h"

#include <algorithm>

#include "common/time.h"
#include "sync/futex.h"
#include "sync/process_identity.h"

namespace ucm {

Result shared_lock(std::atomic<uint32_t>* word, uint32_t holder_id, uint64_t deadline_ns,
                   const LockWaitPolicy& policy, uint32_t* dead_holder) {
  uint32_t c = 0;
  if (word->compare_exchange_strong(c, holder_id, std::memory_order_acquire, std::memory_order_relaxed))
    return Result::kOk;
  // Brief spin: critical sections are a few hundred nanoseconds.
  for (int i = 0; i < 64; ++i) {
    cpu_relax();
    c = word->load(std::memory_order_relaxed);
    if (c == 0 && word->compare_exchange_weak(c, holder_id, std::memory_order_acquire, std::memory_order_relaxed))
      return Result::kOk;
  }
  for (;;) {
    c = word->load(std::memory_order_relaxed);
    if (c == 0) {
      // After sleeping we cannot know whether others sleep too: keep bit 31.
      if (word->compare_exchange_weak(c, holder_id | kLockContended, std::memory_order_acquire,
                                      std::memory_order_relaxed))
        return Result::kOk;
      continue;
    }
    if (!(c & kLockContended)) {
      if (!word->compare_exchange_weak(c, c | kLockContended, std::memory_order_relaxed)) continue;
      c |= kLockContended;
    }
    uint64_t now = now_ns();
    if (now >= deadline_ns) return fail(Result::kTimeout, "lock held by id %u past the deadline", lock_holder(c));
    uint64_t slice_end = std::min(deadline_ns, now + policy.slice_ns);
    FutexResult r = futex_wait(word, c, slice_end);
    if (r == FutexResult::kTimedOut && policy.holder_alive) {
      uint32_t now_word = word->load(std::memory_order_relaxed);
      uint32_t holder = lock_holder(now_word);
      if (holder != 0 && now_word == c && !policy.holder_alive(policy.ctx, holder)) {
        if (dead_holder) *dead_holder = holder;
        return fail(Result::kPeerDead, "lock holder id %u is dead", holder);
      }
    }
  }
}

void shared_unlock_wake(std::atomic<uint32_t>* word) { futex_wake(word, 1); }

bool shared_lock_steal(std::atomic<uint32_t>* word, uint32_t dead_holder_id, uint32_t new_holder_id) {
  uint32_t c = word->load(std::memory_order_relaxed);
  while (lock_holder(c) == dead_holder_id) {
    if (word->compare_exchange_weak(c, new_holder_id | kLockContended, std::memory_order_acquire,
                                    std::memory_order_relaxed))
      return true;
  }
  return false;
}

// ---- process lock ------------------------------------------------------------

namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the process lock sleeps on the low half of its word");

// The futex word: the low half (pid and sleeper bit).
const std::atomic<uint32_t>* low_half(const std::atomic<uint64_t>* word) {
  return reinterpret_cast<const std::atomic<uint32_t>*>(word);
}

uint32_t tag_ticks(uint64_t tag) { return static_cast<uint32_t>(tag >> 32); }

}  // namespace

uint64_t process_lock_tag(int32_t pid, uint64_t start_ticks) {
  return (uint64_t{static_cast<uint32_t>(start_ticks)} << 32) | (static_cast<uint32_t>(pid) & kLockHolderMask);
}

bool process_lock_holder_alive(uint64_t tag) {
  const int32_t pid = process_lock_pid(tag);
  if (tag_ticks(tag) == 0) return pid_running(pid);
  if (!pid_running(pid)) return false;
  // Running: but is it the holder, or a later process with its pid? Read the
  // start time after the liveness check, so a holder that died in between
  // reads as "no such pid" (0) rather than as itself.
  return static_cast<uint32_t>(read_start_ticks(pid, nullptr)) == tag_ticks(tag);
}

Result process_lock(std::atomic<uint64_t>* word, uint64_t tag, uint64_t deadline_ns, uint64_t slice_ns,
                    uint64_t* dead) {
  uint64_t c = 0;
  if (word->compare_exchange_strong(c, tag, std::memory_order_acquire, std::memory_order_relaxed)) return Result::kOk;
  uint64_t next_probe = 0;
  for (;;) {
    c = word->load(std::memory_order_relaxed);
    if (c == 0) {
      if (word->compare_exchange_weak(c, tag | kLockContended, std::memory_order_acquire, std::memory_order_relaxed))
        return Result::kOk;
      continue;
    }
    if (!(c & kLockContended)) {
      if (!word->compare_exchange_weak(c, c | kLockContended, std::memory_order_relaxed)) continue;
      c |= kLockContended;
    }
    const uint64_t now = now_ns();
    // The probe reads /proc: once per slice, and at once the first time, so a
    // holder that died long ago costs the waiter no slice.
    if (now >= next_probe) {
      next_probe = now + slice_ns;
      if (word->load(std::memory_order_relaxed) == c && !process_lock_holder_alive(c)) {
        if (dead) *dead = process_lock_id(c);
        return fail(Result::kPeerDead, "the recovery lock's holder pid %d (start 0x%x) is dead", process_lock_pid(c),
                    tag_ticks(c));
      }
    }
    if (now >= deadline_ns)
      return fail(Result::kTimeout, "the recovery lock is held by live pid %d past the deadline (stopped, or slow)",
                  process_lock_pid(c));
    (void)futex_wait(low_half(word), static_cast<uint32_t>(c), std::min(deadline_ns, next_probe));
  }
}

bool process_lock_steal(std::atomic<uint64_t>* word, uint64_t dead_tag, uint64_t tag) {
  uint64_t c = word->load(std::memory_order_relaxed);
  while (process_lock_id(c) == dead_tag) {
    if (word->compare_exchange_weak(c, tag | kLockContended, std::memory_order_acquire, std::memory_order_relaxed))
      return true;
  }
  return false;
}

void process_unlock(std::atomic<uint64_t>* word) {
  const uint64_t old = word->exchange(0, std::memory_order_release);
  if (old & kLockContended) futex_wake(low_half(word), 1);
}

}  // namespace ucm
