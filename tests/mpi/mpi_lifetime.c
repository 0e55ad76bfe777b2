/* The cache against MPI's own lifetime, as an app that gets the order wrong
 * drives it: ucm_cache_init before MPI_Init and after MPI_Finalize is
 * UCM_ERR_BAD_STATE naming the call to make (before, Open MPI aborted the
 * process from inside ucm_cache_init); MPI_COMM_NULL (a rank that
 * MPI_Comm_split left out) is UCM_ERR_INVALID_ARG at once, with no
 * collective (before: MPI's fatal error handler aborted the job); and a cache
 * finalized after MPI_Finalize (an atexit handler, a destructor) tears down
 * with UCM_OK instead of calling MPI_Comm_free on a finalized MPI.
 *
 * Run with `mpirun -np 2`. MPI cannot reduce the verdict after MPI_Finalize,
 * so each rank prints its own and exits non-zero on a failure. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "c_config.h"
#include "leak_check.h"
#include "ucmcache/ucm.h"

static int failures = 0;

static void expect(int rank, const char* what, ucm_result_t got, ucm_result_t want, const char* needle) {
  const char* msg = ucm_last_error(NULL);
  if (got == want && (needle == NULL || strstr(msg, needle) != NULL)) return;
  ++failures;
  printf("rank %d: FAIL: %s: got %s (%s), want %s naming '%s'\n", rank, what, ucm_result_string(got), msg,
         ucm_result_string(want), needle ? needle : "");
}

int main(int argc, char** argv) {
  const ucm_config_t cfg = small_host_config(4u << 20, 20000);
  ucm_cache_t cache = NULL;
  expect(-1, "init before MPI_Init", ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_ERR_BAD_STATE, "MPI_Init");
  if (cache != NULL) ++failures;

  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  expect(rank, "init on MPI_COMM_NULL", ucm_cache_init(MPI_COMM_NULL, &cfg, &cache), UCM_ERR_INVALID_ARG,
         "MPI_COMM_NULL");
  if (cache != NULL) ++failures;

  expect(rank, "init", ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK, NULL);
  static unsigned char dst[64u << 10];
  ucm_load_entry_t e;
  memset(&e, 0, sizeof(e));
  e.key.block.bytes[0] = 1;
  e.dst = dst;
  ucm_task_t t = 0;
  if (cache != NULL) {
    expect(rank, "load", ucm_load_task(cache, &e, 1, &t), UCM_OK, NULL);
    expect(rank, "wait", ucm_task_wait(cache, t, 20000), UCM_OK, NULL);
  }
  /* LeakSanitizer's one check, now: after MPI_Finalize, Open MPI's own
   * allocations and the communicators the cache's finalize leaves to MPI read
   * as leaks (leak_check.h says why). The cache is still reachable here. */
  leak_check_before_mpi_finalize();
  MPI_Finalize();

  if (cache != NULL) expect(rank, "finalize after MPI_Finalize", ucm_cache_finalize(&cache), UCM_OK, NULL);
  expect(rank, "init after MPI_Finalize", ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_ERR_BAD_STATE,
         "MPI_Finalize");
  if (cache != NULL) ++failures;
  printf("rank %d: %s\n", rank, failures == 0 ? "ok: every call in the wrong MPI state returned its error" : "FAIL");
  return failures == 0 ? 0 : 1;
}
