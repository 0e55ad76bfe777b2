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

bool overlapping_pair(const void* const* at, size_t n, uint64_t bytes, size_t* a, size_t* b) {
  // p <= q share a byte when q - p < bytes (no end is computed: nothing wraps).
  auto close = [bytes](uintptr_t p, uintptr_t q) { return q - p < bytes; };
  size_t i = 1;
  for (; i < n; ++i) {
    const uintptr_t p = reinterpret_cast<uintptr_t>(at[i - 1]), q = reinterpret_cast<uintptr_t>(at[i]);
    if (q <= p || close(p, q)) break;
  }
  if (i >= n) return false;  // ascending, none overlaps the next: none overlaps any
  std::vector<std::pair<uintptr_t, size_t>> s(n);
  for (size_t k = 0; k < n; ++k) s[k] = {reinterpret_cast<uintptr_t>(at[k]), k};
  std::sort(s.begin(), s.end());
  // Sorted, a buffer that overlaps any later one overlaps the next.
  for (size_t k = 1; k < n; ++k) {
    if (!close(s[k - 1].first, s[k].first)) continue;
    *a = std::min(s[k - 1].second, s[k].second);
    *b = std::max(s[k - 1].second, s[k].second);
    return true;
  }
  return false;
}

void OwnMemory::clear() {
  ranges_.clear();
  lo_ = UINTPTR_MAX;
  hi_ = 0;
}

}  // namespace ucm
