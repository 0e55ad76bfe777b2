#include "common/trace.h"

#include <cstddef>

#if UCM_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace ucm {
namespace {

constexpr const char* kNames[] = {"init", "finalize", "submit", "touch", "task wait", "dispatch", "wait for Ready",
                                  "copy", "dump", "backend load", "backend dump"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(TraceRange::kCount));

#if UCM_HAVE_NVTX
// ARGB colours, so that a timeline tells the ranges apart at a glance.
constexpr uint32_t kColors[] = {0xff4e79a7, 0xff4e79a7, 0xfff28e2b, 0xff76b7b2, 0xffbab0ac, 0xff59a14f,
                                0xffe15759, 0xffedc948, 0xffb07aa1, 0xffff9da7, 0xff9c755f};
static_assert(sizeof(kColors) / sizeof(kColors[0]) == static_cast<size_t>(TraceRange::kCount));

// Made on first use (thread-safe static). Without a tool NVTX gives a null
// domain, and every range after that is an inline load and a branch (trace.h).
struct Domain {
  nvtxDomainHandle_t handle = nullptr;
  nvtxEventAttributes_t attrs[static_cast<size_t>(TraceRange::kCount)] = {};
};

Domain make_domain() {
  Domain d;
  d.handle = nvtxDomainCreateA("ucmcache");
  // A push and its pop agree: both see 0 and go through domain(), or both see
  // the final value (it is stored once the domain exists, and never changes).
  g_trace_tool.store(d.handle ? 2 : 1, std::memory_order_relaxed);
  if (!d.handle) return d;
  for (size_t i = 0; i < static_cast<size_t>(TraceRange::kCount); ++i) {
    nvtxEventAttributes_t& a = d.attrs[i];
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = kColors[i];
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = nvtxDomainRegisterStringA(d.handle, kNames[i]);
  }
  return d;
}

const Domain& domain() {
  static const Domain d = make_domain();
  return d;
}
#endif

}  // namespace

#if UCM_HAVE_NVTX
std::atomic<uint8_t> g_trace_tool{0};
#endif

const char* trace_range_name(TraceRange r) {
  const auto i = static_cast<size_t>(r);
  return i < static_cast<size_t>(TraceRange::kCount) ? kNames[i] : "?";
}

#if UCM_HAVE_NVTX
void trace_push_slow(TraceRange r) {
  const Domain& d = domain();
  if (d.handle) nvtxDomainRangePushEx(d.handle, &d.attrs[static_cast<size_t>(r)]);
}

void trace_pop_slow() {
  const Domain& d = domain();
  if (d.handle) nvtxDomainRangePop(d.handle);
}
#endif

}  // namespace ucm
