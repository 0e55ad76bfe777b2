// The sim store's content: a pure function of (block, shard, byte offset), so
// any copy of a shard, anywhere, can be verified byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/key.h"

namespace ucm {

inline uint64_t sim_word(const Key& k, uint64_t word_index) {
  uint64_t z = k.block.lo ^ ((k.block.hi << 17) | (k.block.hi >> 47)) ^ (uint64_t{k.shard} << 40) ^
               (word_index * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint8_t sim_byte(const Key& k, uint64_t offset) {
  return static_cast<uint8_t>(sim_word(k, offset / 8) >> (8 * (offset % 8)));
}

inline void sim_fill(const Key& k, void* buf, uint64_t bytes) {
  auto* p = static_cast<uint8_t*>(buf);
  uint64_t w = 0;
  for (; (w + 1) * 8 <= bytes; ++w) {
    const uint64_t v = sim_word(k, w);
    std::memcpy(p + w * 8, &v, 8);
  }
  for (uint64_t o = w * 8; o < bytes; ++o) p[o] = sim_byte(k, o);
}

// Returns the first offset whose byte differs, or `bytes` when all match.
inline uint64_t sim_verify(const Key& k, const void* buf, uint64_t bytes) {
  const auto* p = static_cast<const uint8_t*>(buf);
  uint64_t w = 0;
  for (; (w + 1) * 8 <= bytes; ++w) {
    uint64_t v;
    std::memcpy(&v, p + w * 8, 8);
    if (v != sim_word(k, w))
      for (uint64_t o = w * 8;; ++o)
        if (p[o] != sim_byte(k, o)) return o;
  }
  for (uint64_t o = w * 8; o < bytes; ++o)
    if (p[o] != sim_byte(k, o)) return o;
  return bytes;
}

}  // namespace ucm
