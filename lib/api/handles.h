// The handle table: which ucm_cache_t values are live, which were finalized.
//
// A handle is a pointer to a small shell that is never freed once handed out:
// after finalize the shell stays as a tombstone (a few dozen bytes per cache
// ever finalized), so a stale copy of a handle is reliably UCM_ERR_FINALIZED
// and never a use-after-free, and a pointer that was never a handle is
// UCM_ERR_BAD_HANDLE.
#pragma once

#include <memory>
#include <string>

#include "api/cache.h"
#include "ucmcache/ucm.h"

struct ucm_cache_s {
  std::unique_ptr<ucm::Cache> impl;  // null once finalized
};

namespace ucm {

ucm_cache_s* register_handle(std::unique_ptr<Cache> impl);
// Looks `h` up: kOk with *out set, kBadHandle, or kFinalized (with a message).
[[nodiscard]] Result resolve_handle(ucm_cache_t h, Cache** out);
// Moves the Cache out of a live handle and marks it finalized.
[[nodiscard]] Result retire_handle(ucm_cache_t h, std::unique_ptr<Cache>* out);

// Ends a C API call: a failure's message goes to the cache's last error (or
// the thread's, with no cache); the result is returned as the C enum.
ucm_result_t finish_call(Cache* c, Result r);

// The error of the last call that had no usable handle, per thread.
void set_orphan_error(const std::string& e);
const char* orphan_error();

}  // namespace ucm
