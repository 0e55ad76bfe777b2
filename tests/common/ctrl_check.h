// Invariant checks over a shared control plane, for tests.
//
// check_quiescent() walks every bucket chain and every slot of a cache nobody
// is using at the moment (all ranks parked at a barrier, or gone) and reports
// the first broken rule, naming bucket, slot and key:
//   - every bucket lock and the recovery lock are free;
//   - every chain ends within total_slots steps (no cycle), holds only valid
//     slot indexes, and every slot on it is keyed for that bucket;
//   - no slot is on two chains, no key is resident twice;
//   - a keyed slot is on its bucket's chain, an empty slot on none;
//   - no claims; no pins (unless allowed); no load in flight (Idle with an
//     owner) unless allowed; every rank record is free or names a live process;
//   - with a data plane and a content function, every Ready slot holds
//     exactly its key's bytes.
//
// ready_copy_elsewhere() is the one check that runs while others work: it
// looks for a slot other than `except` that holds k, Ready, and is not being
// re-keyed (claim 0, word unchanged across the key read). An owner calls it
// right after being chosen: a key that has a Ready copy must never get a
// second loader. It cannot report a slot that an evictor has detached: that
// slot is claimed until its new key and word are written.
#pragma once

#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/key.h"
#include "ctrl/buffer_ctrl.h"
#include "ctrl/chain.h"
#include "ctrl/pins.h"
#include "data/buffer_data.h"
#include "sync/shared_lock.h"

namespace ucm::test {

struct QuiescentOptions {
  bool allow_pins = false;
  bool allow_loads_in_flight = false;
  // Returns -1 if the bytes are k's, else the first bad 8-byte word.
  int64_t (*check_bytes)(const void* bytes, uint64_t n, const Key& k) = nullptr;
};

struct QuiescentStats {
  uint32_t resident = 0;  // keyed slots on chains
  uint32_t ready = 0;
  uint32_t failed = 0;     // Failed or Corrupt
  uint32_t idle = 0;       // keyed, Idle (preallocated or abandoned-and-recovered)
  uint32_t empty = 0;      // no key
  uint32_t max_chain = 0;
};

inline std::string key_str(const Key& k) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "(%016" PRIx64 ":%016" PRIx64 ", shard %u)", k.block.hi, k.block.lo, k.shard);
  return buf;
}

// Returns "" when every invariant holds, else a description of the first broken one.
inline std::string check_quiescent(const BufferCtrl& c, const BufferData* data, const QuiescentOptions& o,
                                   QuiescentStats* stats = nullptr) {
  char buf[512];
  QuiescentStats st;
  const uint32_t total = c.total_slots();
  if (uint64_t h = c.globals().recovery_lock.load(); h != 0) {
    std::snprintf(buf, sizeof(buf), "the recovery lock is held (word 0x%" PRIx64 ")", h);
    return buf;
  }
  std::vector<int64_t> on_bucket(total, -1);
  std::map<std::tuple<uint64_t, uint64_t, uint32_t>, uint32_t> where;
  for (uint32_t b = 0; b < c.bucket_count(); ++b) {
    if (uint32_t w = c.bucket(b).lock.load(); w != 0) {
      std::snprintf(buf, sizeof(buf), "bucket %u's lock is held (word 0x%x, holder %u)", b, w, lock_holder(w));
      return buf;
    }
    uint32_t steps = 0;
    for (uint32_t i = c.bucket(b).head.load(); i != kNoSlot; i = c.slot(i).next.load()) {
      if (i >= total) {
        std::snprintf(buf, sizeof(buf), "bucket %u's chain holds slot index %u >= %u slots", b, i, total);
        return buf;
      }
      if (++steps > total) {
        std::snprintf(buf, sizeof(buf), "bucket %u's chain has a cycle (more than %u steps)", b, total);
        return buf;
      }
      if (on_bucket[i] >= 0) {
        std::snprintf(buf, sizeof(buf), "slot %u is on bucket %" PRId64 "'s chain and on bucket %u's", i, on_bucket[i],
                      b);
        return buf;
      }
      on_bucket[i] = b;
      const Key k = slot_key(c, i);
      if (k.shard == kEmptyShard) {
        std::snprintf(buf, sizeof(buf), "slot %u on bucket %u's chain holds no key", i, b);
        return buf;
      }
      if (bucket_of(k, c.bucket_mask()) != b) {
        std::snprintf(buf, sizeof(buf), "slot %u with key %s is on bucket %u's chain, its key hashes to bucket %u", i,
                      key_str(k).c_str(), b, bucket_of(k, c.bucket_mask()));
        return buf;
      }
      const auto id = std::make_tuple(k.block.lo, k.block.hi, k.shard);
      if (auto it = where.find(id); it != where.end()) {
        std::snprintf(buf, sizeof(buf), "key %s is resident twice: slots %u and %u", key_str(k).c_str(), it->second, i);
        return buf;
      }
      where.emplace(id, i);
    }
    st.max_chain = std::max(st.max_chain, steps);
  }
  for (uint32_t i = 0; i < total; ++i) {
    const SlotMeta& s = c.slot(i);
    if (uint32_t cl = s.claim.load(); cl != 0) {
      std::snprintf(buf, sizeof(buf), "slot %u is still claimed by holder %u", i, cl);
      return buf;
    }
    for (uint32_t r = 0; r < c.max_ranks(); ++r) {
      const uint32_t p = c.pin(r, i).load();
      if (p != 0 && (!o.allow_pins || !c.rank_alive(r))) {
        std::snprintf(buf, sizeof(buf), "slot %u holds %u pin(s) of rank %u%s", i, p, r,
                      c.rank_alive(r) ? "" : " (which is not a live rank)");
        return buf;
      }
    }
    const Key k = slot_key(c, i);
    const uint32_t w = s.word.load();
    if ((w & kWordHold) && (!o.allow_pins || word_owner(w) == kNoOwner || !c.rank_alive(word_owner(w)))) {
      std::snprintf(buf, sizeof(buf), "slot %u still carries the hold of owner %u%s", i, word_owner(w),
                    word_owner(w) != kNoOwner && c.rank_alive(word_owner(w)) ? "" : " (which is not a live rank)");
      return buf;
    }
    if (k.shard == kEmptyShard) {
      ++st.empty;
      if (on_bucket[i] >= 0) {
        std::snprintf(buf, sizeof(buf), "empty slot %u is on bucket %" PRId64 "'s chain", i, on_bucket[i]);
        return buf;
      }
      continue;
    }
    if (on_bucket[i] < 0) {
      std::snprintf(buf, sizeof(buf), "slot %u holds key %s but is on no chain", i, key_str(k).c_str());
      return buf;
    }
    ++st.resident;
    switch (word_state(w)) {
      case State::kReady: {
        ++st.ready;
        if (data && o.check_bytes) {
          const int64_t bad = o.check_bytes(data->at(i), c.slot_bytes(), k);
          if (bad >= 0) {
            std::snprintf(buf, sizeof(buf), "Ready slot %u does not hold key %s's bytes (word %" PRId64 " differs)", i,
                          key_str(k).c_str(), bad);
            return buf;
          }
        }
        break;
      }
      case State::kFailed:
      case State::kCorrupt: ++st.failed; break;
      case State::kIdle:
        ++st.idle;
        if (word_owner(w) != kNoOwner && !o.allow_loads_in_flight) {
          std::snprintf(buf, sizeof(buf), "slot %u (key %s) is Idle with owner rank %u: a load in flight", i,
                        key_str(k).c_str(), word_owner(w));
          return buf;
        }
        break;
      default:
        std::snprintf(buf, sizeof(buf), "slot %u has an invalid state in word 0x%x", i, w);
        return buf;
    }
  }
  for (uint32_t r = 0; r < c.max_ranks(); ++r) {
    const uint32_t rs = c.rank(r).state.load();
    if (rs == static_cast<uint32_t>(RankState::kFree)) continue;
    if (rs != static_cast<uint32_t>(RankState::kAlive) || !c.rank_alive(r)) {
      std::snprintf(buf, sizeof(buf), "rank %u's record is in state %u with pid %d, which is %s", r, rs,
                    c.rank(r).pid.load(), c.rank_alive(r) ? "alive" : "dead");
      return buf;
    }
  }
  if (stats) *stats = st;
  return "";
}

// A slot other than `except` holding k, Ready, and not being re-keyed. Safe to
// call while other processes work (see above); kNoSlot if there is none.
inline uint32_t ready_copy_elsewhere(const BufferCtrl& c, const Key& k, uint32_t except) {
  for (uint32_t j = 0; j < c.total_slots(); ++j) {
    if (j == except) continue;
    const SlotMeta& s = c.slot(j);
    if (s.claim.load(std::memory_order_seq_cst) != 0) continue;
    const uint32_t w1 = s.word.load(std::memory_order_seq_cst);
    if (word_state(w1) != State::kReady) continue;
    if (!slot_has_key(c, j, k)) continue;
    const uint32_t w2 = s.word.load(std::memory_order_seq_cst);
    if (word_changed(w1, w2) || s.claim.load(std::memory_order_seq_cst) != 0) continue;
    // Re-keying writes the word before the key and holds the claim until both
    // are written; a claim that came and went in between changed the word.
    return j;
  }
  return kNoSlot;
}

}  // namespace ucm::test
