// Pins and claims: how a reader keeps a slot and how an evictor takes one.
//
// A pin is a 32-bit count in the pinning rank's own row (pins[rank][slot]), so
// pins are attributable (recovery zeroes a dead rank's row) and two ranks
// hitting the same slot never write the same cache line. A claim is a CAS of
// SlotMeta.claim from 0 to the claimer's holder id; only the claimer may change
// the slot's key or chain membership.
//
// Pin and claim exclude each other Dekker-style, with sequentially consistent
// operations on both sides:
//   pinner:  pins[r][i] += 1;   then read claim;  claim != 0 -> undo, back off
//   evictor: claim 0 -> me;     then read all pins; any != 0 -> unclaim, skip
// In the single total order of these operations one side always sees the
// other, so a slot is never re-keyed under a pin. A pinner then re-checks the
// key: the slot may have been re-keyed before the pin landed.
//
// The owner's hold (in the slot's futex word) is one more reference of the
// owner rank; how it is set, moved to a pin row and dropped, and the pairs
// that make an evictor see it, are the slot word's table (slot_word.h: T1,
// T3/T4/T8 with [R3], T6 with [R4]). Each release() drops exactly one of the
// rank's references: the hold by a CAS on the word, a pin on a Ready slot by
// one fetch_sub (Ready cannot change under a reference), any other pin by a
// CAS on the row that re-decides the abandon rule (T7) on the count it
// replaces. Two threads of a rank releasing at once thus never drop the same
// reference, and never both skip abandoning a load.
#pragma once

#include <atomic>
#include <cstdint>

#include "ctrl/buffer_ctrl.h"
#include "sync/futex.h"

namespace ucm {

enum class PinResult { kPinned, kClaimed, kOverflow };

constexpr uint32_t kMaxPinsPerRank = 0xffffffu;  // far above any real count; guards wrap-around

inline PinResult pin_slot(const BufferCtrl& c, uint32_t rank, uint32_t i) {
  std::atomic<uint32_t>& p = c.pin(rank, i);
  uint32_t before = p.fetch_add(1, std::memory_order_seq_cst);  // Dekker with claim_slot
  if (before == kMaxPinsPerRank) {
    p.fetch_sub(1, std::memory_order_relaxed);
    return PinResult::kOverflow;
  }
  if (c.slot(i).claim.load(std::memory_order_seq_cst) != 0) {  // [A1] (slot_word.h) when 0
    p.fetch_sub(1, std::memory_order_release);
    return PinResult::kClaimed;
  }
  return PinResult::kPinned;
}

// Drops one pin; returns the count this rank still holds on the slot. Release:
// pairs with claim_slot's seq_cst read of the rows, as [R4] (slot_word.h).
inline uint32_t unpin_slot(const BufferCtrl& c, uint32_t rank, uint32_t i) {
  return c.pin(rank, i).fetch_sub(1, std::memory_order_release) - 1;
}

// The owner's hold (slot_word.h) is a pin too. Relaxed: a hint (sweep_candidate);
// claim_slot's seq_cst read is [A3]/[A4].
inline bool slot_held(const BufferCtrl& c, uint32_t i, std::memory_order mo = std::memory_order_relaxed) {
  return word_held(c.slot(i).word.load(mo));
}

// The hold is read first ([A3] in slot_word.h): a reference moves from the
// hold to a pin row, never back, so a reader that finds the hold gone then
// sees the pin that replaced it.
inline bool slot_pinned(const BufferCtrl& c, uint32_t i, std::memory_order mo = std::memory_order_relaxed) {
  if (slot_held(c, i, mo)) return true;
  // The walk's bounds in locals: after each seq_cst load the compiler would
  // read c's fields again (an evictor's claim paid 10 instructions a rank).
  const uint32_t ranks = c.max_ranks();
  const uint64_t stride = c.pin_row_bytes();
  const auto* row = reinterpret_cast<const uint8_t*>(&c.pin(0, i));
  for (uint32_t r = 0; r < ranks; ++r, row += stride)
    if (reinterpret_cast<const std::atomic<uint32_t>*>(row)->load(mo) != 0) return true;
  return false;
}

inline uint32_t pin_count(const BufferCtrl& c, uint32_t i) {
  uint32_t n = slot_held(c, i) ? 1 : 0;
  for (uint32_t r = 0; r < c.max_ranks(); ++r) n += c.pin(r, i).load(std::memory_order_relaxed);
  return n;
}

// What drop_rank_refs() released.
struct DroppedRefs {
  uint64_t pins = 0;
  uint64_t holds = 0;
  uint64_t loads = 0;   // unfinished loads marked Failed
  uint64_t writes = 0;  // unfinished write-throughs marked NotStored
};

// Rings the node's completion doorbell (layout.h): a copier sleeping on it
// looks at its words again.
inline void ring_doorbell(const BufferCtrl& c) {
  c.globals().bell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&c.globals().bell, kWakeAll);
}

// A write-through by one of `rank_mask` that will never end: NotStored, with
// its sleepers woken, so that one of them writes the bytes itself (layout.h,
// the stored word, S3). Before the pins go: the write's own pin keeps the
// slot Ready (and this word current) until then.
inline void drop_rank_write(const BufferCtrl& c, uint32_t i, uint32_t rank_mask, DroppedRefs* out) {
  std::atomic<uint32_t>& sw = c.stored(i);
  uint32_t v = sw.load(std::memory_order_acquire);
  while (static_cast<StoreState>(v & kStoredStateMask) == StoreState::kWriting && stored_writer(v) < kMaxRanks &&
         ((rank_mask >> stored_writer(v)) & 1u)) {
    if (sw.compare_exchange_weak(v, stored_make(StoreState::kNotStored, kNoOwner, stored_epoch(v)),
                                 std::memory_order_acq_rel)) {
      ++out->writes;
      if (v & kStoredWaiters) {
        futex_wake(&sw, kWakeAll);
        // A copier sleeps on the doorbell beside its other words (layout.h):
        // a writer that leaves (or died) is seen at once, not a slice later.
        ring_doorbell(c);
      }
      return;
    }
  }
}

// Releases every reference the ranks in `rank_mask` hold on slot i, for ranks
// that will never release them themselves (dead, or leaving): a write-through
// one of them never finished, their pins, an
// owner's hold, and a load one of them owns and never marked, which becomes
// Failed with its sleepers woken, so that a waiter takes it over.
inline void drop_rank_refs(const BufferCtrl& c, uint32_t i, uint32_t rank_mask, DroppedRefs* out) {
  drop_rank_write(c, i, rank_mask, out);
  for (uint32_t r = 0; r < c.max_ranks(); ++r)
    if ((rank_mask >> r) & 1u) out->pins += c.pin(r, i).exchange(0, std::memory_order_acq_rel);
  std::atomic<uint32_t>& word = c.slot(i).word;
  uint32_t w = word.load(std::memory_order_acquire);  // [A2]
  for (;;) {
    const uint32_t owner = word_owner(w);
    // kNoOwner, or a stray value past any rank: not one of ours to drop.
    if (owner >= kMaxRanks || !((rank_mask >> owner) & 1u)) return;
    // Idle: a load they never finished (T7); finished, with their hold (T6).
    const bool unfinished = word_state(w) == State::kIdle;
    if (!unfinished && !word_held(w)) return;
    const uint32_t nw = unfinished ? word_abandon(w) : word_drop_hold(w);
    if (word.compare_exchange_weak(w, nw, std::memory_order_acq_rel)) {  // T7 [R2] / T6 [R4]
      ++(unfinished ? out->loads : out->holds);
      if (unfinished || word_has_waiters(w)) futex_wake(&word, kWakeAll);
      if (word_has_waiters(w)) ring_doorbell(c);  // a copier sleeps on the doorbell, as for a write above
      return;
    }
  }
}

// Claims slot i for `holder` if nobody claims or pins it.
inline bool claim_slot(const BufferCtrl& c, uint32_t holder, uint32_t i) {
  SlotMeta& s = c.slot(i);
  if (s.claim.load(std::memory_order_relaxed) != 0) return false;
  uint32_t expected = 0;
  if (!s.claim.compare_exchange_strong(expected, holder, std::memory_order_seq_cst)) return false;
  if (slot_pinned(c, i, std::memory_order_seq_cst)) {  // [A3] [A4] (slot_word.h)
    s.claim.store(0, std::memory_order_release);
    return false;
  }
  return true;
}

// Release: [R1] (slot_word.h) when it ends a re-key.
inline void unclaim_slot(const BufferCtrl& c, uint32_t i) { c.slot(i).claim.store(0, std::memory_order_release); }

}  // namespace ucm
