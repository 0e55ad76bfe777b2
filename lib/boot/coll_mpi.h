// The MPI implementation of the fan-out seam (common/collective.h):
// MPI_Iallgather and MPI_Ibcast over a duplicate of the node communicator,
// host buffers only (this Open MPI is not CUDA-aware). The fan-out thread
// calls MPI while the app's thread may too, so it needs MPI_THREAD_MULTIPLE.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "common/collective.h"
#include "sync/process_identity.h"

namespace ucm {

// Collective over `node` (from the app's MPI thread, at init): checks the
// thread level and duplicates the communicator, watching the node's
// processes (`watch`, by local rank: one killed meanwhile is kPeerDead).
// kUnsupported naming the level when MPI was not initialized with
// MPI_THREAD_MULTIPLE.
[[nodiscard]] Result make_mpi_collective(MPI_Comm node, const std::vector<ProcessIdentity>* watch,
                                         std::unique_ptr<Collective>* out);

}  // namespace ucm
