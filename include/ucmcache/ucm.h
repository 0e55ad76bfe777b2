/*
 * ucmcache: a node-shared host-memory cache of KV-cache shards for multi-GPU
 * inference. This is the public C API, and the one header an application
 * includes; everything not declared here is hidden.
 *
 * ucm_base.h holds everything that needs no MPI header (types, results,
 * config, stats, and every call but ucm_cache_init), with the contract that
 * applies to all calls (errors, threads, versions, structs that grow); this
 * header adds <mpi.h> and ucm_cache_init. Define UCM_NO_MPI before including
 * it to leave out MPI and the cache calls (a library built without MPI).
 */
#ifndef UCMCACHE_UCM_H
#define UCMCACHE_UCM_H

#include <ucmcache/ucm_base.h>

#ifndef UCM_NO_MPI
#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Collective over comm: every rank calls it. Ranks on one node (or pretend
 * node, see ranks_per_node) share one cache. On failure every rank returns the
 * same error, *cache is NULL, and ucm_last_error(NULL) says which rank failed
 * and why. That holds for bad arguments too: a rank that passes a NULL config
 * or a NULL cache still takes part, and every rank returns
 * UCM_ERR_NULL_POINTER. timeout_ms bounds each step that waits for peers
 * (building the shared planes, handing them out, joining): a step past it is
 * UCM_ERR_TIMEOUT on every rank, naming the step and timeout_ms, also when a
 * peer gave up first. A local rank that dies during init (after the node
 * split and its gather of pids, the first MPI calls) is UCM_ERR_PEER_DEAD
 * naming it on the node's other ranks; live ranks, and ranks of other
 * nodes, are waited for, however late, as in any collective. The config is read as its struct_bytes says (an
 * older app's smaller config works, the fields it lacks at their defaults).
 * MPI must be initialized: before MPI_Init or after MPI_Finalize the result is
 * UCM_ERR_BAD_STATE, and MPI_COMM_NULL (a rank that MPI_Comm_split left out)
 * UCM_ERR_INVALID_ARG; both return at once on that rank, with no collective
 * (no communicator joins this rank to the others). The cache may be finalized
 * after MPI_Finalize (from an atexit handler): the ranks meet through shared
 * memory, and the communicators, which MPI has freed, are not freed again;
 * with UCM_FANOUT=mpi, finalize it before MPI_Finalize.
 * Threads: the thread that calls MPI for the app, as any collective; not at
 * the same time as another ucm_cache_init or ucm_cache_finalize on comm. */
UCM_API ucm_result_t ucm_cache_init(MPI_Comm comm, const ucm_config_t* config, ucm_cache_t* cache);

#ifdef __cplusplus
}
#endif
#endif /* UCM_NO_MPI */

#endif /* UCMCACHE_UCM_H */
