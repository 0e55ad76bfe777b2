#include "ctrl/clock.h"

#include <algorithm>

#include "common/log.h"
#include "ctrl/chain.h"
#include "ctrl/pins.h"
#include "ctrl/protect.h"
#include "sync/futex.h"
#include "sync/shared_lock.h"

namespace ucm {

namespace {

// The candidate test (sweep_candidate is its out-of-line name), inlined into
// the sweep's loop: a call per position cost a miss about 30 instructions.
[[gnu::always_inline]] inline Candidate candidate_at(const BufferCtrl& c, uint32_t i, SweepPhase phase) {
  if (phase != SweepPhase::kAny) {
    std::atomic<uint8_t>& a = c.accessed(i);
    if (const uint8_t bit = a.load(std::memory_order_relaxed); bit != 0) {
      if (bit == kAccessedUnstored) return Candidate::kSkip;
      if (phase == SweepPhase::kSecondChance) {
        a.store(0, std::memory_order_relaxed);
        return Candidate::kSkip;
      }
    }
  }
  // Claimed or held: skip without a CAS. Pins are read once, after the
  // claim (claim_slot): reading every rank's row before it as well cost a
  // miss about 6% (perf, ratio to the v1 model), and a CLOCK candidate with
  // its bit clear is rarely pinned.
  if (c.slot(i).claim.load(std::memory_order_relaxed) != 0 || slot_held(c, i)) return Candidate::kSkip;
  return Candidate::kTry;
}

}  // namespace

Candidate sweep_candidate(const BufferCtrl& c, uint32_t i, SweepPhase phase) { return candidate_at(c, i, phase); }

namespace {

// Detaches claimed slot i from the chain it is on (*done). If its bucket is
// busy, or its chain corrupt (kCorrupt), the claim is dropped.
Result detach_claimed(const BufferCtrl& c, uint32_t i, uint32_t holder, uint32_t locked_bucket, bool* evicted,
                      bool* done) {
  SlotMeta& s = c.slot(i);
  *done = false;
  if (s.shard.load(std::memory_order_relaxed) == kEmptyShard) {
    *evicted = false;
    *done = true;
    return Result::kOk;
  }
  const uint32_t ob = bucket_of(slot_key(c, i), c.bucket_mask());
  if (ob != locked_bucket && !shared_try_lock(&c.bucket(ob).lock, holder)) {
    unclaim_slot(c, i);
    return Result::kOk;
  }
  bool found = false;
  const Result r = chain_unlink(c, ob, i, &found);
  if (ob != locked_bucket) shared_unlock(&c.bucket(ob).lock);
  if (r != Result::kOk) {
    unclaim_slot(c, i);
    return r;
  }
  *evicted = true;
  *done = true;
  return Result::kOk;
}

// The hand is taken in runs: one fetch_add claims `run` consecutive positions
// for the calling thread, which then visits them in order. With one evicting
// thread the victims come in exactly the order of a hand advanced one slot at
// a time; with several, each sweeps its own run of accessed bytes, pin rows
// and slot meta instead of all of them writing the shared hand (and each
// other's lines) at every step. A run a thread never finishes (it exits, or
// stops evicting) only means those slots are skipped on this lap. Runs are
// short when the pool is small, so that ranks still interleave: a pool of
// fewer than 8 slots per rank keeps the one-slot hand. The legacy ring keeps
// it always: with no accessed bits, a run left unfinished would later evict
// whatever was loaded since, not the oldest slot.
struct HandRun {
  const std::atomic<uint64_t>* hand = nullptr;
  uint64_t epoch = 0;     // BufferCtrl epoch the run was taken in (a run never outlives its region)
  uint32_t pos = 0;       // next position in [0, n)
  uint32_t left = 0;      // positions still to visit
  uint32_t len = 1;       // run_length() of this hand in this region (check_run)
};
thread_local HandRun t_runs[2];

uint32_t run_length(const BufferCtrl& c, uint32_t n, bool second_chance) {
  if (!second_chance) return 1;
  const uint32_t per_rank = n / (8 * c.max_ranks());
  return per_rank < 1 ? 1 : per_rank > 64 ? 64 : per_rank;
}

// Drops a run taken on another hand, or in a region mapped before the last
// map or unmap of this process. Once per call: the region of the hand cannot
// go away under a sweep of it, so a run valid at the start stays valid.
// Its run length is worked out then too (a division), not at every call.
inline void check_run(HandRun& run, const BufferCtrl& c, const std::atomic<uint64_t>& hand, uint32_t n,
                      bool second_chance) {
  const uint64_t epoch = ctrl_epoch();
  if (run.hand == &hand && run.epoch == epoch) return;
  run.hand = &hand;
  run.epoch = epoch;
  run.left = 0;
  run.len = run_length(c, n, second_chance);
}

// The next position of the hand for this thread, in [0, n) (check_run() first).
inline uint32_t next_position(HandRun& run, std::atomic<uint64_t>& hand, uint32_t n) {
  if (run.left == 0) {
    run.pos = static_cast<uint32_t>(hand.fetch_add(run.len, std::memory_order_relaxed) % n);
    run.left = run.len;
  }
  const uint32_t p = run.pos;
  run.pos = p + 1 == n ? 0 : p + 1;
  --run.left;
  return p;
}

thread_local SweepStats t_sweep_stats;

// A reserved position the sweep skipped: held by a load (its owner's hold),
// pinned (copies, waiters, an I/O) or claimed is work in flight, which ends on
// its own. Not a slot without a key: an abandoned load's stays pinned until
// its store completes it, which may be never.
void note_in_flight(const BufferCtrl& c, uint32_t i, SweepState* st) {
  if (c.slot(i).shard.load(std::memory_order_relaxed) == kEmptyShard) return;
  if (c.slot(i).claim.load(std::memory_order_relaxed) != 0 || slot_held(c, i) || slot_pinned(c, i)) ++st->in_flight;
}

void start_sweep(SweepState* st, uint32_t n, bool second_chance) {
  if (st->started) return;
  st->started = true;
  if (second_chance) {
    st->chance_left = n < kSweepSecondChance ? n : kSweepSecondChance;
    st->stored_left = n;
    st->any_left = n;
  } else {
    st->any_left = 2ull * n;  // the ring: two laps of the raw cursor
  }
}

// What the sweep did with a candidate that passed the candidate test.
enum class Tried : uint8_t { kNext, kTaken, kFailed };

// Claims candidate i, keeps it when protected or a kept hint, else detaches
// it (*res: kCorrupt from its chain).
Tried try_victim(const BufferCtrl& c, uint32_t i, uint32_t holder, uint32_t locked_bucket, bool* evicted,
                 SweepState* st, ProtectView* protect, Result* res) {
  if (!claim_slot(c, holder, i)) {  // claimed or pinned
    if (st->reserved) note_in_flight(c, i, st);
    return Tried::kNext;
  }
  // A peer has yet to copy it, or a prealloc nobody has used yet (protect.h).
  if (slot_protected(c, i, protect) || (st->reserved && hint_kept(c, i, protect))) {
    unclaim_slot(c, i);
    return Tried::kNext;
  }
  bool done = false;
  *res = detach_claimed(c, i, holder, locked_bucket, evicted, &done);
  if (*res != Result::kOk) return Tried::kFailed;
  return done ? Tried::kTaken : Tried::kNext;
}

Result clock_sweep(const BufferCtrl& c, std::atomic<uint64_t>& hand, HandRun& run, uint32_t first, uint32_t n,
                   bool second_chance, uint32_t holder, uint32_t locked_bucket, bool* evicted, uint32_t* out,
                   SweepState* st) {
  *out = kNoSlot;
  start_sweep(st, n, second_chance);
  check_run(run, c, hand, n, second_chance);
  uint32_t examined = 0;
  Result res = Result::kOk;
  bool stop = false;
  ProtectView protect = protect_view(c, holder, st->have_task, st->task, st->wait_self, st->relax);
  // Phases (clock.h): second chance; any stored slot; anything. The last is
  // reached only when every slot is pinned or holds bytes the store lacks.
  // Each pass of the outer loop runs one phase for as many positions as it
  // has left within this call's budget.
  while (!stop && examined < kSweepPerCall && !st->done()) {
    uint64_t* left = st->chance_left ? &st->chance_left : st->stored_left ? &st->stored_left : &st->any_left;
    const SweepPhase phase = left == &st->chance_left ? SweepPhase::kSecondChance
                             : left == &st->stored_left ? SweepPhase::kStored
                                                        : SweepPhase::kAny;
    const uint32_t m = static_cast<uint32_t>(std::min<uint64_t>(*left, kSweepPerCall - examined));
    uint32_t k = 0;
    while (k < m) {
      ++k;
      const uint32_t i = first + next_position(run, hand, n);
      if (candidate_at(c, i, phase) == Candidate::kSkip) {
        if (st->reserved) note_in_flight(c, i, st);
        continue;
      }
      const Tried t = try_victim(c, i, holder, locked_bucket, evicted, st, &protect, &res);
      if (t == Tried::kNext) continue;
      if (t == Tried::kTaken) *out = i;
      stop = true;
      break;
    }
    *left -= k;
    examined += k;
  }
  st->examined += examined;
  ++t_sweep_stats.calls;
  t_sweep_stats.positions += examined;
  if (examined > t_sweep_stats.max_per_call) t_sweep_stats.max_per_call = examined;
  return res;
}

uint32_t take_unused(const BufferCtrl& c, std::atomic<uint32_t>& next, uint32_t first, uint32_t n, uint32_t holder) {
  uint32_t u = next.load(std::memory_order_relaxed);
  while (u < n) {
    if (next.compare_exchange_weak(u, u + 1, std::memory_order_relaxed)) {
      // Between our bump and our claim, a sweep that found the counter used up
      // may have taken this slot as a victim, keyed it and released it: then
      // it is no longer ours to take. Only a claimed slot with no key is.
      if (claim_slot(c, holder, first + u)) {
        if (c.slot(first + u).shard.load(std::memory_order_relaxed) == kEmptyShard) return first + u;
        unclaim_slot(c, first + u);
      }
      u = next.load(std::memory_order_relaxed);
    }
  }
  return kNoSlot;
}

}  // namespace

uint32_t take_unused_regular_slow(const BufferCtrl& c, uint32_t holder) {
  return take_unused(c, c.globals().unused_regular, 0, c.regular_slots(), holder);
}

SweepStats sweep_stats() { return t_sweep_stats; }
void reset_sweep_stats() { t_sweep_stats = SweepStats{}; }

Result take_regular_victim(const BufferCtrl& c, uint32_t holder, uint32_t locked_bucket, bool* evicted,
                           uint32_t* slot, SweepState* st) {
  return clock_sweep(c, c.globals().clock_hand, t_runs[0], 0, c.regular_slots(), c.evict_mode() == EvictMode::kClock,
                     holder, locked_bucket, evicted, slot, st);
}

Result take_reserved_slot(const BufferCtrl& c, uint32_t holder, uint32_t locked_bucket, bool* evicted,
                          uint32_t* slot, SweepState* st) {
  *slot = kNoSlot;
  const uint32_t first = c.regular_slots();
  const uint32_t n = c.total_slots() - first;
  if (n == 0) return Result::kOk;
  uint32_t i = take_unused(c, c.globals().unused_reserved, first, n, holder);
  if (i != kNoSlot) {
    *evicted = false;
    *slot = i;
    return Result::kOk;
  }
  st->reserved = true;
  return clock_sweep(c, c.globals().reserved_hand, t_runs[1], first, n, true, holder, locked_bucket, evicted, slot, st);
}

}  // namespace ucm
