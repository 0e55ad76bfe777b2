#include "ctrl/recovery.h"

#include "common/log.h"
#include "common/time.h"
#include "ctrl/chain.h"
#include "ctrl/pins.h"
#include "ctrl/space_bell.h"
#include "sync/futex.h"
#include "sync/process_identity.h"

#include <unistd.h>

#include <string>

namespace ucm {
namespace {

// The recovery lock names its holder by process (pid and start time), not by
// rank: a process that reaps the dead predecessor of the very rank it is about
// to join must not look dead itself while the record still names that
// predecessor.
constexpr uint64_t kRecoverySliceNs = 20'000'000;

bool holder_alive_probe(void* ctx, uint32_t holder) {
  const auto* c = static_cast<const BufferCtrl*>(ctx);
  return holder == 0 || c->rank_alive(holder - 1);
}

bool is_dead_holder(uint32_t holder, uint32_t dead_mask) {
  return holder != 0 && holder <= kMaxRanks && (dead_mask >> (holder - 1)) & 1u;
}

// A bucket lock word that names a holder no rank can be (not 1..max_ranks):
// a stray write. Nobody could ever release it.
Result check_lock_word(const BufferCtrl& c, uint32_t b) {
  const uint32_t h = lock_holder(c.bucket(b).lock.load(std::memory_order_relaxed));
  if (h > c.max_ranks())
    return fail(Result::kCorrupt, "bucket %u's lock word names holder id %u > %u ranks", b, h, c.max_ranks());
  return Result::kOk;
}

// Locks b for the reaper by the deadline, stealing it from any dead holder
// (dead now, even if it was alive when the reap started).
Result reaper_lock(const BufferCtrl& c, uint32_t holder, uint32_t b, uint64_t deadline) {
  const LockWaitPolicy pol = lock_policy_for(c, kRecoverySliceNs);
  for (;;) {
    uint32_t dead = 0;
    const Result r = shared_lock(&c.bucket(b).lock, holder, deadline, pol, &dead);
    if (r == Result::kOk) return r;
    if (r != Result::kPeerDead) return r;
    UCM_CHECK(check_lock_word(c, b));
    if (shared_lock_steal(&c.bucket(b).lock, dead, holder)) return Result::kOk;
  }
}

void reset_floating_slot(const BufferCtrl& c, uint32_t i) {
  SlotMeta& s = c.slot(i);
  s.shard.store(kEmptyShard, std::memory_order_relaxed);
  // A CAS, not a load and a store: a waiter may set the waiters bit in
  // between, and would then sleep its whole slice unwoken (helper-20).
  uint32_t w = s.word.load(std::memory_order_relaxed);
  while (!s.word.compare_exchange_weak(w, word_reset(w), std::memory_order_relaxed)) {
  }  // T10 (slot_word.h)
  c.accessed(i).store(0, std::memory_order_relaxed);
  unclaim_slot(c, i);  // [R1]
  if (word_has_waiters(w)) futex_wake(&s.word, kWakeAll);
}

}  // namespace

LockWaitPolicy lock_policy_for(const BufferCtrl& c, uint64_t slice_ns) {
  LockWaitPolicy p;
  p.slice_ns = slice_ns;
  p.holder_alive = &holder_alive_probe;
  p.ctx = const_cast<BufferCtrl*>(&c);
  return p;
}

bool any_rank_dead(const BufferCtrl& c) {
  for (uint32_t r = 0; r < c.max_ranks(); ++r) {
    const uint32_t st = c.rank(r).state.load(std::memory_order_acquire);
    if (st != static_cast<uint32_t>(RankState::kFree) && !c.rank_alive(r)) return true;
  }
  return false;
}

Result lock_bucket(const BufferCtrl& c, uint32_t me, uint32_t b, uint64_t slice_ns, uint64_t deadline) {
  const LockWaitPolicy pol = lock_policy_for(c, slice_ns);
  for (;;) {
    uint32_t dead = 0;
    Result r = shared_lock(&c.bucket(b).lock, holder_id(me), deadline, pol, &dead);
    if (r != Result::kPeerDead) return r;
    UCM_CHECK(check_lock_word(c, b));
    UCM_CHECK(reap_dead_ranks(c, me, nullptr, deadline));
  }
}

Result lock_recovery(const BufferCtrl& c, uint64_t deadline_ns) {
  std::atomic<uint64_t>* word = &c.globals().recovery_lock;
  const ProcessIdentity self = self_identity();
  const uint64_t tag = process_lock_tag(self.pid, self.start_ticks);
  for (;;) {
    uint64_t dead = 0;
    const Result r = process_lock(word, tag, deadline_ns, kRecoverySliceNs, &dead);
    if (r != Result::kPeerDead) return r;
    if (process_lock_steal(word, dead, tag)) {
      UCM_WARN("pid %d died holding the recovery lock: taken over by pid %d", process_lock_pid(dead), self.pid);
      return Result::kOk;
    }
  }
}

void unlock_recovery(const BufferCtrl& c) { process_unlock(&c.globals().recovery_lock); }

int32_t recovery_lock_holder(const BufferCtrl& c) {
  return process_lock_pid(c.globals().recovery_lock.load(std::memory_order_relaxed));
}

namespace {

Result reap_locked(const BufferCtrl& c, uint32_t me, uint32_t* reaped, uint32_t inherited, uint64_t deadline);

}  // namespace

Result join_rank(const BufferCtrl& c, uint32_t r, uint64_t deadline_ns) {
  auto& ctrl = const_cast<BufferCtrl&>(c);
  // Under the recovery lock, no reaper can free the record while we adopt it.
  UCM_CHECK(lock_recovery(c, deadline_ns));
  Result res = ctrl.join(r);
  if (res == Result::kPeerDead) {
    res = ctrl.adopt_dead_record(r);
    if (res == Result::kOk) res = reap_locked(c, r, nullptr, 1u << r, deadline_ns);
    if (res == Result::kOk) ctrl.finish_join(r);
  }
  unlock_recovery(c);
  return res;
}

Result reap_dead_ranks(const BufferCtrl& c, uint32_t me, uint32_t* reaped, uint64_t deadline_ns, uint32_t inherited) {
  if (reaped) *reaped = 0;
  UCM_CHECK(lock_recovery(c, deadline_ns));
  const Result r = reap_locked(c, me, reaped, inherited, deadline_ns);
  unlock_recovery(c);
  return r;
}

namespace {

// 1. The ranks that died, marked kReaping (each named once in the log). The
// records in `inherited` (the caller's own, adopted) count as dead but only
// their leftovers are reaped.
uint32_t mark_dead_ranks(const BufferCtrl& c, uint32_t inherited) {
  uint32_t dead_mask = inherited;
  for (uint32_t r = 0; r < c.max_ranks(); ++r) {
    RankRecord& rec = c.rank(r);
    const uint32_t st = rec.state.load(std::memory_order_acquire);
    if ((inherited >> r) & 1u) continue;  // our own record: its leftovers only
    if (st == static_cast<uint32_t>(RankState::kFree) || c.rank_alive(r)) continue;
    dead_mask |= 1u << r;
    rec.state.store(static_cast<uint32_t>(RankState::kReaping), std::memory_order_release);
    UCM_WARN("local rank %u (pid %d) died: releasing its locks, claims, pins, loads and writes", r,
             rec.pid.load(std::memory_order_relaxed));
  }
  return dead_mask;
}

// 2. Bucket locks held by the dead.
void release_dead_bucket_locks(const BufferCtrl& c, uint32_t holder, uint32_t dead_mask) {
  for (uint32_t b = 0; b < c.bucket_count(); ++b) {
    std::atomic<uint32_t>* lk = &c.bucket(b).lock;
    const uint32_t h = lock_holder(lk->load(std::memory_order_relaxed));
    if (is_dead_holder(h, dead_mask) && shared_lock_steal(lk, h, holder)) shared_unlock(lk);
  }
}

// A corrupt chain seen while reaping: the first one's error, the last one's result.
struct ReapCorruption {
  Result result = Result::kOk;
  std::string what;
};

// 3, one slot claimed by the dead: a floating slot is reset; a slot on a
// chain keeps its key and loses the claim. A corrupt chain keeps the dead
// claim (we cannot tell whether the slot is on it) and is noted in `bad`.
Result release_dead_claim(const BufferCtrl& c, uint32_t holder, uint32_t i, uint64_t deadline, ReapCorruption* bad) {
  if (c.slot(i).shard.load(std::memory_order_relaxed) == kEmptyShard) {
    reset_floating_slot(c, i);
    return Result::kOk;
  }
  // Keys change only while a slot floats, so a slot on a chain is on the
  // chain of its own key's bucket: look there, under that lock.
  const uint32_t b = bucket_of(slot_key(c, i), c.bucket_mask());
  UCM_CHECK(reaper_lock(c, holder, b, deadline));
  bool on_chain = false;
  const Result r = chain_contains(c, b, i, &on_chain);
  if (r != Result::kOk) {
    if (bad->result == Result::kOk) bad->what = last_error();
    bad->result = r;
  } else if (on_chain) {
    unclaim_slot(c, i);
  } else {
    reset_floating_slot(c, i);
  }
  shared_unlock(&c.bucket(b).lock);
  return Result::kOk;
}

// 3. Slots: pins, claims, loads in flight. A corrupt chain does not stop the
// rest: the reap ends kCorrupt naming it.
Result release_dead_slots(const BufferCtrl& c, uint32_t holder, uint32_t dead_mask, uint64_t deadline,
                          ReapCorruption* bad) {
  DroppedRefs dropped;
  for (uint32_t i = 0; i < c.total_slots(); ++i) {
    if (is_dead_holder(c.slot(i).claim.load(std::memory_order_acquire), dead_mask))
      UCM_CHECK(release_dead_claim(c, holder, i, deadline, bad));
    drop_rank_refs(c, i, dead_mask, &dropped);
  }
  return Result::kOk;
}

// 4. Records (not the ones the caller adopted).
void free_dead_records(const BufferCtrl& c, uint32_t dead_mask, uint32_t inherited) {
  for (uint32_t r = 0; r < c.max_ranks(); ++r) {
    if (!((dead_mask >> r) & 1u) || ((inherited >> r) & 1u)) continue;
    RankRecord& rec = c.rank(r);
    rec.pid.store(0, std::memory_order_relaxed);
    rec.start_ticks.store(0, std::memory_order_relaxed);
    rec.state.store(static_cast<uint32_t>(RankState::kFree), std::memory_order_release);
  }
}

Result reap_locked(const BufferCtrl& c, uint32_t me, uint32_t* reaped, uint32_t inherited, uint64_t deadline) {
  const uint32_t holder = holder_id(me);
  CtrlGlobals& g = c.globals();
  const uint32_t dead_mask = mark_dead_ranks(c, inherited);
  if (reaped) *reaped = static_cast<uint32_t>(__builtin_popcount(dead_mask));
  if (dead_mask == 0) return Result::kOk;

  // 1b. The dead copy nothing more: no shard waits for them (protect.h), and
  // nobody need wake their dispatchers.
  g.copiers.fetch_and(~dead_mask, std::memory_order_seq_cst);
  g.deferring.fetch_and(~dead_mask, std::memory_order_relaxed);
  g.space_waiting.fetch_and(~dead_mask, std::memory_order_relaxed);

  release_dead_bucket_locks(c, holder, dead_mask);
  ReapCorruption bad;
  UCM_CHECK(release_dead_slots(c, holder, dead_mask, deadline, &bad));
  free_dead_records(c, dead_mask, inherited);
  g.reap_count.fetch_add(1, std::memory_order_relaxed);
  note_space_freed(c);  // the dead's pins, holds and protections are gone (space_bell.h)
  if (me < c.max_ranks()) c.rank(me).counters.reaps.fetch_add(__builtin_popcount(dead_mask), std::memory_order_relaxed);
  if (bad.result != Result::kOk)
    return fail(bad.result, "reaped %d dead rank(s), but a slot claim stays: %s", __builtin_popcount(dead_mask),
                bad.what.c_str());
  return Result::kOk;
}

}  // namespace

}  // namespace ucm
