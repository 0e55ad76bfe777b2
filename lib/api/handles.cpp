#include "api/handles.h"

#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <unordered_set>

#include "common/log.h"

namespace ucm {
namespace {

std::mutex g_mu;
std::unordered_set<ucm_cache_s*>& live() {
  static auto* s = new std::unordered_set<ucm_cache_s*>();
  return *s;
}
// How many forks this process is from the one it started as. A forked child
// inherits every handle and the cache's memory, but none of its threads: a
// task would wait for a dispatcher that is not there, and a finalize would
// depart the node for the parent. g_mu is held across fork (prepare, then
// unlocked on both sides), so the child's table is consistent.
std::atomic<uint32_t> g_fork_epoch{0};
const int g_fork_hooks = pthread_atfork([] { g_mu.lock(); }, [] { g_mu.unlock(); },
                                        [] {
                                          g_fork_epoch.fetch_add(1, std::memory_order_relaxed);
                                          g_mu.unlock();
                                        });

std::unordered_set<ucm_cache_s*>& tombstones() {
  static auto* s = new std::unordered_set<ucm_cache_s*>();
  return *s;
}

// Under g_mu: kOk for a shell in the table (live or closing), else the error.
Result lookup_locked(ucm_cache_t h) {
  if (live().count(h)) {
    if (h->fork_epoch == g_fork_epoch.load(std::memory_order_relaxed)) return Result::kOk;
    return fail(Result::kBadState,
                "cache handle %p belongs to process %d, and this is a forked child of it (pid %d): a cache does not "
                "cross fork() (its threads stay in the parent); the child must neither use it nor finalize it",
                static_cast<void*>(h), h->creator_pid, static_cast<int>(getpid()));
  }
  if (tombstones().count(h)) return fail(Result::kFinalized, "cache handle %p was finalized", static_cast<void*>(h));
  return fail(Result::kBadHandle, "%p is not a cache handle", static_cast<void*>(h));
}

}  // namespace

ucm_cache_s* register_handle(std::unique_ptr<Cache> impl) {
  auto* h = new ucm_cache_s;
  h->impl = std::move(impl);
  h->creator_pid = static_cast<int>(getpid());
  std::lock_guard<std::mutex> g(g_mu);
  h->fork_epoch = g_fork_epoch.load(std::memory_order_relaxed);
  live().insert(h);
  return h;
}

Result resolve_handle(ucm_cache_t h, Cache** out) {
  if (!h) return fail(Result::kBadHandle, "cache handle is NULL");
  std::lock_guard<std::mutex> g(g_mu);
  UCM_CHECK(lookup_locked(h));
  if (h->closing.load()) return fail(Result::kFinalized, "cache handle %p is being finalized", static_cast<void*>(h));
  *out = h->impl.get();
  return Result::kOk;
}

Result CacheRef::acquire(ucm_cache_t h) {
  release();
  if (!h) return fail(Result::kBadHandle, "cache handle is NULL");
  {
    std::lock_guard<std::mutex> g(g_mu);
    UCM_CHECK(lookup_locked(h));
    // Count in first, then look at closing: finalize does the converse.
    h->calls.fetch_add(1);
    shell_ = h;
  }
  if (h->closing.load()) {
    release();
    return fail(Result::kFinalized, "cache handle %p is being finalized", static_cast<void*>(h));
  }
  cache_ = h->impl.get();
  return Result::kOk;
}

void CacheRef::release() {
  ucm_cache_s* h = shell_;
  if (!h) return;
  shell_ = nullptr;
  cache_ = nullptr;
  if (h->calls.fetch_sub(1) == 1 && h->closing.load()) {
    std::lock_guard<std::mutex> g(h->mu);
    h->cv.notify_all();
  }
}

Result retire_handle(ucm_cache_t h, void (*close)(Cache*), Retired* out) {
  if (!h)
    return fail(Result::kBadHandle, "cache handle is NULL (ucm_cache_finalize sets the handle it finalizes to NULL: "
                "was this one finalized already?)");
  {
    std::lock_guard<std::mutex> g(g_mu);
    UCM_CHECK(lookup_locked(h));
    if (h->finalizing.exchange(true))
      return fail(Result::kFinalized, "cache handle %p is already being finalized by another thread",
                  static_cast<void*>(h));
  }
  Cache* c = h->impl.get();
  // Close first, then refuse new calls: a ucm_task_wait refused here returns
  // UCM_ERR_FINALIZED, and its caller may then free the task's destinations,
  // so the queue must have stopped writing into them before any call is
  // refused. Calls that start meanwhile are safe: the cache refuses new tasks
  // itself once its queue stops, and a wait returns when its task is abandoned.
  close(c);
  h->closing.store(true);
  const uint32_t timeout_ms = c->config().timeout_ms;
  bool drained;
  {
    std::unique_lock<std::mutex> lk(h->mu);
    drained = h->cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), [h] { return h->calls.load() == 0; });
    out->calls = h->calls.load();
  }
  {
    std::lock_guard<std::mutex> g(g_mu);
    live().erase(h);
    tombstones().insert(h);
  }
  // Calls still running use the cache: it stays with the tombstone, never freed.
  if (drained) out->cache = std::move(h->impl);
  else out->still_used = c;
  return Result::kOk;
}

namespace {

// This thread's last failed call on a cache: the handle and the message.
struct ThreadCacheError {
  ucm_cache_t handle = nullptr;
  std::string message;
};
thread_local ThreadCacheError t_cache_error;

}  // namespace

ucm_result_t finish_call(Cache* c, Result r, ucm_cache_t h) noexcept {
  if (r != Result::kOk) {
    try {
      if (c) c->set_error(last_error());
      else set_orphan_error(last_error());
      if (c && h) t_cache_error.handle = h, t_cache_error.message = last_error();
    } catch (...) {
      // No memory for the message: the result still says what failed.
    }
  }
  return static_cast<ucm_result_t>(r);
}

std::string cache_error(ucm_cache_t h, const Cache& c) {
  if (t_cache_error.handle == h) return t_cache_error.message;
  return c.error();
}

}  // namespace ucm
