// The posix store's look after requests a file system holds in the kernel
// (posix_backend.h, docs/design.md 10 "a server that stops answering for some
// files"): the room kept beside held requests (rebalance_locked, spare
// threads), the watcher that looks without a caller, the refusal of a second
// request of a held file and of what cannot start at the bound, the ring's
// give-up, and a caller taking back a request not started (cancel).
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <system_error>
#include <utility>

#include "backend/posix_backend.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "common/time.h"
#include "ucm_build_config.h"

#if UCM_HAVE_URING
#include "backend/posix_uring.h"
#endif

namespace ucm {

void PosixBackend::requests_stuck(uint32_t loads, uint32_t dumps) {
  (void)dumps;  // the threads look for themselves (rebalance_locked); this call says when to look
  std::deque<IoRequest*> handed;
#if !UCM_HAVE_URING
  (void)loads;  // only the ring hands its stuck loads back
#else
  if (loads > 0 && ring_ && !ring_->given_up()) handed = ring_->requests_stuck();  // else its thread is stuck
#endif
  std::deque<std::pair<IoRequest*, bool>> refused;
  size_t held = 0;
  bool stopped = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    stopped = stopping_;  // shutdown() took queue_ already: these get their completion below
    if (!stopped)
      for (IoRequest* req : handed) queue_.emplace_back(req, true);
    held = rebalance_locked(&refused);
  }
  if (stopped)
    for (IoRequest* req : handed) complete_with(req, Result::kTimeout, "posix store shut down with the request queued");
  refuse(&refused, held);
  if (!handed.empty()) cv_.notify_all();
}

// Every request held in the kernel for kHeldNs holds its thread, maybe for
// good (a dead server): while requests wait, the store keeps `depth` threads
// that are not held, adding up to spare_ threads in its life (they stay: a
// held thread that returns serves again). With every thread held and no
// more to add, nothing queued can start: it fails now (*refused) rather than
// at its caller's deadline, naming why.
size_t PosixBackend::rebalance_locked(std::deque<std::pair<IoRequest*, bool>>* refused) {
  if (stopping_ || queue_.empty()) return 0;
  const uint64_t now = now_ns();
  size_t held = 0;
  uint64_t next = kNoDeadline;  // when the next busy thread counts as held
  for (size_t i = 0; i < threads_.size(); ++i) {
    if (busy_since_[i] == 0) continue;
    if (now - busy_since_[i] >= kHeldNs) ++held;
    else next = std::min(next, busy_since_[i] + kHeldNs);
  }
  arm_watch_locked(next);  // the watcher looks again then, whether or not anyone submits
  const size_t before = threads_.size();
  while (threads_.size() - held < opts_.depth && threads_.size() < busy_since_.size() && add_spare_locked()) {
  }
  if (threads_.size() > before)
    UCM_INFO(kBackend, "posix store at %s: %zu I/O threads held in the kernel; %zu threads now (depth %u, at most %zu)",
             opts_.dir.c_str(), held, threads_.size(), opts_.depth, busy_since_.size());
  if (held < threads_.size()) return 0;
  refused->swap(queue_);
  return held;
}

void PosixBackend::refuse(std::deque<std::pair<IoRequest*, bool>>* refused, size_t held) {
  if (refused->empty()) return;
  UCM_WARN("posix store at %s: all %zu I/O threads are held in the kernel (each for over %llu ms) by requests the file "
           "system does not return (a server down?); %zu queued request(s) fail",
           opts_.dir.c_str(), held, static_cast<unsigned long long>(kHeldNs / 1'000'000), refused->size());
  for (auto& [req, is_load] : *refused) {
    complete_with(req, Result::kBackend,
                  "posix store at %s: all %zu I/O threads are held in the kernel by requests the file system does not "
                  "return (a server down?); this %s was not started",
                  opts_.dir.c_str(), held, is_load ? "load" : "dump");
  }
  refused->clear();
}

void PosixBackend::fail_held_file(IoRequest* req) {
  std::snprintf(req->error, sizeof(req->error),
                "posix store: %s: another request of this block file has been held in the kernel for over %llu ms "
                "(its server down?); not started",
                block_path(req->key.block).c_str(), static_cast<unsigned long long>(kHeldNs / 1'000'000));
  req->result = Result::kBackend;
}

void PosixBackend::arm_watch_locked(uint64_t at) {
  if (at >= watch_at_.load(std::memory_order_relaxed)) return;
  watch_at_.store(at, std::memory_order_relaxed);
  watch_cv_.notify_one();
}

void PosixBackend::watch_ring(uint64_t since) {
#if UCM_HAVE_URING
  const uint64_t at = since + kHeldNs;
  // The ring's thread arms this before each of its calls: mostly a look at
  // an atomic, as the watcher is armed already for sooner.
  if (watch_at_.load(std::memory_order_seq_cst) <= at) return;  // after CallMark's store (it says why)
  std::lock_guard<std::mutex> g(mu_);
  arm_watch_locked(at);
#else
  (void)since;
#endif
}

// The ring's thread held in one call past kHeldNs with loads queued
// behind it: they, and the loads after them, go to the threads (unlocked).
void PosixBackend::look_at_ring() {
#if UCM_HAVE_URING
  if (!ring_ || ring_->given_up()) return;
  const uint64_t since = ring_->call_since();
  if (since == 0) return;
  if (now_ns() - since < kHeldNs) return watch_ring(since);
  std::deque<IoRequest*> handed = ring_->requests_stuck(true);
  if (handed.empty()) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!stopping_) {
      for (IoRequest* req : handed) queue_.emplace_back(req, true);
      handed.clear();
    }
  }
  for (IoRequest* req : handed) complete_with(req, Result::kTimeout, "posix store shut down with the request queued");
  cv_.notify_all();
#endif
}

// Requests queued behind busy threads that then hang are looked at again
// when those count as held, with no submit or report needed to do it; so is
// the ring's thread (look_at_ring).
void PosixBackend::watch() {
  name_this_thread("posix-watch");
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    const uint64_t now = now_ns();
    const uint64_t at = watch_at_.load(std::memory_order_relaxed);
    if (at == kNoDeadline) {
      watch_cv_.wait(lk);
      continue;
    }
    if (now < at) {
      watch_cv_.wait_for(lk, std::chrono::nanoseconds(at - now));
      continue;
    }
    watch_at_.store(kNoDeadline, std::memory_order_seq_cst);  // before look_at_ring reads call_since_ (CallMark)
    std::deque<std::pair<IoRequest*, bool>> refused;
    const size_t held = rebalance_locked(&refused);
    lk.unlock();
    refuse(&refused, held);
    look_at_ring();
    lk.lock();
  }
}

bool PosixBackend::add_spare_locked() {
  // The caller is the queue's dispatcher or copier, pinned to its core
  // (topo/): a spare runs where the store's first threads do instead.
  const auto idx = static_cast<uint32_t>(threads_.size());
  try {
    threads_.emplace_back([this, idx] {
      if (has_affinity_) (void)sched_setaffinity(0, sizeof(affinity_), &affinity_);
      worker(idx);
    });
  } catch (const std::system_error& e) {  // EAGAIN: a limit on threads (RLIMIT_NPROC, a pids cgroup)
    UCM_WARN("posix store at %s: no spare I/O thread beside held requests: %s", opts_.dir.c_str(), e.what());
    return false;
  }
  return true;
}

bool PosixBackend::cancel(IoRequest* req) {
#if UCM_HAVE_URING
  if (ring_ && ring_->cancel(req)) return true;
#endif
  std::lock_guard<std::mutex> g(mu_);
  const auto at = std::find_if(queue_.begin(), queue_.end(), [&](const auto& q) { return q.first == req; });
  if (at == queue_.end()) return false;
  queue_.erase(at);
  return true;
}

uint32_t PosixBackend::io_threads() {
  std::lock_guard<std::mutex> g(mu_);
  return static_cast<uint32_t>(threads_.size());
}

// A request for a block file of which another thread's read has been held in
// the kernel for held_file_ns (kHeldNs and then some for a large shard) is not
// started: the file's server is likely down,
// and a second read would hold a second thread as long (the queue asks again
// for each shard of the block, and for each of its retries).
bool PosixBackend::file_held_locked(const BlockId& b, uint64_t now) const {
  for (size_t i = 0; i < threads_.size(); ++i)
    if (busy_read_[i] != 0 && now - busy_since_[i] >= held_file_ns(busy_read_[i]) && busy_block_[i] == b) return true;
  return false;
}

}  // namespace ucm
