// The process's one hwloc topology, shared by placement and the node view
// (the only topo/ files that include hwloc, with this one's .cpp).
//
// Loaded on first use, with the important I/O devices (the GPUs' PCI
// objects), and kept for the life of the process: loading it costs from
// milliseconds to a good part of a second on a node with many PCI devices,
// queries on a loaded topology are thread-safe, and destroying the last one
// unloads hwloc's plugins (the PCI one among them), which leaves their
// allocations unreachable (LeakSanitizer reports them). Placement and the node
// view each loaded their own before: two loads per rank at every init.
#pragma once

#include <hwloc.h>

#include "common/result.h"

namespace ucm {

// The topology, or nullptr with *r the failure (named in last_error()) when
// hwloc could not load it; the same answer for every caller.
hwloc_topology_t process_topology(Result* r);

}  // namespace ucm
