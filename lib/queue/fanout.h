// Fan-out (UCM_FANOUT=nccl|mpi): each shard of a load task is read from the
// node's host cache once, by its root, and broadcast to the other local
// ranks' destinations (docs/design.md, "Fan-out").
//
// Turns. In fan-out mode ucm_load_task is collective in time: every local
// rank submits the same keys in the same task order, and each submitted load
// (or refused one: reject()) is one turn, run in order on this rank's fan-out
// thread. A turn starts with an allgather of a record per rank (turn number,
// task id, entry count, a fingerprint of the keys, the first key): ranks that
// submitted different tasks all fail that task with kBadState naming both
// tasks; the turn is used either way, so the next tasks stay paired.
//
// Per task, in chunks of chunk_entries: entry i's root is local rank
// i mod local_size. Each rank submits its rooted entries of a chunk to its
// LoadQueue (through the cache, host slot -> its own destination), and the
// next chunk's loads are submitted before this chunk's broadcasts run, so
// loads and broadcasts overlap. Once a chunk's loads are done, an allgather
// of per-entry results tells every rank which loads failed: those keys fail
// on every rank (the root's error named) and are not broadcast; the rest go
// in one grouped round of broadcasts, root = the entry's root.
//
// Failure. A collective that fails or passes its bound (step_timeout_ns; a
// rank that stops calling) is aborted: this rank falls back to per-rank
// copies from the host slots (through the LoadQueue) for every entry not yet
// delivered, and counts it (fallbacks). The communicator is not used again:
// later tasks run as per-rank copies too (counted), so no rank waits on a
// communicator that another rank left. The collective seam guarantees that
// nothing lands in a destination after its call returned
// (common/collective.h), so an entry reported done stays as delivered.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/collective.h"
#include "queue/load_queue.h"
#include "queue/task.h"

namespace ucm {

struct FanoutOptions {
  uint32_t mode = 0;  // ucm_fanout_t
  uint64_t shard_bytes = 0;
  uint32_t chunk_entries = 64;
  uint64_t step_timeout_ns = 30'000'000'000;  // bound on each collective step
  uint64_t task_timeout_ns = 30'000'000'000;  // deadline of an internal load task whose caller's task has none
  // Test hook (UCM_FANOUT_TEST_STALL=<local rank>:<turn>): that rank does not
  // post its first broadcast of that turn and falls back, as if it had timed
  // out; its peers then meet a rank that stopped calling.
  int64_t stall_rank = -1;
  uint64_t stall_turn = 0;
};

struct FanoutCounters {
  std::atomic<uint64_t> host_bytes{0};   // read from host slots for fanned-out tasks (rooted + fallback)
  std::atomic<uint64_t> bcast_bytes{0};  // received by broadcast
  std::atomic<uint64_t> fallbacks{0};    // tasks (or their rest) run as per-rank copies
  std::atomic<uint64_t> mismatches{0};   // tasks failed: the ranks submitted different tasks
  std::atomic<uint64_t> rooted{0};       // entries this rank loaded as root
  std::atomic<uint64_t> turns{0};
};

class Fanout {
 public:
  Fanout(LoadQueue* queue, std::unique_ptr<Collective> coll, const FanoutOptions& opts);
  ~Fanout();
  Fanout(const Fanout&) = delete;
  Fanout& operator=(const Fanout&) = delete;

  [[nodiscard]] Result start();
  // Joins the thread; a turn in a collective gives up (kFinalized), its task is
  // left to the caller to abandon.
  void stop();
  // Queues a load task as this rank's next turn.
  [[nodiscard]] Result submit(const std::shared_ptr<Task>& t);
  // This rank refused a load of n entries (why): it still takes its turn, so
  // the peers get kBadState naming it instead of pairing their next task with it.
  void reject(uint64_t task_id, uint64_t n, const std::string& why);

  const FanoutCounters& counters() const { return ctr_; }
  uint32_t mode() const { return opts_.mode; }
  std::string describe() const;

 private:
  struct Turn {
    std::shared_ptr<Task> task;  // null: refused
    uint64_t task_id = 0;
    uint64_t n = 0;
    std::string why;
  };
  struct Chunk;

  void main();
  void run_turn(Turn& turn);
  struct TaskRun;
  struct Broadcasts;
  // A task in chunks; each chunk: its rooted loads, an allgather of their
  // results, one round of broadcasts. A failed collective hands what is not
  // yet delivered to fallback().
  void run_task(const std::shared_ptr<Task>& t);
  // false: the task ends at chunk k (stopping, finalized, or handed to fallback()).
  bool run_chunk(TaskRun& run, uint32_t k);
  void start_chunk_of(TaskRun& run, uint32_t k);
  // This rank's own loads of `c`, finished by their own outcomes.
  void finish_rooted(TaskRun& run, Chunk& c);
  // After a give-up at chunk k: rooted entries of chunks k and k+1 keep their
  // own loads; everything else not finished is copied per rank.
  void finish_rest(TaskRun& run, uint32_t k, const char* why);
  [[nodiscard]] Result gather_results(TaskRun& run, Chunk& c);
  // A broadcast per entry whose root loaded it; an entry whose root's load
  // failed fails here (on the other ranks; its root finishes it itself).
  void plan_broadcasts(TaskRun& run, const Chunk& c, Broadcasts* b);
  [[nodiscard]] Result broadcast(const Broadcasts& b, uint32_t k);
  void finish_broadcasts(TaskRun& run, Chunk& c, const Broadcasts& b);
  // Loads entries [from, to) of `t` on this rank alone (per-rank copies), and
  // finishes them on `t` with their outcomes.
  void fallback(const std::shared_ptr<Task>& t, const std::vector<uint32_t>& idx, const char* why);
  void start_chunk(const std::shared_ptr<Task>& t, Chunk* c);
  uint64_t sub_deadline(const Task& t) const;
  bool wait_chunk(Chunk* c);
  void give_up(const std::string& why);
  uint32_t root_of(uint32_t i) const { return i % size_; }

  LoadQueue* queue_;
  std::unique_ptr<Collective> coll_;
  FanoutOptions opts_;
  uint32_t rank_, size_;
  FanoutCounters ctr_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Turn> turns_;
  bool broken_ = false;          // fan-out thread only
  mutable std::mutex why_mu_;
  std::string broken_why_;       // under why_mu_
  uint64_t turn_no_ = 0;         // fan-out thread only
  uint64_t next_internal_id_ = uint64_t{1} << 62;
  std::thread thread_;
};

}  // namespace ucm
