/* One node with more ranks than a cache may have, beside a node that is fine:
 * every rank of both must get the same error, and none may hang.
 *
 * Run with `mpirun -np 18`: ranks 0..16 ask for the real node (17 ranks, one
 * more than the 16 a cache allows); rank 17 asks for pretend nodes of one
 * rank, which puts it on a node of its own. Exits 0 when this rank got
 * UCM_ERR_INVALID_ARG naming the limit. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "c_config.h"
#include "leak_check.h"
#include "ucmcache/ucm.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  ucm_config_t cfg = small_host_config(4u << 20, 20000);
  cfg.ranks_per_node = rank == size - 1 ? 1 : 0;
  ucm_cache_t cache = NULL;
  const ucm_result_t r = ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache);
  const char* msg = ucm_last_error(NULL);
  const int ok = r == UCM_ERR_INVALID_ARG && strstr(msg, "at most 16 can") != NULL && cache == NULL;
  if (!ok || rank == 0 || rank == size - 1) printf("rank %d: %s: %s\n", rank, ucm_result_string(r), msg);
  if (cache) ucm_cache_finalize(&cache);
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (rank == 0) printf("%s\n", all ? "ok: every rank got the node limit's error" : "FAIL: some rank did not");
  leak_check_before_mpi_finalize();
  MPI_Finalize();
  return all ? 0 : 1;
}
