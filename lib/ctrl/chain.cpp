#include "ctrl/chain.h"

#include "common/log.h"
#include "ctrl/pins.h"

namespace ucm {

Result chain_bad_index(const BufferCtrl& c, uint32_t b, uint32_t pos, uint32_t bad) {
  return fail(Result::kCorrupt, "bucket %u's chain: slot index %u at position %u >= %u slots", b, bad, pos,
              c.total_slots());
}

Result chain_too_long(const BufferCtrl& c, uint32_t b) {
  return fail(Result::kCorrupt, "bucket %u's chain: more than %u links with its lock held (a cycle)", b,
              c.total_slots());
}

namespace {

thread_local ChainStats t_chain_stats;

// Visits bucket b's chain under its lock: fn(slot, predecessor) returns true
// to stop. Every index is checked before use, and the walk ends after
// total_slots links.
template <class Fn>
Result walk_locked(const BufferCtrl& c, uint32_t b, Fn&& fn) {
  const uint32_t total = c.total_slots();
  uint32_t prev = kNoSlot;
  uint32_t i = c.bucket(b).head.load(std::memory_order_acquire);
  uint32_t pos = 0;
  Result r = Result::kOk;
  for (; i != kNoSlot; ++pos) {
    if (i >= total) {
      r = chain_bad_index(c, b, pos, i);
      break;
    }
    if (pos >= total) {
      r = chain_too_long(c, b);
      break;
    }
    if (fn(i, prev)) {
      ++pos;
      break;
    }
    prev = i;
    i = c.slot(i).next.load(std::memory_order_acquire);
  }
  ++t_chain_stats.locked_walks;
  t_chain_stats.links += pos;
  return r;
}

}  // namespace

ChainStats chain_stats() { return t_chain_stats; }
void reset_chain_stats() { t_chain_stats = ChainStats{}; }

Result chain_find_locked(const BufferCtrl& c, uint32_t b, const Key& k, uint32_t* slot) {
  *slot = kNoSlot;
  return walk_locked(c, b, [&](uint32_t i, uint32_t) {
    if (!slot_has_key(c, i, k)) return false;
    *slot = i;
    return true;
  });
}

Result chain_contains(const BufferCtrl& c, uint32_t b, uint32_t slot, bool* found) {
  *found = false;
  return walk_locked(c, b, [&](uint32_t i, uint32_t) { return *found = i == slot; });
}

void chain_push(const BufferCtrl& c, uint32_t b, uint32_t slot) {
  Bucket& bk = c.bucket(b);
  c.slot(slot).next.store(bk.head.load(std::memory_order_relaxed), std::memory_order_relaxed);
  bk.head.store(slot, std::memory_order_release);
}

Result chain_unlink(const BufferCtrl& c, uint32_t b, uint32_t slot, bool* found) {
  *found = false;
  // Locals, written at the hit only: through *found (which may alias the
  // chain) the walk stored at every link.
  uint32_t prev = kNoSlot;
  bool hit = false;
  UCM_CHECK(walk_locked(c, b, [&](uint32_t i, uint32_t p) {
    if (i != slot) return false;
    prev = p;
    return hit = true;
  }));
  if (!hit) return Result::kOk;
  // The link after the slot is checked too: unlinking would splice it in.
  const uint32_t total = c.total_slots();
  const uint32_t after = c.slot(slot).next.load(std::memory_order_relaxed);
  if (after != kNoSlot && after >= total)
    return fail(Result::kCorrupt, "bucket %u's chain: slot %u links to slot index %u >= %u slots", b, slot, after,
                total);
  *found = true;
  if (prev == kNoSlot) c.bucket(b).head.store(after, std::memory_order_release);
  else c.slot(prev).next.store(after, std::memory_order_release);
  return Result::kOk;
}

void install_claimed_slot(const BufferCtrl& c, uint32_t slot, uint32_t b, const Key& k, State s, uint32_t owner,
                          bool accessed, bool hold) {
  SlotMeta& m = c.slot(slot);
  // A claimed slot has no pins and no hold (claim_slot read both), hence no
  // sleepers: no wake is needed here.
  uint32_t w = m.word.load(std::memory_order_relaxed);
  m.word.store(word_install(w, s, owner, hold), std::memory_order_relaxed);  // T1 (slot_word.h)
  m.key_lo.store(k.block.lo, std::memory_order_relaxed);
  m.key_hi.store(k.block.hi, std::memory_order_relaxed);
  m.shard.store(k.shard, std::memory_order_relaxed);
  c.accessed(slot).store(accessed ? 1 : 0, std::memory_order_relaxed);
  c.guard(slot).store(0, std::memory_order_relaxed);  // a new residency: unarmed, untaken (protect.h)
  chain_push(c, b, slot);  // [R1] release: publishes the key and word to chain walkers
  unclaim_slot(c, slot);   // [R1] release: publishes them to pinners
}

}  // namespace ucm
