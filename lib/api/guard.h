// Exceptions at the C boundary: nothing throws across it, so every extern "C"
// entry point runs its work through guarded(), which turns an exception into
// a Result with a message, like any other failure.
#pragma once

#include <string>

#include "common/result.h"

namespace ucm {

// Inside a catch block: the exception in flight as a result, its message
// recorded by fail() ("ucm_touch: out of memory (std::bad_alloc)"):
// std::bad_alloc is kNoMemory, std::system_error (a thread that cannot be
// created, say) kSystem with its text and code, anything else kInternal.
Result exception_result(const char* where) noexcept;

// Runs f() -> Result; an exception becomes exception_result(where).
template <typename F>
Result guarded(const char* where, F&& f) noexcept {
  try {
    return f();
  } catch (...) {
    return exception_result(where);
  }
}

// The message of the last failed call on this thread that had no usable
// cache (ucm_config_*, ucm_cache_init, a bad handle): ucm_last_error(NULL).
void set_orphan_error(const std::string& e) noexcept;
const char* orphan_error() noexcept;

}  // namespace ucm
