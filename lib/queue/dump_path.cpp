// LoadQueue's dump path (load_queue.h, "Dumps"; docs/design.md 9.2). A dump
// runs in the same queue as a load, on the same dispatcher and copier: the
// dispatcher's get() decides whether this rank fills the slot (write_dump),
// writes an existing copy through (start_write) or hands the entry to the
// copier, which waits for the slot (process_dump) and then for the stored
// word's outcome (dump_ready, stored_outcome), beside its other entries and
// never in place. The store's completion of a write-through
// ends here too (write_done). There is no separate dump queue.
#include <algorithm>
#include <string>

#include "common/log.h"
#include "common/time.h"
#include "common/trace.h"
#include "ctrl/layout.h"
#include "queue/load_queue.h"
#include "queue/load_queue_impl.h"

namespace ucm {
using load_queue_impl::add;

Result LoadQueue::write_dump(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot, CopyStream* stream) {
  UCM_TRACE(TraceRange::kDump);
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
  io->deadline_ns = t->deadline_ns();
  io->stuck_at_ns = stuck_at(*t);
  io->req.key = t->entries()[index].key;
  io->req.buf = cache_->data_at(slot);
  io->req.bytes = cache_->ctrl().slot_bytes();
  io->req.done = &LoadQueue::on_io_done;
  io->req.user = io;
  track_io(io);
  backend_->dump(&io->req);
}

void LoadQueue::write_done(Io& io) {
  const IoRequest& req = io.req;
  // The stored word first: once the task is done, a new dump of the key
  // must find the outcome (and write again after a failure).
  if (cache_->finish_write(io.slot, req.result == Result::kOk) != Result::kOk)
    UCM_WARN("rank %u: ending the write-through of slot %u: %s", opts_.local_rank, io.slot, last_error().c_str());
  if (req.result == Result::kOk) {
    add(ctr_->dumps, 1);
    add(ctr_->bytes_dumped, req.bytes);
    io.task->entry_ok();
  } else {
    // The slot stays Ready (its bytes are right); the store did not take
    // them: the next dump of the key writes them again.
    add(ctr_->failed_shards, 1);
    io.task->entry_failed(io.index, Result::kBackend,
                          key_text(req.key) + ": write-through failed: " + std::string(req.error));
  }
}

bool LoadQueue::process_dump(Item& it) {
  const TaskEntry& e = it.task->entries()[it.index];
  if (it.on_stored) {  // a write-through of these bytes was in flight
    const Look l = stored_outcome(it);
    if (l != Look::kReady) return l == Look::kEnded;
    return dump_ready(it);  // its writer died: claim the write ourselves
  }
  uint32_t w = it.slotless ? 0 : cache_->word(it.slot);
  for (;;) {
    Look look = Look::kWaiting;
    if (it.slotless && !look_for_slot(it, &w, &look)) return look == Look::kEnded;
    const State s = SlotView(w).state();
    if (s == State::kReady) return dump_ready(it);
    const bool unowned = SlotView(w).is_unowned();
    if ((s == State::kFailed || unowned) && !cache_->holds_key(it.slot, e.key)) {
      if (!drop_lost_slot(it)) return true;
      continue;  // look_for_slot gets the key again
    }
    if (s == State::kFailed || s == State::kCorrupt || unowned) {
      if (s == State::kFailed && ++it.failures > opts_.load_retries) {
        fail_item(it, Result::kBackend,
                  key_text(e.key) + ": the slot failed " + std::to_string(it.failures) + " times while it was filled");
        return true;
      }
      // Nobody else will fill it: fill it from our bytes and write them
      // through (a corrupt copy is replaced, in the cache and the store).
      if (cache_->try_take_over(it.slot, w, true)) {
        dump_as_owner(it);
        return true;
      }
      w = cache_->word(it.slot);
      continue;
    }
    // Idle with an owner: the copier waits on its word with its other entries.
    const Look l = owner_filling(it, &w);
    if (l != Look::kReady) return l == Look::kEnded;
  }
}

void LoadQueue::dump_as_owner(Item& it) {
  count_wait(it);  // the entry ends with its write-through
  const Result r = write_dump(it.task, it.index, it.slot, copy_stream_.get());
  if (r != Result::kOk) {
    (void)cache_->mark_failed(it.slot);
    fail_item(it, r, key_text(it.task->entries()[it.index].key) + ": " + last_error());
    return;
  }
  cache_->release(it.slot);  // the entry completes with the write-through
}

bool LoadQueue::dump_ready(Item& it) {
  const TaskEntry& e = it.task->entries()[it.index];
  for (;;) {
    WriteClaim wc = WriteClaim::kStored;
    uint32_t sw = 0;
    const Result r = cache_->claim_write(it.slot, &wc, &sw);
    if (r != Result::kOk) {
      fail_item(it, r, key_text(e.key) + ": " + last_error());
      return true;
    }
    if (wc != WriteClaim::kBeingWritten) {
      count_wait(it);
      if (wc == WriteClaim::kWriter) start_write(it.task, it.index, it.slot);  // completes the entry
      else it.task->entry_ok();
      cache_->release(it.slot);
      return true;
    }
    // Another write of these bytes is in flight (or ours, from an earlier
    // task): its outcome is ours. The copier waits on its stored word with
    // its other entries, never in place (a hung store held every entry
    // behind this one until this one's deadline).
    it.on_stored = true;
    it.stored_seen = sw;
    const Look l = stored_outcome(it);
    if (l != Look::kReady) return l == Look::kEnded;
    // NotStored: its writer died; claim the write ourselves.
  }
}

LoadQueue::Look LoadQueue::stored_outcome(Item& it) {
  const TaskEntry& e = it.task->entries()[it.index];
  uint32_t sw = cache_->stored_word(it.slot);
  if (((sw ^ it.stored_seen) & ~kStoredWaiters) == 0) {
    if (stopping()) {
      fail_item(it, Result::kFinalized, key_text(e.key) + ": the cache was finalized while it was written through");
      return Look::kEnded;
    }
    if (now_ns() < it.task->deadline_ns()) return Look::kWaiting;
    // The last look: at a passed deadline this reaps a dead writer and reads once more.
    if (cache_->wait_store_change(it.slot, it.stored_seen, it.task->deadline_ns(), &sw) != Result::kOk) {
      fail_item(it, Result::kTimeout,
                key_text(e.key) + ": the write-through by local rank " + std::to_string(stored_writer(it.stored_seen)) +
                    " did not end by the task's deadline");
      return Look::kEnded;
    }
  }
  it.on_stored = false;
  switch (static_cast<StoreState>(sw & kStoredStateMask)) {
    case StoreState::kWriting:  // a new writer took over a dead one's write
      it.on_stored = true;
      it.stored_seen = sw;
      return Look::kWaiting;
    case StoreState::kWriteFailed:
      count_wait(it);
      add(ctr_->failed_shards, 1);
      cache_->release(it.slot);
      it.task->entry_failed(it.index, Result::kBackend,
                            key_text(e.key) + ": local rank " + std::to_string(stored_writer(sw)) +
                                "'s write-through failed: the store refused the bytes, or did not take them by "
                                "that task's deadline (they are not known to be in the store)");
      return Look::kEnded;
    case StoreState::kStored:
      count_wait(it);
      cache_->release(it.slot);
      it.task->entry_ok();
      return Look::kEnded;
    default:
      return Look::kReady;  // NotStored: its writer died
  }
}

}  // namespace ucm
