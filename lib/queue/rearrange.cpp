#include "queue/rearrange.h"

namespace ucm {

void rearrange_order(uint32_t count, uint32_t rank, uint32_t ranks, bool rotate, std::vector<uint32_t>* out) {
  out->clear();
  out->reserve(count);
  if (!rotate || ranks <= 1) {
    for (uint32_t i = 0; i < count; ++i) out->push_back(i);
    return;
  }
  for (uint32_t k = 0; k < ranks; ++k)
    for (uint32_t p = (rank + k) % ranks; p < count; p += ranks) out->push_back(p);
}

}  // namespace ucm
