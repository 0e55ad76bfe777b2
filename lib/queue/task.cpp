#include "queue/task.h"

#include <cinttypes>
#include <cstdio>

#include "common/time.h"
#include "sync/futex.h"

namespace ucm {

Task::Task(uint64_t id, TaskKind kind, std::vector<TaskEntry> entries, uint64_t deadline_ns)
    : Task(id, kind, std::move(entries), deadline_ns, now_ns()) {}

Task::Task(uint64_t id, TaskKind kind, std::vector<TaskEntry> entries, uint64_t deadline_ns, uint64_t submit_ns)
    : id_(id),
      kind_(kind),
      entries_(std::move(entries)),
      submit_ns_(submit_ns),
      deadline_ns_(deadline_ns),
      remaining_(static_cast<uint32_t>(entries_.size())) {}

void Task::entry_failed(uint32_t index, Result r, const std::string& why) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (result_ == Result::kOk) {
      result_ = r;
      first_error_ = why;
    }
    if (failed_ < 16) {
      const Key& k = entries_[index].key;
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%s%016" PRIx64 "%016" PRIx64 ":%u", failed_ ? ", " : "", k.block.hi, k.block.lo,
                    k.shard);
      failed_keys_ += buf;
    }
    ++failed_;
  }
  if (on_failed_) on_failed_(index, r, why);
  finish(1);
}

void Task::finish(uint32_t n) {
  if (remaining_.fetch_sub(n, std::memory_order_acq_rel) != n) return;
  done_ns_.store(now_ns(), std::memory_order_release);
  if (on_done_) on_done_(*this);
  // acq_rel: a waiter's kWaitersBit (set by its RMW) is seen here, or its
  // RMW comes after this one and reads kDoneBit.
  const uint32_t before = done_word_.fetch_or(kDoneBit, std::memory_order_acq_rel);
  if (before & kWaitersBit) futex_wake(&done_word_, kWakeAll);
}

void Task::abandon() {
  done_word_.fetch_or(kAbandonedBit, std::memory_order_release);
  futex_wake(&done_word_, kWakeAll);
}

bool Task::wait_until(uint64_t deadline_ns) const {
  for (;;) {
    uint32_t w = done_word_.load(std::memory_order_acquire);
    if (w & kDoneBit) return true;
    if (w & kAbandonedBit) return false;
    if (now_ns() >= deadline_ns) return false;
    // Announce the sleep (task.h): the finisher wakes only announced waiters.
    if (!(w & kWaitersBit)) {
      w = done_word_.fetch_or(kWaitersBit, std::memory_order_acq_rel) | kWaitersBit;
      if (w & (kDoneBit | kAbandonedBit)) continue;
    }
    // On exactly the value read: a bit set since then makes this return at once.
    (void)futex_wait(&done_word_, w, deadline_ns);
  }
}

Result Task::result() const {
  if (done()) return result_;  // acquire: after every write of it (task.h)
  std::lock_guard<std::mutex> g(mu_);
  return result_;
}

std::string Task::error() const {
  std::lock_guard<std::mutex> g(mu_);
  if (result_ == Result::kOk) return {};
  char head[96];
  std::snprintf(head, sizeof(head), "task %" PRIu64 ": %u of %zu entries failed; first: ", id_, failed_, entries_.size());
  return head + first_error_ + " (failed keys: " + failed_keys_ + (failed_ > 16 ? ", ..." : "") + ")";
}

}  // namespace ucm
