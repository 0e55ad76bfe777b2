// LoadQueue: one rank's pipeline from tasks to bytes (DESIGN.md section 7).
//
//   submit() -> pending (bounded) -> DISPATCHER -> copier queue -> COPIER
//
// With order=natural (the legacy control group) it instead finishes each
// entry before the next, as the old code did.
// The dispatcher visits a task's entries in RearrangeIndex order: its own
// stride at once, a peer's stride once some rank serves it or after
// owner_grace (so that a rank that arrives first does not own the whole
// task). It calls get() on each: a hit goes to the copier; as owner it pins the slot once more
// for the backend I/O, submits the load (at most io_depth in flight) and hands
// the entry to the copier; as waiter it hands it over at once. It never waits
// for another rank. When everything of a load task is handed over and no task
// is pending, it preallocates (block, shard + 1) for the task's blocks, and
// stops the moment a task arrives. A dump task's owner entries are written
// into their slot, made Ready (so peers hit them) and written through.
//
// The copier takes entries in order and waits for Ready on the slot's futex
// word (bounded, checking the owner's liveness; recovery turns a dead owner's
// load into Failed). Failed: it takes the load over (one CAS: one winner per
// node) and reloads, up to load_retries times, then fails the entry with the
// backend's error. Ready: it copies through its own copy stream and releases
// the pin once the copy has landed.
//
// The backend's completion marks the slot Ready or Failed and drops the I/O
// pin; a slot is never re-keyed while its I/O is in flight, so a late or hung
// load can never write into another key's bytes.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "cache/cache_buffer.h"
#include "device/copy_engine.h"
#include "queue/task.h"
#include "topo/placement.h"

namespace ucm {

struct QueueOptions {
  uint32_t local_rank = 0;
  uint32_t local_size = 1;
  bool rotate = true;
  bool prealloc = true;
  uint32_t io_depth = 16;
  uint32_t load_retries = 2;
  uint32_t pending_limit = 1024;
  uint64_t no_space_backoff_ns = 200'000;
  // How long a peer's share of a task waits for that peer (or anyone) to load
  // it before this rank does; 0: never wait (the first rank to arrive owns all).
  uint64_t owner_grace_ns = 1'000'000;
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
  uint64_t io_in_flight() const;

 private:
  struct Item {
    std::shared_ptr<Task> task;
    uint32_t index;
    uint32_t slot;
    uint32_t word;
    uint32_t failures;
  };
  struct Copy {
    std::shared_ptr<Task> task;
    uint32_t index;
    uint32_t slot;
    uint64_t ticket;
  };
  struct Io;

  void dispatcher_main();
  void copier_main();
  void dispatch(const std::shared_ptr<Task>& t);
  // false when the queue is stopping (the entry is failed).
  bool dispatch_entry(const std::shared_ptr<Task>& t, uint32_t index);
  void fail_rest(const std::shared_ptr<Task>& t, const std::vector<uint32_t>& order, size_t from);
  void wait_legacy_step(const Task& t, size_t left);
  Result get_with_backpressure(const Key& k, const Task& t, GetResult* g);
  Result start_load(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot);
  Result write_dump(const std::shared_ptr<Task>& t, uint32_t index, uint32_t slot, CopyStream* stream);
  void idle_prealloc(const Task& t);
  bool task_pending();
  bool stopping();
  void process(Item& it);
  void retire_copies(bool all);
  void fail_item(Item& it, Result r, const std::string& why);
  static void on_io_done(IoRequest* req);
  void record_done(const Task& t);
  std::string key_text(const Key& k) const;

  CacheBuffer* cache_;
  Backend* backend_;
  CopyEngine* engine_;
  Placement placement_;
  QueueOptions opts_;
  RankCounters* ctr_;
  std::unique_ptr<CopyStream> copy_stream_;
  std::unique_ptr<CopyStream> dump_stream_;

  std::mutex mu_;
  std::condition_variable pending_cv_;
  std::condition_variable copier_cv_;
  std::deque<std::shared_ptr<Task>> pending_;
  std::deque<Item> items_;
  bool stopping_ = false;

  mutable std::mutex io_mu_;
  std::condition_variable io_cv_;
  uint64_t io_inflight_ = 0;
  std::string last_backend_error_;

  std::deque<Copy> copies_;  // copier thread only
  std::thread dispatcher_;
  std::thread copier_;
};

}  // namespace ucm
