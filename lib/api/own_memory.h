// The memory a rank maps of its node's cache: the control region, every
// data-plane segment and the store's node state. An app's dst or src must
// lie outside all of it. With the host engine nothing else would notice one
// that does not (a CUDA engine refuses host memory anyway): a load copies a
// shard over slots that every rank of the node reads, so the next load of
// their keys brings another key's bytes, or over the control region, and a
// dump stores the cache's own bytes under a key. The C API refuses such an
// entry at submit (UCM_ERR_INVALID_ARG naming the entry and the region).
//
// Owned by the Cache, filled once at init (after the planes are mapped) and
// read only after that, so lookups take no lock. Ranges are this process's
// addresses; they stay reserved until finalize (a fenced-off segment keeps
// its address range).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ucm {

// Of n buffers of `bytes` each at at[0..n), two that share a byte: true, with
// their indexes (*a < *b), the pair found first in address order; else false.
// O(n) when the addresses ascend without overlap (a task cut from one buffer,
// the common case), O(n log n) otherwise. Buffers that would run past the
// top of the address space end there. Two dsts of one load that overlap get
// each other's bytes in whichever order the copies run: the C API refuses
// such a load at submit (UCM_ERR_INVALID_ARG naming both entries).
bool overlapping_pair(const void* const* at, size_t n, uint64_t bytes, size_t* a, size_t* b);

class OwnMemory {
 public:
  struct Range {
    uintptr_t begin = 0, end = 0;  // [begin, end)
    std::string what;              // "the control region", "data segment 3", ...
  };

  // Adds [base, base + bytes); nothing for a null base or 0 bytes.
  void add(const void* base, uint64_t bytes, std::string what);
  // The range that [p, p + bytes) overlaps, or nullptr. A range that would
  // wrap past the top of the address space is taken to end there.
  const Range* overlap(const void* p, uint64_t bytes) const {
    const uintptr_t begin = reinterpret_cast<uintptr_t>(p);
    const uintptr_t end = bytes > UINTPTR_MAX - begin ? UINTPTR_MAX : begin + bytes;
    if (end <= lo_ || begin >= hi_ || bytes == 0) return nullptr;  // outside the hull: the common case
    return overlap_in_hull(begin, end);
  }
  void clear();

 private:
  const Range* overlap_in_hull(uintptr_t begin, uintptr_t end) const;

  std::vector<Range> ranges_;  // sorted by begin; mappings do not overlap
  uintptr_t lo_ = UINTPTR_MAX, hi_ = 0;  // the hull: most buffers are outside it
};

}  // namespace ucm
