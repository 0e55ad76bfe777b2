#include "cache/cache_buffer.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>

#include "common/log.h"
#include "common/time.h"
#include "ctrl/clock.h"
#include "ctrl/pins.h"
#include "ctrl/protect.h"
#include "ctrl/recovery.h"
#include "ctrl/space_bell.h"
#include "sync/futex.h"
#include "sync/shared_lock.h"
#include "sync/spin.h"

namespace ucm {
namespace {

inline void mark_accessed(const BufferCtrl& c, uint32_t i) {
  std::atomic<uint8_t>& a = c.accessed(i);
  // Read first: a hot slot's bit is already set, and not writing it keeps the
  // line shared between ranks that hit neighbouring slots.
  if (!a.load(std::memory_order_relaxed)) a.store(1, std::memory_order_relaxed);
}

// Statistics, not accounting: a load and a store, not a locked add (which
// costs as much as the rest of a hit). Each rank's counters have one writer
// in practice (its dispatcher); two threads of one rank bumping the same
// counter at the same instant may lose one increment.
inline void bump(std::atomic<uint64_t>& counter) {
  counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}
// For a counter that two threads of a rank bump by design (takeovers: the
// dispatcher in get(), the copier in try_take_over()); rare, so exact.
inline void bump_shared(std::atomic<uint64_t>& counter) { counter.fetch_add(1, std::memory_order_relaxed); }

std::atomic<uint64_t> g_next_buffer_id{1};

// Each thread remembers the tally cells of the last few CacheBuffers it used.
struct TallyRef {
  uint64_t id = 0;
  std::atomic<int64_t>* cell = nullptr;
};
constexpr size_t kTallyRefs = 4;
thread_local TallyRef t_tally[kTallyRefs];
thread_local size_t t_tally_next = 0;
// The one this thread used last, looked at first: a thread that uses one
// CacheBuffer finds its cell in one compare, wherever it sits among the four.
thread_local TallyRef t_tally_last;

}  // namespace

std::atomic<int64_t>* CacheBuffer::tally_cell() {
  // The slow path out of line: inlined, its registers were saved and
  // restored on every call, found or not.
  if (t_tally_last.id == id_) [[likely]]
    return t_tally_last.cell;
  return tally_cell_slow();
}

std::atomic<int64_t>* CacheBuffer::tally_cell_slow() {
  for (TallyRef& t : t_tally)
    if (t.id == id_) {
      t_tally_last = t;
      return t.cell;
    }
  std::atomic<int64_t>* cell;
  {
    std::lock_guard<std::mutex> g(cells_mu_);
    cell = &cells_.emplace_back(0);
  }
  // A thread that forgets a cell (it used more objects since) takes a new
  // one next time; the old keeps its count, and the sum stays exact.
  t_tally[t_tally_next] = TallyRef{id_, cell};
  t_tally_next = (t_tally_next + 1) % kTallyRefs;
  t_tally_last = TallyRef{id_, cell};
  return cell;
}

int64_t CacheBuffer::references_held() const {
  std::lock_guard<std::mutex> g(cells_mu_);
  int64_t n = 0;
  for (const std::atomic<int64_t>& c : cells_) n += c.load(std::memory_order_relaxed);
  return n;
}

CacheBuffer::CacheBuffer(const BufferCtrl* ctrl, const BufferData* data, const CacheOptions& opts)
    : ctrl_(ctrl),
      data_(data),
      opts_(opts),
      holder_(holder_id(opts.rank)),
      slice_ns_(std::max<uint64_t>(1, opts.liveness_slice_ms) * 1000000ull),
      ctr_(&ctrl->rank(opts.rank).counters),
      pid_(static_cast<int32_t>(getpid())),
      protect_(ctrl->protect_grace_ms() != 0),
      id_(g_next_buffer_id.fetch_add(1, std::memory_order_relaxed)) {}

Result CacheBuffer::check_key(const Key& k) const {
  if (k.shard >= ctrl_->shards_per_block())
    return fail(Result::kInvalidArg, "shard %u >= shards_per_block %u", k.shard, ctrl_->shards_per_block());
  return Result::kOk;
}

Result CacheBuffer::attach_found(uint32_t i, const Key& k, GetResult* out, Attach* a, GetFor f) {
  const BufferCtrl& c = *ctrl_;
  const PinResult p = pin_slot(c, opts_.rank, i);
  if (p == PinResult::kOverflow)
    return fail(Result::kBusy, "rank %u already holds %u pins on slot %u", opts_.rank, kMaxPinsPerRank, i);
  *a = Attach::kRetry;
  if (p == PinResult::kClaimed) return Result::kOk;
  // Re-keyed between our walk and our pin: nothing of ours, unless it still holds k.
  Result r = Result::kOk;
  if (slot_has_key(c, i, k)) r = attach_pinned(i, k, out, a, f);
  if (r != Result::kOk || *a == Attach::kRetry) unpin_slot(c, opts_.rank, i);
  return r;
}

Result CacheBuffer::attach_pinned(uint32_t i, const Key& k, GetResult* out, Attach* a, GetFor f) {
  const BufferCtrl& c = *ctrl_;
  std::atomic<uint32_t>& word = c.slot(i).word;
  uint32_t w = word.load(std::memory_order_acquire);  // [A2] (slot_word.h): Ready means the bytes are in
  *a = Attach::kDone;
  for (;;) {
    const State s = word_state(w);
    if (s == State::kReady) {
      mark_accessed(c, i);
      if (protect_ && f.take) guard_take(c, opts_.rank, i, f.ordinal, true);
      bump(ctr_->hits);
      *out = GetResult{GetKind::kHit, i, w, false, false};
      return Result::kOk;
    }
    // Off the hit path: an owner no rank can be is a stray write, and waiting
    // on it would wait for nobody.
    if (const Result r = check_owner(i, w); r != Result::kOk) return r;
    if (s == State::kCorrupt) {
      // Not taken over: a reload would fail the same way (slot_word.h). The
      // caller fails its load, or dumps the key over it.
      bump(ctr_->waits);
      *out = GetResult{GetKind::kWaiter, i, w, false, false};
      return Result::kOk;
    }
    if (s == State::kFailed || word_owner(w) == kNoOwner) {
      // An abandoned load's slot loses its key before it turns Failed (T8):
      // seen Failed, the key is re-checked, never taken over.
      if (!slot_has_key(c, i, k)) {
        *a = Attach::kRetry;
        return Result::kOk;
      }
      // T5: take over a failed load, or a preallocated / recovered Idle slot.
      const uint32_t nw = word_take_over(w, opts_.rank, false);
      if (!word.compare_exchange_weak(w, nw, std::memory_order_acq_rel, std::memory_order_acquire)) continue;  // [A2][R5]
      if (word_has_waiters(w)) wake_word(word);
      const bool was_prealloc = s == State::kIdle;
      if (protect_) guard_stamp_task(c, i, f.ordinal);
      mark_accessed(c, i);
      bump_shared(ctr_->takeovers);
      if (was_prealloc) {
        bump(ctr_->prealloc_used);
        note_serving(c, opts_.rank);  // a deferring peer may wait for this key (protect.h)
      }
      *out = GetResult{GetKind::kOwner, i, nw, was_prealloc, false};
      return Result::kOk;
    }
    if (protect_ && f.take) guard_take(c, opts_.rank, i, f.ordinal, false);  // it will copy it once Ready
    bump(ctr_->waits);
    *out = GetResult{GetKind::kWaiter, i, w, false, false};
    return Result::kOk;
  }
}

Result CacheBuffer::get(const Key& k, GetResult* out, GetFor f) {
  if (!data_) return fail(Result::kBadState, "a scheduler rank (no data plane) cannot get() a shard");
  UCM_CHECK(check_key(k));
  const uint32_t b = bucket_of(k, ctrl_->bucket_mask());
  // Optimistic, lock-free: the hit path.
  WalkEnd end;
  const uint32_t i = chain_find_unlocked(*ctrl_, b, k, &end);
  if (i != kNoSlot) {
    Attach a;
    UCM_CHECK(attach_found(i, k, out, &a, f));
    if (a == Attach::kDone) {
      tally(1);
      return Result::kOk;
    }
  } else if (end == WalkEnd::kCorrupt) {
    return Result::kCorrupt;  // last_error() names the chain
  }
  // A walk that ran out of steps goes the locked way, which tells a cycle.
  UCM_CHECK(get_locked(k, b, out, f));
  tally(1);  // every kind of answer holds one reference: a pin or the hold
  return Result::kOk;
}

// Inlined into pin_all_ready, its one caller (below).
[[gnu::always_inline]] inline bool CacheBuffer::pin_one_ready(const Key& k, uint32_t b, uint32_t* slot) {
  const BufferCtrl& c = *ctrl_;
  if (k.shard >= c.shards_per_block()) return false;
  WalkEnd end;
  const uint32_t i = chain_find_unlocked(c, b, k, &end);
  if (i == kNoSlot || pin_slot(c, opts_.rank, i) != PinResult::kPinned) return false;
  // Pinned: re-checked as attach_found() does (re-keyed, or not Ready yet).
  if (!slot_has_key(c, i, k) || word_state(c.slot(i).word.load(std::memory_order_acquire)) != State::kReady) {
    unpin_slot(c, opts_.rank, i);
    return false;
  }
  mark_accessed(c, i);
  *slot = i;  // taken (protect.h) by the caller's take_all once the whole batch is pinned and numbered
  return true;
}

void CacheBuffer::prefetch_records(const uint32_t* buckets, size_t n) const {
  const BufferCtrl& c = *ctrl_;
  const uint32_t total = c.total_slots();
  // With the heads' prefetch (pin_all_ready's hashing pass), two passes of n
  // independent loads each: the pin loop's walks are dependent loads behind a
  // locked add each, so on a cold control plane (a cache of gigabytes) it
  // would wait for its misses one after another.
  for (size_t i = 0; i < n; ++i) {
    // A hint: the walk reads the head again, with acquire.
    const uint32_t h = c.bucket(buckets[i]).head.load(std::memory_order_relaxed);
    if (h >= total) continue;
    __builtin_prefetch(&c.slot(h));
    __builtin_prefetch(&c.pin(opts_.rank, h), 1);
    __builtin_prefetch(&c.accessed(h));
    if (protect_) __builtin_prefetch(&c.guard(h));
  }
}

void CacheBuffer::take_all(const uint32_t* slots, size_t n, uint32_t ordinal) {
  if (!protect_) return;
  uint64_t now_ms = 0;  // one clock read for the batch's rounds
  for (size_t i = 0; i < n; ++i) guard_take(*ctrl_, opts_.rank, slots[i], ordinal, true, &now_ms);
}

void CacheBuffer::unpin_ready(const uint32_t* slots, size_t n) {
  const BufferCtrl& c = *ctrl_;
  // Pins this thread took on Ready slots (pin_one_ready): Ready cannot change
  // under them, so each goes in one release fetch_sub ([R4], slot_word.h), as
  // release_one() drops a pin on a Ready slot, with no hold to look for
  // first: a hold of this rank on the same slot is another reference, which
  // its own release() drops.
  for (size_t i = 0; i < n; ++i) (void)unpin_slot(c, opts_.rank, slots[i]);
  note_space_freed(c);  // once per batch (ctrl/space_bell.h)
}

// In this file, after its pieces, so that they inline into the loops: per
// key, the pin path is then no calls and the batch's fields stay at hand.
bool CacheBuffer::pin_all_ready(size_t n, KeyRun keys, uint32_t* slots) {
  if (!data_) return false;
  SmallBuffer<uint32_t, 64> b(n);
  const uint32_t mask = ctrl_->bucket_mask();
  for (size_t i = 0; i < n; ++i) {
    b[i] = bucket_of(keys[i], mask);
    __builtin_prefetch(&ctrl_->bucket(b[i]).head);  // the heads' loads start while the next key is hashed
  }
  if (n > 1) prefetch_records(b.data(), n);
  for (size_t i = 0; i < n; ++i) {
    if (pin_one_ready(keys[i], b[i], &slots[i])) continue;
    unpin_ready(slots, i);
    return false;
  }
  // Not taken here: the caller takes the batch (take_all) once it knows the
  // ordinal of its task, which it numbers only when the batch is all hits. A
  // batch that gives up copied nothing, and a take it had recorded would let
  // peers evict a shard this rank still has to copy (ctrl/protect.h).
  tally(static_cast<int64_t>(n));
  return true;
}

Result CacheBuffer::check_joined() const {
  // Lock words and pins name a rank; a process that uses a rank it has not
  // joined would look dead to everyone else and have its locks stolen.
  const RankRecord& rec = ctrl_->rank(opts_.rank);
  if (rec.state.load(std::memory_order_acquire) != static_cast<uint32_t>(RankState::kAlive) ||
      rec.pid.load(std::memory_order_relaxed) != pid_)
    return fail(Result::kBadState, "local rank %u is not joined by this process (pid %d)", opts_.rank, pid_);
  return Result::kOk;
}

// The clock of a locked get(), read only when something makes it wait: an
// uncontended miss never pays for it.
struct CacheBuffer::WaitClock {
  uint64_t cap = 0;  // the caller's task deadline (GetFor::deadline_ns), 0: none
  uint64_t deadline = 0;
  uint64_t next_liveness_check = 0;
  void start(uint64_t timeout_ms, uint64_t slice_ns) {
    if (deadline != 0) return;
    const uint64_t now = now_ns();
    deadline = now + timeout_ms * 1000000ull;
    if (cap != 0 && cap < deadline) deadline = std::max(cap, uint64_t{1});
    next_liveness_check = now + slice_ns;
  }
};

namespace {
// A miss's sweep, for whom its get serves (protect.h): its load task, its own
// takes there (a dump copies nothing to this rank: it owes itself nothing),
// and how far the protection holds for it.
SweepState sweep_for(const GetFor& f) {
  SweepState s;
  s.have_task = true;
  s.task = f.ordinal;
  s.wait_self = f.wait_self && f.take;
  s.relax = f.relax;
  return s;
}
}  // namespace

Result CacheBuffer::get_locked(const Key& k, uint32_t b, GetResult* out, GetFor f) {
  const BufferCtrl& c = *ctrl_;
  UCM_CHECK(check_joined());
  WaitClock clk{f.deadline_ns};
  bool reaped_for_space = false;
  SweepState sweep = sweep_for(f);  // the eviction's progress across lock holds (clock.h: kSweepPerCall positions each)
  std::atomic<uint32_t>* lock = &c.bucket(b).lock;
  for (;;) {
    if (!shared_try_lock(lock, holder_)) {
      clk.start(opts_.lock_timeout_ms, slice_ns_);
      UCM_CHECK(lock_bucket(c, opts_.rank, b, slice_ns_, clk.deadline));
    }
    uint32_t i = kNoSlot;
    Result r = chain_find_locked(c, b, k, &i);
    if (r == Result::kOk && i != kNoSlot) {
      Attach a;
      r = attach_found(i, k, out, &a, f);
      shared_unlock(lock);
      UCM_CHECK(r);
      if (a == Attach::kDone) return Result::kOk;
      UCM_CHECK(wait_out_claim(i, b, &clk));
      continue;
    }
    bool evicted = false;
    uint32_t v = kNoSlot;
    if (r == Result::kOk) {
      v = take_unused_regular(c, holder_);
      if (v == kNoSlot) r = take_regular_victim(c, holder_, b, &evicted, &v, &sweep);
    }
    if (r != Result::kOk) {
      shared_unlock(lock);
      return r;
    }
    if (v == kNoSlot) {
      shared_unlock(lock);
      // This hold's budget is spent: let the bucket go, then look for the key
      // again (another rank may have loaded it) and sweep on.
      if (!sweep.done()) continue;
      // Pins of a dead rank may be what fills the cache: recover, then retry once.
      if (!reaped_for_space && any_rank_dead(c)) {
        reaped_for_space = true;
        sweep = sweep_for(f);  // from the start, for the same task
        clk.start(opts_.lock_timeout_ms, slice_ns_);
        UCM_CHECK(reap_dead_ranks(c, opts_.rank, nullptr, clk.deadline));
        continue;
      }
      bump(ctr_->no_space);
      return fail(Result::kNoSpace, "no victim among %u regular slots: every slot is pinned, or protected until a peer copies it", c.regular_slots());
    }
    own_new_slot(v, b, k, evicted, out, f);
    return Result::kOk;
  }
}

void CacheBuffer::own_new_slot(uint32_t v, uint32_t b, const Key& k, bool evicted, GetResult* out, GetFor f) {
  const BufferCtrl& c = *ctrl_;
  // The caller's next move is to fill the slot: start bringing its first
  // line (and its page's translation) in while we finish the bookkeeping.
  __builtin_prefetch(data_->at(v), 1, 3);
  install_claimed_slot(c, v, b, k, State::kIdle, opts_.rank, true, true);  // T1 [R1]: Idle, ours, with the hold
  if (protect_) guard_stamp_task(c, v, f.ordinal);
  shared_unlock(&c.bucket(b).lock);
  note_serving(c, opts_.rank);  // a deferring peer may wait for this key (protect.h)
  bump(ctr_->owner_misses);
  if (evicted) bump(ctr_->evictions);
  *out = GetResult{GetKind::kOwner, v, c.slot(v).word.load(std::memory_order_relaxed), false, evicted};
}

Result CacheBuffer::wait_out_claim(uint32_t i, uint32_t b, WaitClock* clk) {
  // Claimed by an evictor: it needs our bucket's lock to detach it, will
  // fail its try-lock and drop the claim. Unless it died holding it.
  const BufferCtrl& c = *ctrl_;
  clk->start(opts_.lock_timeout_ms, slice_ns_);
  const uint64_t now = now_ns();
  const uint32_t claimer = c.slot(i).claim.load(std::memory_order_relaxed);
  if (claimer > c.max_ranks())
    return fail(Result::kCorrupt, "slot %u (bucket %u) is claimed by holder id %u > %u ranks", i, b, claimer,
                c.max_ranks());
  if (now >= clk->deadline)
    return fail(Result::kTimeout, "slot %u stayed claimed by holder %u past the deadline (the task's, or %" PRIu64 " ms)", i, claimer,
                opts_.lock_timeout_ms);
  if (now >= clk->next_liveness_check) {
    clk->next_liveness_check = now + slice_ns_;
    if (any_rank_dead(c)) UCM_CHECK(reap_dead_ranks(c, opts_.rank, nullptr, clk->deadline));
  }
  sched_yield();
  return Result::kOk;
}

Result CacheBuffer::set_final_state(uint32_t slot, State s, bool for_write, const char* what) {
  if (slot >= ctrl_->total_slots())
    return fail(Result::kInvalidArg, "%s: slot %u >= %u slots", what, slot, ctrl_->total_slots());
  std::atomic<uint32_t>& word = ctrl_->slot(slot).word;
  uint32_t w = word.load(std::memory_order_relaxed);
  bool hold_moved = false;
  for (;;) {
    if (word_state(w) != State::kIdle || word_owner(w) != opts_.rank) {
      if (hold_moved) unpin_slot(*ctrl_, opts_.rank, slot);
      return fail(Result::kBadState, "%s: slot %u is %s with owner %u, not a load owned by rank %u", what, slot,
                  state_name(word_state(w)), word_owner(w), opts_.rank);
    }
    // T2 keeps the owner's hold. T3/T4 do not: a waiter may take the slot
    // over and become its owner, so the hold becomes an ordinary pin of this
    // rank first, while the hold still keeps the slot ([R3]).
    const uint32_t nw = word_finish(w, s, opts_.rank);
    if (word_held(w) && s != State::kReady && !hold_moved) {
      ctrl_->pin(opts_.rank, slot).fetch_add(1, std::memory_order_relaxed);
      hold_moved = true;
    }
    // The stored word of the residency about to become Ready (S1 in
    // layout.h): nobody else writes it while the slot is not Ready, and the
    // CAS below publishes it with the state.
    // A load's shard stays until every copier has taken it (protect.h);
    // armed while the hold still keeps the slot, before Ready publishes it.
    if (s == State::kReady && !for_write && protect_) guard_arm(*ctrl_, opts_.rank, slot);
    if (for_write)
      ctrl_->stored(slot).store(stored_make(StoreState::kWriting, opts_.rank, word_version(nw)),
                                std::memory_order_relaxed);
    // [R2]: the bytes written into the slot happen-before any reader that
    // sees the new state ([A2]).
    if (word.compare_exchange_weak(w, nw, std::memory_order_acq_rel, std::memory_order_relaxed)) break;
  }
  // CLOCK keeps bytes the store lacks (clock.h) and takes a corrupt copy first.
  if (for_write) {
    ctrl_->accessed(slot).store(kAccessedUnstored, std::memory_order_relaxed);
    tally(1);  // the write-through is this rank's until finish_write()
  }
  if (s == State::kCorrupt) ctrl_->accessed(slot).store(0, std::memory_order_relaxed);
  if (word_has_waiters(w)) wake_word(word);
  return Result::kOk;
}

Result CacheBuffer::mark_ready(uint32_t slot) { return set_final_state(slot, State::kReady, false, "mark_ready"); }
Result CacheBuffer::mark_ready_for_write(uint32_t slot) {
  return set_final_state(slot, State::kReady, true, "mark_ready_for_write");
}
Result CacheBuffer::mark_failed(uint32_t slot) { return set_final_state(slot, State::kFailed, false, "mark_failed"); }
Result CacheBuffer::mark_corrupt(uint32_t slot) {
  return set_final_state(slot, State::kCorrupt, false, "mark_corrupt");
}

Result CacheBuffer::claim_write(uint32_t slot, WriteClaim* out, uint32_t* seen) {
  if (slot >= ctrl_->total_slots())
    return fail(Result::kInvalidArg, "claim_write: slot %u >= %u slots", slot, ctrl_->total_slots());
  const uint32_t w = ctrl_->slot(slot).word.load(std::memory_order_acquire);  // [A2]
  if (word_state(w) != State::kReady)
    return fail(Result::kBadState, "claim_write: slot %u is %s, not Ready", slot, state_name(word_state(w)));
  std::atomic<uint32_t>& sw = ctrl_->stored(slot);
  uint32_t v = sw.load(std::memory_order_acquire);
  for (;;) {
    switch (stored_state(v, w)) {
      case StoreState::kStored:
        *out = WriteClaim::kStored;
        *seen = v;
        return Result::kOk;
      case StoreState::kWriting:
        *out = WriteClaim::kBeingWritten;
        *seen = v;
        return Result::kOk;
      case StoreState::kNotStored:
      case StoreState::kWriteFailed: {
        // S2: one writer per node. Nobody sleeps on these values, so no wake.
        const uint32_t nv = stored_make(StoreState::kWriting, opts_.rank, word_version(w));
        if (!sw.compare_exchange_weak(v, nv, std::memory_order_acq_rel, std::memory_order_acquire)) continue;
        ctrl_->accessed(slot).store(kAccessedUnstored, std::memory_order_relaxed);
        tally(1);  // the write-through is this rank's until finish_write()
        *out = WriteClaim::kWriter;
        *seen = nv;
        return Result::kOk;
      }
    }
  }
}

Result CacheBuffer::finish_write(uint32_t slot, bool ok) {
  if (slot >= ctrl_->total_slots())
    return fail(Result::kInvalidArg, "finish_write: slot %u >= %u slots", slot, ctrl_->total_slots());
  std::atomic<uint32_t>& sw = ctrl_->stored(slot);
  uint32_t v = sw.load(std::memory_order_relaxed);
  for (;;) {
    if (static_cast<StoreState>(v & kStoredStateMask) != StoreState::kWriting || stored_writer(v) != opts_.rank)
      return fail(Result::kBadState, "finish_write: slot %u's stored word 0x%x is not a write-through by rank %u", slot,
                  v, opts_.rank);
    // S3: the writer stays named in WriteFailed, for the waiters' message.
    const uint32_t nv = ok ? stored_make(StoreState::kStored, kNoOwner, stored_epoch(v))
                           : stored_make(StoreState::kWriteFailed, opts_.rank, stored_epoch(v));
    if (sw.compare_exchange_weak(v, nv, std::memory_order_acq_rel, std::memory_order_relaxed)) break;
  }
  ctrl_->accessed(slot).store(ok ? 1 : kAccessedUnstored, std::memory_order_relaxed);
  tally(-1);
  // The bell too: a copier waits on stored words beside its slots' (wait_any).
  if (v & kStoredWaiters) wake_word(sw);
  note_space_freed(*ctrl_);  // the writer's reference is gone (ctrl/space_bell.h)
  return Result::kOk;
}

bool CacheBuffer::try_take_over(uint32_t slot, uint32_t observed, bool replace_corrupt) {
  const State s = word_state(observed);
  if (!(s == State::kFailed || (s == State::kIdle && word_owner(observed) == kNoOwner) ||
        (s == State::kCorrupt && replace_corrupt)))
    return false;
  std::atomic<uint32_t>& word = ctrl_->slot(slot).word;
  uint32_t w = observed;
  // T5 [A2][R5]: of the ranks that saw `observed`, one wins.
  if (!word.compare_exchange_strong(w, word_take_over(observed, opts_.rank, replace_corrupt),
                                    std::memory_order_acq_rel))
    return false;
  if (word_has_waiters(w)) wake_word(word);
  if (protect_) guard_stamp_task(*ctrl_, slot, task_ordinal_.load(std::memory_order_relaxed));
  if (s == State::kIdle) note_serving(*ctrl_, opts_.rank);  // an unowned slot is served from now on
  bump_shared(ctr_->takeovers);
  return true;
}

Result CacheBuffer::abandon_load(uint32_t slot, uint32_t expected) {
  const BufferCtrl& c = *ctrl_;
  if (slot >= c.total_slots())
    return fail(Result::kInvalidArg, "abandon_load: slot %u >= %u slots", slot, c.total_slots());
  const Key k = slot_key(c, slot);
  if (k.shard == kEmptyShard) return fail(Result::kBadState, "abandon_load: slot %u holds no key", slot);
  const uint32_t b = bucket_of(k, c.bucket_mask());
  UCM_CHECK(lock_bucket(c, opts_.rank, b, slice_ns_, deadline_after_ms(opts_.lock_timeout_ms)));
  std::atomic<uint32_t>& word = c.slot(slot).word;
  uint32_t w = word.load(std::memory_order_acquire);  // [A2]
  if (word_changed(w, expected) || word_state(w) != State::kIdle || word_owner(w) != opts_.rank ||
      !slot_has_key(c, slot, k)) {
    shared_unlock(&c.bucket(b).lock);
    return fail(Result::kBadState, "abandon_load: slot %u's load by rank %u already ended", slot, opts_.rank);
  }
  // Off the chain first (one release store), then keyless: a walker already
  // on the slot re-checks the key after its pin and moves on.
  bool found = false;
  if (const Result u = chain_unlink(c, b, slot, &found); u != Result::kOk) {
    shared_unlock(&c.bucket(b).lock);
    return u;
  }
  c.slot(slot).shard.store(kEmptyShard, std::memory_order_relaxed);
  c.accessed(slot).store(0, std::memory_order_relaxed);
  bool hold_moved = false;
  for (;;) {
    if (word_state(w) != State::kIdle || word_owner(w) != opts_.rank) {
      // Another thread of this rank dropped its last reference meanwhile
      // (release() marks such a load Failed): the slot floats keyless all the same.
      if (hold_moved) unpin_slot(c, opts_.rank, slot);
      w = 0;
      break;
    }
    const uint32_t nw = word_abandon_keyless(w, opts_.rank);  // T8
    if (word_held(w) && !hold_moved) {
      ctrl_->pin(opts_.rank, slot).fetch_add(1, std::memory_order_relaxed);  // [R3]
      hold_moved = true;
    }
    // [R2]: the cleared key happens-before any reader that sees Failed ([A2]).
    if (word.compare_exchange_weak(w, nw, std::memory_order_acq_rel, std::memory_order_relaxed)) break;
  }
  shared_unlock(&c.bucket(b).lock);
  if (word_has_waiters(w)) wake_word(word);
  return Result::kOk;
}

bool CacheBuffer::holds_key(uint32_t slot, const Key& k) const {
  return slot < ctrl_->total_slots() && slot_has_key(*ctrl_, slot, k);
}

void CacheBuffer::ring_bell() const { ring_doorbell(*ctrl_); }

void CacheBuffer::wake_word(std::atomic<uint32_t>& word) const {
  futex_wake(&word, kWakeAll);
  ring_bell();
}

Result CacheBuffer::check_owner(uint32_t slot, uint32_t w) const {
  const uint32_t owner = word_owner(w);
  if (owner != kNoOwner && owner >= ctrl_->max_ranks())
    return fail(Result::kCorrupt, "slot %u's word 0x%08x names owner rank %u >= %u ranks", slot, w, owner,
                ctrl_->max_ranks());
  return Result::kOk;
}

void CacheBuffer::release(uint32_t slot) {
  if (!release_one(slot)) return;
  tally(-1);
  note_space_freed(*ctrl_);  // a rank waiting for a free slot looks again (ctrl/space_bell.h)
}

bool CacheBuffer::release_one(uint32_t slot) {
  const BufferCtrl& c = *ctrl_;
  if (slot >= c.total_slots()) return false;
  // References are counted per rank: the hold (an owner's, in the word) plus
  // the rank's pin row. Each release drops exactly one of them, decided by a
  // CAS on the place it drops it from, so two threads of the rank releasing
  // at once never both take the same one (a leak) or both skip it.
  uint32_t w = c.slot(slot).word.load(std::memory_order_acquire);  // [A3]
  // A finished load of ours: the hold goes first, without reading the row.
  if (drop_finished_hold(slot, &w)) return true;
  // A pin on a Ready slot (a hit's path): one RMW. Ready cannot change while
  // we hold a reference, so no abandon decision can hang on this pin. Any
  // other state goes to the guarded loop: a Failed slot may be taken over by
  // another thread of this rank between our read and our decrement, and then
  // the count before the decrement decides whether its load is abandoned.
  if (word_state(w) == State::kReady) {
    std::atomic<uint32_t>& row = c.pin(opts_.rank, slot);
    if (row.fetch_sub(1, std::memory_order_release) != 0) return true;  // as [R4]
    // We held no pin here: the hold of a finished load was taken above, so
    // this is a release without a reference (a caller's error). Undo; the
    // loop below waits out the transient and finds nothing to drop.
    row.fetch_add(1, std::memory_order_relaxed);
  }
  return release_guarded(slot);
}

bool CacheBuffer::drop_finished_hold(uint32_t slot, uint32_t* w) {
  std::atomic<uint32_t>& word = ctrl_->slot(slot).word;
  while (word_owner(*w) == opts_.rank && word_held(*w) && word_state(*w) != State::kIdle) {
    if (word.compare_exchange_weak(*w, word_drop_hold(*w), std::memory_order_acq_rel)) {  // T6 [R4]
      if (word_has_waiters(*w)) wake_word(word);
      return true;
    }
  }
  return false;
}

bool CacheBuffer::release_guarded(uint32_t slot) {
  std::atomic<uint32_t>& row = ctrl_->pin(opts_.rank, slot);
  uint32_t n = row.load(std::memory_order_relaxed);
  for (int spins = 0;;) {
    if (n > kMaxPinsPerRank && spins < 100000) {
      // Another thread's undo of a decrement from zero, in flight: wait it
      // out (bounded: a row corrupted some other way must not hang us).
      ++spins;
      cpu_relax();
      n = row.load(std::memory_order_relaxed);
      continue;
    }
    if (n == 0) {
      // No pin left: our reference is the hold of a load we own.
      const ReleaseStep step = release_last_hold(slot, &n);
      if (step == ReleaseStep::kAgain) continue;
      return step == ReleaseStep::kDropped;
    }
    // Our last pin on a load we own without a hold: abandon it before the
    // unpin, while the slot cannot be re-keyed under us.
    if (n == 1) abandon_unheld_load(slot);
    if (row.compare_exchange_weak(n, n - 1, std::memory_order_release, std::memory_order_relaxed)) return true;
  }
}

CacheBuffer::ReleaseStep CacheBuffer::release_last_hold(uint32_t slot, uint32_t* n) {
  std::atomic<uint32_t>& word = ctrl_->slot(slot).word;
  std::atomic<uint32_t>& row = ctrl_->pin(opts_.rank, slot);
  uint32_t w = word.load(std::memory_order_acquire);  // [A3]
  if (word_owner(w) != opts_.rank || !word_held(w)) {
    // The hold became a pin (T3, T4, T8) or was dropped by recovery.
    *n = row.load(std::memory_order_acquire);
    return *n == 0 ? ReleaseStep::kNothing : ReleaseStep::kAgain;  // nothing of ours left to drop
  }
  // Our last reference to a load we never finished abandons it (T7).
  const bool abandon = word_state(w) == State::kIdle;
  const uint32_t nw = abandon ? word_abandon(w) : word_drop_hold(w);
  if (word.compare_exchange_strong(w, nw, std::memory_order_acq_rel)) {  // T7 [R2] / T6 [R4]
    if (word_has_waiters(w)) wake_word(word);
    if (abandon) UCM_WARN("rank %u released slot %u without marking its load: marked Failed", opts_.rank, slot);
    return ReleaseStep::kDropped;
  }
  *n = row.load(std::memory_order_relaxed);
  return ReleaseStep::kAgain;
}

void CacheBuffer::abandon_unheld_load(uint32_t slot) {
  std::atomic<uint32_t>& word = ctrl_->slot(slot).word;
  uint32_t w = word.load(std::memory_order_acquire);  // [A3]
  while (word_state(w) == State::kIdle && word_owner(w) == opts_.rank && !word_held(w)) {
    if (word.compare_exchange_weak(w, word_abandon(w), std::memory_order_acq_rel)) {  // T7 [R2]
      wake_word(word);
      UCM_WARN("rank %u released slot %u without marking its load: marked Failed", opts_.rank, slot);
      return;
    }
  }
}

Result CacheBuffer::touch(const BlockId* blocks, size_t n, size_t* marked_out) {
  const BufferCtrl& c = *ctrl_;
  const uint32_t runs = std::min(c.shards_per_block(), c.bucket_count());
  const uint32_t total = c.total_slots();
  size_t marked = 0;
  Result res = Result::kOk;
  for (size_t j = 0; j < n; ++j) {
    const BlockId& blk = blocks[j];
    const uint64_t h = block_hash(blk);
    // The shards of a block live in the run of buckets [h, h + shards_per_block).
    for (uint32_t s = 0; s < runs; ++s) {
      const uint32_t b = static_cast<uint32_t>((h + s) & c.bucket_mask());
      uint32_t i = c.bucket(b).head.load(std::memory_order_acquire);
      uint32_t steps = 0;
      // Lock-free, so bounded (clock.h): a walk that runs out of steps only
      // misses a mark; an index past the end is corrupt.
      for (; i < total && steps < total; ++steps) {
        const SlotMeta& m = c.slot(i);
        if (m.key_lo.load(std::memory_order_relaxed) == blk.lo && m.key_hi.load(std::memory_order_relaxed) == blk.hi &&
            m.shard.load(std::memory_order_relaxed) != kEmptyShard) {
          mark_accessed(c, i);
          ++marked;
        }
        i = m.next.load(std::memory_order_acquire);
      }
      if (i >= total && i != kNoSlot && res == Result::kOk) res = chain_bad_index(c, b, steps, i);
    }
  }
  ctr_->touched_slots.fetch_add(marked, std::memory_order_relaxed);
  if (touch_hook_) touch_hook_(touch_ctx_, blocks, n);
  if (marked_out) *marked_out = marked;
  if (res != Result::kOk) return fail(res, "touch: %s", last_error().c_str());
  return Result::kOk;
}

Result CacheBuffer::prealloc(const Key& k, PreallocOutcome* out, bool* in_flight) {
  if (!data_) return fail(Result::kBadState, "a scheduler rank (no data plane) cannot prealloc()");
  UCM_CHECK(check_key(k));
  UCM_CHECK(check_joined());
  if (in_flight) *in_flight = false;
  const BufferCtrl& c = *ctrl_;
  const uint32_t b = bucket_of(k, c.bucket_mask());
  std::atomic<uint32_t>* lock = &c.bucket(b).lock;
  if (!shared_try_lock(lock, holder_)) {
    *out = PreallocOutcome::kBusy;
    return Result::kOk;
  }
  uint32_t found = kNoSlot;
  if (const Result r = chain_find_locked(c, b, k, &found); r != Result::kOk) {
    shared_unlock(lock);
    return r;
  }
  if (found != kNoSlot) {
    shared_unlock(lock);
    *out = PreallocOutcome::kAlreadyPresent;
    return Result::kOk;
  }
  bool evicted = false;
  bool reserved = false;
  SweepState sweep;
  uint32_t v = take_unused_regular(c, holder_);
  if (v == kNoSlot) {
    reserved = true;
    // One call's budget: prealloc is a hint and never waits, so a reserved
    // pool whose first kSweepPerCall positions are all taken is NoSpace.
    if (const Result r = take_reserved_slot(c, holder_, b, &evicted, &v, &sweep); r != Result::kOk) {
      shared_unlock(lock);
      return r;
    }
  }
  if (v == kNoSlot) {
    shared_unlock(lock);
    if (in_flight) *in_flight = sweep.in_flight != 0;
    *out = PreallocOutcome::kNoSpace;
    return Result::kOk;
  }
  install_claimed_slot(c, v, b, k, State::kIdle, kNoOwner, false, false);
  guard_hint(c, v);  // before the unlock: no evictor can detach it until then (protect.h)
  shared_unlock(lock);
  bump(ctr_->prealloc_made);
  *out = reserved ? PreallocOutcome::kPlacedReserved : PreallocOutcome::kPlacedRegular;
  return Result::kOk;
}

Result CacheBuffer::exists(const Key& k, bool* present) const {
  *present = false;
  if (k.shard >= ctrl_->shards_per_block()) return Result::kOk;
  WalkEnd end;
  const uint32_t i = chain_find_unlocked(*ctrl_, bucket_of(k, ctrl_->bucket_mask()), k, &end);
  if (i == kNoSlot) return end == WalkEnd::kCorrupt ? Result::kCorrupt : Result::kOk;
  const bool ready = word_state(ctrl_->slot(i).word.load(std::memory_order_acquire)) == State::kReady;  // [A2]
  *present = ready && slot_has_key(*ctrl_, i, k);
  return Result::kOk;
}

bool CacheBuffer::being_served(const Key& k) const {
  if (k.shard >= ctrl_->shards_per_block()) return false;
  WalkEnd end;
  const uint32_t i = chain_find_unlocked(*ctrl_, bucket_of(k, ctrl_->bucket_mask()), k, &end);
  if (i == kNoSlot) return false;
  const uint32_t w = ctrl_->slot(i).word.load(std::memory_order_acquire);  // [A2]
  return !SlotView(w).is_unowned() && slot_has_key(*ctrl_, i, k);
}

Result CacheBuffer::reap() {
  return reap_dead_ranks(*ctrl_, opts_.rank, nullptr, deadline_after_ms(opts_.lock_timeout_ms));
}

}  // namespace ucm
