// Keys named by a number, as tests and benchmarks name blocks: block n is
// (lo = n, hi = n ^ 0x5a5a5a5a5a5a5a5a), so blocks 1, 2, 3... differ in both
// halves and no two numbers give one id. One spelling for the library's Key
// and the C API's ucm_key_t, and the conversions between them, so that a
// test, a benchmark and an error message agree on which block is which.
// Header-only; nothing in lib/ uses it.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/key.h"
#include "ucmcache/ucm.h"

namespace ucm {

inline BlockId numbered_block(uint64_t n) {
  BlockId b;
  b.lo = n;
  b.hi = n ^ 0x5a5a5a5a5a5a5a5aull;
  return b;
}

inline Key numbered_key(uint64_t n, uint32_t shard) {
  Key k;
  k.block = numbered_block(n);
  k.shard = shard;
  return k;
}

inline ucm_block_t to_ucm_block(const BlockId& b) {
  ucm_block_t out{};
  std::memcpy(out.bytes, &b.lo, 8);
  std::memcpy(out.bytes + 8, &b.hi, 8);
  return out;
}

inline ucm_key_t to_ucm_key(const Key& k) {
  ucm_key_t out{};
  out.block = to_ucm_block(k.block);
  out.shard = k.shard;
  return out;
}

// The library's Key for a C API key (any key, numbered or not).
inline Key ikey(const ucm_key_t& k) {
  Key out;
  out.block = block_from_bytes(k.block.bytes);
  out.shard = k.shard;
  return out;
}

// The C API's spelling of numbered_key / numbered_block.
inline ucm_key_t ukey(uint64_t n, uint32_t shard) { return to_ucm_key(numbered_key(n, shard)); }
inline ucm_block_t ublock(uint64_t n) { return to_ucm_block(numbered_block(n)); }

}  // namespace ucm
