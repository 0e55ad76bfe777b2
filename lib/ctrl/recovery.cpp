#include "ctrl/recovery.h"

#include "common/log.h"
#include "common/time.h"
#include "ctrl/clock.h"
#include "ctrl/pins.h"
#include "sync/futex.h"
#include "sync/process_identity.h"

#include <unistd.h>

namespace ucm {
namespace {

// The recovery lock names its holder by pid, not by rank: a process that
// reaps the dead predecessor of the very rank it is about to join must not
// look dead itself while the record still names that predecessor.
bool pid_alive_probe(void*, uint32_t pid) { return pid_running(static_cast<int32_t>(pid)); }

bool holder_alive_probe(void* ctx, uint32_t holder) {
  const auto* c = static_cast<const BufferCtrl*>(ctx);
  return holder == 0 || c->rank_alive(holder - 1);
}

bool is_dead_holder(uint32_t holder, uint32_t dead_mask) {
  return holder != 0 && holder <= kMaxRanks && (dead_mask >> (holder - 1)) & 1u;
}

// Locks b for the reaper, stealing it from any dead holder (dead now, even if
// it was alive when the reap started).
void reaper_lock(const BufferCtrl& c, uint32_t holder, uint32_t b) {
  const LockWaitPolicy pol = lock_policy_for(c, 20'000'000);
  for (;;) {
    uint32_t dead = 0;
    Result r = shared_lock(&c.bucket(b).lock, holder, kNoDeadline, pol, &dead);
    if (r == Result::kOk) return;
    if (r == Result::kPeerDead && shared_lock_steal(&c.bucket(b).lock, dead, holder)) return;
  }
}

void reset_floating_slot(const BufferCtrl& c, uint32_t i) {
  SlotMeta& s = c.slot(i);
  s.shard.store(kEmptyShard, std::memory_order_relaxed);
  uint32_t w = s.word.load(std::memory_order_relaxed);
  s.word.store(word_next(w, State::kIdle, kNoOwner), std::memory_order_relaxed);
  c.accessed(i).store(0, std::memory_order_relaxed);
  unclaim_slot(c, i);
  if (w & kWordWaiters) futex_wake(&s.word, kWakeAll);
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
    UCM_CHECK(reap_dead_ranks(c, me, nullptr));
  }
}

namespace {

void lock_recovery(const BufferCtrl& c) {
  CtrlGlobals& g = c.globals();
  const uint32_t self_pid = static_cast<uint32_t>(getpid());
  LockWaitPolicy pid_pol;
  pid_pol.slice_ns = 20'000'000;
  pid_pol.holder_alive = &pid_alive_probe;
  for (;;) {
    uint32_t dead = 0;
    Result r = shared_lock(&g.recovery_lock, self_pid, kNoDeadline, pid_pol, &dead);
    if (r == Result::kOk) return;
    if (r == Result::kPeerDead && shared_lock_steal(&g.recovery_lock, dead, self_pid)) return;
  }
}

Result reap_locked(const BufferCtrl& c, uint32_t me, uint32_t* reaped, uint32_t inherited);

}  // namespace

Result join_rank(const BufferCtrl& c, uint32_t r) {
  auto& ctrl = const_cast<BufferCtrl&>(c);
  // Under the recovery lock, no reaper can free the record while we adopt it.
  lock_recovery(c);
  Result res = ctrl.join(r);
  if (res == Result::kPeerDead) {
    res = ctrl.adopt_dead_record(r);
    if (res == Result::kOk) res = reap_locked(c, r, nullptr, 1u << r);
    if (res == Result::kOk) ctrl.finish_join(r);
  }
  shared_unlock(&c.globals().recovery_lock);
  return res;
}

Result reap_dead_ranks(const BufferCtrl& c, uint32_t me, uint32_t* reaped, uint32_t inherited) {
  lock_recovery(c);
  const Result r = reap_locked(c, me, reaped, inherited);
  shared_unlock(&c.globals().recovery_lock);
  return r;
}

namespace {

Result reap_locked(const BufferCtrl& c, uint32_t me, uint32_t* reaped, uint32_t inherited) {
  const uint32_t holder = holder_id(me);
  CtrlGlobals& g = c.globals();

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
  if (reaped) *reaped = static_cast<uint32_t>(__builtin_popcount(dead_mask));
  if (dead_mask == 0) return Result::kOk;

  // 2. Bucket locks held by the dead.
  for (uint32_t b = 0; b < c.bucket_count(); ++b) {
    std::atomic<uint32_t>* lk = &c.bucket(b).lock;
    const uint32_t h = lock_holder(lk->load(std::memory_order_relaxed));
    if (is_dead_holder(h, dead_mask) && shared_lock_steal(lk, h, holder)) shared_unlock(lk);
  }

  // 3. Slots: pins, claims, loads in flight.
  DroppedRefs dropped;
  for (uint32_t i = 0; i < c.total_slots(); ++i) {
    SlotMeta& s = c.slot(i);
    if (is_dead_holder(s.claim.load(std::memory_order_acquire), dead_mask)) {
      if (s.shard.load(std::memory_order_relaxed) == kEmptyShard) {
        reset_floating_slot(c, i);
      } else {
        // Keys change only while a slot floats, so a slot on a chain is on the
        // chain of its own key's bucket: look there, under that lock.
        const uint32_t b = bucket_of(slot_key(c, i), c.bucket_mask());
        reaper_lock(c, holder, b);
        if (chain_contains(c, b, i)) unclaim_slot(c, i);
        else reset_floating_slot(c, i);
        shared_unlock(&c.bucket(b).lock);
      }
    }
    drop_rank_refs(c, i, dead_mask, &dropped);
  }

  // 4. Records (not the ones the caller adopted).
  for (uint32_t r = 0; r < c.max_ranks(); ++r) {
    if (!((dead_mask >> r) & 1u) || ((inherited >> r) & 1u)) continue;
    RankRecord& rec = c.rank(r);
    rec.pid.store(0, std::memory_order_relaxed);
    rec.start_ticks.store(0, std::memory_order_relaxed);
    rec.state.store(static_cast<uint32_t>(RankState::kFree), std::memory_order_release);
  }
  g.reap_count.fetch_add(1, std::memory_order_relaxed);
  if (me < c.max_ranks()) c.rank(me).counters.reaps.fetch_add(__builtin_popcount(dead_mask), std::memory_order_relaxed);
  return Result::kOk;
}

}  // namespace

}  // namespace ucm
