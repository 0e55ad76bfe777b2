// Victim selection (CLOCK second chance, or the legacy ring). Bucket chains
// are chain.h.
//
// Victims: every taker returns a slot it has *claimed* (pins.h) and detached
// from its old chain ("floating"), or kNoSlot. The caller re-keys it and
// pushes it on the locked target bucket (install_claimed_slot, chain.h), then
// unclaims. A victim in another bucket is detached only if that bucket's lock
// is free (try-lock): we never block on a second lock while holding one.
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
// that of any other miss. Besides its sweep a miss's lock hold walks two
// chains (its bucket's and its victim's, chain.h), each as long as the chain:
// at 512k slots a miss examines at most 65 positions in one hold and about
// as many links as the chains hold (bench/scale_bench.cpp --mode miss counts
// them; tests SweepBound.*).
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

#include "ctrl/buffer_ctrl.h"
#include "ctrl/chain.h"  // the caller installs the victim on its chain
#include "ctrl/protect_relax.h"

namespace ucm {

// A never-used regular slot, claimed; kNoSlot when all have been used.
uint32_t take_unused_regular_slow(const BufferCtrl& c, uint32_t holder);
inline uint32_t take_unused_regular(const BufferCtrl& c, uint32_t holder) {
  // Used up (every miss once the cache has filled): one load, no call. The
  // counter only grows, so a stale read here at worst costs the slow path's
  // own look at it.
  if (c.globals().unused_regular.load(std::memory_order_relaxed) >= c.regular_slots()) return kNoSlot;
  return take_unused_regular_slow(c, holder);
}
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
  // The reserved pool (take_reserved_slot sets it): unused preallocs younger
  // than the grace stay (protect.h, hint_kept), and the sweep counts what it
  // passed over, so a prealloc that finds no slot can tell why.
  bool reserved = false;
  uint64_t in_flight = 0;    // positions held by a load, pinned (copies, waiters) or claimed
  // Whom the evictor serves (protect.h, the order of waits): the load task of
  // its get (have_task; otherwise its RankRecord.tasks_passed stands in), and
  // whether it still waits for its own takes at that task.
  bool have_task = false;
  uint32_t task = 0;
  bool wait_self = true;
  ProtectRelax relax = ProtectRelax::kStrict;  // how far the protection holds (protect.h)
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
// with the same budget per call. It never takes an unused prealloc younger
// than the grace (protect.h); st->in_flight counts the positions it passed
// over that loads or copies in flight hold.
[[nodiscard]] Result take_reserved_slot(const BufferCtrl& c, uint32_t holder, uint32_t locked_bucket, bool* evicted,
                                        uint32_t* slot, SweepState* st);

}  // namespace ucm
