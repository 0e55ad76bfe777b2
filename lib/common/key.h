// The cache key: (16-byte block id, shard index), and its bucket hash.
//
// The block id is already a hash (the engine derives it from token content), so
// its bytes are used directly; one multiply spreads ids that callers make
// sequential in tests. Shards of one block land in consecutive buckets, which is
// what lets Touch(block) walk a short, contiguous run of buckets. This function
// is a cross-process contract (every rank must compute the same bucket): it is
// part of the control-region ABI, so never std::hash.
#pragma once

#include <cstdint>
#include <cstring>

namespace ucm {

struct BlockId {
  uint64_t lo = 0;
  uint64_t hi = 0;
  friend bool operator==(const BlockId&, const BlockId&) = default;
};

struct Key {
  BlockId block;
  uint32_t shard = 0;
  friend bool operator==(const Key&, const Key&) = default;
};

inline BlockId block_from_bytes(const uint8_t bytes[16]) {
  BlockId b;
  std::memcpy(&b.lo, bytes, 8);
  std::memcpy(&b.hi, bytes + 8, 8);
  return b;
}

inline uint64_t block_hash(const BlockId& b) {
  return ((b.lo ^ (b.hi * 0xC2B2AE3D27D4EB4Full)) * 0x9E3779B97F4A7C15ull) >> 17;
}

inline uint32_t bucket_of(const Key& k, uint32_t bucket_mask) {
  return static_cast<uint32_t>((block_hash(k.block) + k.shard) & bucket_mask);
}

// The whole key's hash for in-process hash tables (bucket_of is the shared
// one, an ABI): the shard is mixed into every bit, so the shards of one block
// spread as well as different blocks do.
struct KeyHash {
  uint64_t operator()(const Key& k) const { return block_hash(k.block) ^ (uint64_t{k.shard} * 0x9E3779B97F4A7C15ull); }
};

}  // namespace ucm
