#include "device/host_copy.h"

#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ucm {

#if defined(__x86_64__)

bool vector_copy_available() {
  static const bool avx2 = __builtin_cpu_supports("avx2");
  return avx2;
}

namespace {

__attribute__((target("avx2"), always_inline)) inline void copy32(uint8_t* d, const uint8_t* s) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
}

}  // namespace

// 128 bytes a step into a 64-byte aligned destination: four unaligned loads,
// four aligned stores (the store side is what the misaligned rep movsb pays
// for). The unaligned head (up to the first 64-byte boundary) and the tail
// (the last 128 bytes) are copied with unaligned vector stores that overlap
// what the loop writes, with no call out: a shard's copy issues no rep movsb
// and calls nothing (a short memcpy is a microcoded rep movsb or a call per
// end, per shard, in the inline path's loop). Same bytes written, since the
// buffers do not overlap.
__attribute__((target("avx2"))) void vector_copy(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  if (bytes < 128) {  // the head and tail steps need 128 bytes to stay inside
    std::memcpy(d, s, bytes);
    return;
  }
  copy32(d, s);
  copy32(d + 32, s + 32);
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  size_t i = head;
  for (; i + 128 <= bytes; i += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_store_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  if (i == bytes) return;
  const size_t end = bytes - 128;  // at or before where the loop stopped
  copy32(d + end, s + end);
  copy32(d + end + 32, s + end + 32);
  copy32(d + end + 64, s + end + 64);
  copy32(d + end + 96, s + end + 96);
}

#else

bool vector_copy_available() { return false; }
void vector_copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

#endif

namespace {
// Whether the vector loop beat memcpy here (calibrate_host_copy); read on
// every copy, so relaxed: a copy that reads the old value is still right.
std::atomic<bool> g_vector_preferred{true};

double seconds_now() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// One pass of `n` shards of `bytes` with `copy`, in seconds.
template <typename F>
double timed_pass(uint8_t* dst, const uint8_t* src, uint64_t bytes, size_t n, F copy) {
  const double t0 = seconds_now();
  for (size_t k = 0; k < n; ++k) copy(dst + k * bytes, src + k * bytes, bytes);
  return seconds_now() - t0;
}
}  // namespace

bool vector_copy_preferred() { return g_vector_preferred.load(std::memory_order_relaxed); }
void set_vector_copy_preferred(bool vector) { g_vector_preferred.store(vector, std::memory_order_relaxed); }

CopyCalibration calibrate_host_copy(uint64_t bytes) {
  CopyCalibration c;
  if (bytes < kVectorCopyMin || bytes > kVectorCopyMax || !vector_copy_available()) return c;
  // In the CPU's caches, as the inline path's hot shards are: about 1 MiB
  // (at least 4 shards), each pass well above the clock's resolution.
  const size_t n = std::max<size_t>(4, (size_t{1} << 20) / bytes);
  const size_t set = n * bytes;
  void* s = mmap(nullptr, set, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* d = mmap(nullptr, set + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED || d == MAP_FAILED) {  // keep what was chosen before
    if (s != MAP_FAILED) munmap(s, set);
    if (d != MAP_FAILED) munmap(d, set + 4096);
    return c;
  }
  auto* src = static_cast<uint8_t*>(s);
  auto* dst = static_cast<uint8_t*>(d) + 16;  // malloc's large blocks: 16 bytes past a page
  std::memset(src, 0x5c, set);
  std::memset(dst, 0, set);
  double best_memcpy = 1e9, best_vector = 1e9;
  for (int pass = 0; pass < 8; ++pass) {  // interleaved: a busy moment hits both
    best_memcpy = std::min(best_memcpy, timed_pass(dst, src, bytes, n, [](void* a, const void* b, size_t k) {
                             std::memcpy(a, b, k);
                           }));
    best_vector = std::min(best_vector, timed_pass(dst, src, bytes, n, &vector_copy));
  }
  munmap(s, set);
  munmap(d, set + 4096);
  c.bytes = bytes;
  c.memcpy_gbs = best_memcpy > 0 ? double(set) / best_memcpy / 1e9 : 0;
  c.vector_gbs = best_vector > 0 ? double(set) / best_vector / 1e9 : 0;
  c.vector = c.vector_gbs > c.memcpy_gbs * kVectorCopyMargin;
  set_vector_copy_preferred(c.vector);
  return c;
}

CopyPath host_copy_path(const void* dst, const void* src, size_t bytes) {
  const uintptr_t skew = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 63;
  if (skew == 0 || bytes < kVectorCopyMin || bytes > kVectorCopyMax || !vector_copy_available() ||
      !g_vector_preferred.load(std::memory_order_relaxed))
    return CopyPath::kMemcpy;
  return CopyPath::kVector;
}

namespace {
// Initial-exec: a plain %fs-relative add per copy, not a __tls_get_addr call
// (the shared library's default model), on the inline path's per-shard loop.
__attribute__((tls_model("initial-exec"))) thread_local uint64_t t_vector_copies = 0;
}  // namespace

void host_copy(void* dst, const void* src, size_t bytes) {
  if (host_copy_path(dst, src, bytes) == CopyPath::kVector) {
    vector_copy(dst, src, bytes);
    ++t_vector_copies;
  } else {
    std::memcpy(dst, src, bytes);
  }
}

uint64_t vector_copies_on_this_thread() { return t_vector_copies; }

}  // namespace ucm
