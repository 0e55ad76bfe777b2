/*
 * ucm_info: run under mpirun/srun; every rank builds the node-shared cache and
 * prints one line about what it got: host, local rank and size, device,
 * where its queue threads run, hugepages, data plane size, and which optional
 * stacks (CUDA, NCCL, hwloc) are built and usable. Lines come out in rank order.
 *
 *   mpirun -np 4 ucm_info                  (UCM_BACKEND defaults to sim: here)
 *   UCM_RANKS_PER_NODE=2 mpirun -np 4 ucm_info
 *
 * Written in C against the public header only: it is also the proof that the
 * C API is usable from C.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ucmcache/ucm.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  ucm_config_t cfg;
  ucm_result_t r = ucm_config_init(&cfg);
  if (r != UCM_OK) {
    fprintf(stderr, "rank %d: %s: %s\n", rank, ucm_result_string(r), ucm_config_error());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  /* ucm_info needs a store only to start: a sim store unless one is given. */
  if (cfg.backend[0] == '\0') snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=0");
  if (!getenv("UCM_CACHE_BYTES")) cfg.cache_bytes = 64ull << 20;

  ucm_cache_t cache = NULL;
  r = ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache);
  if (r != UCM_OK) {
    fprintf(stderr, "rank %d: ucm_cache_init: %s: %s\n", rank, ucm_result_string(r), ucm_last_error(NULL));
    MPI_Finalize();
    return 1;
  }
  ucm_cache_info_t info;
  memset(&info, 0, sizeof(info));
  info.struct_bytes = sizeof(info);
  r = ucm_cache_info(cache, &info);
  if (r != UCM_OK) {
    fprintf(stderr, "rank %d: ucm_cache_info: %s\n", rank, ucm_last_error(cache));
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  char line[1600];
  int used = snprintf(line, sizeof(line),
           "rank %d/%d host=%s node=%d/%d local_rank=%d local_size=%d device=%d engine=%s scheduler=%d "
           "hugetlb=%d data_bytes=%llu segments=%u control_bytes=%llu control_inode=%llu slots=%u+%u "
           "cuda=%s(%d visible) nccl=%s hwloc=%s bound=%d binding=\"%s\"",
           info.rank, info.size, info.host, info.node_id, info.node_count, info.local_rank, info.local_size,
           info.device_id, info.scheduler ? "none" : info.copy_engine, info.scheduler, info.hugetlb,
           (unsigned long long)info.data_bytes, info.segments, (unsigned long long)info.control_bytes,
           (unsigned long long)info.control_inode, info.regular_slots, info.reserved_slots,
           info.cuda_built ? "built" : "not-built", info.visible_devices, info.nccl_built ? "built" : "not-built",
           info.hwloc_built ? "built" : "not-built", info.threads_bound, info.binding);
  if (used > 0 && (size_t)used < sizeof(line))
    snprintf(line + used, sizeof(line) - (size_t)used,
             " register=%.3fs(%u threads, %.3f s/GiB) device_choice=\"%s\" pages=\"%s\"", info.register_seconds,
             info.register_threads,
             info.data_bytes ? info.register_seconds / ((double)info.data_bytes / (1024.0 * 1024 * 1024)) : 0.0,
             info.device_choice, info.pages);
  /* Print in rank order through rank 0 so lines never interleave. */
  if (rank == 0) {
    printf("%s\n", line);
    for (int i = 1; i < size; ++i) {
      char other[sizeof(line)];
      MPI_Recv(other, sizeof(other), MPI_CHAR, i, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      printf("%s\n", other);
    }
    fflush(stdout);
  } else {
    MPI_Send(line, sizeof(line), MPI_CHAR, 0, 7, MPI_COMM_WORLD);
  }
  r = ucm_cache_finalize(&cache);
  if (r != UCM_OK) fprintf(stderr, "rank %d: ucm_cache_finalize: %s\n", rank, ucm_last_error(NULL));
  MPI_Finalize();
  return r == UCM_OK ? 0 : 1;
}
