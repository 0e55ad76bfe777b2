// StoreCalls: a store's synchronous calls (exists, touch) made on threads of
// their own, so that a store stuck in the kernel (a hard-mounted NFS that
// stopped answering) never holds an application thread past its deadline.
//
// The store object belongs to the caller and must outlive this object; this
// object must outlive every thread shutdown() left behind (it returns its
// count: then keep both, never destroy them).
//
// ask(): the keys go to one of at most kMaxAskers threads as one job, and the
// caller waits for the job until its deadline. The job keeps its own copy of
// the keys and the answers, so a call that returns into it late writes
// nothing the caller owns; at the deadline the caller takes the answers the
// job had so far (a prefix, in key order) and kTimeout. A stuck asker holds
// its thread; the next call gets another while there are fewer than
// kMaxAskers, and after that waits (bounded by its own deadline) for one.
//
// touch(): a hint, so it never waits. The batch is queued for one toucher
// thread (batches reach the store in call order) and the call returns. While
// the toucher is held, at most kMaxQueuedTouchBlocks blocks wait; a batch
// past that is dropped and counted (touches_dropped), with one warning.
//
// stop() refuses new calls and wakes every waiting caller (kFinalized);
// shutdown(deadline) stops, then gives the threads until the deadline: the
// ones still in the store are detached, and counted.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "common/key.h"
#include "common/result.h"

namespace ucm {

enum class StoreAnswer : uint8_t { kUnasked = 0, kHeld, kNotHeld, kError };

struct StoreAnswers {
  std::vector<StoreAnswer> per_key;  // one per key: kUnasked for a key the store had not answered
  size_t first_error = SIZE_MAX;     // the first key whose exists() failed, with its message
  std::string first_error_text;
};

class StoreCalls {
 public:
  static constexpr uint32_t kMaxAskers = 4;
  static constexpr size_t kMaxQueuedTouchBlocks = size_t{1} << 20;

  StoreCalls(Backend* store, uint32_t local_rank);
  ~StoreCalls();  // shutdown() without a bound, when the owner has not called it
  StoreCalls(const StoreCalls&) = delete;
  StoreCalls& operator=(const StoreCalls&) = delete;

  // exists() of every key, in order, until `deadline_ns`: kOk with every key
  // answered (kHeld, kNotHeld or kError), kTimeout with a prefix answered,
  // kFinalized once stop() ran; kSystem when no thread can be started.
  [[nodiscard]] Result ask(const Key* keys, size_t n, uint64_t deadline_ns, StoreAnswers* out);
  void touch(const BlockId* blocks, size_t n);

  void stop();
  uint32_t shutdown(uint64_t deadline_ns);  // the threads left in the store
  uint64_t touches_dropped() const;
  size_t queued_asks() const;  // asks no asker has begun

 private:
  struct Job;
  struct Worker {
    std::thread th;
    bool exited = false;  // under mu_
  };

  void asker_main(Worker* self);
  void toucher_main(Worker* self);
  void answer(Job& job);
  Result start_worker(bool toucher);  // under mu_

  Backend* const store_;
  const uint32_t rank_;
  mutable std::mutex mu_;
  std::condition_variable ask_cv_;    // askers wait for a job
  std::condition_variable touch_cv_;  // the toucher waits for a batch
  std::condition_variable done_cv_;  // callers wait for their job; shutdown for exits
  std::deque<std::shared_ptr<Job>> asks_;
  std::deque<std::vector<BlockId>> touches_;
  size_t queued_touch_blocks_ = 0;
  uint64_t touches_dropped_ = 0;
  bool warned_drop_ = false;
  uint32_t askers_ = 0, idle_askers_ = 0;
  bool toucher_started_ = false;
  bool stopping_ = false;
  bool shut_down_ = false;
  std::vector<std::unique_ptr<Worker>> workers_;
};

}  // namespace ucm
