// Where a rank's queue threads run: distinct cores near the rank's GPU.
//
// With hwloc: the cores of the GPU's closest non-I/O ancestor (its NUMA node
// or package), found by the PCI bus id CUDA reports (Debian's hwloc has no
// CUDA plugin); without a GPU, all the cores this process may use. Local rank
// r takes the cores at positions 2r (dispatcher) and 2r+1 (copier) of that
// list, wrapping when there are fewer cores than threads (then `shared` is set
// and the summary says so). Binding itself is sched_setaffinity on the calling
// thread. Without hwloc, or with binding switched off, nothing is pinned and
// the summary says why.
#pragma once

#include <string>
#include <vector>

#include "common/result.h"

namespace ucm {

enum class ThreadRole { kDispatcher = 0, kCopier = 1 };

struct Placement {
  bool enabled = false;
  bool shared = false;                   // fewer cores than threads: cores are shared
  std::vector<int> cpus[2];              // OS cpu indexes per role (the PUs of one core)
  std::string summary;                   // for logs and ucm_info
};

[[nodiscard]] Result plan_placement(int local_rank, int local_size, const std::string& gpu_bus_id, bool enable,
                                    Placement* out);
// Pins the calling thread; a no-op when placement is disabled.
[[nodiscard]] Result bind_this_thread(const Placement& p, ThreadRole role);
// The calling thread's current affinity, as a cpu list ("0-1,4").
std::string this_thread_affinity();

}  // namespace ucm
