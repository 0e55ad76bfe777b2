// LoadQueue's copier (load_queue.h): the thread that serves every entry the
// dispatcher handed over, whatever is Ready first, and sleeps on the node's
// completion doorbell for the rest at once (docs/design.md 9.1 step 5). It
// never waits for one entry in place: an entry whose slot lost its key looks
// for a slot once per round (space_wait.cpp, look_for_slot), a dump waiting
// for another rank's write-through waits on its stored word beside the slot
// words (dump_path.cpp). The dispatcher, the store's completions and the
// inline path are load_queue.cpp's.
#include <algorithm>
#include <mutex>
#include <string>

#include "common/log.h"
#include "common/thread_name.h"
#include "common/time.h"
#include "common/trace.h"
#include "ctrl/layout.h"
#include "queue/load_queue.h"
#include "queue/load_queue_impl.h"

namespace ucm {
using load_queue_impl::add;
using load_queue_impl::kStopCheckNs;

namespace {
constexpr size_t kCopyWindow = 8;  // copies in flight before the copier waits
}  // namespace

void LoadQueue::copier_main() {
  name_this_thread("copy", opts_.local_rank);
  if (bind_this_thread(placement_, ThreadRole::kCopier) != Result::kOk)
    UCM_WARN("copier of rank %u: %s", opts_.local_rank, last_error().c_str());
  // Entries whose slot is still being filled. Each round looks at all of
  // them and serves whatever is Ready, in any order; when none moved, the
  // copier sleeps on the node's completion doorbell (layout.h) until any of
  // their words changes, bounded by the earliest deadline and the liveness
  // slice. So a hung key holds back only the task that contains it.
  std::vector<Item> waiting;
  WaitLists lists;
  while (take_items(&waiting)) {
    const uint64_t next_expiry = expire_due_ios();
    const bool moved = serve_round(&waiting);
    if (copier_wanted_depth_ &&
        std::none_of(waiting.begin(), waiting.end(), [](const Item& it) { return it.unsent; })) {
      copier_wanted_depth_ = false;
      depth_unwanted();
    }
    // Every slice, also while rounds keep moving (a busy copier never
    // sleeps, and the sleep is where wait_any looks): are the ranks its
    // entries wait on alive?
    if (now_ns() >= lists.set.next_check_ns && !waiting.empty()) {
      (void)fill_wait_lists(waiting, &lists);
      cache_->check_waited_on(&lists.set);
    }
    if (moved || waiting.empty()) continue;
    // Nothing moved: sleep until one of them may have. A copy in flight
    // lands first (nothing rings the bell for it).
    retire_copies(0);
    sleep_on_waiting(waiting, next_expiry, &lists);
  }
  retire_copies(0);
  if (copier_wanted_depth_) depth_unwanted();
}

bool LoadQueue::take_items(std::vector<Item>* waiting) {
  std::unique_lock<std::mutex> lk(mu_);
  if (waiting->empty()) {
    if (items_.empty() && !copies_.empty()) {
      lk.unlock();
      retire_copies(0);  // nothing else to do: finish what is in flight
      lk.lock();
    }
    wait_for_items(lk);
    if (items_.empty()) return false;  // stopping and drained
  }
  while (!items_.empty()) {
    waiting->push_back(std::move(items_.front()));
    items_.pop_front();
  }
  return true;
}

void LoadQueue::wait_for_items(std::unique_lock<std::mutex>& lk) {
  while (!stopping_ && items_.empty()) {
    bool ios = false;
    {
      std::lock_guard<std::mutex> g(io_mu_);
      ios = !live_ios_.empty();
    }
    if (!ios) {
      copier_cv_.wait(lk);
      continue;
    }
    // I/Os in flight with no entry waiting here (write-throughs): their
    // deadlines are looked at all the same.
    lk.unlock();
    const uint64_t next = expire_due_ios();
    lk.lock();
    if (!stopping_ && items_.empty()) {
      const uint64_t now = now_ns();
      const uint64_t nap = next > now ? std::min(next - now, kStopCheckNs) : 0;
      if (nap > 0) copier_cv_.wait_for(lk, std::chrono::nanoseconds(nap));
    }
  }
}

bool LoadQueue::serve_round(std::vector<Item>* waiting) {
  bool moved = false;
  size_t kept = 0;
  for (size_t k = 0; k < waiting->size(); ++k) {
    if (process((*waiting)[k])) {
      moved = true;
      // A sliding window: what landed goes at once; a full window waits
      // for its oldest copy only.
      retire_copies(kCopyWindow - 1);
      continue;
    }
    if (kept != k) (*waiting)[kept] = std::move((*waiting)[k]);
    ++kept;
  }
  waiting->erase(waiting->begin() + static_cast<long>(kept), waiting->end());
  flush_copies();
  retire_copies(kCopyWindow);
  return moved;
}

void LoadQueue::sleep_on_waiting(const std::vector<Item>& waiting, uint64_t next_expiry, WaitLists* l) {
  copier_asleep_.store(true, std::memory_order_seq_cst);
  const uint32_t bell = cache_->bell();
  bool fresh = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    fresh = stopping_ || !items_.empty();
  }
  // An unsent entry waits for depth (each one looked for it this round, so
  // copier_wanted_depth_ says whether any is left): a completion after the
  // bell was read rings it (on_io_done); one before shows here.
  if (copier_wanted_depth_ && !fresh) fresh = depth_free();
  if (!fresh) {
    const uint64_t until = std::min({next_expiry, now_ns() + kStopCheckNs, fill_wait_lists(waiting, l)});
    UCM_TRACE(TraceRange::kWaitReady);
    (void)cache_->wait_any(&l->set, bell, until);
  }
  copier_asleep_.store(false, std::memory_order_relaxed);
}

uint64_t LoadQueue::fill_wait_lists(const std::vector<Item>& waiting, WaitLists* l) {
  l->slots.clear();
  l->words.clear();
  l->stored_slots.clear();
  l->stored_seen.clear();
  uint64_t until = kNoDeadline, earliest_deadline = kNoDeadline;
  for (const Item& it : waiting) {
    earliest_deadline = std::min(earliest_deadline, it.task->deadline_ns());
    if (it.slotless) {  // no word to wait on: its next look for a slot bounds the sleep
      until = std::min(until, it.next_look_ns);
    } else if (it.unsent) {  // its own slot, Idle: the ring of a depth given back wakes it
      continue;
    } else if (it.on_stored) {  // a dump waiting for another write-through's outcome
      l->stored_slots.push_back(it.slot);
      l->stored_seen.push_back(it.stored_seen);
    } else {
      l->slots.push_back(it.slot);
      l->words.push_back(it.word);
    }
  }
  l->set.slots = l->slots.data();
  l->set.words = l->words.data();
  l->set.n = l->slots.size();
  l->set.stored_slots = l->stored_slots.data();
  l->set.stored_seen = l->stored_seen.data();
  l->set.m = l->stored_slots.size();
  l->set.reap_deadline_ns = earliest_deadline;  // a reap may take that long, not just until the next look
  return std::min(until, earliest_deadline);
}

void LoadQueue::count_wait(Item& it) {
  if (it.started == 0) return;  // counted already
  add(ctr_->wait_ns, now_ns() - it.started);
  it.started = 0;
}

void LoadQueue::fail_item(Item& it, Result r, const std::string& why) {
  count_wait(it);
  cache_->release(it.slot);
  add(ctr_->failed_shards, 1);
  it.task->entry_failed(it.index, r, why);
}

std::string LoadQueue::corrupt_text(const Key& k, uint32_t slot, uint32_t w) {
  const uint32_t by = SlotView(w).owner();
  if (by == opts_.local_rank) {
    std::lock_guard<std::mutex> g(io_mu_);
    const auto it = corrupt_notes_.find(slot);
    if (it != corrupt_notes_.end() && it->second.key == k) return key_text(k) + ": " + it->second.error;
  }
  return key_text(k) + ": the store's copy failed its checks (loaded by local rank " + std::to_string(by) +
         "); not retried";
}

void LoadQueue::fail_slotless(Item& it, Result r, const std::string& why) {
  count_wait(it);
  add(ctr_->failed_shards, 1);
  it.task->entry_failed(it.index, r, why);
}

bool LoadQueue::drop_lost_slot(Item& it) {
  const TaskEntry& e = it.task->entries()[it.index];
  cache_->release(it.slot);
  it.slot = kNoSlot;
  if (now_ns() >= it.task->deadline_ns()) {
    fail_slotless(it, Result::kTimeout,
                  key_text(e.key) + ": the store did not complete its load by the task's deadline" +
                      (it.task->kind() == TaskKind::kDump ? " (a load of the key the dump waited for)" : ""));
    return false;
  }
  if (++it.failures > opts_.load_retries) {
    fail_slotless(it, Result::kTimeout,
                  key_text(e.key) + ": its load was abandoned at a deadline " + std::to_string(it.failures) + " times" +
                      (it.task->kind() == TaskKind::kDump ? " (loads of the key the dump waited for)" : ""));
    return false;
  }
  if (stopping()) {
    fail_slotless(it, Result::kFinalized, key_text(e.key) + ": the cache was finalized while waiting for it");
    return false;
  }
  it.slotless = true;  // look_for_slot gets the key again
  it.space_since = 0;
  it.next_look_ns = 0;
  it.space_step_ns = 0;
  return true;
}

bool LoadQueue::load_as_owner(Item& it, uint32_t* w) {
  // Never a wait for I/O depth here: the copier's other entries would wait
  // behind the older I/Os, until a hung one's deadline. Without a depth the
  // entry keeps its slot, owned and unsent, and send_unsent sends it later.
  it.unsent = true;
  *w = cache_->word(it.slot);
  Look look = Look::kWaiting;
  return send_unsent(it, &look) || look == Look::kWaiting;
}

bool LoadQueue::send_unsent(Item& it, Look* look) {
  const TaskEntry& e = it.task->entries()[it.index];
  *look = Look::kWaiting;
  const bool stop = stopping();
  const bool stuck = !stop && load_stuck(e.key);
  if (!stop && !stuck && now_ns() < it.task->deadline_ns()) {
    if (!claim_depth(true)) {
      copier_wanted_depth_ = true;
      return false;
    }
    it.unsent = false;
    send_load(it.task, it.index, it.slot);
    return true;
  }
  // Peers waiting on the slot take the load over.
  (void)cache_->mark_failed(it.slot);
  if (stop) {
    fail_item(it, Result::kFinalized, key_text(e.key) + ": the cache was finalized before its load was sent");
  } else if (stuck) {
    fail_item(it, Result::kBackend, key_text(e.key) + ": " + stuck_reason());
  } else {
    fail_item(it, Result::kTimeout,
              key_text(e.key) + ": the task's deadline passed before its load was sent" +
                  (depth_free() ? std::string()
                                : " (all " + std::to_string(opts_.io_depth) + " of this rank's I/O places held, and " +
                                      std::to_string(io_stuck()) + " stuck in the store)"));
  }
  *look = Look::kEnded;
  return false;
}

bool LoadQueue::process(Item& it) {
  if (it.started == 0) it.started = now_ns();
  if (it.task->kind() == TaskKind::kDump) return process_dump(it);
  // Fresh: the item holds a reference, so the slot's word speaks for its key.
  uint32_t w = it.slotless ? 0 : cache_->word(it.slot);
  const Look look = await_ready(it, &w);
  if (look == Look::kWaiting) return false;
  if (look == Look::kReady) start_copy(it);
  return true;
}

LoadQueue::Look LoadQueue::await_ready(Item& it, uint32_t* w) {
  for (;;) {
    Look look = Look::kWaiting;
    if (it.slotless && !look_for_slot(it, w, &look)) return look;
    if (it.unsent && !send_unsent(it, &look)) return look;
    const State s = SlotView(*w).state();
    if (s == State::kReady) return Look::kReady;
    if (s == State::kCorrupt) {
      fail_item(it, Result::kCorrupt, corrupt_text(it.task->entries()[it.index].key, it.slot, *w));
      return Look::kEnded;
    }
    if (s == State::kFailed || SlotView(*w).is_unowned()) {
      if (!retry_load(it, w)) return Look::kEnded;
      continue;
    }
    return owner_filling(it, w);
  }
}

bool LoadQueue::retry_load(Item& it, uint32_t* w) {
  const TaskEntry& e = it.task->entries()[it.index];
  if (!cache_->holds_key(it.slot, e.key)) {
    // Its load was abandoned at its deadline: the key, not the slot, is taken
    // over. The copier never waits for space here (look_for_slot): the only
    // slot that could free may be one it holds for an entry it has yet to copy.
    return drop_lost_slot(it);
  }
  if (SlotView(*w).state() == State::kFailed && ++it.failures > opts_.load_retries) {
    std::string why;
    {
      std::lock_guard<std::mutex> g(io_mu_);
      const auto at = load_errors_.find(e.key);  // this key's, not the rank's last (helper-18)
      if (at != load_errors_.end()) why = at->second;
    }
    fail_item(it, Result::kBackend,
              key_text(e.key) + ": the backend load failed " + std::to_string(it.failures) + " times" +
                  (why.empty() ? "" : " (last error here: " + why + ")"));
    return false;
  }
  if (cache_->try_take_over(it.slot, *w) && !load_as_owner(it, w)) return false;
  *w = cache_->word(it.slot);
  return true;
}

LoadQueue::Look LoadQueue::owner_filling(Item& it, uint32_t* w) {
  // Idle with an owner: somebody (maybe us) is filling it. The copier
  // waits for this and its other entries together (copier_main).
  const TaskEntry& e = it.task->entries()[it.index];
  if (stopping()) {
    fail_item(it, Result::kFinalized, key_text(e.key) + ": the cache was finalized while waiting for it");
    return Look::kEnded;
  }
  if (now_ns() >= it.task->deadline_ns()) {
    // Our own load of it, if any, expires first: its slot goes, its depth comes back.
    (void)expire_due_ios();
    const uint32_t again = cache_->word(it.slot);
    if (SlotView(again).changed_from(*w) && SlotView(again).is_ready()) {
      *w = again;
      return Look::kReady;
    }
    fail_item(it, Result::kTimeout,
              key_text(e.key) + ": still loading by local rank " + std::to_string(SlotView(*w).owner()) +
                  " at the task's deadline");
    return Look::kEnded;
  }
  it.word = *w;
  return Look::kWaiting;
}

void LoadQueue::start_copy(Item& it) {
  const TaskEntry& e = it.task->entries()[it.index];
  count_wait(it);
  uint64_t ticket = 0;
  UCM_TRACE(TraceRange::kCopy);
  Result r = copy_stream_->copy(e.dst, cache_->data_at(it.slot), cache_->ctrl().slot_bytes(), &ticket);
  if (r != Result::kOk) {
    fail_item(it, r, key_text(e.key) + ": " + last_error());
    return;
  }
  // Queued, not started: the round's copies go out together (flush_copies),
  // one batch call for every shard that was Ready when the copier looked.
  copies_.push_back(Copy{it.task, it.index, it.slot, ticket});
  unflushed_ = true;
}

void LoadQueue::flush_copies() {
  if (!unflushed_) return;
  unflushed_ = false;
  UCM_TRACE(TraceRange::kCopy);
  // A failed flush may have put some copies in flight: each keeps its pin
  // until the stream settles its ticket, and retire_copies() then fails it.
  if (copy_stream_->flush() != Result::kOk) UCM_INFO(kQueue, "rank %u: %s", opts_.local_rank, last_error().c_str());
}

void LoadQueue::retire_copies(size_t keep) {
  // Copies settle in ticket order (one stream), so the oldest decides.
  while (!copies_.empty()) {
    Copy& c = copies_.front();
    if (!copy_stream_->done(c.ticket)) {
      if (copies_.size() <= keep) return;
      flush_copies();  // never wait for a copy that was not started
      if (copy_stream_->wait(c.ticket) != Result::kOk) {
        cache_->release(c.slot);
        add(ctr_->failed_shards, 1);
        c.task->entry_failed(c.index, Result::kDevice, key_text(c.task->entries()[c.index].key) + ": " + last_error());
        copies_.pop_front();
        continue;
      }
    }
    // The copy has landed: the slot may go.
    cache_->release(c.slot);
    add(ctr_->bytes_to_device, cache_->ctrl().slot_bytes());
    c.task->entry_ok();
    copies_.pop_front();
  }
}

}  // namespace ucm
