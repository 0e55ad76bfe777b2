/* ucm_cache_finalize with a peer that is not there: bounded, and it says who.
 *
 *   finalize_peer dead  local rank 2 is SIGKILLed after init (run it under
 *                       `mpirun --enable-recovery -np 3`, which keeps the
 *                       survivors running); the survivors wait until its
 *                       process is gone, then finalize: UCM_ERR_PEER_DEAD
 *                       naming local rank 2, quickly (well under timeout_ms).
 *   finalize_peer late  local rank 1 calls finalize 4 s after rank 0
 *                       (timeout_ms 1000): rank 0 gets UCM_ERR_TIMEOUT naming
 *                       local rank 1 after about 1 s; rank 1, arriving last,
 *                       finds rank 0 departed: UCM_OK.
 *
 * Each rank prints "rank R: finalize=NAME ms=T msg=..." and exits with 0 when
 * what it saw is right, 1 otherwise. Survivors of `dead` leave with _exit:
 * MPI_Finalize itself waits for the dead rank. */
#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "c_config.h"
#include "c_proc.h"
#include "leak_check.h"
#include "ucmcache/ucm.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int dead_mode = argc > 1 && strcmp(argv[1], "dead") == 0;
  const ucm_config_t cfg = small_host_config(8u << 20, dead_mode ? 20000 : 1000);
  ucm_cache_t cache = NULL;
  if (ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache) != UCM_OK) {
    fprintf(stderr, "rank %d: init: %s\n", rank, ucm_last_error(NULL));
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  pid_t pids[64] = {0};
  pid_t me = getpid();
  MPI_Allgather(&me, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  const int victim = 2;
  if (dead_mode && rank == victim) raise(SIGKILL);
  if (dead_mode) {
    /* Wait (bounded) until the victim's process is gone, so the test asserts
     * what finalize does with a dead peer, not a race with its death. */
    const double until = now_ms() + 10000;
    while (!gone(pids[victim]) && now_ms() < until) usleep(1000);
  }
  if (!dead_mode && rank == 1) sleep(4);
  const double t0 = now_ms();
  const ucm_result_t r = ucm_cache_finalize(&cache);
  const double took = now_ms() - t0;
  const char* msg = ucm_last_error(NULL);
  printf("rank %d: finalize=%s ms=%.0f msg=%s\n", rank, ucm_result_string(r), took, r == UCM_OK ? "" : msg);
  fflush(stdout);
  int ok;
  if (dead_mode) {
    ok = r == UCM_ERR_PEER_DEAD && strstr(msg, "local rank(s) 2 died") != NULL && took < 5000 && cache == NULL;
  } else if (rank == 0) {
    ok = r == UCM_ERR_TIMEOUT && strstr(msg, "local rank(s) 1 (alive)") != NULL && took >= 900 && took < 3500;
  } else {
    ok = r == UCM_OK;
  }
  printf("rank %d: %s\n", rank, ok ? "ok" : "WRONG");
  fflush(stdout);
  if (dead_mode) _exit(ok ? 0 : 1);
  leak_check_before_mpi_finalize();
  MPI_Finalize();
  return ok ? 0 : 1;
}
