/* A rank SIGKILLed at a phase kill_mid_task and finalize_peer do not reach,
 * at the public API (run under `mpirun --enable-recovery`, which keeps the
 * survivors running). The victim arms a thread that SIGKILLs its process
 * DELAY_US after it starts the phase, so the death lands anywhere in it.
 *
 *   kill_in_phase init WHEN VICTIM          the victim dies inside
 *       ucm_cache_init: WHEN "planes" while local rank 0 builds the planes
 *       (before the fd exchange), "socket+US" US after the boot socket
 *       appears (during the exchange). Every survivor's init must return
 *       within its steps' bounds (each timeout_ms; the watchdog allows
 *       3 x timeout_ms + 5 s): UCM_OK (the victim died after the
 *       node met, then the cache works) or UCM_ERR_PEER_DEAD naming the
 *       victim's pid. Before these fixes they waited in MPI for good.
 *       WHEN "mpi:NAME:N": the victim dies entering init's Nth MPI call
 *       NAME (kill_at_mpi_call.h), the same outcomes; "mpitrace" (VICTIM
 *       -1): every rank prints the MPI calls of its init, nobody dies.
 *   kill_in_phase finalize DELAY_US VICTIM  the victim dies inside
 *       ucm_cache_finalize. The survivors then load every key (right
 *       bytes) and finalize: UCM_OK or UCM_ERR_PEER_DEAD, bounded.
 *   kill_in_phase posixdump DELAY_US VICTIM DIR  the victim dumps large
 *       shards to a posix store in DIR and dies during the write-throughs.
 *       The survivors load every key (right bytes, or a clear failure, never
 *       wrong bytes), dump the first half again (UCM_OK) and finalize.
 *   kill_in_phase posixcheck 0 -1 DIR  a fresh job after posixdump: the
 *       first half loads with the right bytes; each key of the second half
 *       (whose files the victim may have left torn) loads right or fails,
 *       never with another key's or torn bytes.
 *
 * A watchdog thread ends a survivor whose call is past its bound: "rank R:
 * HANG in CALL". Each survivor prints "rank R: ok" when right and leaves with
 * _exit (MPI_Finalize itself would wait for the dead rank). */
#include <errno.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "c_config.h"
#include "c_proc.h"
#include "kill_at_mpi_call.h"
#include "ucmcache/ucm.h"

#define NKEYS 16
#define TIMEOUT_MS 3000u

static uint32_t shard_bytes = 64u << 10;
/* The call being bounded, and until when: the watchdog's, under watch_mu. */
static pthread_mutex_t watch_mu = PTHREAD_MUTEX_INITIALIZER;
static const char* in_call = "";
static double call_until = 0;
static int my_rank = 0;

static void* watchdog(void* arg) {
  (void)arg;
  for (;;) {
    usleep(20 * 1000);
    pthread_mutex_lock(&watch_mu);
    const char* call = in_call;
    const double until = call_until;
    pthread_mutex_unlock(&watch_mu);
    if (until > 0 && now_ms() > until) {
      printf("rank %d: HANG in %s\n", my_rank, call);
      fflush(stdout);
      _exit(2);
    }
  }
  return NULL;
}

static void bound(const char* call, double ms) {
  const double until = ms > 0 ? now_ms() + ms : 0;
  pthread_mutex_lock(&watch_mu);
  in_call = call;
  call_until = until;
  pthread_mutex_unlock(&watch_mu);
}

/* When the victim's killer fires: DELAY_US after it is armed, or (init) at a
 * point of the bootstrap seen from outside, through /proc: "planes" once local
 * rank 0 holds its control memfd (the planes are being built, before the fd
 * exchange), "socket[+US]" US after the boot socket appears (the exchange). */
static const char* trigger = "0";
static pid_t rank0_pid = 0;
static pid_t world_pids[64];

static int rank0_has_ctrl_memfd(void) {
  char dir[64], link[80], target[256];
  snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)rank0_pid);
  for (int fd = 0; fd < 256; ++fd) {
    snprintf(link, sizeof(link), "%s/%d", dir, fd);
    const ssize_t n = readlink(link, target, sizeof(target) - 1);
    if (n > 0 && (target[n] = '\0', strstr(target, "memfd:ucmcache-ctrl") != NULL)) return 1;
  }
  return 0;
}

/* Boot sockets (@ucmcache.*) in /proc/net/unix now. */
static int boot_sockets(void) {
  FILE* f = fopen("/proc/net/unix", "r");
  char line[512];
  int n = 0;
  while (f && fgets(line, sizeof(line), f)) n += strstr(line, "@ucmcache.") != NULL;
  if (f) fclose(f);
  return n;
}

static void* killer(void* arg) {
  const int before = boot_sockets();
  const double until = now_ms() + 20000;
  if (strcmp(trigger, "planes") == 0)
    while (!rank0_has_ctrl_memfd() && now_ms() < until) usleep(50);
  else if (strncmp(trigger, "socket", 6) == 0)
    while (boot_sockets() <= before && now_ms() < until) usleep(20);
  if (strncmp(trigger, "socket+", 7) == 0) usleep((useconds_t)atol(trigger + 7));
  else usleep((useconds_t)(size_t)arg);
  kill(getpid(), SIGKILL);
  return NULL;
}

static void arm_killer(long delay_us) {
  pthread_t t;
  pthread_create(&t, NULL, killer, (void*)(size_t)delay_us);
}

/* A key's bytes: a pure function of the key (not the sim store's content). */
static void fill(int i, uint8_t* p) {
  uint64_t z = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
  for (uint32_t w = 0; w < shard_bytes / 8; ++w) {
    z ^= z << 13, z ^= z >> 7, z ^= z << 17;
    memcpy(p + (size_t)w * 8, &z, 8);
  }
}

static ucm_key_t key_of(int i) {
  ucm_key_t k;
  memset(&k, 0, sizeof(k));
  k.block.bytes[0] = (uint8_t)(i + 1);
  k.block.bytes[15] = 0xa7;
  k.shard = (uint32_t)i;
  return k;
}

/* One task over keys [from, to): a load into buf, or a dump of buf. */
static ucm_result_t run_task(ucm_cache_t c, int dump, int from, int to, uint8_t* buf) {
  ucm_load_entry_t le[NKEYS];
  ucm_dump_entry_t de[NKEYS];
  for (int i = from; i < to; ++i) {
    uint8_t* p = buf + (size_t)(i - from) * shard_bytes;
    le[i - from].key = de[i - from].key = key_of(i);
    le[i - from].dst = p;
    de[i - from].src = p;
  }
  ucm_task_t t = 0;
  bound(dump ? "ucm_dump_task" : "ucm_load_task", TIMEOUT_MS + 5000);
  ucm_result_t r = dump ? ucm_dump_task(c, de, (size_t)(to - from), &t) : ucm_load_task(c, le, (size_t)(to - from), &t);
  bound("ucm_task_wait", TIMEOUT_MS + 5000);
  if (r == UCM_OK) r = ucm_task_wait(c, t, TIMEOUT_MS + 2000);
  bound("", 0);
  return r;
}

/* Loads key i alone: 1 right bytes, 0 a clear failure, -1 wrong bytes. */
static int load_one(ucm_cache_t c, int i, uint8_t* buf, uint8_t* want) {
  memset(buf, 0xee, shard_bytes);
  const ucm_result_t r = run_task(c, 0, i, i + 1, buf);
  if (r != UCM_OK) {
    printf("rank %d: key %d: %s: %s\n", my_rank, i, ucm_result_string(r), ucm_last_error(c));
    return strlen(ucm_last_error(c)) > 0 ? 0 : -1;
  }
  fill(i, want);
  if (memcmp(buf, want, shard_bytes) == 0) return 1;
  printf("rank %d: key %d: UCM_OK with WRONG bytes\n", my_rank, i);
  return -1;
}

/* Every key in [from, to) loads right (need_all), or right or failing clearly. */
static int check_keys(ucm_cache_t c, int from, int to, int need_all) {
  uint8_t* buf = malloc(shard_bytes);
  uint8_t* want = malloc(shard_bytes);
  int ok = 1, right = 0;
  for (int i = from; i < to; ++i) {
    const int v = load_one(c, i, buf, want);
    right += v == 1;
    if (v < 0 || (need_all && v != 1)) ok = 0;
  }
  printf("rank %d: keys %d..%d: %d right\n", my_rank, from, to - 1, right);
  free(buf);
  free(want);
  return ok;
}

static ucm_config_t config_for(const char* mode, const char* dir) {
  ucm_config_t cfg = small_host_config(64u << 20, TIMEOUT_MS);
  if (strncmp(mode, "posix", 5) == 0) {
    shard_bytes = 1u << 20;
    cfg.shard_bytes = shard_bytes;
    snprintf(cfg.backend, sizeof(cfg.backend), "posix:%s", dir);
  } else {
    snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=0,populated=dumped");
  }
  return cfg;
}

static int finish(ucm_cache_t* c, int ok) {
  bound("ucm_cache_finalize", TIMEOUT_MS + 5000);
  const double t0 = now_ms();
  const ucm_result_t r = ucm_cache_finalize(c);
  bound("", 0);
  printf("rank %d: finalize=%s ms=%.0f msg=%s\n", my_rank, ucm_result_string(r), now_ms() - t0,
         r == UCM_OK ? "" : ucm_last_error(NULL));
  return ok && (r == UCM_OK || r == UCM_ERR_PEER_DEAD);
}

/* The victim's pid, gathered after init (MPI_COMM_WORLD still works then). */
static pid_t victim_pid(int victim) {
  pid_t pids[64] = {0};
  pid_t me = getpid();
  MPI_Allgather(&me, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
  return pids[victim];
}

static void wait_gone(pid_t pid) {
  const double until = now_ms() + 10000;
  while (!gone(pid) && now_ms() < until) usleep(1000);
}

/* "mpi:NAME:N": the victim dies entering init's Nth MPI call NAME;
 * "mpitrace": every rank prints init's MPI calls, nobody dies. */
static int arm_mpi_call(int victim) {
  static char name[64];
  int nth = 0;
  if (strcmp(trigger, "mpitrace") == 0) {
    kill_at_mpi_call_set(NULL, 0);
    kill_at_mpi_call_arm(my_rank, 1);
    return 1;
  }
  if (sscanf(trigger, "mpi:%63[A-Za-z_]:%d", name, &nth) != 2) return 0;
  kill_at_mpi_call_set(name, nth);
  kill_at_mpi_call_arm(my_rank, my_rank == victim);
  return 1;
}

static int phase_init(const ucm_config_t* cfg, long delay_us, int victim) {
  if (!arm_mpi_call(victim) && my_rank == victim) arm_killer(delay_us);
  ucm_cache_t c = NULL;
  bound("ucm_cache_init", 3 * TIMEOUT_MS + 5000);
  const double t0 = now_ms();
  const ucm_result_t r = ucm_cache_init(MPI_COMM_WORLD, cfg, &c);
  kill_at_mpi_call_arm(my_rank, 0);
  bound("", 0);
  if (my_rank == victim) pause();
  printf("rank %d: init=%s ms=%.0f msg=%s\n", my_rank, ucm_result_string(r), now_ms() - t0,
         r == UCM_OK ? "" : ucm_last_error(NULL));
  /* Failed: UCM_ERR_PEER_DEAD naming the victim (one node: its local rank is its rank). */
  char named[32] = "(no victim)";
  if (victim >= 0) snprintf(named, sizeof(named), "(pid %d)", (int)world_pids[victim]);
  if (r != UCM_OK) return victim >= 0 && r == UCM_ERR_PEER_DEAD && strstr(ucm_last_error(NULL), named) != NULL;
  /* Up: this survivor's cache works (dump, then load back). */
  uint8_t* buf = malloc((size_t)NKEYS * shard_bytes);
  for (int i = 0; i < NKEYS; ++i) fill(i, buf + (size_t)i * shard_bytes);
  const ucm_result_t d = run_task(c, 1, 0, NKEYS, buf);
  free(buf);
  printf("rank %d: dump=%s\n", my_rank, ucm_result_string(d));
  return finish(&c, d == UCM_OK && check_keys(c, 0, NKEYS, 1));
}

static int phase_finalize(ucm_cache_t c, long delay_us, int victim) {
  uint8_t* buf = malloc((size_t)NKEYS * shard_bytes);
  for (int i = 0; i < NKEYS; ++i) fill(i, buf + (size_t)i * shard_bytes);
  const ucm_result_t d = run_task(c, 1, 0, NKEYS, buf);
  free(buf);
  const pid_t vp = victim_pid(victim);
  MPI_Barrier(MPI_COMM_WORLD);
  if (my_rank == victim) {
    arm_killer(delay_us);
    (void)ucm_cache_finalize(&c);
    pause();
  }
  usleep(20 * 1000);
  wait_gone(vp);
  printf("rank %d: dump=%s\n", my_rank, ucm_result_string(d));
  return finish(&c, d == UCM_OK && check_keys(c, 0, NKEYS, 1));
}

static int phase_posixdump(ucm_cache_t c, long delay_us, int victim) {
  uint8_t* buf = malloc((size_t)NKEYS * shard_bytes);
  for (int i = 0; i < NKEYS; ++i) fill(i, buf + (size_t)i * shard_bytes);
  const pid_t vp = victim_pid(victim);
  MPI_Barrier(MPI_COMM_WORLD);
  if (my_rank == victim) {
    arm_killer(delay_us);
    (void)run_task(c, 1, 0, NKEYS, buf);
    pause();
  }
  wait_gone(vp);
  int ok = check_keys(c, 0, NKEYS, 0);
  const ucm_result_t d = run_task(c, 1, 0, NKEYS / 2, buf);
  printf("rank %d: re-dump of keys 0..%d=%s %s\n", my_rank, NKEYS / 2 - 1, ucm_result_string(d),
         d == UCM_OK ? "" : ucm_last_error(c));
  free(buf);
  ok = ok && d == UCM_OK && check_keys(c, 0, NKEYS / 2, 1);
  return finish(&c, ok);
}

static int phase_posixcheck(ucm_cache_t c) {
  const int ok = check_keys(c, 0, NKEYS / 2, 1) & check_keys(c, NKEYS / 2, NKEYS, 0);
  return finish(&c, ok);
}

int main(int argc, char** argv) {
  int provided = 0; /* UCM_FANOUT=mpi (the script's fan-out pass) needs MPI_THREAD_MULTIPLE */
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  if (provided < MPI_THREAD_MULTIPLE) fprintf(stderr, "kill_in_phase: MPI gave thread level %d, not MULTIPLE\n", provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &my_rank);
  if (argc < 4) {
    fprintf(stderr, "usage: kill_in_phase init|finalize|posixdump|posixcheck DELAY_US VICTIM [DIR]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const char* mode = argv[1];
  const long delay_us = atol(argv[2]);
  trigger = argv[2];
  pid_t me = getpid();
  MPI_Allgather(&me, 1, MPI_INT, world_pids, 1, MPI_INT, MPI_COMM_WORLD);
  rank0_pid = world_pids[0];
  const int victim = atoi(argv[3]);
  const ucm_config_t cfg = config_for(mode, argc > 4 ? argv[4] : "");
  pthread_t w;
  pthread_create(&w, NULL, watchdog, NULL);
  int ok;
  if (strcmp(mode, "init") == 0) {
    ok = phase_init(&cfg, delay_us, victim);
  } else {
    ucm_cache_t c = NULL;
    bound("ucm_cache_init", TIMEOUT_MS + 5000);
    if (ucm_cache_init(MPI_COMM_WORLD, &cfg, &c) != UCM_OK) {
      printf("rank %d: init: %s\n", my_rank, ucm_last_error(NULL));
      fflush(stdout);
      MPI_Abort(MPI_COMM_WORLD, 3);
    }
    bound("", 0);
    if (strcmp(mode, "finalize") == 0) ok = phase_finalize(c, delay_us, victim);
    else if (strcmp(mode, "posixdump") == 0) ok = phase_posixdump(c, delay_us, victim);
    else ok = phase_posixcheck(c);
  }
  printf("rank %d: %s\n", my_rank, ok ? "ok" : "WRONG");
  fflush(stdout);
  if (victim >= 0) _exit(ok ? 0 : 1);
  MPI_Finalize();
  return ok ? 0 : 1;
}
