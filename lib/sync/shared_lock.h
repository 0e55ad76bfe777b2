// A cross-process lock in one 32-bit word of shared memory that names its holder.
//
// Word: 0 = free; otherwise bits 0..30 hold the holder id (a local rank + 1:
// bucket locks) and bit 31 says that someone may be sleeping on it. A lock
// named by a process rather than a rank is process_lock, below. Lock takes it with a CAS;
// a contended locker sets bit 31 and futex-waits in slices. After each slice it
// asks `holder_alive(holder id)`; a dead holder ends the wait with kPeerDead so
// the caller can run recovery (which steals the lock with `shared_lock_steal`).
// Unlock is one exchange to 0 and a wake of one sleeper if bit 31 was set.
//
// The lock is not recursive and holder ids are per process: threads of one
// process share an id, which is fine because a thread cannot die alone.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/result.h"
#include "sync/spin.h"

namespace ucm {

constexpr uint32_t kLockContended = 0x80000000u;
constexpr uint32_t kLockHolderMask = 0x7fffffffu;

inline uint32_t lock_holder(uint32_t word) { return word & kLockHolderMask; }

using HolderAliveFn = bool (*)(void* ctx, uint32_t holder_id);

struct LockWaitPolicy {
  uint64_t slice_ns = 50'000'000;  // how often a sleeper checks the holder's liveness
  HolderAliveFn holder_alive = nullptr;
  void* ctx = nullptr;
};

// Acquires the lock for `holder_id` (1..2^31-1). Returns kOk, kTimeout when the
// absolute deadline passes, or kPeerDead with *dead_holder set when the holder
// died (the lock is then still held by the dead id: steal it to recover).
[[nodiscard]] Result shared_lock(std::atomic<uint32_t>* word, uint32_t holder_id, uint64_t deadline_ns,
                                 const LockWaitPolicy& policy, uint32_t* dead_holder);

inline bool shared_try_lock(std::atomic<uint32_t>* word, uint32_t holder_id) {
  uint32_t expected = 0;
  return word->compare_exchange_strong(expected, holder_id, std::memory_order_acquire,
                                       std::memory_order_relaxed);
}

// The wake half of shared_unlock, out of line: only a contended unlock needs it.
void shared_unlock_wake(std::atomic<uint32_t>* word);

// Inline: every miss unlocks one or two buckets.
inline void shared_unlock(std::atomic<uint32_t>* word) {
  const uint32_t old = word->exchange(0, std::memory_order_release);
  if (old & kLockContended) shared_unlock_wake(word);
}

// Takes over a lock whose holder is `dead_holder_id` (recovery only). Returns
// false if the word no longer names that holder.
bool shared_lock_steal(std::atomic<uint32_t>* word, uint32_t dead_holder_id, uint32_t new_holder_id);


// ---- a lock named by a process (the node's recovery lock) ---------------------
//
// A pid alone does not name a process for long: once its holder dies, the pid
// may go to a stranger, who would then look like a live holder forever. So
// this lock's word is 64 bits: bits 0..30 the holder's pid, bit 31 the sleeper
// bit (the low half is the futex word), bits 32..63 the low 32 bits of the
// holder's start time (process_identity.h). One CAS writes both halves, so no
// SIGKILL can leave a holder named by its pid alone. A holder whose start time
// is unknown (no /proc: tag 0) is judged by its pid only; waiters still end at
// their deadline.
//
// Transitions (every one a single CAS or exchange on the whole word):
//   0            -> tag            process_lock: the winner (acquire)
//   tag[|sleep]  -> tag|sleep      a waiter, before it futex-waits on the low half
//   tag[|sleep]  -> 0              process_unlock (release); wakes one if `sleep`
//   dead[|sleep] -> tag|sleep      process_lock_steal, after the probe found the
//                                  holder dead (acquire)

// The lock tag of a process: its pid and the low half of its start time.
uint64_t process_lock_tag(int32_t pid, uint64_t start_ticks);
inline int32_t process_lock_pid(uint64_t word) { return static_cast<int32_t>(word & kLockHolderMask); }
inline uint64_t process_lock_id(uint64_t word) { return word & ~uint64_t{kLockContended}; }
// Whether the process a tag names still runs (a reused pid does not count).
bool process_lock_holder_alive(uint64_t tag);

// Acquires the lock for `tag` (process_lock_tag of the caller). Returns kOk,
// kTimeout at the absolute deadline (naming the live holder), or kPeerDead
// with *dead set to the dead holder's tag (steal it to go on). The holder's
// liveness is probed every `slice_ns`.
[[nodiscard]] Result process_lock(std::atomic<uint64_t>* word, uint64_t tag, uint64_t deadline_ns, uint64_t slice_ns,
                                  uint64_t* dead);
// Takes over a lock still held by `dead_tag`; false if the word names another.
bool process_lock_steal(std::atomic<uint64_t>* word, uint64_t dead_tag, uint64_t tag);
void process_unlock(std::atomic<uint64_t>* word);

}  // namespace ucm
