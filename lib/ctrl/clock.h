// Bucket chains and victim selection (CLOCK second chance, or the legacy ring).
//
// Chains: a bucket's chain is edited only by the holder of that bucket's lock,
// and each edit is one release store (push: slot.next = head, then head = slot;
// unlink: predecessor's link = slot.next). A process killed at any instruction
// leaves every chain well-formed; lock-free readers may wander off a slot that
// was just moved to another chain, so they bound their walk and re-check keys.
//
// Victims: every taker returns a slot it has *claimed* (pins.h) and detached
// from its old chain ("floating"), or kNoSlot. The caller re-keys it and
// pushes it on the locked target bucket, then unclaims. A victim in another
// bucket is detached only if that bucket's lock is free (try-lock): we never
// block on a second lock while holding one.
//
// CLOCK over the regular pool: the shared hand advances one slot per step;
// accessed = 1 -> clear it and move on (second chance); accessed = 0, unpinned,
// unclaimed -> victim. The second-chance phase lasts min(n, kSweepSecondChance)
// positions (a full lap in a small pool; 64 positions in a large one, so the
// first miss after the cache fills, when every bit is set, does not clear a
// whole lap under its bucket lock). Then a lap takes the next unpinned slot
// under the raw cursor whatever its bit. After that: none (everything
// pinned). Ring (legacy) is the raw-cursor lap alone: cursor + 1.
//
// Bounded work under a lock: one call examines at most kSweepPerCall
// positions. A miss keeps its progress in a SweepState; a call that used its
// budget without a victim returns kNoSlot with the state not done(), and the
// caller drops its bucket lock and calls again (get(): re-lock, look for the
// key again, continue the sweep). So the answer "none" (NoSpace) still means
// every phase ran to its end, as before, but no lock is held for more than
// kSweepPerCall positions, and the cost of the first miss after a fill is
// that of any other miss.
//
// Bytes the store lacks: a slot whose dump has not reached the store (its
// write-through in flight, failed, or its writer dead) has accessed =
// kAccessedUnstored, which hits keep, the hand never clears, and both laps
// skip; a third lap takes such a slot only when every other one is pinned.
// So CLOCK evicts a key that exists nowhere else only when the cache has no
// other victim, at no extra load per candidate (the byte is read anyway), and
// never stops for a store that is down; the dump whose write failed was told
// UCM_ERR_BACKEND, and the next dump of the key writes it again.
#pragma once

#include <cstdint>

#include "common/key.h"
#include "ctrl/buffer_ctrl.h"

namespace ucm {

inline Key slot_key(const BufferCtrl& c, uint32_t i) {
  const SlotMeta& s = c.slot(i);
  Key k;
  k.block.lo = s.key_lo.load(std::memory_order_relaxed);
  k.block.hi = s.key_hi.load(std::memory_order_relaxed);
  k.shard = s.shard.load(std::memory_order_relaxed);
  return k;
}

inline bool slot_has_key(const BufferCtrl& c, uint32_t i, const Key& k) {
  const SlotMeta& s = c.slot(i);
  return s.key_lo.load(std::memory_order_relaxed) == k.block.lo &&
         s.key_hi.load(std::memory_order_relaxed) == k.block.hi && s.shard.load(std::memory_order_relaxed) == k.shard;
}

// Fails with kCorrupt: bucket b's chain holds index `bad` at position `pos`.
[[nodiscard]] Result chain_bad_index(const BufferCtrl& c, uint32_t b, uint32_t pos, uint32_t bad);
// Fails with kCorrupt: bucket b's chain (walked under its lock) has more
// links than there are slots: a cycle.
[[nodiscard]] Result chain_too_long(const BufferCtrl& c, uint32_t b);

// How a lock-free walk ended when it found nothing.
enum class WalkEnd : uint8_t {
  kClean,    // reached kNoSlot
  kTooLong,  // ran out of steps: wandered, or a cycle (only a locked walk can tell)
  kCorrupt,  // an index past the end: last_error() names it
};

// Lock-free lookup of `k` on bucket b's chain: at most total_slots steps.
// The answer is a hint; confirm it under a pin. *end says how a walk that
// found nothing ended.
inline uint32_t chain_find_unlocked(const BufferCtrl& c, uint32_t b, const Key& k, WalkEnd* end) {
  const uint32_t total = c.total_slots();
  uint32_t i = c.bucket(b).head.load(std::memory_order_acquire);
  uint32_t steps = 0;
  for (; i < total && steps < total; ++steps) {
    if (slot_has_key(c, i, k)) return i;
    i = c.slot(i).next.load(std::memory_order_acquire);
  }
  if (i == kNoSlot) {
    *end = WalkEnd::kClean;
  } else if (i < total) {
    *end = WalkEnd::kTooLong;
  } else {
    (void)chain_bad_index(c, b, steps, i);
    *end = WalkEnd::kCorrupt;
  }
  return kNoSlot;
}

// The caller holds bucket b's lock. Each fails with kCorrupt (nothing
// changed) on a bad index or a cycle.
[[nodiscard]] Result chain_find_locked(const BufferCtrl& c, uint32_t b, const Key& k, uint32_t* slot);
[[nodiscard]] Result chain_contains(const BufferCtrl& c, uint32_t b, uint32_t slot, bool* found);
void chain_push(const BufferCtrl& c, uint32_t b, uint32_t slot);
[[nodiscard]] Result chain_unlink(const BufferCtrl& c, uint32_t b, uint32_t slot, bool* found);

// Writes a new key into a claimed floating slot with the given word state and
// owner, pushes it on bucket b (whose lock the caller holds) and unclaims it.
// `hold` gives the owner its hold (layout.h) in the same store, before the
// slot becomes visible.
void install_claimed_slot(const BufferCtrl& c, uint32_t slot, uint32_t b, const Key& k, State s, uint32_t owner,
                          bool accessed, bool hold);

// A never-used regular slot, claimed; kNoSlot when all have been used.
uint32_t take_unused_regular(const BufferCtrl& c, uint32_t holder);
// Positions of the second-chance phase in a pool larger than this, and the
// most positions one call of a taker examines (see above).
constexpr uint32_t kSweepSecondChance = 64;
constexpr uint32_t kSweepPerCall = 128;

// One eviction's progress through the phases, across calls. Start each miss
// with a fresh one.
struct SweepState {
  bool started = false;
  uint64_t chance_left = 0;  // second-chance positions left
  uint64_t stored_left = 0;  // positions left that take any stored slot, whatever its bit
  uint64_t any_left = 0;     // positions left that take anything unpinned (bytes the store lacks too)
  uint64_t examined = 0;     // positions examined so far, all calls
  // Every phase ran to its end: a kNoSlot answer is final.
  bool done() const { return started && chance_left == 0 && stored_left == 0 && any_left == 0; }
};

// What one phase of the sweep does with the slot under the hand. The one test
// of whether a slot may be a victim now, before its claim (pins are read by
// the claim itself).
enum class SweepPhase : uint8_t { kSecondChance, kStored, kAny };
enum class Candidate : uint8_t { kSkip, kTry };
Candidate sweep_candidate(const BufferCtrl& c, uint32_t i, SweepPhase phase);

// Per thread, for tests and benchmarks: calls of the regular and reserved
// takers, positions they examined, and the most one call examined.
struct SweepStats {
  uint64_t calls = 0;
  uint64_t positions = 0;
  uint64_t max_per_call = 0;
};
SweepStats sweep_stats();
void reset_sweep_stats();

// A regular-pool victim by the configured eviction mode, claimed and detached
// (*slot; kNoSlot when there is none). `*evicted` says whether it held a key.
// `locked_bucket` is the caller's. kCorrupt when the victim's chain is.
// kNoSlot with !st->done(): this call's budget ran out; drop the lock and
// call again with the same state.
[[nodiscard]] Result take_regular_victim(const BufferCtrl& c, uint32_t holder, uint32_t locked_bucket, bool* evicted,
                                         uint32_t* slot, SweepState* st);
// A reserved-pool slot: never used first, then CLOCK over the reserved pool,
// with the same budget per call.
[[nodiscard]] Result take_reserved_slot(const BufferCtrl& c, uint32_t holder, uint32_t locked_bucket, bool* evicted,
                                        uint32_t* slot, SweepState* st);

}  // namespace ucm
