// NVTX ranges for Nsight Systems, in the `ucmcache` domain.
//
// One line per call site: UCM_TRACE(TraceRange::kSubmit) opens a range that
// closes at the end of the enclosing scope (a push and a pop on the calling
// thread). Built with NVTX (meson option `nvtx`, on when nvtx3/ is found),
// each range is two calls into NVTX 3 (header-only, no library); with no
// tool attached (nsys, or a library named by NVTX_INJECTION64_PATH), known
// from the first range on, a range is an inline relaxed load and a branch at
// each end. Built without, the macro compiles to nothing.
//
// Where each range is (docs/design.md, "Observability"): init and finalize
// (ucm_cache_init/_finalize), submit (ucm_load/ucm_dump), touch (ucm_touch)
// and task wait (ucm_task_wait) on the caller's thread; dispatch (one task) on the dispatcher; wait for
// Ready (the copier asleep on slots that are loading), copy (a copy or a
// batch flush) and dump (the app's bytes into a slot) on the queue's
// threads; backend load and backend dump on the store's I/O threads.
#pragma once

#include <atomic>
#include <cstdint>

#include "ucm_build_config.h"

namespace ucm {

enum class TraceRange : uint32_t {
  kInit,
  kFinalize,
  kSubmit,
  kTouch,
  kTaskWait,
  kDispatch,
  kWaitReady,
  kCopy,
  kDump,
  kBackendLoad,
  kBackendDump,
  kCount,
};

// The range's name in the domain ("wait for Ready").
const char* trace_range_name(TraceRange r);
// Whether this library was built with NVTX.
constexpr bool trace_built() { return UCM_HAVE_NVTX != 0; }

#if UCM_HAVE_NVTX
// 0: not known yet, 1: no tool attached, 2: a tool. Set once, by the first
// range (which makes the domain); it never changes after.
extern std::atomic<uint8_t> g_trace_tool;
void trace_push_slow(TraceRange r);
void trace_pop_slow();
inline void trace_push(TraceRange r) {
  if (g_trace_tool.load(std::memory_order_relaxed) != 1) trace_push_slow(r);
}
inline void trace_pop() {
  if (g_trace_tool.load(std::memory_order_relaxed) != 1) trace_pop_slow();
}

class TraceScope {
 public:
  explicit TraceScope(TraceRange r) { trace_push(r); }
  ~TraceScope() { trace_pop(); }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;
};

#define UCM_TRACE_CAT2_(a, b) a##b
#define UCM_TRACE_CAT_(a, b) UCM_TRACE_CAT2_(a, b)
#define UCM_TRACE(range) const ::ucm::TraceScope UCM_TRACE_CAT_(ucm_trace_scope_, __LINE__)(range)
#else
#define UCM_TRACE(range) static_cast<void>(0)
#endif

}  // namespace ucm
