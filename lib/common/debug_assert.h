// UCM_DEBUG_ASSERT(cond, fmt, ...): a check of the library's own invariants
// (a state machine's legal moves), never of input: bad input, a stray word in
// shared memory or a caller's error is a Result with a message, in every
// build. When the check fails it prints where, the condition, and the
// caller's message (for a transition: its name, the word's old and new
// values), then aborts.
//
// On when UCM_DEBUG_ASSERTS is nonzero (-DUCM_DEBUG_ASSERTS alone makes it 1),
// off when it is 0; the build defines it from the meson option `debug_asserts` (auto: on
// in the debug and debugoptimized buildtypes, off in release; docs/design.md
// says why). Compiled without that define, NDEBUG decides, as for assert().
// Off, the condition and the arguments are still compiled (so a variable
// used only by an assert is not "unused") but never evaluated: no code.
#pragma once

#include <unistd.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>

#if defined(UCM_DEBUG_ASSERTS)
#if UCM_DEBUG_ASSERTS + 0  // -DUCM_DEBUG_ASSERTS alone defines it as 1
#define UCM_DEBUG_ASSERTS_ON 1
#else
#define UCM_DEBUG_ASSERTS_ON 0
#endif
#elif !defined(NDEBUG)
#define UCM_DEBUG_ASSERTS_ON 1
#else
#define UCM_DEBUG_ASSERTS_ON 0
#endif

namespace ucm {

constexpr bool kDebugAsserts = UCM_DEBUG_ASSERTS_ON != 0;

[[noreturn]] __attribute__((cold, noinline, format(printf, 4, 5))) inline void debug_assert_fail(
    const char* file, int line, const char* cond, const char* fmt, ...) {
  std::fprintf(stderr, "ucmcache pid %d: %s:%d: UCM_DEBUG_ASSERT(%s) failed: ", static_cast<int>(getpid()), file,
               line, cond);
  va_list ap;
  va_start(ap, fmt);
  std::vfprintf(stderr, fmt, ap);
  va_end(ap);
  std::fputc('\n', stderr);
  std::fflush(stderr);
  std::abort();
}

}  // namespace ucm

#if UCM_DEBUG_ASSERTS_ON
#define UCM_DEBUG_ASSERT(cond, ...)                                                          \
  do {                                                                                       \
    if (__builtin_expect(!(cond), 0)) ::ucm::debug_assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__); \
  } while (0)
#else
#define UCM_DEBUG_ASSERT(cond, ...)                                                          \
  do {                                                                                       \
    if (false && !(cond)) ::ucm::debug_assert_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);  \
  } while (0)
#endif
