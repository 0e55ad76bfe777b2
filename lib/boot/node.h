// The node bootstrap's MPI side: which ranks share a cache, and agreeing.
//
// <mpi.h> appears only here and in the public header. Every function here is
// collective over the communicator it names and never returns early on one
// rank only: a failure on any rank becomes the same error on every rank
// (collective_status), so no rank is left waiting in a collective.
#pragma once

#include <mpi.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "boot/agreement.h"
#include "common/result.h"
#include "common/time.h"
#include "sync/process_identity.h"
#include "ucmcache/ucm.h"

namespace ucm {

struct NodeContext {
  MPI_Comm comm = MPI_COMM_NULL;  // a duplicate of the caller's communicator
  MPI_Comm node = MPI_COMM_NULL;  // the ranks that share this cache
  int rank = 0;                   // in comm
  int size = 0;
  int local_rank = 0;             // in node
  int local_size = 0;
  int node_id = 0;                // 0..node_count-1, by the lowest rank of each node
  int node_count = 0;
  std::vector<pid_t> local_pids;  // by local rank
  std::vector<ProcessIdentity> local_ids;  // by local rank: pid and start time
  std::string host;
};

// Splits `comm` into nodes (MPI_COMM_TYPE_SHARED, then pretend nodes of
// ranks_per_node ranks when that is > 0) and gathers the node's pids with
// their start times (so a pid taken over by another process is no rank).
// A failure that leaves the communicators built (a node with more than
// kMaxRanks ranks, a rank without a start time) still fills *out: pass the
// result through collective_status(out->comm, ...) so that every rank of
// every node gets it. With out->comm null nothing collective is possible.
[[nodiscard]] Result node_setup(MPI_Comm comm, uint32_t ranks_per_node, NodeContext* out);
// Frees the communicators, unless MPI was finalized (MPI freed them then: a
// cache may be finalized after MPI_Finalize, from an atexit handler).
void node_teardown(NodeContext* n);

// Whether ucm_cache_init can use MPI and `comm`, checked before any MPI call
// (no collective: a rank in the wrong state could not join one anyway):
// kBadState before MPI_Init or after MPI_Finalize, kInvalidArg for
// MPI_COMM_NULL (a rank that MPI_Comm_split left out), each naming it.
[[nodiscard]] Result check_mpi_usable(MPI_Comm comm);
// MPI_Finalized, as a bool: teardown after MPI_Finalize must not call MPI.
bool mpi_finalized();

// Every rank of `comm` learns whether all succeeded; if not, every rank
// returns the first failing rank's result and message ("rank 3: ...").
// With `watch` (the node's ranks), the wait watches their processes: a local
// rank that dies (SIGKILL mid-init) is kPeerDead naming it on every
// survivor, never a wait in MPI for good. Live ranks are waited for as a
// blocking collective would (giving up on a live one would leave the ranks
// in different collectives).
[[nodiscard]] Result collective_status(MPI_Comm comm, Result local,
                                       const std::vector<ProcessIdentity>* watch = nullptr);
// Waits for one nonblocking MPI request, as above (no watch: MPI_Wait). Given
// up on, the request stays in flight: its buffers must outlive it.
[[nodiscard]] Result wait_watching(MPI_Request* req, const std::vector<ProcessIdentity>* watch, const char* what);
// Local rank 0's `bytes` at `buf` to every rank of n.node (MPI_Ibcast of a
// heap copy, watching the node's processes: see wait_watching).
[[nodiscard]] Result bcast_watching(void* buf, size_t bytes, const NodeContext& n, const char* what);
// Every rank's `bytes` at `mine` into *all, by local rank (MPI_Iallgather
// over n.node of heap buffers, watching the node's processes).
[[nodiscard]] Result allgather_watching(const void* mine, size_t bytes, const NodeContext& n, const char* what,
                                        std::vector<char>* all);
// Keeps a collective's buffer that was given up on (it may still be written)
// for the life of the process, reachable (LeakSanitizer reports none).
void keep_for_abandoned_collective(void* buffer);

// The node's ranks compare every field of their records with local rank 0's;
// a difference is the same error on each of them, naming the field, the
// ranks and both values (for "backend", both specs).
[[nodiscard]] Result agree_on_config(const NodeContext& n, const Agreement& mine);

}  // namespace ucm
