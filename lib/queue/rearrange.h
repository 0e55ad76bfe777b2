// RearrangeIndex (seed 3.1, scenario A): the order in which local rank r of n
// visits the entries of a task. Rotate: its own stride first (r, r+n, r+2n,
// ...), then the next rank's stride (r+1, r+1+n, ...), and so on, mod n; so at
// every step the n ranks ask for n different shards, become n concurrent
// owners, and each owns about 1/n of the task. Natural (legacy): 0, 1, 2, ...
#pragma once

#include <cstdint>
#include <vector>

namespace ucm {

void rearrange_order(uint32_t count, uint32_t rank, uint32_t ranks, bool rotate, std::vector<uint32_t>* out);

}  // namespace ucm
