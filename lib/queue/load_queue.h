// LoadQueue: one rank's pipeline from tasks to bytes (DESIGN.md section 7).
//
//   submit() -> pending (bounded) -> DISPATCHER -> copier queue -> COPIER
//
// With order=natural (the legacy control group) it instead finishes each
// entry before the next, as the old code did.
//
// The inline path (QueueOptions::inline_hits, over the host engine only): a
// load task whose every entry is Ready in the cache when submit() looks never
// reaches the dispatcher. The submitting thread pins each entry's slot
// (CacheBuffer::pin_all_ready: a hit, accessed), numbers the task and takes
// the slots for it (take_all: the eviction protection's take, exactly as the
// dispatcher's get() would), copies them with
// memcpy, releases the pins, counts the task, its shards, hits, bytes and
// latency, and finishes the task before submit() returns. One entry that is
// not a hit (absent, being filled, Failed, Corrupt, claimed by an evictor)
// and every pin taken so far is dropped and the whole task goes the queue's
// way (docs/design.md, "The inline path", says why the whole task). The
// queue's threads are not involved, so stop() does not wait for it; the
// caller (the C API) holds its reference on the cache for the whole call.
// The dispatcher visits a task's entries in RearrangeIndex order: its own
// stride at once, a peer's stride once some rank serves it or after
// owner_grace (so that a rank that arrives first does not own the whole
// task); meanwhile it sleeps on the node's defer bell, rung by a rank that
// starts serving a key while someone defers (ctrl/protect.h), never in naps. It calls get() on each: a hit goes to the copier; as owner it pins the slot once more
// for the backend I/O, submits the load (at most io_depth in flight) and hands
// the entry to the copier; as waiter it hands it over at once. It never waits
// for another rank. When everything of a load task is handed over, it
// preallocates (block, shard + 1) for the task's blocks in one bounded pass,
// also when the next task is already pending (a pipeline window).
//
// Dumps. A dump says OK only once the key's bytes are in the store (the
// slot's stored word, layout.h). An owner entry is copied into its slot, made
// Ready (so peers hit it) with this rank as its writer, and written through.
// A Ready slot: stored -> OK at once; not stored (its write failed, or its
// writer died) -> this rank writes the slot's bytes through; being written ->
// the copier waits for that write (bounded by the task's deadline, checking
// the writer's liveness) and reports its outcome: OK, or UCM_ERR_BACKEND
// naming the rank whose write-through failed. A slot still being filled is
// waited for as a load is; a Failed or Corrupt one is taken over and filled
// from the caller's bytes. The entry of the rank that writes completes with
// its write.
//
// The copier serves whatever entry is Ready first, in any order; when none
// is, it sleeps on the node's completion doorbell (layout.h) for all of them
// at once (bounded by the earliest deadline and the liveness slice, checking
// every slice whether the owners and writers it waits on live; recovery turns
// a dead owner's load into Failed). It never waits for one entry in place: a
// dump entry waiting for another rank's write-through waits on its stored
// word beside the others, an entry whose slot lost its key looks for a slot
// once per round (copier.cpp). Failed: it takes the load over (one CAS: one winner per
// node) and reloads, up to load_retries times, then fails the entry with the
// backend's error. Ready: it copies through its own copy stream and releases
// the pin once the copy has landed. Corrupt (the store's copy failed its
// checks): it fails the entry with UCM_ERR_CORRUPT at once, never retries
// (the owner's rank with the store's words, the others naming the key and
// the rank whose load found it).
//
// The backend's completion marks the slot Ready or Failed and drops the I/O
// pin; a slot is never re-keyed while its I/O is in flight, so a late or hung
// load can never write into another key's bytes.
//
// Deadlines. Every backend I/O carries its task's deadline and is listed
// while in flight. Past it (checked by the dispatcher while it waits for I/O
// depth, and by the copier every wait slice), the I/O expires: it gives back
// its I/O depth at once; a load abandons its slot (CacheBuffer::abandon_load:
// the slot leaves its chain, loses its key and turns Failed, still pinned by
// the I/O), so waiters on every rank get the key again instead of waiting on
// the store; a write-through fails its entry with kTimeout and its stored
// word says WriteFailed (the bytes are not known to be in the store). The
// store's late completion of an expired I/O only drops the I/O's pin and is
// counted (late_completions()); it never marks a slot. A task past its
// deadline never waits for I/O depth: its entry fails with kTimeout. Only
// the dispatcher waits for depth in place (start_load); an entry the copier
// comes to own with no depth left stays owned and unsent, and the copier sends
// it in a later round (send_unsent), serving its other entries meanwhile.
// A key with kStuckLoadsMax expired loads the store has not returned is not
// sent again until it returns one (stuck_loads_): its entry fails at once,
// naming them; one more load would likely hang too, and hold a slot (and
// maybe a store thread) of its own for as long. One retry is sent: a store
// that has recovered answers it while the first load is still stuck.
// Stuck I/Os. An I/O in flight for a quarter of its task's time (at most
// io_stuck_ns) gives its io_depth place to the next, up to io_depth such
// (io_stuck_), and the store is told (Backend::requests_stuck) so that it
// makes room beside it too: keys a store never answers do not hold every
// place until their deadlines (docs/design.md 9.1, hung store loads).
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "cache/cache_buffer.h"
#include "device/copy_engine.h"
#include "queue/counters.h"
#include "queue/task.h"
#include "topo/placement.h"

namespace ucm {

struct QueueOptions {
  uint32_t local_rank = 0;
  uint32_t local_size = 1;
  bool rotate = true;
  bool prealloc = true;
  uint32_t io_depth = 16;
  // A backend I/O in flight for a quarter of its task's time (at least
  // 250 ms, or this if less), or for this long if that is sooner, is stuck: it gives its io_depth place back (a
  // store that hangs on some files keeps serving the others), up to io_depth
  // stuck at once (so at most 2 x io_depth in flight).
  uint64_t io_stuck_ns = 1'000'000'000;
  uint32_t load_retries = 2;
  uint32_t pending_limit = 1024;
  // A get() that found no free slot (NoSpace) sleeps on the node's space
  // bell (ctrl/space_bell.h) until a release rings it, at most this long at
  // first, doubling while no ring comes up to no_space_backoff_max_ns: the
  // bound of a wait for what rings nobody (a protection's grace running out).
  uint64_t no_space_backoff_ns = 200'000;
  uint64_t no_space_backoff_max_ns = 10'000'000;
  // How long one prealloc pass waits, at most, for loads and copies in flight
  // to free the reserved pool (design.md 9.1 step 6): a load that hangs costs
  // the next task no more than this.
  uint64_t prealloc_wait_ns = 20'000'000;
  // How long a peer's share of a task waits for that peer (or anyone) to load
  // it before this rank does; 0: never wait (the first rank to arrive owns all).
  uint64_t owner_grace_ns = 1'000'000;
  // All-hit load tasks are copied by the submitting thread (above). Taken
  // only when the engine is the host engine (memcpy): never for CUDA, whose
  // async copies and their completion stay with the copier.
  bool inline_hits = false;
};

class LoadQueue {
 public:
  LoadQueue(CacheBuffer* cache, Backend* backend, CopyEngine* engine, const Placement& placement,
            const QueueOptions& opts);
  ~LoadQueue();
  LoadQueue(const LoadQueue&) = delete;
  LoadQueue& operator=(const LoadQueue&) = delete;

  [[nodiscard]] Result start();
  // Fails what is pending (kFinalized), joins both threads. Backend I/O still
  // in flight completes later through the backend (destroy it next).
  void stop();
  // kBusy when pending_limit tasks are already waiting.
  [[nodiscard]] Result submit(const std::shared_ptr<Task>& t);
  // Backend I/Os in flight and not expired: those holding an io_depth place
  // and the stuck ones (QueueOptions::io_stuck_ns).
  uint64_t io_in_flight() const;
  // Of them, the stuck ones.
  uint64_t io_stuck() const;
  // Store completions that came after their I/O had expired (and were dropped).
  uint64_t late_completions() const { return late_completions_.load(std::memory_order_acquire); }
  // I/Os that passed their deadline in flight (each ends in one late
  // completion, or was taken back by the store unstarted: cancelled_ios).
  uint64_t expired_ios() const { return expired_ios_.load(std::memory_order_relaxed); }
  uint64_t cancelled_ios() const { return cancelled_ios_.load(std::memory_order_relaxed); }
  // Hand-offs of dispatched entries to the copier (each one lock and one wake).
  uint64_t handoffs() const { return handoffs_.load(std::memory_order_relaxed); }
  // Tasks that went to the dispatcher (not the inline path).
  uint64_t queued_tasks() const { return queued_tasks_.load(std::memory_order_relaxed); }
  // Whether all-hit load tasks take the inline path (inline_hits and the host engine).
  bool inline_enabled() const { return inline_; }
  // Peer deferral (owner grace): how the dispatcher waited for its peers' shares.
  struct DeferStats {
    uint64_t sleeps = 0;   // futex waits on the node's defer bell
    uint64_t wakes = 0;    // of those, ended by the bell moving (a peer served a key, or stop)
    uint64_t cpu_ns = 0;   // the dispatcher's thread CPU time from its first sleep to the end of each deferral
    uint64_t wall_ns = 0;  // the wall time of the same spans
  };
  DeferStats defer_stats() const {
    return DeferStats{defer_sleeps_.load(std::memory_order_relaxed), defer_wakes_.load(std::memory_order_relaxed),
                      defer_cpu_ns_.load(std::memory_order_relaxed), defer_wall_ns_.load(std::memory_order_relaxed)};
  }
  // Waits for a free slot (NoSpace, ctrl/space_bell.h): futex sleeps on the
  // node's space bell, and how many a ring ended (not the sleep's bound).
  struct SpaceStats {
    uint64_t sleeps = 0;
    uint64_t wakes = 0;
  };
  SpaceStats space_stats() const {
    return SpaceStats{space_sleeps_.load(std::memory_order_relaxed), space_wakes_.load(std::memory_order_relaxed)};
  }

 private:
  struct Item {
    std::shared_ptr<Task> task;
    uint32_t index;
    uint32_t slot;
    uint32_t word;       // the slot's word it waits to change
    uint32_t failures;
    uint64_t started = 0;  // first look (for wait_ns)
    // Its slot lost the key (a load abandoned at a deadline) and no slot was
    // free for it since: it holds no slot, and the copier looks for one again
    // at next_look_ns (look_for_slot), never waiting for space in between.
    bool slotless = false;
    uint64_t space_since = 0;    // the first NoSpace of that get
    uint64_t next_look_ns = 0;
    uint64_t space_step_ns = 0;  // the bound of the current pause between looks
    // A dump whose bytes another write-through has in flight: it waits for
    // the slot's stored word to leave stored_seen (stored_outcome).
    bool on_stored = false;
    uint32_t stored_seen = 0;
    // The copier owns its slot's load but found every one of the rank's
    // io_depth I/Os in flight: the load is sent in a later round (send_unsent).
    bool unsent = false;
  };
  // What the copier sleeps on (sleep_on_waiting): its entries' slot words and
  // its dumps' stored words, reused from round to round.
  struct WaitLists {
    std::vector<uint32_t> slots, words, stored_slots, stored_seen;
    CacheBuffer::WaitSet set;  // over the vectors; its liveness timer runs from sleep to sleep
  };
  struct Copy {
    std::shared_ptr<Task> task;
    uint32_t index;
    uint32_t slot;
    uint64_t ticket;
  };
  struct Io;

  // The inline path: true when t was copied and finished here.
  bool run_inline(Task& t);
  // tasks_passed in this rank's RankRecord (ctrl/protect.h): a queued load
  // task whose dispatch ended, an inline one that completed.
  void pass_queued(uint32_t ordinal);
  void pass_inline(uint32_t ordinal);
  void publish_passed(uint32_t through);
  // RankRecord.idle_since_ms (ctrl/protect.h): 0 while a load task is in
  // this queue, the time it passed the last one otherwise.
  void note_busy();
  void note_idle();
  void dispatcher_main();
  void copier_main();
  void dispatch(const std::shared_ptr<Task>& t);
  // The peers' strides of t (dispatch): false when the queue stopped (every
  // entry not yet dispatched is failed).
  bool dispatch_deferred(const std::shared_ptr<Task>& t, std::vector<uint32_t>* deferred);
  // One look at the deferred entries: dispatches those some rank serves (every
  // one once the grace has expired) and keeps the rest; false when stopped.
  bool dispatch_served(const std::shared_ptr<Task>& t, std::vector<uint32_t>* deferred, bool expired);
  // One task's deferral: announced on the node's deferring mask, and the span
  // of its sleeps (for DeferStats).
  struct DeferSpan {
    bool announced = false;
    uint64_t cpu0 = 0, wall0 = 0;  // at the first sleep
  };
  // Announces the deferral (once) and reads the defer bell to sleep on.
  uint32_t defer_announce(DeferSpan* span);
  void defer_sleep(DeferSpan* span, uint32_t bell, uint64_t grace_end);
  void defer_end(const DeferSpan& span);
  // One wait for a free slot (get_with_backpressure, prealloc_next; the
  // dispatcher's; the copier never waits for space, look_for_slot): announced
  // on the node's space_waiting mask at its first NoSpace; its sleep's
  // bound doubles while no ring comes (space_bell.h).
  struct SpaceWait {
    LoadQueue* q;
    bool announced = false;
    uint32_t bell = 0;   // read before the look that found no space
    uint64_t look_cpu0_ns = 0;  // the thread's CPU time when the last look began
    uint64_t step_ns = 0;
    explicit SpaceWait(LoadQueue* queue) : q(queue), step_ns(queue->opts_.no_space_backoff_ns) {}
    ~SpaceWait();
    SpaceWait(const SpaceWait&) = delete;
    SpaceWait& operator=(const SpaceWait&) = delete;
    // Before a look: the bell's value then (announced only).
    void before_look();
    // After a look found no space: the first time, announces the wait and
    // returns at once (look again); then sleeps until a ring or min(step,
    // until), and at least kLookShare times the CPU time that look took.
    void sleep(uint64_t until_ns);
  };
  // false when the queue is stopping (the entry is failed).
  bool dispatch_entry(const std::shared_ptr<Task>& t, uint32_t index);
  // dispatch_entry after its get() answered r: hands the entry on, or fails it.
  void dispatch_got(const std::shared_ptr<Task>& t, uint32_t index, Result r, GetResult& g);
  // Fails every entry of order[from..] not yet dispatched.
  void fail_rest(const std::shared_ptr<Task>& t, const std::vector<uint32_t>& order, size_t from);
  void wait_legacy_step(const Task& t, size_t left);
  // get() until it finds a slot, backing off on NoSpace until t's deadline.
  // With `mine` (the load task the dispatcher is dispatching), a NoSpace
  // first takes the task's other entries that some rank already serves
  // (take_served): the slots they hold may be protected until this rank
  // takes them (ctrl/protect.h), while the ranks that loaded them wait for
  // slots that this rank's loads hold, and none would take the other's
  // before its own stride was done: every rank waited out the grace.
  GetFor get_for(const Task& t) const;
  Result get_with_backpressure(const Key& k, const Task& t, GetResult* g, const std::shared_ptr<Task>* mine = nullptr);
  // Dispatches, out of order, the entries of t not yet dispatched whose keys
  // some rank serves, each with one get() that never waits for space; true
  // when it dispatched any. Never nests (taking_served_).
  bool take_served(const std::shared_ptr<Task>& t);
  // While the dispatcher waits inside one task (for an I/O place, a free
  // slot), a task queued behind it whose deadline passes fails then, each
  // entry naming what the dispatcher waited for, not when the dispatcher
  // reaches it; dispatcher_main then skips it (it is done).
  void fail_overdue_pending(const char* waiting_for);
  // The dispatcher's: waits for I/O depth (bounded by t's deadline and the
  // older I/Os' deadlines), then sends the load.
  Result start_load(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot);
  // Takes one of io_depth if one is free. A copier's call that finds none
  // sets depth_wanted_ (completions then ring, and the dispatcher leaves the
  // copier a place) until the copier has no unsent entry left (depth_unwanted).
  bool claim_depth(bool copier);
  bool depth_left_locked(bool copier) const;  // under io_mu_
  void depth_unwanted();
  bool depth_free() const;
  // Whether the store still holds kStuckLoadsMax expired loads of k
  // (stuck_loads_); the caller fails the entry with the key and stuck_reason().
  bool load_stuck(const Key& k) const;
  static std::string stuck_reason();
  // Sends the load of an owned slot, with a depth claimed for it.
  void send_load(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot);
  Result write_dump(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot, CopyStream* stream);
  void start_write(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot);
  // Preallocates (block, shard + 1) for t's entries: one bounded pass, run
  // whether or not the next task is pending (docs/design.md, "Prealloc").
  void prealloc_next(const Task& t);
  bool stopping();
  // Hands the dispatcher's batch to the copier: one lock, one wake.
  void flush_batch();
  // One look at an entry, never sleeping on its slot: true when it is done
  // (copied, written, or failed), false while it waits (it.word).
  bool process(Item& it);
  // This rank owns the entry's slot now: start its load, or leave it unsent
  // when no I/O depth is free. False when the entry failed (its slot marked Failed).
  bool load_as_owner(Item& it, uint32_t* w);
  // A dump entry's look (process): true when it ended, false while it waits
  // (on its slot's word, its stored word, or for a slot).
  bool process_dump(Item& it);
  // The slot is Ready: write it through, or wait for the write in flight.
  bool dump_ready(Item& it);
  // The item's slot lost its key (its load was abandoned): releases it, and
  // the item is slotless (look_for_slot gets the key again); false when the
  // item failed instead (its deadline, its retries, the queue stopping).
  bool drop_lost_slot(Item& it);
  // Fails an entry that holds no slot (fail_item releases one).
  void fail_slotless(Item& it, Result r, const std::string& why);
  // Adds the entry's wait since its first look to wait_ns, once (it.started
  // is zeroed): every ending of an entry calls it, fail_item's included.
  void count_wait(Item& it);
  // Expires every I/O past its deadline and counts as stuck (io_stuck_) the
  // ones in flight past their stuck_at_ns while fewer than io_depth are;
  // the earliest of the deadlines and stuck times left.
  uint64_t expire_due_ios();
  // An I/O expire_due_ios took off the live list, copied (its completion
  // may free it at any moment), and its ending: the slot abandoned (a load),
  // the entry failed (a write-through).
  struct Expired {
    std::shared_ptr<Task> task;
    Key key;
    uint32_t index, slot, word;
    bool is_load;
    bool pinned = false;  // a write the store still holds: our own pin on its slot until end_expired
  };
  void end_expired(const Expired& x);
  // Takes a live I/O past its deadline off duty (under io_mu_): recorded in
  // *due for end_expired, or in *taken_back when the store gave it back.
  void expire_locked(Io* io, std::vector<Expired>* due, std::vector<Io*>* taken_back);
  // Moves the live I/O io to io_stuck_ when it is due and room is left (under
  // io_mu_); true when it did.
  bool mark_stuck_locked(Io* io, uint64_t now);
  // When an I/O of t sent now counts as stuck: a quarter of t's time (from
  // its submission to its deadline) from now, at least kStuckFloorNs (or
  // io_stuck_ns if less) and at most io_stuck_ns.
  uint64_t stuck_at(const Task& t) const;
  void track_io(Io* io);
  std::string corrupt_text(const Key& k, uint32_t slot, uint32_t w);
  // Releases every copy that landed; then, while more than `keep` are in
  // flight, waits for the oldest (0: all of them).
  void retire_copies(size_t keep);
  // Starts the copies queued since the last flush, as one batch.
  void flush_copies();
  void fail_item(Item& it, Result r, const std::string& why);
  static void on_io_done(IoRequest* req);
  void record_done(const Task& t);
  std::string key_text(const Key& k) const;

  // The copier's loop, piece by piece (copier_main). Moves the handed-over
  // entries into *waiting, first waiting for some when none waits (false:
  // stopping and drained).
  bool take_items(std::vector<Item>* waiting);
  void wait_for_items(std::unique_lock<std::mutex>& lk);
  // One look at every waiting entry; true when any of them moved.
  bool serve_round(std::vector<Item>* waiting);
  // Sleeps on the doorbell until a waiting entry's word may have changed.
  void sleep_on_waiting(const std::vector<Item>& waiting, uint64_t next_expiry, WaitLists* lists);
  // The words the waiting entries wait on, into *lists; the earliest of
  // their deadlines and their next looks for a slot.
  uint64_t fill_wait_lists(const std::vector<Item>& waiting, WaitLists* lists);
  // A load entry's look at its slot (process): Ready (copy it), waiting with
  // the copier's other entries (it.word set), or ended (failed).
  enum class Look : uint8_t { kReady, kWaiting, kEnded };
  Look await_ready(Item& it, uint32_t* w);
  // An unsent entry's look (await_ready): true once its load is sent;
  // otherwise *look says kWaiting, or kEnded (its deadline, the stop).
  bool send_unsent(Item& it, Look* look);
  // The slot is Failed or has no owner: get the key again (its load was
  // abandoned) or take the load over; false when the entry failed.
  bool retry_load(Item& it, uint32_t* w);
  // drop_lost_slot's second half on the load path (space_wait.cpp): one get for a slotless
  // item, never a wait for space, so that the copier serves its other entries
  // meanwhile. True when the item holds a slot again (*w its word; as owner,
  // its load started); otherwise *look says kWaiting (it.next_look_ns set)
  // or kEnded (failed, or a dump's owner that wrote the bytes through).
  bool look_for_slot(Item& it, uint32_t* w, Look* look);
  // The rule of a get that may wait for space (get_with_backpressure,
  // look_for_slot): the task's relax floor, relaxed by how long the get has
  // waited since `since` (0: its first look), raising the floor and counting
  // an override as it relaxes.
  GetFor relaxed_for(const Task& t, uint64_t since);
  // The bound of the next pause between looks for space after `step` (0:
  // the first): doubling from no_space_backoff_ns to its bound.
  uint64_t next_space_step(uint64_t step) const {
    return step == 0 ? opts_.no_space_backoff_ns
                     : std::min(step * 2, std::max(opts_.no_space_backoff_max_ns, opts_.no_space_backoff_ns));
  }
  // Idle with an owner: kWaiting, or the deadline's outcome.
  Look owner_filling(Item& it, uint32_t* w);
  // Queues the Ready slot's copy to the caller's buffer (flush_copies starts it).
  void start_copy(Item& it);
  // on_io_done's pieces: takes io off the live list (true: it had expired,
  // and its completion is late); a late one only drops its pin. *stuck: it
  // counted in io_stuck_.
  bool untrack_io(Io* io, bool* stuck);
  void drop_late(Io* io);
  void load_done(Io& io);

  // The dump path (dump_path.cpp), with write_dump, start_write,
  // process_dump and dump_ready above. The store's completion of a write-through:
  void write_done(Io& io);
  // This rank owns the entry's slot: fill it from the caller's bytes and
  // write them through (the entry completes with the write).
  void dump_as_owner(Item& it);
  // One look at the write-through in flight (it.stored_seen): kEnded when
  // the entry completed with its outcome (or its deadline, or the stop),
  // kWaiting while it is in flight, kReady when its writer died first (the
  // write is to be claimed again).
  Look stored_outcome(Item& it);

  CacheBuffer* cache_;
  Backend* backend_;
  CopyEngine* engine_;
  Placement placement_;
  QueueOptions opts_;
  QueueCounters* ctr_;
  std::unique_ptr<CopyStream> copy_stream_;
  std::unique_ptr<CopyStream> dump_stream_;

  std::mutex mu_;
  std::condition_variable pending_cv_;
  std::condition_variable copier_cv_;
  std::deque<std::shared_ptr<Task>> pending_;
  std::deque<Item> items_;
  bool stopping_ = false;
  std::atomic<bool> stop_flag_{false};  // stopping_, readable without mu_
  std::vector<Item> batch_;             // dispatcher thread only: entries not yet handed to the copier
  // The dispatcher's: which entries of the task in dispatch() are dispatched
  // (take_served may dispatch them out of order), and whether it is inside
  // take_served (which never nests).
  std::vector<uint8_t> dispatched_;
  bool taking_served_ = false;

  mutable std::mutex io_mu_;
  std::condition_variable io_cv_;
  uint64_t io_inflight_ = 0;  // I/Os holding one of io_depth places
  uint64_t io_stuck_ = 0;     // live I/Os past their stuck time, holding none (at most io_depth)
  // The store's last error for each key whose load failed on this rank (for
  // the message of an entry out of retries); cleared at kLoadErrorsMax.
  std::unordered_map<Key, std::string, KeyHash> load_errors_;
  static constexpr size_t kLoadErrorsMax = 1024;
  std::vector<Io*> live_ios_;  // in flight and not expired
  // Keys whose loads expired and the store has not returned yet (how many
  // of each): with kStuckLoadsMax, not sent again until it does (load_stuck).
  std::unordered_map<Key, uint32_t, KeyHash> stuck_loads_;
  static constexpr uint32_t kStuckLoadsMax = 2;
  std::atomic<uint64_t> late_completions_{0};
  std::atomic<uint64_t> expired_ios_{0};
  std::atomic<uint64_t> cancelled_ios_{0};
  std::atomic<bool> copier_asleep_{false};  // on the doorbell: new items ring it
  // The copier holds an unsent entry and found no depth (under io_mu_): a
  // completion that gives depth back rings the doorbell it sleeps on, and
  // the dispatcher leaves it one place. Set until the copier has no unsent
  // entry left, so no ring is missed between two of its looks.
  bool depth_wanted_ = false;
  bool copier_wanted_depth_ = false;  // the copier's own note that it set it (copier thread only)
  std::atomic<bool> deferring_{false};      // the dispatcher may sleep on the defer bell: stop() rings it
  // This rank's waits for space in progress (the dispatcher's; the copier
  // never waits for space): the rank's bit in space_waiting stays while any does; stop() rings.
  std::atomic<uint32_t> space_waiters_{0};
  std::mutex space_mu_;  // the count and the rank's bit change together under it
  std::atomic<uint64_t> handoffs_{0};
  std::atomic<uint64_t> queued_tasks_{0};
  // Load task ordinals and tasks_passed (ctrl/protect.h): the next ordinal;
  // load tasks queued and not yet dispatched; 1 + the newest inline task's.
  std::atomic<uint32_t> next_ordinal_{0};
  std::atomic<uint32_t> undispatched_loads_{0};
  std::atomic<uint32_t> inline_through_{0};
  bool inline_ = false;  // const after construction
  std::atomic<uint64_t> defer_sleeps_{0}, defer_wakes_{0}, defer_cpu_ns_{0}, defer_wall_ns_{0};
  std::atomic<uint64_t> space_sleeps_{0}, space_wakes_{0};
  // The store's words for each slot whose load this rank found corrupt.
  struct CorruptNote {
    Key key;
    std::string error;
  };
  std::unordered_map<uint32_t, CorruptNote> corrupt_notes_;

  std::deque<Copy> copies_;  // copier thread only
  bool unflushed_ = false;   // copier thread only: copies_ holds copies not yet flushed
  std::thread dispatcher_;
  std::thread copier_;
};

}  // namespace ucm
