#include "sync/shared_lock.h"

#include <algorithm>

#include "common/time.h"
#include "sync/futex.h"

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

}  // namespace ucm
