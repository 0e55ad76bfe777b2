// Bucket chains: a bucket's slots linked through SlotMeta.next, and the one
// step that puts a claimed floating slot on one (install_claimed_slot).
//
// A bucket's chain is edited only by the holder of that bucket's lock, and
// each edit is one release store (push: slot.next = head, then head = slot;
// unlink: predecessor's link = slot.next). A process killed at any
// instruction leaves every chain well-formed; lock-free readers may wander
// off a slot that was just moved to another chain, so they bound their walk
// and re-check keys.
//
// Every walk is bounded by total_slots links and checks each index before it
// uses it: a bad index or a cycle is kCorrupt naming the bucket, never a
// fault or a hang. With bucket_count = next_pow2(slots) a chain holds about
// one slot, so a locked walk costs what the chain holds, not the cache.
//
// Victim selection (CLOCK, the ring) is clock.h; it detaches victims from
// their chains with chain_unlink.
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

// Per thread, for tests and benchmarks: walks made under a bucket lock
// (find, contains, unlink) and the links they visited. One add per walk, not
// per link; the lock-free walk (the hit path) is not counted.
struct ChainStats {
  uint64_t locked_walks = 0;
  uint64_t links = 0;
};
ChainStats chain_stats();
void reset_chain_stats();

}  // namespace ucm
