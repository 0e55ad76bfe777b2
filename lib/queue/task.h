// A task: a batch of shard loads (or dumps) submitted by one call.
//
// The submitting thread owns nothing after submit: the task is shared by the
// handle table (until the app waits for it), the dispatcher, the copier and
// any backend I/O in flight. Each entry finishes exactly once (ok or failed);
// the last one publishes the result and wakes waiters on `done_word` (a futex
// word, so ucm_task_wait blocks without polling). Finalize abandons the tasks
// it will not run to their end: that sets another bit of the same word and
// wakes the waiters too, who then return without the task being done.
//
// done_word, bit by bit (each set once, never cleared):
//   kDoneBit       the last finish()       (release; pairs with wait_until's acquire)
//   kAbandonedBit  abandon(), at finalize  (release; pairs with wait_until's acquire)
//   kWaitersBit    a waiter, before it sleeps on the word
// The last finish() wakes only when kWaitersBit was set before its fetch_or
// (a waiter that sets it later reads kDoneBit in the same RMW and does not
// sleep): a task nobody waits on yet (the inline path, or an app that waits
// later) costs no futex syscall. abandon() always wakes.
//
// A load task whose every entry is a hit may be copied and finished by the
// submitting thread itself (LoadQueue's inline path): it is then done before
// it is handed out.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/key.h"
#include "common/result.h"

namespace ucm {

enum class TaskKind : uint8_t { kLoad, kDump };

struct TaskEntry {
  Key key;
  void* dst = nullptr;        // load: where the shard goes (device or host memory)
  const void* src = nullptr;  // dump: where it comes from
};

class Task {
 public:
  // submit_ns: when it was submitted (now_ns(); a caller that read the clock
  // for the deadline passes what it read).
  Task(uint64_t id, TaskKind kind, std::vector<TaskEntry> entries, uint64_t deadline_ns);
  Task(uint64_t id, TaskKind kind, std::vector<TaskEntry> entries, uint64_t deadline_ns, uint64_t submit_ns);

  uint64_t id() const { return id_; }
  // A load task's place among its rank's load tasks (LoadQueue numbers them
  // in the order it accepts them; ctrl/protect.h says what peers make of it).
  uint32_t ordinal() const { return ordinal_; }
  void set_ordinal(uint32_t o) { ordinal_ = o; }
  TaskKind kind() const { return kind_; }
  const std::vector<TaskEntry>& entries() const { return entries_; }
  uint64_t submit_ns() const { return submit_ns_; }
  uint64_t deadline_ns() const { return deadline_ns_; }
  uint8_t relax_floor() const { return relax_floor_.load(std::memory_order_relaxed); }
  void raise_relax_floor(uint8_t r) const {
    uint8_t cur = relax_floor_.load(std::memory_order_relaxed);
    while (cur < r && !relax_floor_.compare_exchange_weak(cur, r, std::memory_order_relaxed)) {
    }
  }

  void entry_ok() { finish(1); }
  // n entries at once (the inline path: every entry copied by the caller).
  void entries_ok(uint32_t n) {
    if (n != 0) finish(n);
  }
  // Records why an entry failed; the task's result is the first failure's.
  void entry_failed(uint32_t index, Result r, const std::string& why);

  bool done() const { return (done_word_.load(std::memory_order_acquire) & kDoneBit) != 0; }
  bool abandoned() const { return (done_word_.load(std::memory_order_acquire) & kAbandonedBit) != 0; }
  uint32_t remaining() const { return remaining_.load(std::memory_order_acquire); }
  // Blocks until done, abandoned, or the absolute deadline (kNoDeadline: none);
  // true when done.
  bool wait_until(uint64_t deadline_ns) const;
  // Wakes every waiter for good: the task will not be run to its end.
  void abandon();
  // Without the lock once done: every entry_failed() wrote it before the
  // last finish() set kDoneBit.
  Result result() const;
  std::string error() const;
  uint64_t latency_ns() const { return done_ns_.load(std::memory_order_acquire) - submit_ns_; }
  // Runs once, when the last entry finishes, before waiters wake.
  void set_on_done(std::function<void(const Task&)> f) { on_done_ = std::move(f); }
  // Runs in entry_failed, before the entry counts as finished (fan-out reads
  // each entry's outcome this way). Set before the task is submitted.
  void set_on_failed(std::function<void(uint32_t, Result, const std::string&)> f) { on_failed_ = std::move(f); }

 private:
  void finish(uint32_t n);

  static constexpr uint32_t kDoneBit = 1;
  static constexpr uint32_t kAbandonedBit = 2;
  static constexpr uint32_t kWaitersBit = 4;

  const uint64_t id_;
  const TaskKind kind_;
  const std::vector<TaskEntry> entries_;
  const uint64_t submit_ns_;
  const uint64_t deadline_ns_;
  uint32_t ordinal_ = 0;  // set before the task is queued or run; read by the thread that runs it
  // How far the eviction protection has relaxed for this task's gets
  // (ctrl/protect_relax.h, a ProtectRelax; only rises): each later entry
  // starts there instead of sweeping strictly again.
  mutable std::atomic<uint8_t> relax_floor_{0};
  std::atomic<uint32_t> remaining_;
  std::atomic<uint64_t> done_ns_{0};
  mutable std::atomic<uint32_t> done_word_{0};
  mutable std::mutex mu_;
  Result result_ = Result::kOk;
  std::string first_error_;
  uint32_t failed_ = 0;
  std::string failed_keys_;  // "block:shard" of failed entries, the first 16
  std::function<void(const Task&)> on_done_;
  std::function<void(uint32_t, Result, const std::string&)> on_failed_;
};

}  // namespace ucm
