// CacheBuffer's waits (cache_buffer.h): for one slot's word to change
// (wait_for_change), for a write-through's stored word (wait_store_change),
// and for any of many words at once on the node's completion doorbell
// (wait_any, the copier's), with the looks at the liveness of the ranks
// waited on that end a wait on a dead one. The words' protocols are
// ctrl/slot_word.h's and ctrl/layout.h's.
#include <algorithm>

#include "cache/cache_buffer.h"
#include "common/log.h"
#include "common/time.h"
#include "ctrl/chain.h"
#include "ctrl/recovery.h"
#include "sync/futex.h"
#include "sync/shared_lock.h"

namespace ucm {

uint64_t CacheBuffer::reap_deadline(uint64_t deadline_ns) const {
  // A wait's own reap ends by its deadline, and by the lock timeout even for
  // a wait without one, so a stopped recovery-lock holder cannot keep the
  // wait from seeing its word change: the wait retries on its next slice.
  return std::min(deadline_ns, deadline_after_ms(opts_.lock_timeout_ms));
}

void CacheBuffer::note_writer(uint32_t v, uint64_t deadline_ns) {
  const uint32_t writer = stored_writer(v);
  if (static_cast<StoreState>(v & kStoredStateMask) == StoreState::kWriting && writer != opts_.rank &&
      writer < kMaxRanks && !ctrl_->rank_alive(writer))
    (void)reap_dead_ranks(*ctrl_, opts_.rank, nullptr, reap_deadline(deadline_ns));
}

Result CacheBuffer::wait_store_change(uint32_t slot, uint32_t observed, uint64_t deadline_ns, uint32_t* now_stored) {
  if (slot >= ctrl_->total_slots())
    return fail(Result::kInvalidArg, "wait_store_change: slot %u >= %u slots", slot, ctrl_->total_slots());
  std::atomic<uint32_t>& sw = ctrl_->stored(slot);
  auto changed = [&](uint32_t v) { return ((v ^ observed) & ~kStoredWaiters) != 0; };
  uint64_t next_check = now_ns() + slice_ns_;
  for (;;) {
    uint32_t v = sw.load(std::memory_order_acquire);
    if (changed(v)) {
      *now_stored = v;
      return Result::kOk;
    }
    const uint64_t now = now_ns();
    if (now >= deadline_ns) {
      note_writer(v, deadline_ns);  // as wait_for_change: a dead writer is found whatever the wait's length
      const uint32_t last = sw.load(std::memory_order_acquire);
      if (changed(last)) {
        *now_stored = last;
        return Result::kOk;
      }
      return fail(Result::kTimeout, "slot %u: the write-through by local rank %u is still in flight at the deadline",
                  slot, stored_writer(v));
    }
    if (now >= next_check) {
      next_check = now + slice_ns_;
      note_writer(v, deadline_ns);
    }
    // Always a futex: wait=poll reproduces the legacy load path, which had
    // no write-through to wait for.
    if (!(v & kStoredWaiters)) {
      if (!sw.compare_exchange_weak(v, v | kStoredWaiters, std::memory_order_relaxed)) continue;
      v |= kStoredWaiters;
    }
    (void)futex_wait(&sw, v, std::min(deadline_ns, next_check));
  }
}

namespace {
bool stored_changed(uint32_t v, uint32_t seen) { return ((v ^ seen) & ~kStoredWaiters) != 0; }
}  // namespace

bool CacheBuffer::any_changed(const WaitSet& ws) const {
  const BufferCtrl& c = *ctrl_;
  for (size_t i = 0; i < ws.n; ++i)
    if (word_changed(c.slot(ws.slots[i]).word.load(std::memory_order_seq_cst), ws.words[i])) return true;
  for (size_t j = 0; j < ws.m; ++j)
    if (stored_changed(c.stored(ws.stored_slots[j]).load(std::memory_order_seq_cst), ws.stored_seen[j])) return true;
  return false;
}

bool CacheBuffer::arm_waiters(const WaitSet& ws) const {
  // Each word's waiters bit, so that its next change rings the bell; true
  // when one has changed already.
  const BufferCtrl& c = *ctrl_;
  for (size_t i = 0; i < ws.n; ++i) {
    std::atomic<uint32_t>& word = c.slot(ws.slots[i]).word;
    uint32_t w = word.load(std::memory_order_seq_cst);  // [A2]
    for (;;) {
      if (word_changed(w, ws.words[i])) return true;
      if (word_has_waiters(w)) break;
      if (word.compare_exchange_weak(w, word_with_waiters(w), std::memory_order_seq_cst)) break;  // T9 [W]
    }
  }
  for (size_t j = 0; j < ws.m; ++j) {
    std::atomic<uint32_t>& sw = c.stored(ws.stored_slots[j]);
    uint32_t v = sw.load(std::memory_order_seq_cst);
    for (;;) {
      if (stored_changed(v, ws.stored_seen[j])) return true;
      if (v & kStoredWaiters) break;
      if (sw.compare_exchange_weak(v, v | kStoredWaiters, std::memory_order_seq_cst)) break;
    }
  }
  return false;
}

void CacheBuffer::check_waited_on(WaitSet* ws) {
  const uint64_t now = now_ns();
  if (ws->next_check_ns == 0) ws->next_check_ns = now + slice_ns_;
  if (now < ws->next_check_ns) return;
  ws->next_check_ns = now + slice_ns_;
  // The ranks we wait on: owners filling a slot, writers of a write-through
  // (each looked at once: a look reads /proc). Recovery turns a dead owner's
  // load Failed and a dead writer's write NotStored, and rings the doorbell
  // for their waiters; what ends a wait on a dead rank nobody reaped is this.
  const BufferCtrl& c = *ctrl_;
  uint32_t ranks = 0;
  for (size_t i = 0; i < ws->n; ++i) {
    const uint32_t w = c.slot(ws->slots[i]).word.load(std::memory_order_acquire);
    const uint32_t owner = word_owner(w);
    if (word_state(w) == State::kIdle && owner != kNoOwner && owner != opts_.rank && owner < kMaxRanks)
      ranks |= 1u << owner;
  }
  for (size_t j = 0; j < ws->m; ++j) {
    const uint32_t v = c.stored(ws->stored_slots[j]).load(std::memory_order_acquire);
    const uint32_t writer = stored_writer(v);
    if (static_cast<StoreState>(v & kStoredStateMask) == StoreState::kWriting && writer != opts_.rank &&
        writer < kMaxRanks)
      ranks |= 1u << writer;
  }
  for (uint32_t r = 0; r < kMaxRanks; ++r) {
    if (!((ranks >> r) & 1u) || c.rank_alive(r)) continue;
    (void)reap_dead_ranks(c, opts_.rank, nullptr, reap_deadline(ws->reap_deadline_ns));  // every dead rank at once
    return;
  }
}

Result CacheBuffer::wait_any(WaitSet* ws, uint32_t bell_seen, uint64_t deadline_ns) {
  const BufferCtrl& c = *ctrl_;
  for (size_t i = 0; i < ws->n; ++i)
    if (ws->slots[i] >= c.total_slots())
      return fail(Result::kInvalidArg, "wait_any: slot %u >= %u slots", ws->slots[i], c.total_slots());
  for (size_t j = 0; j < ws->m; ++j)
    if (ws->stored_slots[j] >= c.total_slots())
      return fail(Result::kInvalidArg, "wait_any: stored slot %u >= %u slots", ws->stored_slots[j], c.total_slots());
  const uint64_t now = now_ns();
  if (now >= deadline_ns) return fail(Result::kTimeout, "wait_any: the deadline has passed");
  check_waited_on(ws);
  const uint64_t until = std::min({deadline_ns, now + slice_ns_, ws->next_check_ns});
  if (opts_.wait == WaitMode::kPoll) {
    // The legacy waiter: lock, read, unlock each, then sleep. (Stored words
    // are read as they are: the legacy path had no write-through to wait for.)
    for (size_t i = 0; i < ws->n; ++i) {
      uint32_t w = 0;
      UCM_CHECK(poll_once(ws->slots[i], deadline_ns, &w));
      if (word_changed(w, ws->words[i])) return Result::kOk;
    }
    WaitSet stored_only = *ws;
    stored_only.n = 0;
    if (any_changed(stored_only)) return Result::kOk;
    sleep_for_ns(std::min<uint64_t>(opts_.poll_interval_ms * 1000000ull, until > now ? until - now : 0));
  } else {
    if (arm_waiters(*ws)) return Result::kOk;
    std::atomic<uint32_t>& bell = c.globals().bell;
    if (bell.load(std::memory_order_seq_cst) != bell_seen) return Result::kOk;
    if (any_changed(*ws)) return Result::kOk;
    (void)futex_wait(&bell, bell_seen, until);
  }
  check_waited_on(ws);
  if (now_ns() >= deadline_ns) return fail(Result::kTimeout, "wait_any: nothing changed by the deadline");
  return Result::kOk;
}

void CacheBuffer::note_waited_on(uint32_t w, uint64_t deadline_ns) {
  // After a slice, or at the deadline: is the rank we wait on still there?
  const uint32_t owner = word_owner(w);
  if (word_state(w) == State::kIdle && owner != kNoOwner && owner != opts_.rank && !ctrl_->rank_alive(owner))
    (void)reap_dead_ranks(*ctrl_, opts_.rank, nullptr, reap_deadline(deadline_ns));
}

Result CacheBuffer::poll_once(uint32_t slot, uint64_t deadline_ns, uint32_t* w) {
  // The legacy waiter, kept to measure against: lock, read, unlock.
  const uint32_t b = bucket_of(slot_key(*ctrl_, slot), ctrl_->bucket_mask());
  UCM_CHECK(lock_bucket(*ctrl_, opts_.rank, b, slice_ns_, deadline_ns));
  *w = ctrl_->slot(slot).word.load(std::memory_order_acquire);
  shared_unlock(&ctrl_->bucket(b).lock);
  return Result::kOk;
}

Result CacheBuffer::wait_for_change(uint32_t slot, uint32_t observed, uint64_t deadline_ns, uint32_t* now_word) {
  if (slot >= ctrl_->total_slots())
    return fail(Result::kInvalidArg, "wait_for_change: slot %u >= %u slots", slot, ctrl_->total_slots());
  std::atomic<uint32_t>& word = ctrl_->slot(slot).word;
  uint64_t next_check = now_ns() + slice_ns_;
  for (;;) {
    uint32_t w = word.load(std::memory_order_acquire);  // [A2]
    if (opts_.wait == WaitMode::kPoll) UCM_CHECK(poll_once(slot, deadline_ns, &w));
    UCM_CHECK(check_owner(slot, w));
    if (word_changed(w, observed)) {
      *now_word = w;
      return Result::kOk;
    }
    const uint64_t now = now_ns();
    if (now >= deadline_ns) {
      // Callers that wait in short pieces never reach a full slice: look at
      // the owner once more before giving up, so a dead one is recovered (its
      // load turns Failed) whatever the length of the wait.
      note_waited_on(w, deadline_ns);
      const uint32_t last = word.load(std::memory_order_acquire);
      if (word_changed(last, observed)) {
        *now_word = last;
        return Result::kOk;
      }
      return fail(Result::kTimeout, "slot %u still %s (owner %u) at the deadline", slot, state_name(word_state(w)),
                  word_owner(w));
    }
    if (now >= next_check) {
      next_check = now + slice_ns_;
      note_waited_on(w, deadline_ns);
    }
    if (opts_.wait == WaitMode::kPoll) {
      sleep_for_ns(std::min<uint64_t>(opts_.poll_interval_ms * 1000000ull, deadline_ns - now));
      continue;
    }
    if (!word_has_waiters(w)) {
      if (!word.compare_exchange_weak(w, word_with_waiters(w), std::memory_order_relaxed)) continue;  // T9 [W]
      w |= kWordWaiters;
    }
    // Sleep on exactly the value seen: a change since the load returns at once.
    (void)futex_wait(&word, w, std::min(deadline_ns, next_check));
  }
}

}  // namespace ucm
