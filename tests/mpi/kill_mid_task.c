/* A rank SIGKILLed in the middle of a task, at the public API: what the
 * survivors see (run under `mpirun --enable-recovery -np N`, N >= 2, which
 * keeps them running).
 *
 *   kill_mid_task load  every rank loads the same keys from a slow sim store
 *                       (latency 400 ms); the last rank submits first, owns
 *                       the loads, and is SIGKILLed while they are in the
 *                       store. The survivors' loads must end within
 *                       timeout_ms, UCM_OK with every byte right.
 *   kill_mid_task dump  the same with dumps (populated=dumped): the victim's
 *                       write-throughs are in the store when it dies; the
 *                       survivors' dumps of the same keys must end UCM_OK
 *                       within timeout_ms, and a load of each key afterwards
 *                       brings its bytes.
 * Then each survivor finalizes: UCM_ERR_PEER_DEAD naming the victim. Each
 * survivor prints what it saw, then "rank R: ok" when it was right, and
 * leaves with _exit (MPI_Finalize itself would wait for the dead rank). */
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

#define NKEYS 8
#define SHARD (64u << 10)

/* The sim store's content (lib/backend/sim_content.h), for the check. */
static uint64_t sim_word(const ucm_key_t* k, uint64_t w) {
  uint64_t lo, hi;
  memcpy(&lo, k->block.bytes, 8);
  memcpy(&hi, k->block.bytes + 8, 8);
  uint64_t z = lo ^ ((hi << 17) | (hi >> 47)) ^ ((uint64_t)k->shard << 40) ^ (w * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void fill(const ucm_key_t* k, uint8_t* p) {
  for (uint64_t w = 0; w < SHARD / 8; ++w) {
    const uint64_t v = sim_word(k, w);
    memcpy(p + w * 8, &v, 8);
  }
}

static int bad_bytes(const ucm_key_t* keys, const uint8_t* buf) {
  static uint8_t want[SHARD];
  int bad = 0;
  for (int i = 0; i < NKEYS; ++i) {
    fill(&keys[i], want);
    if (memcmp(want, buf + (size_t)i * SHARD, SHARD) != 0) ++bad;
  }
  return bad;
}

static void make_keys(ucm_key_t* keys) {
  memset(keys, 0, sizeof(ucm_key_t) * NKEYS);
  for (int i = 0; i < NKEYS; ++i) {
    keys[i].block.bytes[0] = (uint8_t)(i + 1);
    keys[i].block.bytes[15] = 0x5a;
    keys[i].shard = (uint32_t)i;
  }
}

/* Submits the keys as a load or a dump of buf. */
static ucm_result_t submit(ucm_cache_t c, int dump, const ucm_key_t* keys, uint8_t* buf, ucm_task_t* t) {
  if (dump) {
    ucm_dump_entry_t e[NKEYS];
    for (int i = 0; i < NKEYS; ++i) e[i].key = keys[i], e[i].src = buf + (size_t)i * SHARD;
    return ucm_dump_task(c, e, NKEYS, t);
  }
  ucm_load_entry_t e[NKEYS];
  for (int i = 0; i < NKEYS; ++i) e[i].key = keys[i], e[i].dst = buf + (size_t)i * SHARD;
  return ucm_load_task(c, e, NKEYS, t);
}

/* A survivor: the task of the same keys, then (dump) a load of them back. */
static int survive(ucm_cache_t c, int rank, int dump, const ucm_key_t* keys, uint8_t* buf) {
  ucm_task_t t = 0;
  const double t0 = now_ms();
  ucm_result_t r = submit(c, dump, keys, buf, &t);
  if (r == UCM_OK) r = ucm_task_wait(c, t, 20000);
  const double ms = now_ms() - t0;
  printf("rank %d: %s=%s ms=%.0f msg=%s\n", rank, dump ? "dump" : "load", ucm_result_string(r), ms,
         r == UCM_OK ? "" : ucm_last_error(c));
  int ok = r == UCM_OK;
  if (dump && ok) {
    uint8_t* back = calloc(NKEYS, SHARD);
    r = submit(c, 0, keys, back, &t);
    if (r == UCM_OK) r = ucm_task_wait(c, t, 20000);
    printf("rank %d: load back=%s bad=%d\n", rank, ucm_result_string(r), r == UCM_OK ? bad_bytes(keys, back) : -1);
    ok = r == UCM_OK && bad_bytes(keys, back) == 0;
    free(back);
  } else if (ok) {
    const int bad = bad_bytes(keys, buf);
    printf("rank %d: bad shards=%d\n", rank, bad);
    ok = bad == 0;
  }
  return ok;
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int dump = argc > 1 && strcmp(argv[1], "dump") == 0;
  ucm_config_t cfg = small_host_config(8u << 20, 10000);
  snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=400000%s", dump ? ",populated=dumped" : "");
  ucm_cache_t cache = NULL;
  if (ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache) != UCM_OK) {
    fprintf(stderr, "rank %d: init: %s\n", rank, ucm_last_error(NULL));
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  pid_t pids[64] = {0};
  pid_t me = getpid();
  MPI_Allgather(&me, sizeof(pid_t), MPI_BYTE, pids, sizeof(pid_t), MPI_BYTE, MPI_COMM_WORLD);
  ucm_key_t keys[NKEYS];
  make_keys(keys);
  uint8_t* buf = calloc(NKEYS, SHARD);
  if (dump)
    for (int i = 0; i < NKEYS; ++i) fill(&keys[i], buf + (size_t)i * SHARD);
  const int victim = size - 1;
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == victim) {
    ucm_task_t t;
    const ucm_result_t r = submit(cache, dump, keys, buf, &t);
    usleep(100 * 1000); /* its requests are in the store now */
    if (r != UCM_OK) fprintf(stderr, "victim: submit: %s\n", ucm_last_error(cache));
    raise(SIGKILL);
  }
  usleep(150 * 1000);
  const int ok = survive(cache, rank, dump, keys, buf);
  while (!gone(pids[victim])) usleep(10 * 1000);
  const double t0 = now_ms();
  const ucm_result_t fr = ucm_cache_finalize(&cache);
  printf("rank %d: finalize=%s ms=%.0f msg=%s\n", rank, ucm_result_string(fr), now_ms() - t0, ucm_last_error(NULL));
  char named[64];
  snprintf(named, sizeof(named), "local rank(s) %d died", victim);
  const int right = ok && fr == UCM_ERR_PEER_DEAD && strstr(ucm_last_error(NULL), named) != NULL;
  if (right) printf("rank %d: ok\n", rank);
  fflush(stdout);
  free(buf);
  leak_check_before_mpi_finalize();
  _exit(right ? 0 : 1);
}
