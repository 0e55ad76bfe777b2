// ucm_demo's KV content: what prefill dumps and decode checks, byte for byte.
// python/ucmcache/demo.py computes the same words (kv_words, block_of);
// tests/bench/demo_bound_test.cpp and tests/python/test_tools.py pin the same
// values, so the two cannot drift apart.
//
// Word i of the shard of (block, layer) is kv_seed(block, layer) XOR
// kv_offset_word(i). Both are splitmix64's finalizer (mix64, a bijection on 64
// bits) of an input that is distinct for distinct arguments, so exactly:
//   - a wrong byte changes its word, and the check compares every word;
//   - a word of another block or layer at the same offset differs (the seeds
//     differ: blocks below 2^47, layers below 2^16, kMaxKvLayers);
//   - a word of the same shard at another offset differs (the offset words
//     differ);
// and a word of another key at another offset matches only where
// seed ^ seed' == off(i) ^ off(j), a 64-bit coincidence of two mixed values
// (the seeds' inputs have the top bit set, the offsets' do not, so no
// argument swap makes it an identity).
// The check is then a load, two xors and an or per word, against a table of
// offset words computed once per shard size (KvPattern): memory speed, where
// the earlier content (a splitmix of block, layer and offset per word)
// computed two multiplies per word.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace ucm_demo {

// splitmix64's finalizer: a bijection on 64-bit words.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Layers a seed tells apart (the demo refuses more).
constexpr uint64_t kMaxKvLayers = uint64_t{1} << 16;

constexpr uint64_t kv_seed(uint64_t block, uint64_t layer) {
  return mix64((uint64_t{1} << 63) | (block << 16) | (layer & (kMaxKvLayers - 1)));
}
constexpr uint64_t kv_offset_word(uint64_t i) { return mix64(i & ~(uint64_t{1} << 63)); }
constexpr uint64_t kv_word(uint64_t block, uint64_t layer, uint64_t i) { return kv_seed(block, layer) ^ kv_offset_word(i); }

// The 16 bytes of prompt p's block id (a hash of its tokens, in an engine):
// lo, hi. Another domain than the KV words' (bit 62), so an id is never a
// KV word of the same prompt by construction.
constexpr uint64_t block_id_word(uint64_t prompt, int half) {
  return mix64((uint64_t{1} << 62) | (prompt << 1) | uint64_t(half & 1));
}

class KvPattern {
 public:
  explicit KvPattern(uint64_t shard_bytes) : table_(shard_bytes / 8) {
    for (uint64_t i = 0; i < table_.size(); ++i) table_[i] = kv_offset_word(i);
  }
  uint64_t shard_bytes() const { return table_.size() * 8; }

  void fill(uint64_t block, uint64_t layer, uint8_t* p) const {
    const uint64_t s = kv_seed(block, layer);
    for (size_t i = 0; i < table_.size(); ++i) {
      const uint64_t w = s ^ table_[i];
      std::memcpy(p + 8 * i, &w, 8);
    }
  }

  // Whether p holds exactly the shard of (block, layer). Four independent
  // lanes of 16 bytes (GCC/Clang vector types: SSE2 on any x86-64, wider
  // where the target has it), no branch until the end: a bad shard is rare
  // and is checked to the end like a good one.
  bool check(uint64_t block, uint64_t layer, const uint8_t* p) const {
    typedef uint64_t V __attribute__((vector_size(16)));
    const uint64_t s = kv_seed(block, layer);
    const V seed = {s, s};
    V acc0 = {0, 0}, acc1 = acc0, acc2 = acc0, acc3 = acc0;
    const size_t n = table_.size();
    const uint64_t* t = table_.data();
    size_t i = 0;
    auto ld = [](const void* at) {
      V v;
      std::memcpy(&v, at, sizeof(v));  // an unaligned vector load, no copy through the stack
      return v;
    };
    for (; i + 8 <= n; i += 8) {
      const uint8_t* w = p + 8 * i;
      acc0 |= ld(w) ^ ld(t + i) ^ seed;
      acc1 |= ld(w + 16) ^ ld(t + i + 2) ^ seed;
      acc2 |= ld(w + 32) ^ ld(t + i + 4) ^ seed;
      acc3 |= ld(w + 48) ^ ld(t + i + 6) ^ seed;
    }
    const V acc = acc0 | acc1 | acc2 | acc3;
    uint64_t diff = acc[0] | acc[1];
    for (; i < n; ++i) {
      uint64_t w;
      std::memcpy(&w, p + 8 * i, 8);
      diff |= w ^ t[i] ^ s;
    }
    return diff == 0;
  }

 private:
  std::vector<uint64_t> table_;
};

}  // namespace ucm_demo
