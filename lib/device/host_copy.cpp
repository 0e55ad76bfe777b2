#include "device/host_copy.h"

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

// The destination is brought to a 64-byte boundary with memcpy, then 128
// bytes a step: four unaligned loads, four aligned stores (the store side is
// what the misaligned rep movsb pays for); memcpy does the tail.
__attribute__((target("avx2"))) void vector_copy(void* dst, const void* src, size_t bytes) {
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  if (head > bytes) head = bytes;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  bytes -= head;
  size_t i = 0;
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
  std::memcpy(d + i, s + i, bytes - i);
}

#else

bool vector_copy_available() { return false; }
void vector_copy(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

#endif

CopyPath host_copy_path(const void* dst, const void* src, size_t bytes) {
  const uintptr_t skew = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 63;
  if (skew == 0 || bytes < kVectorCopyMin || bytes > kVectorCopyMax || !vector_copy_available())
    return CopyPath::kMemcpy;
  return CopyPath::kVector;
}

namespace {
thread_local uint64_t t_vector_copies = 0;
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
