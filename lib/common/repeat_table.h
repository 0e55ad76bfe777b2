// RepeatTable: finds the first entry of a task that repeats an earlier
// entry's key (the C API's UCM_ERR_DUPLICATE_KEY check, api/task_api.cpp), in
// one pass over the entries and no allocation up to 64 of them.
//
// Entry i is looked up once entries 0..i-1 are in, so the first hit names the
// first repeat (in entry order) and the entry it repeats. Per entry: its key's
// hash (KeyHash), one bit of a filter (at least 16 bits per entry, 64 up to
// 64 entries) and a link in the chain of the earlier entries that share its
// place (at least two places per entry). A clear bit says that no earlier
// entry has the key, which is the usual case, so that a task without repeats
// takes no branch that depends on its keys (the open-addressed probe this
// replaced mispredicted its "place taken" test on about a quarter of the
// entries of a 64-entry task); a set bit walks the place's chain, comparing
// hashes, then keys.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/key.h"
#include "common/small_buffer.h"

namespace ucm {

class RepeatTable {
 public:
  explicit RepeatTable(size_t n)
      : filter_mask_(pow2_at_least(std::max<size_t>(4096, 16 * n)) - 1),
        place_mask_(pow2_at_least(std::max<size_t>(16, 2 * n)) - 1),
        filter_((filter_mask_ + 1) / 64),
        head_(place_mask_ + 1),
        next_(n),
        hash_(n) {
    std::fill(filter_.data(), filter_.data() + (filter_mask_ + 1) / 64, uint64_t{0});
    std::fill(head_.data(), head_.data() + place_mask_ + 1, 0u);
  }
  RepeatTable(const RepeatTable&) = delete;
  RepeatTable& operator=(const RepeatTable&) = delete;

  // key_at(i): entry i's key. Returns the earlier entry with the same key,
  // or i itself after adding it. Entries are added in order 0, 1, 2, ...
  template <typename KeyAt>
  size_t add(KeyAt&& key_at, size_t i) {
    const Key k = key_at(i);
    const uint64_t h = KeyHash{}(k);
    hash_[i] = h;
    const uint64_t bit = h & filter_mask_;
    uint64_t& word = filter_[bit >> 6];
    const uint64_t m = uint64_t{1} << (bit & 63);
    const size_t p = h & place_mask_;
    if (word & m) [[unlikely]] {
      for (uint32_t j1 = head_[p]; j1 != 0; j1 = next_[j1 - 1])
        if (hash_[j1 - 1] == h && key_at(j1 - 1) == k) return j1 - 1;
    }
    word |= m;
    next_[i] = head_[p];  // entry index + 1; 0 ends the chain
    head_[p] = static_cast<uint32_t>(i + 1);
    return i;
  }

 private:
  static size_t pow2_at_least(size_t n) {
    size_t p = 1;
    while (p < n) p <<= 1;
    return p;
  }
  const size_t filter_mask_;
  const size_t place_mask_;
  SmallBuffer<uint64_t, 64> filter_;  // 4096 bits
  SmallBuffer<uint32_t, 128> head_;   // per place: its newest entry's index + 1; 0: none
  SmallBuffer<uint32_t, 64> next_;    // per entry: the place's entry before it (index + 1)
  SmallBuffer<uint64_t, 64> hash_;
};

}  // namespace ucm
