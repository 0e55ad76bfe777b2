#include "queue/load_queue.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "common/log.h"
#include "common/small_buffer.h"
#include "common/thread_name.h"
#include "common/time.h"
#include "common/trace.h"
#include "ctrl/layout.h"
#include "ctrl/protect.h"
#include "ctrl/space_bell.h"
#include "device/host_copy.h"
#include "sync/futex.h"
#include "queue/load_queue_impl.h"
#include "queue/rearrange.h"

namespace ucm {
using load_queue_impl::add;
using load_queue_impl::next_relax_ns;
using load_queue_impl::relax_after;
using load_queue_impl::kStopCheckNs;

namespace {

constexpr size_t kBatchMax = 32;                // dispatcher entries handed to the copier at once, at most
constexpr uint64_t kLegacyStepNapNs = 50'000;   // order=natural: between looks at the shard in flight

// The queue whose dispatcher runs on this thread: get() and start_load()
// also run on the copier, which holds no batch.
thread_local const void* t_dispatching = nullptr;

// I/Os past their deadline whose store has not completed them yet. A store
// stuck in the kernel may complete one at any time (or never, if finalize left
// its thread behind): the request must stay valid as long as the process, so
// it is kept here, reachable, until its late completion frees it.
std::mutex g_overdue_mu;
std::unordered_set<const void*>& overdue() {
  static auto* s = new std::unordered_set<const void*>();
  return *s;
}
void note_overdue(const void* io, bool add_it) {
  std::lock_guard<std::mutex> g(g_overdue_mu);
  if (add_it) overdue().insert(io);
  else overdue().erase(io);
}

}  // namespace

LoadQueue::LoadQueue(CacheBuffer* cache, Backend* backend, CopyEngine* engine, const Placement& placement,
                     const QueueOptions& opts)
    : cache_(cache),
      backend_(backend),
      engine_(engine),
      placement_(placement),
      opts_(opts),
      ctr_(&queue_counters(cache->ctrl().rank(opts.local_rank))),
      inline_(opts.inline_hits && engine != nullptr && std::strcmp(engine->name(), "host") == 0) {}

LoadQueue::~LoadQueue() { stop(); }

Result LoadQueue::start() {
  note_idle();  // nothing in it yet (ctrl/protect.h: an idle rank that let a protection lapse holds nothing)
  UCM_CHECK(engine_->open_stream(&copy_stream_));
  UCM_CHECK(engine_->open_stream(&dump_stream_));
  dispatcher_ = std::thread([this] { dispatcher_main(); });
  copier_ = std::thread([this] { copier_main(); });
  return Result::kOk;
}

void LoadQueue::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_ && !dispatcher_.joinable()) return;
    stopping_ = true;
    stop_flag_.store(true, std::memory_order_release);
  }
  pending_cv_.notify_all();
  copier_cv_.notify_all();
  {
    // The dispatcher's wait for a place looks at stopping() under io_mu_
    // before it waits (start_load): through it, this wake-up is not lost.
    std::lock_guard<std::mutex> g(io_mu_);
  }
  io_cv_.notify_all();
  if (copier_asleep_.load(std::memory_order_seq_cst)) cache_->ring_bell();
  if (deferring_.load(std::memory_order_seq_cst)) {  // our dispatcher sleeps on the defer bell
    std::atomic<uint32_t>& bell = cache_->ctrl().globals().defer_bell;
    bell.fetch_add(1, std::memory_order_seq_cst);
    futex_wake(&bell, kWakeAll);
  }
  if (space_waiters_.load(std::memory_order_seq_cst) != 0) ring_space(cache_->ctrl());  // ... or on the space bell
  if (dispatcher_.joinable()) dispatcher_.join();
  if (copier_.joinable()) copier_.join();
  // The copier leaves once stopping finds no item; the dispatcher may still
  // have handed over one it pinned (a waiter's slot): it fails, its pin goes back.
  std::deque<Item> left;
  {
    std::lock_guard<std::mutex> g(mu_);
    left.swap(items_);
  }
  for (Item& it : left)
    fail_item(it, Result::kFinalized,
              key_text(it.task->entries()[it.index].key) + ": the cache was finalized while waiting for it");
}

uint64_t LoadQueue::io_in_flight() const {
  std::lock_guard<std::mutex> g(io_mu_);
  return io_inflight_ + io_stuck_;
}

uint64_t LoadQueue::io_stuck() const {
  std::lock_guard<std::mutex> g(io_mu_);
  return io_stuck_;
}

Result LoadQueue::submit(const std::shared_ptr<Task>& t) {
  t->set_on_done([this](const Task& done) { record_done(done); });
  if (inline_ && t->kind() == TaskKind::kLoad && !stop_flag_.load(std::memory_order_acquire)) {
    note_busy();  // before any of its takes (a peer must wait for it again)
    const bool done = run_inline(*t);
    if (undispatched_loads_.load(std::memory_order_seq_cst) == 0 && !done) note_idle();  // nothing of ours queued yet
    if (done) return Result::kOk;
  }
  std::lock_guard<std::mutex> g(mu_);
  if (stopping_) return fail(Result::kFinalized, "the cache is being finalized");
  if (pending_.size() >= opts_.pending_limit)
    return fail(Result::kBusy, "%zu tasks already wait for this rank's dispatcher (the limit)", pending_.size());
  if (t->kind() == TaskKind::kLoad) {
    t->set_ordinal(next_ordinal_.fetch_add(1, std::memory_order_relaxed));
    undispatched_loads_.fetch_add(1, std::memory_order_seq_cst);
    note_busy();  // again, after the count: a pass that saw no task left and stamped idle is undone
  }
  pending_.push_back(t);
  queued_tasks_.fetch_add(1, std::memory_order_relaxed);
  pending_cv_.notify_one();
  return Result::kOk;
}

bool LoadQueue::run_inline(Task& t) {
  const std::vector<TaskEntry>& es = t.entries();
  const size_t n = es.size();
  SmallBuffer<uint32_t, 64> slots(n);  // on the stack for small tasks
  // Not a hit: the whole task goes to the dispatcher, which gets every key
  // again (and counts its hits then).
  if (!cache_->pin_all_ready(n, KeyRun{&es[0].key, sizeof(TaskEntry)}, slots.data())) return false;
  t.set_ordinal(next_ordinal_.fetch_add(1, std::memory_order_relaxed));
  cache_->take_all(slots.data(), n, t.ordinal());  // for this task (ctrl/protect.h): before the copy, under the pins
  add(ctr_->tasks, 1);
  add(ctr_->shards, n);
  add(ctr_->inline_hits, n);  // not RankCounters.hits: see counters.h
  const uint64_t bytes = cache_->ctrl().slot_bytes();
  {
    UCM_TRACE(TraceRange::kCopy);
    for (size_t i = 0; i < n; ++i) host_copy(es[i].dst, cache_->data_at(slots[i]), bytes);  // the host engine's copy
  }
  cache_->release_ready_pins(slots.data(), n);
  add(ctr_->bytes_to_device, bytes * n);
  add(ctr_->inline_tasks, 1);
  pass_inline(t.ordinal());                // every key of it taken: before the caller can see it done
  t.entries_ok(static_cast<uint32_t>(n));  // records the latency (record_done), then marks it done
  return true;
}

// Dispatch is FIFO, so a queued load task whose dispatch ended has every
// older queued one behind it. An inline task may finish while an older
// queued one is still dispatching: it counts once nothing older is queued
// (its own check, or the dispatcher's when the queue drains: seq_cst on both
// sides, so one of them sees the other). Passed is never published early; a
// late one only makes peers wait longer (at most the grace).
void LoadQueue::pass_queued(uint32_t ordinal) {
  publish_passed(ordinal + 1);
  if (undispatched_loads_.fetch_sub(1, std::memory_order_seq_cst) == 1) {
    publish_passed(inline_through_.load(std::memory_order_seq_cst));
    note_idle();
  }
}

void LoadQueue::pass_inline(uint32_t ordinal) {
  uint32_t seen = inline_through_.load(std::memory_order_relaxed);
  while (static_cast<int32_t>(ordinal + 1 - seen) > 0 &&
         !inline_through_.compare_exchange_weak(seen, ordinal + 1, std::memory_order_seq_cst)) {
  }
  if (undispatched_loads_.load(std::memory_order_seq_cst) == 0) {
    publish_passed(ordinal + 1);
    note_idle();
  }
}

void LoadQueue::note_busy() {
  cache_->ctrl().rank(opts_.local_rank).idle_since_ms.store(0, std::memory_order_seq_cst);
}

// Idle from now, unless a load task came in meanwhile: its submit counts it
// and then stores 0 (seq_cst on both sides), so either this re-check sees the
// count, or the submit's 0 lands after our stamp. A stale 0 only makes peers
// wait longer (at most the grace).
void LoadQueue::note_idle() {
  std::atomic<uint32_t>& idle = cache_->ctrl().rank(opts_.local_rank).idle_since_ms;
  uint32_t stamp = idle_stamp_now();
  idle.store(stamp, std::memory_order_seq_cst);
  // Undo only our own stamp: a later pass may have stamped since (its stamp
  // is as true as ours would have been wrong).
  if (undispatched_loads_.load(std::memory_order_seq_cst) != 0)
    idle.compare_exchange_strong(stamp, 0, std::memory_order_seq_cst);
}

// A CAS max modulo 2^32: tasks_passed only moves forward.
void LoadQueue::publish_passed(uint32_t through) {
  std::atomic<uint32_t>& p = cache_->ctrl().rank(opts_.local_rank).tasks_passed;
  uint32_t cur = p.load(std::memory_order_relaxed);
  while (static_cast<int32_t>(through - cur) > 0 &&
         !p.compare_exchange_weak(cur, through, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

void LoadQueue::record_done(const Task& t) {
  const uint64_t us = t.latency_ns() / 1000;
  add(ctr_->latency_us[latency_bucket(us)], 1);
  uint64_t seen = ctr_->latency_max_us.load(std::memory_order_relaxed);
  while (us > seen && !ctr_->latency_max_us.compare_exchange_weak(seen, us, std::memory_order_relaxed)) {
  }
}

std::string LoadQueue::key_text(const Key& k) const {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "block %016" PRIx64 "%016" PRIx64 " shard %u", k.block.hi, k.block.lo, k.shard);
  return buf;
}

// Without the lock: every entry asks, and stop() sets the flag under it.
bool LoadQueue::stopping() { return stop_flag_.load(std::memory_order_acquire); }

void LoadQueue::flush_batch() {
  if (batch_.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (Item& it : batch_) items_.push_back(std::move(it));
  }
  batch_.clear();
  handoffs_.fetch_add(1, std::memory_order_relaxed);
  copier_cv_.notify_one();
  // A copier asleep on the doorbell (copier_main) hears of new work by it.
  if (copier_asleep_.load(std::memory_order_seq_cst)) cache_->ring_bell();
}

// ---- dispatcher -----------------------------------------------------------------

void LoadQueue::dispatcher_main() {
  t_dispatching = this;
  name_this_thread("disp", opts_.local_rank);
  if (bind_this_thread(placement_, ThreadRole::kDispatcher) != Result::kOk)
    UCM_WARN("dispatcher of rank %u: %s", opts_.local_rank, last_error().c_str());
  for (;;) {
    std::shared_ptr<Task> t;
    {
      std::unique_lock<std::mutex> lk(mu_);
      pending_cv_.wait(lk, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping
      t = pending_.front();
      pending_.pop_front();
      if (t->done()) {  // failed at its deadline while it waited here (fail_overdue_pending)
        lk.unlock();
        if (t->kind() == TaskKind::kLoad) pass_queued(t->ordinal());
        continue;
      }
      if (stopping_) {
        lk.unlock();
        for (uint32_t i = 0; i < t->entries().size(); ++i)
          t->entry_failed(i, Result::kFinalized, "the cache was finalized before the task ran");
        if (t->kind() == TaskKind::kLoad) pass_queued(t->ordinal());
        continue;
      }
    }
    if (t->kind() == TaskKind::kLoad) cache_->set_task_ordinal(t->ordinal());
    dispatch(t);
    if (t->kind() == TaskKind::kLoad) pass_queued(t->ordinal());
  }
}

// Whom a get for task t serves (CacheBuffer::GetFor): a load task's own
// ordinal, also from the copier's retries (the dispatcher may be tasks ahead
// by then); a dump's get takes nothing (it copies nothing to this rank).
GetFor LoadQueue::get_for(const Task& t) const {
  GetFor f = t.kind() != TaskKind::kLoad ? GetFor{cache_->task_ordinal(), false} : GetFor{t.ordinal(), true};
  f.deadline_ns = t.deadline_ns();  // a lock wait inside get() ends with the task (cache_buffer.h)
  return f;
}

Result LoadQueue::get_with_backpressure(const Key& k, const Task& t, GetResult* g, const std::shared_ptr<Task>* mine) {
  SpaceWait space(this);
  uint64_t since = 0;  // the first NoSpace
  for (;;) {
    const GetFor f = relaxed_for(t, since);
    space.before_look();
    const Result r = cache_->get(k, g, f);
    if (r != Result::kNoSpace) return r;
    // Every slot is pinned, or protected for a rank that has not taken it:
    // our copier (and the peers') drain and release, protection ends.
    const uint64_t now = now_ns();
    if (now >= t.deadline_ns())
      return fail(Result::kNoSpace, "%s: no free cache slot before the task's deadline (every slot stayed pinned%s)",
                  key_text(k).c_str(), f.relax == ProtectRelax::kNone ? "" : ", or protected for a local rank that had not taken it");
    if (stopping()) return fail(Result::kFinalized, "the cache was finalized");
    if (since == 0) since = now;
    if (relax_after(t, now, since) > f.relax) continue;  // look again at once, under the relaxed rule
    // Slots this rank has not taken may be protected until it does, and the
    // ranks that loaded them wait for slots this rank's loads hold: take
    // what of the task they serve now, not after our stride, then look again.
    if (mine && take_served(*mine)) continue;
    // Our copier frees what it copies: it must have every entry we hold.
    if (t_dispatching == this) {
      flush_batch();
      fail_overdue_pending("a free cache slot");
    }
    space.sleep(std::min(t.deadline_ns(), next_relax_ns(t, since, f.relax)));
  }
}

bool LoadQueue::take_served(const std::shared_ptr<Task>& t) {
  const auto& entries = t->entries();
  if (taking_served_ || t_dispatching != this || dispatched_.size() != entries.size()) return false;
  taking_served_ = true;
  bool any = false;
  for (uint32_t j = 0; j < entries.size() && !stopping(); ++j) {
    if (dispatched_[j] || !cache_->being_served(entries[j].key)) continue;
    GetResult g;
    const Result r = cache_->get(entries[j].key, &g, get_for(*t));  // one look: never waits for space here
    if (r == Result::kNoSpace) continue;                 // evicted meanwhile, no room for it yet
    dispatched_[j] = 1;
    any = true;
    dispatch_got(t, j, r, g);
  }
  taking_served_ = false;
  if (any) flush_batch();
  return any;
}

void LoadQueue::dispatch(const std::shared_ptr<Task>& t) {
  UCM_TRACE(TraceRange::kDispatch);
  const auto& entries = t->entries();
  add(ctr_->tasks, 1);
  add(ctr_->shards, entries.size());
  std::vector<uint32_t> order;
  rearrange_order(static_cast<uint32_t>(entries.size()), opts_.local_rank, opts_.local_size, opts_.rotate, &order);
  dispatched_.assign(entries.size(), 0);
  // Our own stride comes first in the rotated order.
  size_t own = order.size();
  if (opts_.rotate && opts_.local_size > 1) {
    own = 0;
    while (own < order.size() && order[own] % opts_.local_size == opts_.local_rank) ++own;
  }
  for (size_t n = 0; n < own; ++n) {
    if (dispatched_[order[n]]) continue;  // taken out of order (take_served)
    if (!dispatch_entry(t, order[n])) {
      flush_batch();
      return fail_rest(t, order, n + 1);
    }
    if (!opts_.rotate) wait_legacy_step(*t, entries.size() - (n + 1));
  }
  flush_batch();  // our stride: one lock and one wake for all of it
  std::vector<uint32_t> deferred(order.begin() + static_cast<long>(own), order.end());
  if (!dispatch_deferred(t, &deferred)) return;
  if (t->kind() == TaskKind::kLoad && opts_.prealloc) prealloc_next(*t);
}

// The peers' strides: a rank that arrives first would otherwise own every
// shard its peers have not asked for yet, and the node's loads would run
// from one rank. So a peer's entry waits (at most owner_grace) until some
// rank loads it; only what nobody took by then is ours to load. While it
// waits, the dispatcher sleeps on the node's defer bell, which a rank that
// starts serving a key rings when someone defers (ctrl/protect.h).
bool LoadQueue::dispatch_deferred(const std::shared_ptr<Task>& t, std::vector<uint32_t>* deferred) {
  // Never past the task's deadline: an owner grace longer than the timeout
  // (UCM_OWNER_GRACE_US) held a task for the whole grace.
  const uint64_t grace_end = std::min(now_ns() + opts_.owner_grace_ns, t->deadline_ns());
  DeferSpan span;
  while (!deferred->empty()) {
    const bool expired = now_ns() >= grace_end || stopping();
    const uint32_t bell = expired ? 0 : defer_announce(&span);
    const size_t before = deferred->size();
    if (!dispatch_served(t, deferred, expired)) {
      defer_end(span);
      return false;
    }
    flush_batch();
    if (deferred->empty() || expired || deferred->size() != before) continue;
    // Nothing of the rest is served yet: sleep until a peer serves a key,
    // the grace ends, or the stop check is due (each wait is bounded).
    defer_sleep(&span, bell, grace_end);
  }
  defer_end(span);
  return true;
}

bool LoadQueue::dispatch_served(const std::shared_ptr<Task>& t, std::vector<uint32_t>* deferred, bool expired) {
  const auto& entries = t->entries();
  std::vector<uint32_t>& d = *deferred;
  size_t kept = 0;
  for (size_t n = 0; n < d.size(); ++n) {
    const uint32_t i = d[n];
    if (dispatched_[i]) continue;  // taken out of order (take_served)
    if (!expired && !cache_->being_served(entries[i].key)) {
      d[kept++] = i;
      continue;
    }
    if (!dispatch_entry(t, i)) {  // stopping: entry i is failed; so is every entry not yet dispatched
      std::vector<uint32_t> rest(d.begin(), d.begin() + static_cast<long>(kept));
      rest.insert(rest.end(), d.begin() + static_cast<long>(n) + 1, d.end());
      flush_batch();
      fail_rest(t, rest, 0);
      return false;
    }
  }
  d.resize(kept);
  return true;
}

uint32_t LoadQueue::defer_announce(DeferSpan* span) {
  // Announce, then read the bell, then look (protect.h: a peer that starts
  // serving a key after our look sees the bit and rings).
  CtrlGlobals& globals = cache_->ctrl().globals();
  if (!span->announced) {
    span->announced = true;
    deferring_.store(true, std::memory_order_seq_cst);
    globals.deferring.fetch_or(1u << opts_.local_rank, std::memory_order_seq_cst);
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return globals.defer_bell.load(std::memory_order_seq_cst);
}

void LoadQueue::defer_sleep(DeferSpan* span, uint32_t bell, uint64_t grace_end) {
  CtrlGlobals& globals = cache_->ctrl().globals();
  if (span->wall0 == 0) {  // the first sleep of this task
    span->wall0 = now_ns();
    span->cpu0 = thread_cpu_ns();
  }
  defer_sleeps_.fetch_add(1, std::memory_order_relaxed);
  (void)futex_wait(&globals.defer_bell, bell, std::min(grace_end, now_ns() + kStopCheckNs));
  if (globals.defer_bell.load(std::memory_order_relaxed) != bell) defer_wakes_.fetch_add(1, std::memory_order_relaxed);
}

void LoadQueue::defer_end(const DeferSpan& span) {
  if (!span.announced) return;
  cache_->ctrl().globals().deferring.fetch_and(~(1u << opts_.local_rank), std::memory_order_relaxed);
  deferring_.store(false, std::memory_order_relaxed);
  if (span.wall0 != 0) {
    defer_cpu_ns_.fetch_add(thread_cpu_ns() - span.cpu0, std::memory_order_relaxed);
    defer_wall_ns_.fetch_add(now_ns() - span.wall0, std::memory_order_relaxed);
  }
}

void LoadQueue::wait_legacy_step(const Task& t, size_t left) {
  // The legacy (order=natural) dispatcher finished each shard before asking
  // for the next: its Get waited under the node lock, so every rank stepped
  // through the task in lockstep with one backend load per step (seed 2.1).
  // Reproduced here so the study's control group behaves like the old code;
  // it polls, as the old code did.
  flush_batch();
  while (t.remaining() > left && !stopping()) sleep_for_ns(kLegacyStepNapNs);
}

void LoadQueue::fail_rest(const std::shared_ptr<Task>& t, const std::vector<uint32_t>& order, size_t from) {
  for (size_t m = from; m < order.size(); ++m)
    if (!dispatched_[order[m]]) t->entry_failed(order[m], Result::kFinalized, "the cache was finalized while the task ran");
}

bool LoadQueue::dispatch_entry(const std::shared_ptr<Task>& t, uint32_t i) {
  dispatched_[i] = 1;
  if (stopping()) {
    t->entry_failed(i, Result::kFinalized, "the cache was finalized while the task ran");
    return false;
  }
  GetResult g;
  // Out-of-order takes only for the rotated order's loads: the legacy
  // lockstep (order=natural) stays the control group it was, and a dump
  // takes no protected slot.
  const bool mine = opts_.rotate && t->kind() == TaskKind::kLoad;
  const Result r = get_with_backpressure(t->entries()[i].key, *t, &g, mine ? &t : nullptr);
  dispatch_got(t, i, r, g);
  return true;
}

void LoadQueue::dispatch_got(const std::shared_ptr<Task>& t, uint32_t i, Result r, GetResult& g) {
  const auto& entries = t->entries();
  if (r != Result::kOk) {
    add(ctr_->failed_shards, 1);
    t->entry_failed(i, r, key_text(entries[i].key) + ": " + last_error());
    return;
  }
  if (t->kind() == TaskKind::kDump) {
    if (g.kind == GetKind::kHit) {  // a peer (or an earlier task) already holds it
      WriteClaim wc = WriteClaim::kStored;
      uint32_t seen = 0;
      r = cache_->claim_write(g.slot, &wc, &seen);
      if (r != Result::kOk) {
        cache_->release(g.slot);
        add(ctr_->failed_shards, 1);
        t->entry_failed(i, r, key_text(entries[i].key) + ": " + last_error());
        return;
      }
      if (wc != WriteClaim::kBeingWritten) {
        if (wc == WriteClaim::kWriter) start_write(t, i, g.slot);  // completes the entry
        else t->entry_ok();
        cache_->release(g.slot);
        return;
      }
      // Another rank's write is in flight: the copier waits for its outcome.
    } else if (g.kind == GetKind::kOwner) {
      r = write_dump(t, i, g.slot, dump_stream_.get());
      if (r != Result::kOk) {
        (void)cache_->mark_failed(g.slot);
        add(ctr_->failed_shards, 1);
        t->entry_failed(i, r, key_text(entries[i].key) + ": " + last_error());
      }
      cache_->release(g.slot);
      return;
    }
  } else if (g.kind == GetKind::kOwner) {
    r = start_load(t, i, g.slot);
    if (r != Result::kOk) {
      (void)cache_->mark_failed(g.slot);
      cache_->release(g.slot);
      add(ctr_->failed_shards, 1);
      t->entry_failed(i, r, key_text(entries[i].key) + ": " + last_error());
      return;
    }
    g.word = cache_->word(g.slot);
  }
  // Handed over in batches (flush_batch): one lock and one wake for many
  // entries, and never held back while the dispatcher waits for anything.
  batch_.push_back(Item{t, i, g.slot, g.word, 0});
  if (batch_.size() >= kBatchMax) flush_batch();
  return;
}

void LoadQueue::prealloc_next(const Task& t) {
  // One pass over the task's entries, also when the next task is already
  // pending (a pipeline window). A prealloc that finds the reserved pool
  // held, part of it by loads or copies in flight (the node's: up to
  // io_depth per rank), waits for them to land rather than give the next
  // task's shards up to the regular pool, at most prealloc_wait_ns per pass;
  // the rest of a full pool (unused preallocs, protected or unstored slots)
  // stops the pass at once.
  const uint32_t spb = cache_->ctrl().shards_per_block();
  const uint64_t wait_end = std::min(t.deadline_ns(), now_ns() + opts_.prealloc_wait_ns);
  for (const TaskEntry& e : t.entries()) {
    if (e.key.shard + 1 >= spb) continue;
    Key next = e.key;
    next.shard += 1;
    SpaceWait space(this);
    for (;;) {
      if (stopping()) return;
      PreallocOutcome o;
      bool in_flight = false;
      space.before_look();
      if (cache_->prealloc(next, &o, &in_flight) != Result::kOk) return;
      if (o != PreallocOutcome::kNoSpace) break;
      if (!in_flight || now_ns() >= wait_end) return;  // nothing will free on its own (in time): stop
      flush_batch();  // our copier holds whatever it must copy to free our part
      space.sleep(wait_end);  // a load or copy landing releases, and rings
    }
  }
}

Result LoadQueue::start_load(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot) {
  const uint64_t deadline = t->deadline_ns();
  // The caller's message names the key: these say what befell it.
  if (now_ns() >= deadline)  // a load sent now would be abandoned at once (a fan-out fallback past its task's deadline)
    return fail(Result::kTimeout, "the task's deadline passed before its load was sent");
  // kBackend: the store failed it, no wait of the caller ran out (helper-19: TIMEOUT read as "deadline too short").
  if (load_stuck(t->entries()[index].key)) return fail(Result::kBackend, "%s", stuck_reason().c_str());
  for (;;) {
    // I/Os past their deadline give their depth back here too: the
    // dispatcher is never held behind a hung load past its deadline.
    const uint64_t next_expiry = expire_due_ios();
    if (claim_depth(false)) break;
    if (stopping()) {  // let it go through: the backend completes it on shutdown
      std::lock_guard<std::mutex> g(io_mu_);
      ++io_inflight_;
      break;
    }
    const uint64_t now = now_ns();
    if (now >= deadline) {
      uint64_t in_flight = 0, stuck = 0;
      bool kept = false;
      {
        std::lock_guard<std::mutex> g(io_mu_);
        in_flight = io_inflight_;
        stuck = io_stuck_;
        kept = depth_wanted_;
      }
      return fail(Result::kTimeout,
                  "no I/O place of this rank's %u came free before the task's deadline (%llu in flight, and %llu "
                  "stuck in the store%s)",
                  opts_.io_depth, static_cast<unsigned long long>(in_flight),
                  static_cast<unsigned long long>(stuck), kept ? "; one kept for a load the copier owns" : "");
    }
    const uint64_t until = std::min({deadline, next_expiry, now + kStopCheckNs});
    if (t_dispatching == this) {
      flush_batch();
      fail_overdue_pending("an I/O place");
    }
    std::unique_lock<std::mutex> lk(io_mu_);
    // stopping() again under io_mu_: stop() passes through it before its wake-up.
    if (!depth_left_locked(false) && !stopping()) io_cv_.wait_for(lk, std::chrono::nanoseconds(until - now));
  }
  send_load(t, index, slot);
  return Result::kOk;
}

void LoadQueue::fail_overdue_pending(const char* waiting_for) {
  std::vector<std::shared_ptr<Task>> due;
  const uint64_t now = now_ns();
  {
    std::lock_guard<std::mutex> g(mu_);
    for (const std::shared_ptr<Task>& t : pending_)
      if (t->deadline_ns() <= now && !t->done()) due.push_back(t);
  }
  // Only this thread fails queued tasks (and pops them), so none is failed twice.
  for (const std::shared_ptr<Task>& t : due) {
    const auto& es = t->entries();
    add(ctr_->tasks, 1);  // as dispatch() counts it
    add(ctr_->shards, es.size());
    add(ctr_->failed_shards, es.size());
    for (uint32_t i = 0; i < es.size(); ++i)
      t->entry_failed(i, Result::kTimeout,
                      key_text(es[i].key) + ": the task's deadline passed while it waited in rank " +
                          std::to_string(opts_.local_rank) + "'s queue, behind an earlier task waiting for " +
                          waiting_for);
  }
}

bool LoadQueue::depth_left_locked(bool copier) const {
  // While the copier waits for a place for an unsent entry, the dispatcher
  // leaves it one: woken by io_cv_ at every completion, the dispatcher would
  // otherwise always be first, and the copier (woken by a ring, or by its
  // next poll in wait=poll) would wait behind every miss it dispatches.
  const uint64_t reserved = !copier && depth_wanted_ ? 1 : 0;
  return io_inflight_ + reserved < opts_.io_depth;
}

bool LoadQueue::claim_depth(bool copier) {
  std::lock_guard<std::mutex> g(io_mu_);
  const bool free = depth_left_locked(copier);
  if (free) ++io_inflight_;
  else if (copier) depth_wanted_ = true;  // until the copier has no unsent entry (depth_unwanted)
  return free;
}

void LoadQueue::depth_unwanted() {
  std::lock_guard<std::mutex> g(io_mu_);
  depth_wanted_ = false;
  io_cv_.notify_all();  // the place it left the copier is the dispatcher's again
}

bool LoadQueue::load_stuck(const Key& k) const {
  std::lock_guard<std::mutex> g(io_mu_);
  const auto at = stuck_loads_.find(k);
  return at != stuck_loads_.end() && at->second >= kStuckLoadsMax;
}

std::string LoadQueue::stuck_reason() {
  return "the store still holds " + std::to_string(kStuckLoadsMax) +
         " of this rank's earlier loads of it, past their deadlines; not sent again until the store returns one";
}

bool LoadQueue::depth_free() const {
  std::lock_guard<std::mutex> g(io_mu_);
  return io_inflight_ < opts_.io_depth;
}

void LoadQueue::send_load(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot) {
  cache_->add_pin(slot);
  auto* io = new Io{IoRequest{}, this, nullptr, index, slot, true};
  io->deadline_ns = t->deadline_ns();
  io->stuck_at_ns = stuck_at(*t);
  io->word = cache_->word(slot);
  io->req.key = t->entries()[index].key;
  io->req.buf = cache_->data_at(slot);
  io->req.bytes = cache_->ctrl().slot_bytes();
  io->req.done = &LoadQueue::on_io_done;
  io->req.user = io;
  add(ctr_->backend_loads, 1);
  track_io(io);
  backend_->load(&io->req);
}

void LoadQueue::track_io(Io* io) {
  {
    std::lock_guard<std::mutex> g(io_mu_);
    live_ios_.push_back(io);
  }
  // The copier looks at deadlines while anything is in flight. An idle
  // copier looks at live_ios_ under mu_ and then waits on copier_cv_
  // (wait_for_items): passing through mu_ puts this wake-up after its wait
  // began, or the I/O before its look. Without it, a write-through sent by
  // the dispatcher between the two went unwatched past its deadline.
  { std::lock_guard<std::mutex> g(mu_); }
  copier_cv_.notify_one();
}

uint64_t LoadQueue::expire_due_ios() {
  std::vector<Expired> due;
  std::vector<Io*> taken_back;  // the store had not started them: ours to end
  uint64_t next = kNoDeadline;
  const uint64_t now = now_ns();
  uint32_t newly_stuck_loads = 0, newly_stuck_writes = 0;
  {
    std::lock_guard<std::mutex> g(io_mu_);
    bool freed = false;
    for (size_t k = 0; k < live_ios_.size();) {
      Io* io = live_ios_[k];
      if (io->deadline_ns > now) {
        const bool marked = mark_stuck_locked(io, now);
        (io->is_load ? newly_stuck_loads : newly_stuck_writes) += marked ? 1 : 0;
        freed |= marked;
        next = std::min(next, io->deadline_ns);
        // Stuck already, or due with no room: its deadline is what comes next.
        if (!io->stuck && io->stuck_at_ns > now) next = std::min(next, io->stuck_at_ns);
        ++k;
        continue;
      }
      expire_locked(io, &due, &taken_back);
      live_ios_[k] = live_ios_.back();
      live_ios_.pop_back();
      --(io->stuck ? io_stuck_ : io_inflight_);
      freed = true;
    }
    if (freed && depth_wanted_) cache_->ring_bell();  // as on_io_done: the copier may sleep with an unsent entry
    if (freed) io_cv_.notify_all();
  }
  // The store makes room beside them too.
  if (newly_stuck_loads + newly_stuck_writes > 0) backend_->requests_stuck(newly_stuck_loads, newly_stuck_writes);
  for (const Expired& x : due) {
    end_expired(x);
    if (x.pinned) cache_->release(x.slot);
  }
  for (Io* io : taken_back) {  // after end_expired: the I/O's pin kept the slot keyed to it until then
    cache_->release(io->slot);
    cancelled_ios_.fetch_add(1, std::memory_order_relaxed);
    delete io;
  }
  return next;
}

void LoadQueue::expire_locked(Io* io, std::vector<Expired>* due, std::vector<Io*>* taken_back) {
  // From here the store's completion only drops the I/O's pin; the Io
  // may be freed by it at any moment, so copy what we need now. Alive
  // until then: its completion's untrack_io waits for io_mu_, so the
  // store may be asked to take it back (never started: no thread or
  // ring place of the store's is spent on a load nobody waits for).
  io->expired = true;
  expired_ios_.fetch_add(1, std::memory_order_relaxed);
  due->push_back(Expired{io->task, io->req.key, io->index, io->slot, io->word, io->is_load});
  if (backend_->cancel(&io->req)) {
    taken_back->push_back(io);
  } else {
    // A write's I/O pin is its slot's only reference, and the store's late
    // completion may drop it (drop_late) before end_expired ends the write:
    // the slot, Ready and unstored, could be re-keyed and written again by
    // this rank meanwhile, and the stale finish_write would fail that write.
    // Our own pin keeps the slot this write's until then (helper-20).
    if (!io->is_load) {
      cache_->add_pin(io->slot);
      due->back().pinned = true;
    }
    note_overdue(io, true);
    if (io->is_load) ++stuck_loads_[io->req.key];  // until drop_late
  }
  if (io->is_load) load_errors_[io->req.key] = "the store did not complete the load by the task's deadline";
}

void LoadQueue::end_expired(const Expired& x) {
  if (x.is_load) {
    add(ctr_->load_failures, 1);
    UCM_INFO(kQueue, "rank %u: %s: the store's load is past the task's deadline; slot %u abandoned",
             opts_.local_rank, key_text(x.key).c_str(), x.slot);
    // kBadState: the load ended between our expiry and this call, or its
    // slot was given up meanwhile; either way nobody waits on it.
    if (cache_->abandon_load(x.slot, x.word) != Result::kOk && last_error().find("already ended") == std::string::npos)
      UCM_WARN("rank %u: abandoning slot %u: %s", opts_.local_rank, x.slot, last_error().c_str());
  } else {
    // Not known to be in the store: the stored word says so, and the next
    // dump of the key writes it again.
    if (cache_->finish_write(x.slot, false) != Result::kOk)
      UCM_WARN("rank %u: ending the timed-out write-through of slot %u: %s", opts_.local_rank, x.slot,
               last_error().c_str());
    add(ctr_->failed_shards, 1);
    x.task->entry_failed(x.index, Result::kTimeout,
                         key_text(x.key) + ": the write-through did not complete by the task's deadline");
  }
}

uint64_t LoadQueue::stuck_at(const Task& t) const {
  // The floor: a load sent late in its task's life (a retry, a task that
  // waited in the queue) is not stuck within a few milliseconds; every such
  // count makes the store add room for good.
  const uint64_t span = t.deadline_ns() > t.submit_ns() ? t.deadline_ns() - t.submit_ns() : 0;
  const uint64_t floor = std::min(load_queue_impl::kStuckFloorNs, opts_.io_stuck_ns);
  return now_ns() + std::clamp(span / 4, floor, opts_.io_stuck_ns);
}

bool LoadQueue::mark_stuck_locked(Io* io, uint64_t now) {
  // A store that hangs on some files (a dead server behind some of them)
  // still serves the rest: the rank's other loads go past these, and a
  // stuck one's completion gives back its place in io_stuck_ instead.
  if (io->stuck || io->stuck_at_ns > now || io_stuck_ >= opts_.io_depth) return false;
  io->stuck = true;
  --io_inflight_;
  ++io_stuck_;
  UCM_INFO(kQueue,
           "rank %u: %s: the store has held this %s for a quarter of its task's time (at most %llu ms); its I/O place "
           "goes to the next (%llu stuck)",
           opts_.local_rank, key_text(io->req.key).c_str(), io->is_load ? "load" : "write",
           static_cast<unsigned long long>(opts_.io_stuck_ns / 1'000'000), static_cast<unsigned long long>(io_stuck_));
  return true;
}

void LoadQueue::on_io_done(IoRequest* req) {
  Io* io = static_cast<Io*>(req->user);
  LoadQueue* q = io->queue;
  bool stuck = false;
  if (q->untrack_io(io, &stuck)) {
    q->drop_late(io);
    return;
  }
  if (req->direct_fallback) add(q->ctr_->direct_fallbacks, 1);
  if (io->is_load) q->load_done(*io);
  else q->write_done(*io);  // dump_path.cpp
  q->cache_->release(io->slot);  // the I/O's own pin
  delete io;
  // The notify under the lock: once anyone reads the count at zero, this
  // store thread touches the queue no more (its owner may then destroy it).
  // For the same reason the copier's ring for depth comes under it too: the
  // copier looks at the depth after reading the bell (sleep_on_waiting), so
  // a ring after the count went down is never lost.
  std::lock_guard<std::mutex> g(q->io_mu_);
  --(stuck ? q->io_stuck_ : q->io_inflight_);
  q->io_cv_.notify_all();
  if (q->depth_wanted_) q->cache_->ring_bell();
}

bool LoadQueue::untrack_io(Io* io, bool* stuck) {
  std::lock_guard<std::mutex> g(io_mu_);
  if (io->expired) return true;
  *stuck = io->stuck;
  const auto at = std::find(live_ios_.begin(), live_ios_.end(), io);
  if (at != live_ios_.end()) {
    *at = live_ios_.back();
    live_ios_.pop_back();
  }
  return false;
}

void LoadQueue::drop_late(Io* io) {
  // Its slot was abandoned (or its write failed) at the deadline; the
  // I/O's pin kept the slot from being re-keyed until now.
  UCM_INFO(kQueue, "rank %u: %s: the store completed an I/O after its deadline; dropped", opts_.local_rank,
           key_text(io->req.key).c_str());
  cache_->release(io->slot);
  if (io->is_load) {  // the key may be sent to the store again
    std::lock_guard<std::mutex> g(io_mu_);
    const auto at = stuck_loads_.find(io->req.key);
    if (at != stuck_loads_.end() && --at->second == 0) stuck_loads_.erase(at);
  }
  // Counted once its pin is gone, so a reader that sees the count (acquire)
  // sees the slot released too (test Hang.AHungWriteThroughFailsItsDumpAtTheDeadline
  // saw the count and then the pin, under load).
  late_completions_.fetch_add(1, std::memory_order_release);
  note_overdue(io, false);
  delete io;
}

void LoadQueue::load_done(Io& io) {
  const IoRequest& req = io.req;
  if (req.result == Result::kOk) {
    // Counted before Ready is published: a task that completes on it (here
    // or on a peer) must already see the bytes in the stats.
    add(ctr_->bytes_from_backend, req.bytes);
    if (cache_->mark_ready(io.slot) != Result::kOk)
      UCM_WARN("rank %u: marking slot %u ready: %s", opts_.local_rank, io.slot, last_error().c_str());
    return;
  }
  add(ctr_->load_failures, 1);
  const bool corrupt = req.result == Result::kCorrupt;
  {
    std::lock_guard<std::mutex> g(io_mu_);
    if (load_errors_.size() >= kLoadErrorsMax) load_errors_.clear();  // a bound: the message is a hint
    load_errors_[req.key] = req.error;
    // Before the mark: our copier reads it once it sees Corrupt.
    if (corrupt) corrupt_notes_[io.slot] = CorruptNote{req.key, req.error};
  }
  // Either wakes every waiter, on every rank; Corrupt is not retried.
  if (corrupt) (void)cache_->mark_corrupt(io.slot);
  else (void)cache_->mark_failed(io.slot);
}

}  // namespace ucm
