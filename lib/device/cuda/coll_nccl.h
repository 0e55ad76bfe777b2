// The NCCL implementation of the fan-out seam (common/collective.h): a node
// communicator over the local ranks' GPUs, device buffers. Built only when
// NCCL is found (meson -Dnccl, -Dnccl_prefix); it never includes MPI: the
// unique id travels through `share_id` (an MPI_Bcast in api/cache_fanout.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/collective.h"

namespace ucm {

// Collective over the node: local rank 0 makes the unique id, `share_id`
// sends it to every rank, `agree` turns a local result into the node's (as
// collective_status does). The communicator is made non-blocking
// (ncclCommInitRankConfig, blocking = 0) and polled with
// ncclCommGetAsyncError until it is ready or `deadline_ns` (then aborted:
// kTimeout naming the rank). Later calls poll the same way against their
// deadlines; a timeout or an async error aborts the communicator
// (ncclCommAbort) and drains its stream before the call returns, so nothing
// lands in a destination after that.
[[nodiscard]] Result make_nccl_collective(uint32_t rank, uint32_t size, int device,
                                          const std::function<Result(void*, size_t)>& share_id,
                                          const std::function<Result(Result)>& agree, uint64_t deadline_ns,
                                          std::unique_ptr<Collective>* out);

}  // namespace ucm
