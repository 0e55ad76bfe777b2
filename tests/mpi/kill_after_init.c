/* A job whose local rank KILL_RANK (argv[1]) is SIGKILLed right after
 * ucm_cache_init while its peers keep the cache open: used by
 * kill_leftovers.sh to check that nothing is left in any file system and no
 * process is left running, however the job ends. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ucmcache/ucm.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const int victim = argc > 1 ? atoi(argv[1]) : 1;
  ucm_config_t cfg;
  ucm_config_init(&cfg);
  cfg.cache_bytes = 16u << 20;
  cfg.hugepages = UCM_HUGEPAGES_AUTO;
  snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=0");
  ucm_cache_t cache = NULL;
  if (ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache) != UCM_OK) {
    fprintf(stderr, "rank %d: %s\n", rank, ucm_last_error(NULL));
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  printf("rank %d: cache up\n", rank);
  fflush(stdout);
  if (rank == victim) raise(SIGKILL);
  sleep(30); /* the survivors hold the cache until mpirun tears the job down */
  ucm_cache_finalize(&cache);
  MPI_Finalize();
  return 0;
}
