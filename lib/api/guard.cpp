#include "api/guard.h"

#include <exception>
#include <new>
#include <system_error>

namespace ucm {

Result exception_result(const char* where) noexcept {
  Result r = Result::kInternal;
  try {
    try {
      throw;
    } catch (const std::bad_alloc& e) {
      r = Result::kNoMemory;
      return fail(r, "%s: out of memory (%s)", where, e.what());
    } catch (const std::system_error& e) {
      r = Result::kSystem;
      return fail(r, "%s: %s (%s error %d)", where, e.what(), e.code().category().name(), e.code().value());
    } catch (const std::exception& e) {
      return fail(r, "%s: unexpected exception: %s", where, e.what());
    } catch (...) {
      return fail(r, "%s: an unexpected exception that is not a std::exception", where);
    }
  } catch (...) {
    return r;  // not even the message could be recorded
  }
}

namespace {
thread_local std::string t_orphan_error;
}

void set_orphan_error(const std::string& e) noexcept {
  try {
    t_orphan_error = e;
  } catch (...) {
    t_orphan_error.clear();  // no memory for the message: the result still says what failed
  }
}

const char* orphan_error() noexcept { return t_orphan_error.c_str(); }

}  // namespace ucm
