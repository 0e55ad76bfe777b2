// The handle table, the reference every call holds on its cache, and the one
// wrapper that turns every C API call's failure (or exception) into a result.
//
// A handle is a pointer to a small shell that is never freed once handed out:
// after finalize the shell stays as a tombstone (a few dozen bytes per cache
// ever finalized), so a stale copy of a handle is reliably UCM_ERR_FINALIZED
// and never a use-after-free, and a pointer that was never a handle is
// UCM_ERR_BAD_HANDLE.
//
// Calls and finalize, in steps:
//   1. A call looks the handle up in the table (under the table's mutex), then
//      counts itself in `calls` and only then reads `closing`; seeing it set,
//      it counts itself out and returns UCM_ERR_FINALIZED.
//   2. Finalize sets `finalizing` (under the table's mutex, once: a second
//      finalize is UCM_ERR_FINALIZED) and closes the cache: its queue stops
//      (nothing more is written into any task's destinations) and every
//      blocked wait is woken. Only then it sets `closing` and reads `calls`:
//      a call refused with UCM_ERR_FINALIZED may free its buffers at once.
//      Both sides use sequentially consistent operations, so either the call
//      sees `closing` or finalize sees the call: no call starts on a cache
//      being freed.
//   3. Finalize waits (bounded) until `calls` is 0; the last call out
//      notifies it under `mu`.
//   4. The handle becomes a tombstone; the Cache is freed, unless calls were
//      still running when the bound ran out: then it is left allocated (see
//      ucm_cache_finalize in ucm.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "api/cache.h"
#include "api/guard.h"
#include "ucmcache/ucm.h"

struct ucm_cache_s {
  std::unique_ptr<ucm::Cache> impl;  // null once finalized
  std::atomic<uint32_t> calls{0};    // C API calls running on impl
  std::atomic<bool> finalizing{false};  // set once, when finalize begins; never cleared
  std::atomic<bool> closing{false};     // set once, by finalize after closing the cache; never cleared
  uint32_t fork_epoch = 0;           // the process's fork epoch when it was made (handles.cpp)
  int creator_pid = 0;               // the process that made it
  std::mutex mu;                     // with cv: finalize waits for calls == 0
  std::condition_variable cv;
};

namespace ucm {

ucm_cache_s* register_handle(std::unique_ptr<Cache> impl);

// Looks `h` up without holding a reference: kOk with *out set, kBadHandle, or
// kFinalized (with a message). Only for tests that know no finalize overlaps.
[[nodiscard]] Result resolve_handle(ucm_cache_t h, Cache** out);

// One call's reference on a live cache: finalize waits until it is released.
class CacheRef {
 public:
  CacheRef() = default;
  ~CacheRef() { release(); }
  CacheRef(const CacheRef&) = delete;
  CacheRef& operator=(const CacheRef&) = delete;

  // kOk, kBadHandle, or kFinalized (also once finalize has begun).
  [[nodiscard]] Result acquire(ucm_cache_t h);
  Cache* get() const { return cache_; }
  void release();

 private:
  ucm_cache_s* shell_ = nullptr;
  Cache* cache_ = nullptr;
};

// Finalize's side of the handle (steps 2 to 4 above).
struct Retired {
  std::unique_ptr<Cache> cache;  // to tear down; null when calls were still running
  Cache* still_used = nullptr;   // else the cache they use (the tombstone keeps it)
  uint32_t calls = 0;            // how many were still running
};
// `close` runs once no new call can start; it must wake whatever blocks the
// calls in flight. They then get the cache's timeout_ms to drain.
[[nodiscard]] Result retire_handle(ucm_cache_t h, void (*close)(Cache*), Retired* out);

// Ends a C API call: a failure's message goes to the cache's last error (or
// the thread's, with no cache); the result is returned as the C enum. With
// the call's handle `h`, the message is also kept as this thread's last on
// h, so that a thread reads its own failure's message, not one another
// thread's call on the cache made since (cache_error).
ucm_result_t finish_call(Cache* c, Result r, ucm_cache_t h = nullptr) noexcept;

// ucm_last_error(h) on a cache this thread holds a reference on: this
// thread's last failed call's message on h, or, where this thread had none,
// the cache's (any thread's) last. Handles are never reused (tombstones), so
// a message of a finalized cache never shows for another.
std::string cache_error(ucm_cache_t h, const Cache& c);

// One C API call on a cache: holds a reference for its length, runs
// f(Cache&) -> Result with every exception mapped, records the message.
template <typename F>
ucm_result_t cache_call(ucm_cache_t h, const char* where, F&& f) noexcept {
  CacheRef ref;
  const Result r = guarded(where, [&] { return ref.acquire(h); });
  if (r != Result::kOk) return finish_call(nullptr, r);
  return finish_call(ref.get(), guarded(where, [&] { return f(*ref.get()); }), h);
}

}  // namespace ucm
