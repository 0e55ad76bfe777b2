#include "api/own_memory.h"

#include <algorithm>

namespace ucm {

void OwnMemory::add(const void* base, uint64_t bytes, std::string what) {
  if (!base || bytes == 0) return;
  Range r;
  r.begin = reinterpret_cast<uintptr_t>(base);
  r.end = bytes > UINTPTR_MAX - r.begin ? UINTPTR_MAX : r.begin + bytes;
  r.what = std::move(what);
  lo_ = std::min(lo_, r.begin);
  hi_ = std::max(hi_, r.end);
  const auto at = std::upper_bound(ranges_.begin(), ranges_.end(), r.begin,
                                   [](uintptr_t b, const Range& x) { return b < x.begin; });
  ranges_.insert(at, std::move(r));
}

const OwnMemory::Range* OwnMemory::overlap_in_hull(uintptr_t begin, uintptr_t end) const {
  // The last range that starts before `end` is the only one that can overlap
  // (the ranges are disjoint and sorted).
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), end,
                             [](const Range& x, uintptr_t e) { return x.begin < e; });
  if (it == ranges_.begin()) return nullptr;
  --it;
  return it->end > begin ? &*it : nullptr;
}

void OwnMemory::clear() {
  ranges_.clear();
  lo_ = UINTPTR_MAX;
  hi_ = 0;
}

}  // namespace ucm
