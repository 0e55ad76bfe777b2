#include "common/result.h"

#include <cstdarg>
#include <cstdio>

#include "common/log.h"

namespace ucm {
namespace {
thread_local std::string t_last_error;
}

const char* result_name(Result r) { return ucm_result_string(static_cast<ucm_result_t>(r)); }

Result fail(Result r, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  t_last_error = buf;
  UCM_DEBUG(kCommon, "%s: %s", result_name(r), buf);
  return r;
}

const std::string& last_error() { return t_last_error; }
void clear_last_error() { t_last_error.clear(); }

}  // namespace ucm
