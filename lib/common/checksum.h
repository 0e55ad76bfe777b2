// A fast 64-bit checksum for whole shards (megabytes): four independent
// multiply-rotate lanes over 32-byte stripes, so the CPU overlaps them, then a
// merge and an avalanche. Detects truncation, torn writes and bit flips; it is
// not cryptographic. Stable across builds: it is an on-disk format.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace ucm {

namespace checksum_detail {
constexpr uint64_t kM1 = 0x9E3779B185EBCA87ull;
constexpr uint64_t kM2 = 0xC2B2AE3D27D4EB4Full;
constexpr uint64_t kM3 = 0x165667B19E3779F9ull;
inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t mix(uint64_t acc, uint64_t v) { return rotl(acc + v * kM2, 31) * kM1; }
inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
}  // namespace checksum_detail

inline uint64_t checksum64(const void* data, size_t n, uint64_t seed = 0) {
  using namespace checksum_detail;
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t a = seed + kM1 + kM2, b = seed + kM2, c = seed, d = seed - kM1;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a = mix(a, load64(p + i));
    b = mix(b, load64(p + i + 8));
    c = mix(c, load64(p + i + 16));
    d = mix(d, load64(p + i + 24));
  }
  uint64_t h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18) + n;
  for (; i + 8 <= n; i += 8) h = rotl(h ^ mix(0, load64(p + i)), 27) * kM1 + kM3;
  for (; i < n; ++i) h = rotl(h ^ (p[i] * kM3), 11) * kM1;
  h ^= h >> 33;
  h *= kM2;
  h ^= h >> 29;
  h *= kM3;
  return h ^ (h >> 32);
}

}  // namespace ucm
