/* The job side of hostile_user.sh: what a job does while another user on the
 * node interferes (its attacks are in the script).
 *
 *   hostile_job boot N      N rounds of init, dump, load back (right bytes),
 *                           finalize: all UCM_OK while an attacker connects
 *                           to each boot socket it sees.
 *   hostile_job init DIR    init over posix:DIR and print the result and the
 *                           message ("rank R: init=NAME msg=..."); the script
 *                           checks that a squatted DIR is refused, naming it.
 *   hostile_job planted DIR a file another user planted under key 0's name
 *                           (junk bytes): its load is not UCM_OK with those
 *                           bytes; a dump of key 0 (UCM_ERR_BACKEND: the
 *                           store will not write another user's file) then
 *                           a load bring the right bytes.
 * Each rank prints "rank R: ok" when what it saw is right. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "c_config.h"
#include "ucmcache/ucm.h"

#define SHARD (64u << 10)

static int rank = 0;

static ucm_key_t key0(void) {
  ucm_key_t k;
  memset(&k, 0, sizeof(k));
  k.block.bytes[0] = 1;
  k.block.bytes[15] = 0xa7;
  return k;
}

static ucm_result_t one(ucm_cache_t c, int dump, uint8_t* buf) {
  ucm_task_t t = 0;
  ucm_result_t r;
  if (dump) {
    const ucm_dump_entry_t e = {key0(), buf};
    r = ucm_dump_task(c, &e, 1, &t);
  } else {
    const ucm_load_entry_t e = {key0(), buf};
    r = ucm_load_task(c, &e, 1, &t);
  }
  return r == UCM_OK ? ucm_task_wait(c, t, 20000) : r;
}

static ucm_result_t init_with(const char* backend, ucm_cache_t* c) {
  ucm_config_t cfg = small_host_config(8u << 20, 5000);
  snprintf(cfg.backend, sizeof(cfg.backend), "%s", backend);
  const ucm_result_t r = ucm_cache_init(MPI_COMM_WORLD, &cfg, c);
  printf("rank %d: init=%s msg=%s\n", rank, ucm_result_string(r), r == UCM_OK ? "" : ucm_last_error(NULL));
  return r;
}

/* Dump key 0, then load it back: UCM_OK with the right bytes. The dump may
 * be UCM_ERR_BACKEND only where the store cannot take it (store_refuses):
 * the cached copy is still served. */
static int round_trip(ucm_cache_t c, int store_refuses) {
  uint8_t* want = malloc(SHARD);
  uint8_t* got = calloc(1, SHARD);
  for (uint32_t i = 0; i < SHARD; ++i) want[i] = (uint8_t)(i * 7 + 3);
  const ucm_result_t d = one(c, 1, want);
  if (d != UCM_OK) printf("rank %d: dump=%s msg=%s\n", rank, ucm_result_string(d), ucm_last_error(c));
  const ucm_result_t l = one(c, 0, got);
  const int right = (d == UCM_OK || (store_refuses && d == UCM_ERR_BACKEND)) && l == UCM_OK && memcmp(want, got, SHARD) == 0;
  if (!right) printf("rank %d: dump=%s load=%s right=%d\n", rank, ucm_result_string(d), ucm_result_string(l), right);
  free(want);
  free(got);
  return right;
}

static int planted(const char* dir) {
  char spec[600];
  snprintf(spec, sizeof(spec), "posix:%s", dir);
  ucm_cache_t c = NULL;
  if (init_with(spec, &c) != UCM_OK) return 0;
  uint8_t* got = calloc(1, SHARD);
  const ucm_result_t l = one(c, 0, got);
  printf("rank %d: load of the planted key=%s msg=%s\n", rank, ucm_result_string(l), l == UCM_OK ? "" : ucm_last_error(c));
  const int refused = l != UCM_OK && strlen(ucm_last_error(c)) > 0;
  free(got);
  MPI_Barrier(MPI_COMM_WORLD);
  const int ok = refused && round_trip(c, 1) && ucm_cache_finalize(&c) == UCM_OK;
  return ok;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const char* mode = argc > 2 ? argv[1] : "";
  int ok = 0;
  ucm_cache_t c = NULL;
  if (strcmp(mode, "boot") == 0) {
    ok = 1;
    for (int i = 0; i < atoi(argv[2]) && ok; ++i) {
      ok = init_with("sim:latency_us=0,populated=dumped", &c) == UCM_OK && round_trip(c, 0);
      ok = ok && ucm_cache_finalize(&c) == UCM_OK;
    }
  } else if (strcmp(mode, "init") == 0) {
    char spec[600];
    snprintf(spec, sizeof(spec), "posix:%s", argv[2]);
    ok = 1;
    if (init_with(spec, &c) == UCM_OK) ok = ucm_cache_finalize(&c) == UCM_OK;
  } else if (strcmp(mode, "planted") == 0) {
    ok = planted(argv[2]);
  }
  printf("rank %d: %s\n", rank, ok ? "ok" : "WRONG");
  fflush(stdout);
  MPI_Finalize();
  return ok ? 0 : 1;
}
