#include "backend/fixed_buffers.h"

#include <algorithm>

namespace ucm {

FixedBuffers::FixedBuffers(const std::vector<std::pair<void*, uint64_t>>& regions, uint64_t max_chunk) {
  for (const auto& [base, bytes] : regions) {
    auto* p = static_cast<uint8_t*>(base);
    for (uint64_t off = 0; off < bytes; off += max_chunk)
      chunks_.push_back(iovec{p + off, static_cast<size_t>(std::min(max_chunk, bytes - off))});
  }
  std::sort(chunks_.begin(), chunks_.end(),
            [](const iovec& a, const iovec& b) { return static_cast<uint8_t*>(a.iov_base) < static_cast<uint8_t*>(b.iov_base); });
}

// Overlapping regions (a caller's mistake) still give a correct answer or -1:
// the chunk tried is the last one starting at or below p.
int FixedBuffers::find(const void* p, uint64_t n) const {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = std::upper_bound(chunks_.begin(), chunks_.end(), a,
                             [](uintptr_t v, const iovec& c) { return v < reinterpret_cast<uintptr_t>(c.iov_base); });
  if (it == chunks_.begin()) return -1;
  --it;
  const auto base = reinterpret_cast<uintptr_t>(it->iov_base);
  if (n > it->iov_len || a - base > it->iov_len - n) return -1;
  return static_cast<int>(it - chunks_.begin());
}

}  // namespace ucm
