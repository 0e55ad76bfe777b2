// The slot's futex word (SlotMeta.word, layout.h): its encoding, its
// transition table, and the only functions that compute a new word.
//
// This table is the one place the word's rules are written; the code that
// reads or writes the word (cache/cache_buffer.cpp, ctrl/pins.h,
// ctrl/clock.cpp, ctrl/recovery.cpp, ctrl/buffer_ctrl.cpp) names the table's
// labels at each end and points here. Change a rule here first.
//
// ---- encoding (32 bits; layout is ABI: change it, bump kCtrlAbi) -------------
//   bits 0-1   State: Idle (being loaded, or unowned), Ready, Failed, Corrupt
//   bit  2     waiters: someone sleeps on this word (futex or the bell)
//   bits 3-8   owner: local rank filling or finished filling the slot; kNoOwner = none
//   bit  9     hold: the owner's reference, counted as a pin of the owner rank
//   bits 10-31 version: +1 by every change of state or owner (22 bits, wraps)
//
// The hold is the reference get() gives the rank that wins a missing key: it
// is set in the same store that installs the key (so a miss pays no pin),
// kept by Ready, dropped by that rank's release(). Nothing evicts a held
// slot. A reference moves from the hold to the owner's pin row (Failed and
// Corrupt turn it into a pin first: a Failed slot changes owner when taken
// over), never back. Invariants the transitions keep (and assert):
//   - only an Idle word with an owner, or a Ready one, carries the hold;
//   - a hold always names an owner.
//
// ---- transitions ---------------------------------------------------------------
// Every writer is one of: the claimer (holds SlotMeta.claim, hence no pins,
// no hold and no sleepers: it may store plainly); a rank holding a
// reference (pin or hold) on the slot, by CAS; or the reaper (the recovery
// lock, for dead ranks; leave() for itself) by CAS. `me` is the writer's
// local rank. "wake" = futex_wake all and ring the bell (layout.h) when the
// old word had the waiters bit; every CAS below clears that bit.
//
//  id   from                 to                    who, where                                  order
//  T0   (fresh region)       Idle, no owner, v0    the creator (BufferCtrl::create)             plain; [R0] magic
//  T1   any, no hold         Idle(o), hold if o    the claimer under the bucket lock, re-key:   plain store; [R1]
//                            (o = me: a miss;      install_claimed_slot (clock.cpp): get()'s
//                            o = none: prealloc)   miss, prealloc()
//  T2   Idle(me)             Ready(me), hold kept  the owner: mark_ready(_for_write)            CAS [R2]
//  T3   Idle(me)             Failed(me), no hold   the owner: mark_failed; the hold first      CAS [R2][R3]
//                                                  becomes a pin of me (add 1 to my row)
//  T4   Idle(me)             Corrupt(me), no hold  the owner: mark_corrupt; as T3              CAS [R2][R3]
//  T5   Failed(any), or      Idle(me), no hold     a pinned waiter takes it over: get()'s      CAS [A2][R5]
//       Idle(none), or                             attach_found, try_take_over(); one of the
//       Corrupt (to dump)                          racers wins (all CAS the value they saw)
//  T6   Ready(o), hold       Ready(o), no hold     o's release(); the reaper for a dead o      CAS [R4]
//                            (version kept)        (drop_rank_refs, pins.h)
//  T7   Idle(o)              Failed(none),         o's last reference without a mark           CAS [R2]
//       (hold or not)        no hold               (release_one: "released without marking");
//                                                  the reaper for a dead o (drop_rank_refs)
//  T8   Idle(me)             Failed(me), no hold   the owner at its load's deadline            CAS [R2][R3]
//                                                  (abandon_load), under the bucket lock, after
//                                                  unlinking the slot and clearing its key
//  T9   any, no waiters bit  same, waiters bit     a pinned sleeper (wait_for_change,          CAS, relaxed:
//                                                  wait_any), then futex-waits on that value   [W]
//  T10  any                  Idle, no owner        the reaper, on a slot a dead claimer left   plain store; [R1]
//                                                  floating (reset_floating_slot, recovery.cpp)
//
// ---- pairs (each label appears at both ends in the code) ---------------------
//  [R0] pairs with [A0]: the creator's magic (release) / attach's acquire of
//       it: a peer sees every word at T0.
//  [R1] pairs with [A1]: T1 and T10 store the word relaxed under the claim;
//       chain_push (release) and unclaim_slot (release) publish it with the
//       key. A chain walker's acquire of head/next, and pin_slot's seq_cst
//       read of the claim, are [A1]: after them the key and word are the new
//       residency's (the pinner then re-checks the key).
//  [R2] pairs with [A2]: the owner's CAS out of Idle (T2, T3, T4, T7, T8;
//       release) / every acquire load that decides on the state: attach_found,
//       wait_for_change, wait_any (seq_cst), exists, being_served, claim_write,
//       and the queue's reads through CacheBuffer::word(). A reader that sees
//       Ready sees the slot's bytes and its stored word (layout.h [S1]); one
//       that sees Failed from T8 sees the key already cleared (it re-checks
//       holds_key and takes over the key, never the slot). T5's CAS is
//       acq_rel: it acquires the previous owner's writes.
//  [R3] pairs with [A3]: the hold -> pin hand-over. T3, T4 and T8 add one to
//       the owner's pin row (relaxed) before their release CAS; a reader of
//       the word with acquire (release_one) or seq_cst (claim_slot's
//       slot_pinned, which reads the hold before the rows) that finds the
//       hold gone sees the pin that replaced it.
//  [R4] pairs with [A4]: T6 (release) / an evictor's seq_cst read of the hold
//       in claim_slot: the holder's use of the bytes happens-before the
//       evictor re-keys the slot. (Pins: unpin_slot's release fetch_sub pairs
//       with the same read of the rows.)
//  [R5] pairs with [A2]: T5 releases the takeover to the next reader.
//  [W]  the waiters bit needs no pair: T9 and every changer are RMWs of the
//       one word (or stores under a claim, which excludes sleepers), so a
//       changer that follows T9 in the word's modification order sees the bit
//       and wakes; a sleeper waits on exactly the value it set, so a change
//       between its read and its sleep returns at once. The bell's own pairs
//       are in layout.h (completion doorbell).
//
// Reads that decide nothing (sweep_candidate's relaxed hold check, pin_count,
// statistics) are hints; each is confirmed by one of the reads above.
#pragma once

#include <cstdint>

#include "common/debug_assert.h"

namespace ucm {

enum class State : uint32_t { kIdle = 0, kReady = 1, kFailed = 2, kCorrupt = 3 };

constexpr uint32_t kWordStateMask = 0x3u;
constexpr uint32_t kWordWaiters = 0x4u;
constexpr uint32_t kWordOwnerShift = 3;
constexpr uint32_t kWordOwnerMask = 0x3fu << kWordOwnerShift;
constexpr uint32_t kNoOwner = 0x3fu;
constexpr uint32_t kWordHold = 0x200u;
constexpr uint32_t kWordVersionShift = 10;

// ---- decoding -----------------------------------------------------------------
inline State word_state(uint32_t w) { return static_cast<State>(w & kWordStateMask); }
inline uint32_t word_owner(uint32_t w) { return (w & kWordOwnerMask) >> kWordOwnerShift; }
inline uint32_t word_version(uint32_t w) { return w >> kWordVersionShift; }
inline bool word_held(uint32_t w) { return (w & kWordHold) != 0; }
inline bool word_has_waiters(uint32_t w) { return (w & kWordWaiters) != 0; }
// Two words differ in substance (not just in the waiters bit).
inline bool word_changed(uint32_t a, uint32_t b) { return ((a ^ b) & ~kWordWaiters) != 0; }

inline const char* state_name(State s) {
  switch (s) {
    case State::kIdle: return "Idle";
    case State::kReady: return "Ready";
    case State::kFailed: return "Failed";
    case State::kCorrupt: return "Corrupt";
  }
  return "?";
}

// A word as seen, in the terms callers outside ctrl/ and cache/ decide on.
class SlotView {
 public:
  explicit SlotView(uint32_t w) : w_(w) {}
  uint32_t raw() const { return w_; }
  State state() const { return word_state(w_); }
  uint32_t owner() const { return word_owner(w_); }
  bool is_ready() const { return state() == State::kReady; }
  bool is_failed() const { return state() == State::kFailed; }
  bool is_corrupt() const { return state() == State::kCorrupt; }
  // Idle with nobody loading it (preallocated or recovered): anyone may take it over.
  bool is_unowned() const { return state() == State::kIdle && owner() == kNoOwner; }
  // Idle with an owner: a load is in flight.
  bool is_loading() const { return state() == State::kIdle && owner() != kNoOwner; }
  bool changed_from(uint32_t seen) const { return word_changed(w_, seen); }

 private:
  uint32_t w_;
};

// ---- encoding -----------------------------------------------------------------
// The next word after `w`: new state and owner, version + 1, waiters bit and
// hold clear. The raw step the transitions below are made of; code outside
// this header uses the transitions (tests use it to forge words).
inline uint32_t word_next(uint32_t w, State s, uint32_t owner) {
  return ((word_version(w) + 1) << kWordVersionShift) | (owner << kWordOwnerShift) | static_cast<uint32_t>(s);
}

// ---- transitions (table above): old word -> new word, asserted ---------------
// Each is pure; the caller makes it with the store or CAS the table names
// and wakes if the old word had the waiters bit. Each asserts what the old
// word must be; the callers check the same first where the word comes from
// another rank (a CAS loop re-reads it), so a failed assert is a bug here.
#define UCM_SLOT_WORD_ASSERT(ok, t, w, nw)                                                                    \
  UCM_DEBUG_ASSERT(ok, "slot word transition %s: 0x%08x (%s, owner %u%s) -> 0x%08x (%s, owner %u%s)", t, w, \
                   state_name(word_state(w)), word_owner(w), word_held(w) ? ", hold" : "", nw,               \
                   state_name(word_state(nw)), word_owner(nw), word_held(nw) ? ", hold" : "")

// T0: a fresh slot.
constexpr uint32_t word_initial() { return kNoOwner << kWordOwnerShift; }

// T1: the claimer re-keys: Idle, owned by `owner` (with its hold) or by nobody.
inline uint32_t word_install(uint32_t w, State s, uint32_t owner, bool hold) {
  const uint32_t nw = word_next(w, s, owner) | (hold ? kWordHold : 0u);
  UCM_SLOT_WORD_ASSERT(s == State::kIdle && !word_held(w) && (!hold || owner != kNoOwner), "T1 install", w, nw);
  return nw;
}

// T2, T3, T4: the owner ends its load. Ready keeps the hold; Failed and
// Corrupt drop it (the caller moved it to its pin row first, [R3]).
inline uint32_t word_finish(uint32_t w, State s, uint32_t me) {
  uint32_t nw = word_next(w, s, me);
  if (s == State::kReady && word_held(w)) nw |= kWordHold;
  UCM_SLOT_WORD_ASSERT(s != State::kIdle && word_state(w) == State::kIdle && word_owner(w) == me && me != kNoOwner,
                       s == State::kReady ? "T2 finish Ready" : s == State::kFailed ? "T3 finish Failed" : "T4 finish Corrupt",
                       w, nw);
  return nw;
}

// T5: a pinned waiter becomes the owner.
inline uint32_t word_take_over(uint32_t w, uint32_t me, bool replace_corrupt) {
  const uint32_t nw = word_next(w, State::kIdle, me);
  const State s = word_state(w);
  UCM_SLOT_WORD_ASSERT(me != kNoOwner && !word_held(w) &&
                           (s == State::kFailed || (s == State::kIdle && word_owner(w) == kNoOwner) ||
                            (s == State::kCorrupt && replace_corrupt)),
                       "T5 take over", w, nw);
  return nw;
}

// T6: the owner's hold on a finished (so Ready) slot goes: its release, or the reaper's.
inline uint32_t word_drop_hold(uint32_t w) {
  const uint32_t nw = w & ~(kWordHold | kWordWaiters);
  UCM_SLOT_WORD_ASSERT(word_held(w) && word_state(w) != State::kIdle && word_owner(w) != kNoOwner, "T6 drop hold",
                       w, nw);
  return nw;
}

// T7: a load nobody will finish (its owner's last reference went, or its
// owner died): Failed, owned by nobody, so a waiter takes it over.
inline uint32_t word_abandon(uint32_t w) {
  const uint32_t nw = word_next(w, State::kFailed, kNoOwner);
  UCM_SLOT_WORD_ASSERT(word_state(w) == State::kIdle && word_owner(w) != kNoOwner, "T7 abandon", w, nw);
  return nw;
}

// T8: the owner gives up its load at the deadline; the slot is already
// unlinked and keyless, and the hold already a pin ([R3]).
inline uint32_t word_abandon_keyless(uint32_t w, uint32_t me) {
  const uint32_t nw = word_next(w, State::kFailed, me);
  UCM_SLOT_WORD_ASSERT(word_state(w) == State::kIdle && word_owner(w) == me && me != kNoOwner, "T8 abandon keyless",
                       w, nw);
  return nw;
}

// T9: a sleeper flags itself.
inline uint32_t word_with_waiters(uint32_t w) {
  const uint32_t nw = w | kWordWaiters;
  UCM_SLOT_WORD_ASSERT(!word_has_waiters(w), "T9 waiters", w, nw);
  return nw;
}

// T10: the reaper empties a slot a dead claimer left floating (any word: the
// claimer may have died in the middle of T1, its hold included).
inline uint32_t word_reset(uint32_t w) { return word_next(w, State::kIdle, kNoOwner); }

}  // namespace ucm
