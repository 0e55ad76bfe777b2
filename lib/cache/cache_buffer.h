// CacheBuffer: the node-shared shard cache as one rank sees it (ctrl + data).
//
// Every local rank joins the control plane (BufferCtrl::join) and builds one
// over the same BufferCtrl and BufferData (a
// scheduler rank over the control plane only: data_at() is null, it may
// exists()/touch() and nothing that needs bytes). The object does not own the
// planes; it is cheap and thread-safe: a rank's dispatcher, copier and app
// threads may share it.
//
// The protocol, for one key:
//   get(k)      -> kHit    Ready; pinned; read data_at(slot), then release().
//               -> kOwner  this rank must fill data_at(slot), then mark_ready()
//                          or mark_failed(), then release(). Holds the
//                          owner's reference (the hold bit, slot_word.h),
//                          which counts as a pin of this rank.
//               -> kWaiter another rank is loading it; pinned. Loop on
//                          wait_for_change(slot, word) until Ready (read,
//                          release) or Failed (try_take_over() -> owner, or
//                          wait again on the new word).
//                          A Failed slot that no longer holds k was
//                          abandoned by its owner at its deadline
//                          (abandon_load(): its I/O may still write into
//                          it): release() it and get(k) again.
//               -> Result::kNoSpace when every slot is pinned, or
//                  protected: loaded for a task that a copier rank has
//                  not taken yet, within the grace (ctrl/protect.h).
//                  A Corrupt slot (the store's copy failed its checks) is
//                  answered kWaiter with its word: the caller fails the load
//                  with UCM_ERR_CORRUPT, or, to dump the key, replaces the
//                  bytes (try_take_over(slot, w, true)). See slot_word.h.
// Dumps, on a Ready slot (pinned or held), keep the node's promise that a
// dump which says OK is in the store, through the slot's stored word
// (layout.h): an owner that fills the slot from the caller marks it
// mark_ready_for_write() and writes it through; anyone else asks
// claim_write(): kStored (done), kWriter (this rank writes the slot's bytes
// through), or kBeingWritten (wait_store_change() until the writer's
// outcome). The writer ends with finish_write(ok).
// A hit takes no lock: it walks the chain with acquire loads, pins (pins.h),
// then re-checks key and state. A miss takes the key's bucket lock, looks
// again, and installs a CLOCK victim. Every change of the slot's futex word
// is a transition of ctrl/slot_word.h's table (T0-T10: who may make it, and
// which release each acquire pairs with); the code names its labels. Waits are bounded, check the owner's liveness every
// slice, and recover a dead owner's slot (recovery.h).
//
// Guarantees: a key is resident in at most one slot; a slot is Ready only after
// its owner called mark_ready() or mark_ready_for_write(); a pinned slot is
// never re-keyed; a Ready slot's stored word says Stored only after a load or
// a successful finish_write(). Not
// guaranteed: that a hint from exists() is still true when acted on.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>

#include "common/key.h"
#include "common/result.h"
#include "common/small_buffer.h"
#include "common/time.h"
#include "ctrl/buffer_ctrl.h"
#include "ctrl/protect_relax.h"
#include "data/buffer_data.h"

namespace ucm {

struct CacheOptions {
  uint32_t rank = 0;                // local rank: pins, owner, lock holder
  WaitMode wait = WaitMode::kFutex; // kPoll: the legacy lock/read/unlock/sleep loop
  uint64_t liveness_slice_ms = 50;  // a blocked call re-checks whom it waits on this often
  uint64_t poll_interval_ms = 10;   // kPoll only: sleep between polls
  uint64_t lock_timeout_ms = 10000; // bound on waiting for a live bucket-lock holder or claimer
};

enum class GetKind : uint8_t { kHit, kOwner, kWaiter };

struct GetResult {
  GetKind kind = GetKind::kHit;
  uint32_t slot = kNoSlot;
  uint32_t word = 0;           // the futex word as seen (waiters pass it to wait_for_change)
  bool took_prealloc = false;  // kOwner by taking over a preallocated slot
  bool evicted = false;        // kOwner: a resident key was evicted for this one
};

// Whom a get() serves (ctrl/protect.h): the ordinal of the caller's load
// task, which an Owner answer stamps into the slot's guard and a take is
// recorded for, and whether the answer is a take at all (a load's; a dump's
// hit or wait copies nothing to the rank, so it takes nothing).
struct GetFor {
  uint32_t ordinal = 0;
  bool take = true;
  // A miss's eviction waits for this rank's own takes at `ordinal` (protect.h,
  // the order of waits); false: for none (a dump's get, which takes nothing).
  // Dropping it once the dispatcher had taken all it could of the task
  // (take_served) was tried: slots it was still to take went, and a task of
  // more keys than the cache loaded shards twice.
  bool wait_self = true;
  // When the caller's task ends (steady ns; 0: none): a wait inside get() for
  // a live bucket-lock holder or claimer ends then, or at lock_timeout_ms,
  // whichever comes first, so that a task with many keys behind a stopped
  // holder fails at its deadline, not after a lock timeout per key.
  uint64_t deadline_ns = 0;
  // How far the protection holds for this get (protect.h, ProtectRelax): the
  // load queue relaxes it for a get that has waited for space a while.
  ProtectRelax relax = ProtectRelax::kStrict;
};

enum class WriteClaim : uint8_t { kStored, kWriter, kBeingWritten };

enum class PreallocOutcome : uint8_t { kPlacedRegular, kPlacedReserved, kAlreadyPresent, kBusy, kNoSpace };

using TouchHook = void (*)(void* ctx, const BlockId* blocks, size_t n);

// Keys at a stride: key i at `first` plus i * stride bytes (a field of the
// caller's records, as the load queue's task entries hold theirs), so that a
// batch walks the caller's array without copying the keys out of it.
struct KeyRun {
  const Key* first = nullptr;
  size_t stride = sizeof(Key);
  const Key& operator[](size_t i) const {
    return *reinterpret_cast<const Key*>(reinterpret_cast<const uint8_t*>(first) + i * stride);
  }
};

class CacheBuffer {
 public:
  CacheBuffer(const BufferCtrl* ctrl, const BufferData* data, const CacheOptions& opts);

  [[nodiscard]] Result get(const Key& k, GetResult* out, GetFor f);
  // For the task set_task_ordinal() names, as a load.
  [[nodiscard]] Result get(const Key& k, GetResult* out) {
    return get(k, out, GetFor{task_ordinal_.load(std::memory_order_relaxed), true});
  }
  // The ordinal of the load task this rank's gets without a GetFor serve
  // from now on: an Owner answer stamps it into the slot's guard
  // (ctrl/protect.h), so the slot waits only for copiers not past that task,
  // and a take is recorded for it. Also the stamp of a prealloc's takeover
  // (try_take_over). The load queue's dispatcher sets it before each load
  // task and passes each get the ordinal of the task it serves. 0 until set.
  void set_task_ordinal(uint32_t ordinal) { task_ordinal_.store(ordinal, std::memory_order_relaxed); }
  uint32_t task_ordinal() const { return task_ordinal_.load(std::memory_order_relaxed); }
  // A hit or nothing, for a batch (the load queue's inline path,
  // queue/load_queue.cpp run_inline): when every keys[0..n) is resident
  // and Ready, pins each, marks it accessed, and returns true with
  // slots[0..n) filled (n references: release_ready_pins() them); the caller
  // then numbers its task and takes the batch for it (take_all), as get()'s
  // hit takes its slot. The caller counts the hits
  // (RankCounters.hits) once it uses them. Anything else for any key
  // (absent, being filled, Failed, Corrupt, claimed by an evictor, a corrupt
  // chain, a scheduler rank): false, with nothing held, installed or taken
  // over. Each key is hashed once, the loads of every key's bucket head and
  // slot record are started before the first pin (prefetch_records), and
  // references_held() is counted once per batch.
  [[nodiscard]] bool pin_all_ready(size_t n, KeyRun keys, uint32_t* slots);
  // The takes (ctrl/protect.h, guard_take) of the slots[0..n) a
  // pin_all_ready() batch pinned, for the caller's load task `ordinal`.
  void take_all(const uint32_t* slots, size_t n, uint32_t ordinal);
  // Drops the pins pin_all_ready() took.
  void release_ready_pins(const uint32_t* slots, size_t n) {
    unpin_ready(slots, n);
    tally(-static_cast<int64_t>(n));
  }
  // Ready, with bytes that came from the store (a load).
  [[nodiscard]] Result mark_ready(uint32_t slot);
  // Ready, with bytes the caller wrote and is about to write through: the
  // stored word says Writing by this rank in the same publication.
  [[nodiscard]] Result mark_ready_for_write(uint32_t slot);
  [[nodiscard]] Result mark_failed(uint32_t slot);
  // Failed for good: the store's copy failed its checks (layout.h, Corrupt).
  [[nodiscard]] Result mark_corrupt(uint32_t slot);
  // On a Ready slot this rank holds a reference to: whether its bytes are in
  // the store, and if nobody is writing them, makes this rank the writer
  // (one CAS: one writer per node). *seen is the stored word it acted on.
  [[nodiscard]] Result claim_write(uint32_t slot, WriteClaim* out, uint32_t* seen);
  // Ends this rank's write-through of `slot`: Stored, or WriteFailed.
  [[nodiscard]] Result finish_write(uint32_t slot, bool ok);
  // Returns kOk with *now_stored once the slot's stored word differs from
  // `observed`, kTimeout at the deadline (absolute ns). Checks the writer's
  // liveness every slice: a dead writer's write becomes NotStored.
  [[nodiscard]] Result wait_store_change(uint32_t slot, uint32_t observed, uint64_t deadline_ns,
                                         uint32_t* now_stored);
  // Returns kOk with *now_word once the slot's word differs from `observed`
  // (state or owner changed), kTimeout at the deadline (absolute ns).
  [[nodiscard]] Result wait_for_change(uint32_t slot, uint32_t observed, uint64_t deadline_ns, uint32_t* now_word);
  // A pinned waiter that saw Failed (or an unowned Idle; or Corrupt, with
  // `replace_corrupt`, to dump the key over it) becomes the owner; exactly
  // one of the racing ranks wins.
  bool try_take_over(uint32_t slot, uint32_t observed, bool replace_corrupt = false);
  // This rank's load into `slot` passed its deadline while the store may
  // still write into the slot. Under the key's bucket lock: unlinks the slot
  // from its chain, clears its key and marks it Failed (waking its waiters);
  // the owner's hold becomes a pin of this rank, as in mark_failed(). The
  // slot then floats, keyless, kept by the I/O's own pin until the store
  // really completes (or the rank leaves), so nothing re-keys it under a late
  // write; CLOCK takes it back once unpinned (clock.h). Waiters that see
  // Failed on a slot that no longer holds their key release it and get() the
  // key again: they take over the key, never the slot. kBadState, and no
  // change, when the word is no longer `expected` (the load ended meanwhile).
  [[nodiscard]] Result abandon_load(uint32_t slot, uint32_t expected);
  // The slot's word now, read with acquire ([A2] in ctrl/slot_word.h): decide
  // on it with SlotView, pass it to wait_for_change(), try_take_over() or
  // abandon_load(). The caller holds a reference, so it speaks for its key.
  uint32_t word(uint32_t slot) const { return ctrl_->slot(slot).word.load(std::memory_order_acquire); }
  // Whether `slot` holds k now (a caller holding a reference re-checks after
  // seeing Failed: an abandoned load's slot holds no key).
  bool holds_key(uint32_t slot, const Key& k) const;
  // The node's completion doorbell (layout.h): read it before looking at the
  // words to wait on, then wait_any() on what was read.
  uint32_t bell() const { return ctrl_->globals().bell.load(std::memory_order_seq_cst); }
  void ring_bell() const;
  // What a thread waiting on many slots at once (the copier) waits on: slot
  // words it saw (words[i] for slots[i]) and stored words (the write-through's,
  // layout.h: stored_seen[j] for stored_slots[j]). It keeps the set from wait
  // to wait, so that the liveness of the ranks it waits on is looked at every
  // slice whatever rings in between.
  struct WaitSet {
    const uint32_t* slots = nullptr;
    const uint32_t* words = nullptr;
    size_t n = 0;
    const uint32_t* stored_slots = nullptr;
    const uint32_t* stored_seen = nullptr;
    size_t m = 0;
    uint64_t next_check_ns = 0;  // when the ranks waited on are looked at next (check_waited_on)
    uint64_t reap_deadline_ns = kNoDeadline;  // the bound of a reap of the dead among them (and of the wait's)
  };
  // Once a slice has passed since the last look (ws->next_check_ns): looks
  // whether the owners and writers `ws` waits on live (each rank once: a
  // look reads /proc) and reaps the dead. wait_any calls it; a waiter whose
  // rounds keep moving, and so never sleeps, calls it between them.
  void check_waited_on(WaitSet* ws);
  // Sleeps until a word of `ws` differs from what was seen (in substance), the
  // bell moves from `bell_seen`, or the deadline (kTimeout); sets the waiters
  // bit of each word first (finish_write rings the bell for a stored word's
  // waiters). Once a slice has passed since the last look (ws->next_check_ns),
  // rung or not, and in both wait modes, looks whether the owners and writers
  // it waits on live, and reaps the dead (check_waited_on: it used to look
  // only after a silent slice, which a copier woken by other ranks' rings
  // never saw). kOk tells the caller to look again; it may be spurious.
  [[nodiscard]] Result wait_any(WaitSet* ws, uint32_t bell_seen, uint64_t deadline_ns);
  // The same for slot words alone, with a fresh set (its liveness looked at
  // after a slice of this call).
  [[nodiscard]] Result wait_any(const uint32_t* slots, const uint32_t* words, size_t n, uint32_t bell_seen,
                                uint64_t deadline_ns) {
    WaitSet ws;
    ws.reap_deadline_ns = deadline_ns;
    ws.slots = slots;
    ws.words = words;
    ws.n = n;
    return wait_any(&ws, bell_seen, deadline_ns);
  }
  // The slot's stored word now (acquire): its write-through's state.
  uint32_t stored_word(uint32_t slot) const { return ctrl_->stored(slot).load(std::memory_order_acquire); }
  // One more pin on a slot this rank already holds a reference to (a pin or
  // the owner's hold), for work that must outlive
  // the caller's own pin (a backend I/O into the slot).
  void add_pin(uint32_t slot) {
    ctrl_->pin(opts_.rank, slot).fetch_add(1, std::memory_order_relaxed);
    tally(1);
  }
  // Drops one pin. The last pin of the owning rank on a slot it never marked
  // abandons the load: the slot becomes Failed and its waiters take over.
  void release(uint32_t slot);

  // References this rank took through this object and has not dropped: every
  // get() that returned a slot, add_pin() and write-through begun
  // (claim_write() made this rank the writer, or mark_ready_for_write()) (+1),
  // every release() that dropped one and finish_write() (-1). Exact once the
  // threads that use the object have stopped (each thread adds to its own
  // cell; this sums them). 0 means the rank holds nothing on any slot, so
  // leaving needs no walk of the slots (BufferCtrl::leave).
  int64_t references_held() const;

  // Sets the accessed bit of every resident shard of each block, then forwards
  // the same batch to the hook (the backend's Touch). *marked (optional): slots
  // marked. kCorrupt (naming the chain) when a chain holds an index past the
  // end; the hook still gets the batch.
  [[nodiscard]] Result touch(const BlockId* blocks, size_t n, size_t* marked = nullptr);
  void set_touch_hook(TouchHook hook, void* ctx) {
    touch_hook_ = hook;
    touch_ctx_ = ctx;
  }

  // Hangs an Idle, unpinned slot for k on its chain so that the next get(k)
  // takes it over without eviction. Try-locks only; never evicts the regular
  // pool (a free regular slot, else the reserved pool), nor a still-unused
  // prealloc younger than the protection grace (ctrl/protect.h: hints).
  // kNoSpace with *in_flight (when given) set: part of the reserved pool was
  // held by loads or copies in flight, which free it without anyone's help.
  [[nodiscard]] Result prealloc(const Key& k, PreallocOutcome* out, bool* in_flight = nullptr);

  // Whether k is resident and Ready (a hint). Works on a scheduler rank.
  // kCorrupt (naming the place) when k's chain holds an index past the end.
  [[nodiscard]] Result exists(const Key& k, bool* present) const;
  // The same, with corruption read as "absent" (tests, hints).
  bool exists(const Key& k) const {
    bool present = false;
    return exists(k, &present) == Result::kOk && present;
  }
  // Whether some rank holds k or is loading it (a hint): resident and not a
  // preallocated slot that nobody owns yet. A corrupt chain reads as "no"
  // (get() on the key then reports it).
  bool being_served(const Key& k) const;

  void* data_at(uint32_t slot) const { return data_ ? data_->at(slot) : nullptr; }
  bool scheduler() const { return data_ == nullptr; }
  uint32_t rank() const { return opts_.rank; }
  const BufferCtrl& ctrl() const { return *ctrl_; }
  const RankCounters& counters() const { return ctrl_->rank(opts_.rank).counters; }
  // Recovers every dead local rank now (normally done on demand).
  [[nodiscard]] Result reap();

 private:
  enum class Attach { kDone, kRetry };
  enum class ReleaseStep { kDropped, kNothing, kAgain };
  struct WaitClock;
  Result check_key(const Key& k) const;
  Result check_joined() const;
  // Pins slot i, found holding k, and decides get()'s answer; kRetry (pin dropped) when it was re-keyed.
  Result attach_found(uint32_t i, const Key& k, GetResult* out, Attach* a, GetFor f);
  // The decision on a pinned slot that held k; the caller drops the pin on kRetry or an error.
  Result attach_pinned(uint32_t i, const Key& k, GetResult* out, Attach* a, GetFor f);
  Result get_locked(const Key& k, uint32_t b, GetResult* out, GetFor f);
  // get_locked took slot v for k under bucket b's lock: installs it Idle and
  // ours with the hold, lets the bucket go and reports the miss as owner.
  void own_new_slot(uint32_t v, uint32_t b, const Key& k, bool evicted, GetResult* out, GetFor f);
  // get_locked found k on a slot an evictor claims: bounded wait, reaping a dead claimer.
  Result wait_out_claim(uint32_t i, uint32_t b, WaitClock* clk);
  Result set_final_state(uint32_t slot, State s, bool for_write, const char* what);
  Result poll_once(uint32_t slot, uint64_t deadline_ns, uint32_t* w);
  void note_waited_on(uint32_t w, uint64_t deadline_ns);
  void note_writer(uint32_t stored_word, uint64_t deadline_ns);
  // wait_any's pieces: whether any word moved from what the caller saw; the
  // waiters bit set on each (true: one moved first); and, once a slice has
  // passed, the liveness of the ranks waited on (each rank looked at once).
  bool any_changed(const WaitSet& ws) const;
  bool arm_waiters(const WaitSet& ws) const;
  uint64_t reap_deadline(uint64_t deadline_ns) const;
  Result check_owner(uint32_t slot, uint32_t w) const;
  void wake_word(std::atomic<uint32_t>& word) const;
  bool release_one(uint32_t slot);
  // pin_all_ready()'s pin of k, in bucket b, without the reference count
  // (its caller counts); unpin_ready() drops such pins, uncounted.
  bool pin_one_ready(const Key& k, uint32_t b, uint32_t* slot);
  void unpin_ready(const uint32_t* slots, size_t n);
  // pin_all_ready()'s prefetch of the records of buckets[0..n)'s heads (it
  // prefetched the heads themselves as it hashed the keys).
  void prefetch_records(const uint32_t* buckets, size_t n) const;
  // release_one's steps (slot_word.h, T6 and T7): the hold of a finished load
  // of ours (*w: the word seen, updated by a failed CAS); the guarded loop on
  // the pin row; its step when the row is empty; and the abandon before the
  // last unpin of a load we own without a hold.
  bool drop_finished_hold(uint32_t slot, uint32_t* w);
  bool release_guarded(uint32_t slot);
  ReleaseStep release_last_hold(uint32_t slot, uint32_t* n);
  void abandon_unheld_load(uint32_t slot);
  void tally(int64_t d) {
    std::atomic<int64_t>* cell = tally_cell();
    // One writer per cell (its thread): a load and a store, no locked add.
    cell->store(cell->load(std::memory_order_relaxed) + d, std::memory_order_relaxed);
  }
  std::atomic<int64_t>* tally_cell();
  [[gnu::noinline]] std::atomic<int64_t>* tally_cell_slow();

  const BufferCtrl* ctrl_;
  const BufferData* data_;
  CacheOptions opts_;
  uint32_t holder_;
  uint64_t slice_ns_;
  RankCounters* ctr_;
  int32_t pid_;
  bool protect_;  // the node protects loaded shards (ctrl/protect.h): read once, at construction
  std::atomic<uint32_t> task_ordinal_{0};  // set_task_ordinal
  TouchHook touch_hook_ = nullptr;
  void* touch_ctx_ = nullptr;
  // references_held(): one cell per thread that used this object (a deque:
  // cells never move), and an id no other CacheBuffer of the process has, by
  // which a thread finds its cell.
  uint64_t id_;
  mutable std::mutex cells_mu_;
  std::deque<std::atomic<int64_t>> cells_;
};

}  // namespace ucm
