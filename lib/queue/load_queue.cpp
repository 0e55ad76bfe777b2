#include "queue/load_queue.h"


#include <algorithm>
#include <cinttypes>
#include <cstdio>

#include "common/log.h"
#include "common/time.h"
#include "ctrl/layout.h"
#include "queue/rearrange.h"

namespace ucm {
namespace {

constexpr size_t kCopyWindow = 8;               // copies in flight before the copier waits
constexpr uint64_t kStopCheckNs = 20'000'000;   // how often blocked threads look at stopping_
constexpr uint64_t kDeferNapNs = 20'000;        // between looks at a peer's deferred entries
constexpr uint64_t kLegacyStepNapNs = 50'000;   // order=natural: between looks at the shard in flight

inline void add(std::atomic<uint64_t>& c, uint64_t v) { c.fetch_add(v, std::memory_order_relaxed); }

}  // namespace

// One backend I/O into a slot. Holds its own pin on the slot until done.
struct LoadQueue::Io {
  IoRequest req;
  LoadQueue* queue;
  std::shared_ptr<Task> task;  // dumps: the entry completes with the write
  uint32_t index;
  uint32_t slot;
  bool is_load;
};

LoadQueue::LoadQueue(CacheBuffer* cache, Backend* backend, CopyEngine* engine, const Placement& placement,
                     const QueueOptions& opts)
    : cache_(cache),
      backend_(backend),
      engine_(engine),
      placement_(placement),
      opts_(opts),
      ctr_(&cache->ctrl().rank(opts.local_rank).counters) {}

LoadQueue::~LoadQueue() { stop(); }

Result LoadQueue::start() {
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
  }
  pending_cv_.notify_all();
  copier_cv_.notify_all();
  io_cv_.notify_all();
  if (dispatcher_.joinable()) dispatcher_.join();
  if (copier_.joinable()) copier_.join();
}

uint64_t LoadQueue::io_in_flight() const {
  std::lock_guard<std::mutex> g(io_mu_);
  return io_inflight_;
}

Result LoadQueue::submit(const std::shared_ptr<Task>& t) {
  t->set_on_done([this](const Task& done) { record_done(done); });
  std::lock_guard<std::mutex> g(mu_);
  if (stopping_) return fail(Result::kFinalized, "the cache is being finalized");
  if (pending_.size() >= opts_.pending_limit)
    return fail(Result::kBusy, "%zu tasks already wait for this rank's dispatcher (the limit)", pending_.size());
  pending_.push_back(t);
  pending_cv_.notify_one();
  return Result::kOk;
}

void LoadQueue::record_done(const Task& t) {
  const uint64_t us = t.latency_ns() / 1000;
  const int bucket = us == 0 ? 0 : std::min(31, 63 - __builtin_clzll(us));
  add(ctr_->latency_us_log2[bucket], 1);
}

std::string LoadQueue::key_text(const Key& k) const {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "block %016" PRIx64 "%016" PRIx64 " shard %u", k.block.hi, k.block.lo, k.shard);
  return buf;
}

bool LoadQueue::task_pending() {
  std::lock_guard<std::mutex> g(mu_);
  return !pending_.empty() || stopping_;
}

bool LoadQueue::stopping() {
  std::lock_guard<std::mutex> g(mu_);
  return stopping_;
}

// ---- dispatcher -----------------------------------------------------------------

void LoadQueue::dispatcher_main() {
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
      if (stopping_) {
        lk.unlock();
        for (uint32_t i = 0; i < t->entries().size(); ++i)
          t->entry_failed(i, Result::kFinalized, "the cache was finalized before the task ran");
        continue;
      }
    }
    dispatch(t);
  }
}

Result LoadQueue::get_with_backpressure(const Key& k, const Task& t, GetResult* g) {
  for (;;) {
    const Result r = cache_->get(k, g);
    if (r != Result::kNoSpace) return r;
    // Every slot is pinned: our copier (and the peers') drain and release.
    if (now_ns() >= t.deadline_ns())
      return fail(Result::kNoSpace, "%s: no free cache slot before the task's deadline (every slot stayed pinned)",
                  key_text(k).c_str());
    if (stopping()) return fail(Result::kFinalized, "the cache was finalized");
    sleep_for_ns(opts_.no_space_backoff_ns);
  }
}

void LoadQueue::dispatch(const std::shared_ptr<Task>& t) {
  const auto& entries = t->entries();
  add(ctr_->tasks, 1);
  add(ctr_->shards, entries.size());
  std::vector<uint32_t> order;
  rearrange_order(static_cast<uint32_t>(entries.size()), opts_.local_rank, opts_.local_size, opts_.rotate, &order);
  // Our own stride comes first in the rotated order.
  size_t own = order.size();
  if (opts_.rotate && opts_.local_size > 1) {
    own = 0;
    while (own < order.size() && order[own] % opts_.local_size == opts_.local_rank) ++own;
  }
  for (size_t n = 0; n < own; ++n) {
    if (!dispatch_entry(t, order[n])) return fail_rest(t, order, n + 1);
    if (!opts_.rotate) wait_legacy_step(*t, entries.size() - (n + 1));
  }
  // The peers' strides: a rank that arrives first would otherwise own every
  // shard its peers have not asked for yet, and the node's loads would run
  // from one rank. So a peer's entry waits (at most owner_grace) until some
  // rank loads it; only what nobody took by then is ours to load.
  std::vector<uint32_t> deferred(order.begin() + static_cast<long>(own), order.end());
  const uint64_t grace_end = now_ns() + opts_.owner_grace_ns;
  while (!deferred.empty()) {
    const bool expired = now_ns() >= grace_end;
    size_t kept = 0;
    for (size_t n = 0; n < deferred.size(); ++n) {
      const uint32_t i = deferred[n];
      if (!expired && !cache_->being_served(entries[i].key)) {
        deferred[kept++] = i;
        continue;
      }
      if (!dispatch_entry(t, i)) {  // stopping: entry i is failed; so is every entry not yet dispatched
        std::vector<uint32_t> rest(deferred.begin(), deferred.begin() + static_cast<long>(kept));
        rest.insert(rest.end(), deferred.begin() + static_cast<long>(n) + 1, deferred.end());
        return fail_rest(t, rest, 0);
      }
    }
    deferred.resize(kept);
    if (!deferred.empty()) sleep_for_ns(kDeferNapNs);
  }
  if (t->kind() == TaskKind::kLoad && opts_.prealloc) idle_prealloc(*t);
}

void LoadQueue::wait_legacy_step(const Task& t, size_t left) {
  // The legacy (order=natural) dispatcher finished each shard before asking
  // for the next: its Get waited under the node lock, so every rank stepped
  // through the task in lockstep with one backend load per step (seed 2.1).
  // Reproduced here so the study's control group behaves like the old code;
  // it polls, as the old code did.
  while (t.remaining() > left && !stopping()) sleep_for_ns(kLegacyStepNapNs);
}

void LoadQueue::fail_rest(const std::shared_ptr<Task>& t, const std::vector<uint32_t>& order, size_t from) {
  for (size_t m = from; m < order.size(); ++m)
    t->entry_failed(order[m], Result::kFinalized, "the cache was finalized while the task ran");
}

bool LoadQueue::dispatch_entry(const std::shared_ptr<Task>& t, uint32_t i) {
  const auto& entries = t->entries();
  if (stopping()) {
    t->entry_failed(i, Result::kFinalized, "the cache was finalized while the task ran");
    return false;
  }
  GetResult g;
  Result r = get_with_backpressure(entries[i].key, *t, &g);
  if (r != Result::kOk) {
    add(ctr_->failed_shards, 1);
    t->entry_failed(i, r, key_text(entries[i].key) + ": " + last_error());
    return true;
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
        return true;
      }
      if (wc != WriteClaim::kBeingWritten) {
        if (wc == WriteClaim::kWriter) start_write(t, i, g.slot);  // completes the entry
        else t->entry_ok();
        cache_->release(g.slot);
        return true;
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
      return true;
    }
  } else if (g.kind == GetKind::kOwner) {
    r = start_load(t, i, g.slot);
    if (r != Result::kOk) {
      (void)cache_->mark_failed(g.slot);
      cache_->release(g.slot);
      add(ctr_->failed_shards, 1);
      t->entry_failed(i, r, key_text(entries[i].key) + ": " + last_error());
      return true;
    }
    g.word = cache_->ctrl().slot(g.slot).word.load(std::memory_order_acquire);
  }
  std::lock_guard<std::mutex> lk(mu_);
  items_.push_back(Item{t, i, g.slot, g.word, 0});
  copier_cv_.notify_one();
  return true;
}

void LoadQueue::idle_prealloc(const Task& t) {
  const uint32_t spb = cache_->ctrl().shards_per_block();
  for (const TaskEntry& e : t.entries()) {
    if (task_pending()) return;  // a task arrived: the idle window is over
    if (e.key.shard + 1 >= spb) continue;
    Key next = e.key;
    next.shard += 1;
    PreallocOutcome o;
    if (cache_->prealloc(next, &o) != Result::kOk) return;
    if (o == PreallocOutcome::kNoSpace) return;  // nothing free without evicting: stop
  }
}

Result LoadQueue::start_load(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot) {
  {
    std::unique_lock<std::mutex> lk(io_mu_);
    while (io_inflight_ >= opts_.io_depth) {
      io_cv_.wait_for(lk, std::chrono::nanoseconds(kStopCheckNs));
      lk.unlock();
      const bool stop_now = stopping();
      lk.lock();
      if (stop_now) break;  // let it go through: the backend completes it on shutdown
    }
    ++io_inflight_;
  }
  cache_->add_pin(slot);
  auto* io = new Io{IoRequest{}, this, nullptr, index, slot, true};
  io->req.key = t->entries()[index].key;
  io->req.buf = cache_->data_at(slot);
  io->req.bytes = cache_->ctrl().slot_bytes();
  io->req.done = &LoadQueue::on_io_done;
  io->req.user = io;
  add(ctr_->backend_loads, 1);
  backend_->load(&io->req);
  return Result::kOk;
}

Result LoadQueue::write_dump(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot, CopyStream* stream) {
  const TaskEntry& e = t->entries()[index];
  const uint64_t bytes = cache_->ctrl().slot_bytes();
  uint64_t ticket = 0;
  UCM_CHECK(stream->copy(cache_->data_at(slot), e.src, bytes, &ticket));
  UCM_CHECK(stream->wait(ticket));
  // Ready at once: peers hit it while it is written through, and a peer's
  // dump of it waits for this write's outcome.
  UCM_CHECK(cache_->mark_ready_for_write(slot));
  start_write(t, index, slot);
  return Result::kOk;
}

void LoadQueue::start_write(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot) {
  // The caller holds a reference and is the slot's writer (stored word).
  {
    std::lock_guard<std::mutex> lk(io_mu_);
    ++io_inflight_;
  }
  cache_->add_pin(slot);
  auto* io = new Io{IoRequest{}, this, t, index, slot, false};
  io->req.key = t->entries()[index].key;
  io->req.buf = cache_->data_at(slot);
  io->req.bytes = cache_->ctrl().slot_bytes();
  io->req.done = &LoadQueue::on_io_done;
  io->req.user = io;
  backend_->dump(&io->req);
}

void LoadQueue::on_io_done(IoRequest* req) {
  Io* io = static_cast<Io*>(req->user);
  LoadQueue* q = io->queue;
  if (req->direct_fallback) add(q->ctr_->direct_fallbacks, 1);
  if (io->is_load) {
    if (req->result == Result::kOk) {
      // Counted before Ready is published: a task that completes on it (here
      // or on a peer) must already see the bytes in the stats.
      add(q->ctr_->bytes_from_backend, req->bytes);
      if (q->cache_->mark_ready(io->slot) != Result::kOk)
        UCM_WARN("rank %u: marking slot %u ready: %s", q->opts_.local_rank, io->slot, last_error().c_str());
    } else {
      add(q->ctr_->load_failures, 1);
      const bool corrupt = req->result == Result::kCorrupt;
      {
        std::lock_guard<std::mutex> g(q->io_mu_);
        q->last_backend_error_ = req->error;
        // Before the mark: our copier reads it once it sees Corrupt.
        if (corrupt) q->corrupt_notes_[io->slot] = CorruptNote{req->key, req->error};
      }
      // Either wakes every waiter, on every rank; Corrupt is not retried.
      if (corrupt) (void)q->cache_->mark_corrupt(io->slot);
      else (void)q->cache_->mark_failed(io->slot);
    }
  } else {
    // The stored word first: once the task is done, a new dump of the key
    // must find the outcome (and write again after a failure).
    if (q->cache_->finish_write(io->slot, req->result == Result::kOk) != Result::kOk)
      UCM_WARN("rank %u: ending the write-through of slot %u: %s", q->opts_.local_rank, io->slot,
               last_error().c_str());
    if (req->result == Result::kOk) {
      add(q->ctr_->dumps, 1);
      add(q->ctr_->bytes_dumped, req->bytes);
      io->task->entry_ok();
    } else {
      // The slot stays Ready (its bytes are right); the store did not take
      // them: the next dump of the key writes them again.
      add(q->ctr_->failed_shards, 1);
      io->task->entry_failed(io->index, Result::kBackend,
                             q->key_text(req->key) + ": write-through failed: " + std::string(req->error));
    }
  }
  q->cache_->release(io->slot);  // the I/O's own pin
  {
    std::lock_guard<std::mutex> g(q->io_mu_);
    --q->io_inflight_;
  }
  q->io_cv_.notify_all();
  delete io;
}

// ---- copier -------------------------------------------------------------------

void LoadQueue::copier_main() {
  if (bind_this_thread(placement_, ThreadRole::kCopier) != Result::kOk)
    UCM_WARN("copier of rank %u: %s", opts_.local_rank, last_error().c_str());
  for (;;) {
    Item it;
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (items_.empty() && !copies_.empty()) {
        lk.unlock();
        retire_copies(true);  // nothing else to do: finish what is in flight
        lk.lock();
      }
      copier_cv_.wait(lk, [&] { return stopping_ || !items_.empty(); });
      if (items_.empty()) break;  // stopping and drained
      it = std::move(items_.front());
      items_.pop_front();
    }
    process(it);
    retire_copies(copies_.size() >= kCopyWindow);
  }
  retire_copies(true);
}

void LoadQueue::fail_item(Item& it, Result r, const std::string& why) {
  cache_->release(it.slot);
  add(ctr_->failed_shards, 1);
  it.task->entry_failed(it.index, r, why);
}

bool LoadQueue::await_change(Item& it, uint32_t* w, uint64_t started) {
  // Idle with an owner: somebody (maybe us) is filling it. Sleep on the word.
  const TaskEntry& e = it.task->entries()[it.index];
  if (stopping()) {
    fail_item(it, Result::kFinalized, key_text(e.key) + ": the cache was finalized while waiting for it");
    return false;
  }
  const uint64_t until = std::min(it.task->deadline_ns(), now_ns() + kStopCheckNs);
  uint32_t now_word = *w;
  const Result r = cache_->wait_for_change(it.slot, *w, until, &now_word);
  if (r == Result::kOk) {
    *w = now_word;
  } else if (r == Result::kTimeout) {
    if (now_ns() >= it.task->deadline_ns()) {
      add(ctr_->wait_ns, now_ns() - started);
      fail_item(it, Result::kTimeout,
                key_text(e.key) + ": still loading by local rank " + std::to_string(word_owner(*w)) +
                    " at the task's deadline");
      return false;
    }
    // A piece of the wait ended (wait_for_change looked at the owner's
    // liveness before it returned); wait again.
  } else {
    fail_item(it, r, key_text(e.key) + ": " + last_error());
    return false;
  }
  return true;
}

std::string LoadQueue::corrupt_text(const Key& k, uint32_t slot, uint32_t w) {
  const uint32_t by = word_owner(w);
  if (by == opts_.local_rank) {
    std::lock_guard<std::mutex> g(io_mu_);
    const auto it = corrupt_notes_.find(slot);
    if (it != corrupt_notes_.end() && it->second.key == k) return key_text(k) + ": " + it->second.error;
  }
  return key_text(k) + ": the store's copy failed its checks (loaded by local rank " + std::to_string(by) +
         "); not retried";
}

void LoadQueue::process(Item& it) {
  if (it.task->kind() == TaskKind::kDump) return process_dump(it);
  const TaskEntry& e = it.task->entries()[it.index];
  const uint64_t started = now_ns();
  uint32_t w = it.word;
  for (;;) {
    const State s = word_state(w);
    if (s == State::kReady) break;
    if (s == State::kCorrupt) {
      add(ctr_->wait_ns, now_ns() - started);
      fail_item(it, Result::kCorrupt, corrupt_text(e.key, it.slot, w));
      return;
    }
    const bool unowned = s == State::kIdle && word_owner(w) == kNoOwner;
    if (s == State::kFailed || unowned) {
      if (s == State::kFailed && ++it.failures > opts_.load_retries) {
        std::string why;
        {
          std::lock_guard<std::mutex> g(io_mu_);
          why = last_backend_error_;
        }
        add(ctr_->wait_ns, now_ns() - started);
        fail_item(it, Result::kBackend,
                  key_text(e.key) + ": the backend load failed " + std::to_string(it.failures) + " times" +
                      (why.empty() ? "" : " (last error here: " + why + ")"));
        return;
      }
      if (cache_->try_take_over(it.slot, w)) {
        const Result r = start_load(it.task, it.index, it.slot);
        if (r != Result::kOk) {
          (void)cache_->mark_failed(it.slot);
          fail_item(it, r, key_text(e.key) + ": " + last_error());
          return;
        }
      }
      w = cache_->ctrl().slot(it.slot).word.load(std::memory_order_acquire);
      continue;
    }
    if (!await_change(it, &w, started)) return;
  }
  add(ctr_->wait_ns, now_ns() - started);
  uint64_t ticket = 0;
  Result r = copy_stream_->copy(e.dst, cache_->data_at(it.slot), cache_->ctrl().slot_bytes(), &ticket);
  if (r != Result::kOk) {
    fail_item(it, r, key_text(e.key) + ": " + last_error());
    return;
  }
  // A failed flush may have put the copy in flight: it keeps its pin until
  // the stream settles its ticket, and retire_copies() then fails the entry.
  if (copy_stream_->flush() != Result::kOk) UCM_INFO(kQueue, "%s: %s", key_text(e.key).c_str(), last_error().c_str());
  copies_.push_back(Copy{it.task, it.index, it.slot, ticket});
}

void LoadQueue::process_dump(Item& it) {
  const TaskEntry& e = it.task->entries()[it.index];
  const uint64_t started = now_ns();
  uint32_t w = it.word;
  for (;;) {
    const State s = word_state(w);
    if (s == State::kReady) return dump_ready(it, started);
    const bool unowned = s == State::kIdle && word_owner(w) == kNoOwner;
    if (s == State::kFailed || s == State::kCorrupt || unowned) {
      if (s == State::kFailed && ++it.failures > opts_.load_retries) {
        add(ctr_->wait_ns, now_ns() - started);
        fail_item(it, Result::kBackend,
                  key_text(e.key) + ": the slot failed " + std::to_string(it.failures) + " times while it was filled");
        return;
      }
      // Nobody else will fill it: fill it from our bytes and write them
      // through (a corrupt copy is replaced, in the cache and the store).
      if (cache_->try_take_over(it.slot, w, true)) {
        add(ctr_->wait_ns, now_ns() - started);
        const Result r = write_dump(it.task, it.index, it.slot, copy_stream_.get());
        if (r != Result::kOk) {
          (void)cache_->mark_failed(it.slot);
          fail_item(it, r, key_text(e.key) + ": " + last_error());
          return;
        }
        cache_->release(it.slot);
        return;  // the entry completes with the write-through
      }
      w = cache_->ctrl().slot(it.slot).word.load(std::memory_order_acquire);
      continue;
    }
    if (!await_change(it, &w, started)) return;
  }
}

void LoadQueue::dump_ready(Item& it, uint64_t started) {
  const TaskEntry& e = it.task->entries()[it.index];
  for (;;) {
    WriteClaim wc = WriteClaim::kStored;
    uint32_t sw = 0;
    const Result r = cache_->claim_write(it.slot, &wc, &sw);
    if (r != Result::kOk) {
      add(ctr_->wait_ns, now_ns() - started);
      fail_item(it, r, key_text(e.key) + ": " + last_error());
      return;
    }
    if (wc != WriteClaim::kBeingWritten) {
      add(ctr_->wait_ns, now_ns() - started);
      if (wc == WriteClaim::kWriter) start_write(it.task, it.index, it.slot);  // completes the entry
      else it.task->entry_ok();
      cache_->release(it.slot);
      return;
    }
    // Another write of these bytes is in flight (or ours, from an earlier
    // task): its outcome is ours.
    for (;;) {
      if (stopping()) {
        fail_item(it, Result::kFinalized, key_text(e.key) + ": the cache was finalized while it was written through");
        return;
      }
      const uint64_t until = std::min(it.task->deadline_ns(), now_ns() + kStopCheckNs);
      uint32_t now_sw = sw;
      const Result wr = cache_->wait_store_change(it.slot, sw, until, &now_sw);
      if (wr == Result::kTimeout) {
        if (now_ns() < it.task->deadline_ns()) continue;
        add(ctr_->wait_ns, now_ns() - started);
        fail_item(it, Result::kTimeout,
                  key_text(e.key) + ": the write-through by local rank " + std::to_string(stored_writer(sw)) +
                      " did not end by the task's deadline");
        return;
      }
      if (wr != Result::kOk) {
        fail_item(it, wr, key_text(e.key) + ": " + last_error());
        return;
      }
      const StoreState st = static_cast<StoreState>(now_sw & kStoredStateMask);
      if (st == StoreState::kWriting) {  // a new writer took over a dead one's write
        sw = now_sw;
        continue;
      }
      if (st == StoreState::kWriteFailed) {
        add(ctr_->wait_ns, now_ns() - started);
        add(ctr_->failed_shards, 1);
        cache_->release(it.slot);
        it.task->entry_failed(it.index, Result::kBackend,
                              key_text(e.key) + ": local rank " + std::to_string(stored_writer(now_sw)) +
                                  "'s write-through failed (the store did not take the bytes)");
        return;
      }
      if (st == StoreState::kStored) {
        add(ctr_->wait_ns, now_ns() - started);
        cache_->release(it.slot);
        it.task->entry_ok();
        return;
      }
      break;  // NotStored: its writer died; claim the write ourselves
    }
  }
}

void LoadQueue::retire_copies(bool all) {
  while (!copies_.empty()) {
    Copy& c = copies_.front();
    if (!copy_stream_->done(c.ticket)) {
      if (!all) return;
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
