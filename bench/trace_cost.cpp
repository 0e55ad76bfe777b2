// What the library's NVTX ranges cost a task, side by side in one run:
// UCM_TRACE push/pop pairs (with no tool attached, the case in production
// without Nsight; or with whatever NVTX_INJECTION64_PATH names), against a
// loop of empty out-of-line calls and against a 16 KiB memcpy, the smallest
// copy a task makes. A 1-entry load passes about 6 ranges.
//
// usage: ucm_trace_cost [iterations (10000000)]
// Prints ns per range, per empty call and per 16 KiB memcpy, and the ratios
// "6 ranges / 16 KiB memcpy" and "range / empty call".
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/trace.h"

namespace {

__attribute__((noinline)) void empty_call(int* sink) { asm volatile("" : : "r"(sink) : "memory"); }

template <typename F>
double ns_per(uint64_t n, F f) {
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t i = 0; i < n; ++i) f();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / static_cast<double>(n);
}

}  // namespace

int main(int argc, char** argv) {
  const uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 10'000'000;
  if (n == 0) {
    std::fprintf(stderr, "ucm_trace_cost: iterations must be > 0\n");
    return 2;
  }
  if (!ucm::trace_built()) {
    std::printf("ucm_trace_cost: built without NVTX: UCM_TRACE compiles to nothing\n");
    return 0;
  }
  int sink = 0;
  std::vector<char> src(16384, 1), dst(16384);
  // Warm: the first range makes the domain (and loads a tool, if one is named).
  { UCM_TRACE(ucm::TraceRange::kCopy); }
  const double range_ns = ns_per(n, [] { UCM_TRACE(ucm::TraceRange::kCopy); });
  const double call_ns = ns_per(n, [&] { empty_call(&sink); });
  const uint64_t copies = n / 100 + 1;
  const double copy_ns = ns_per(copies, [&] {
    std::memcpy(dst.data(), src.data(), src.size());
    asm volatile("" : : "r"(dst.data()) : "memory");
  });
  std::printf("tool: %s\n", std::getenv("NVTX_INJECTION64_PATH") ? std::getenv("NVTX_INJECTION64_PATH") : "none");
  std::printf("range (push+pop): %.2f ns\nempty call:       %.2f ns\nmemcpy 16 KiB:    %.1f ns\n", range_ns, call_ns,
              copy_ns);
  std::printf("ratio 6 ranges / memcpy 16 KiB: %.4f\nratio range / empty call: %.2f\n", 6 * range_ns / copy_ns,
              range_ns / call_ns);
  return 0;
}
