/* What a task shows to the tools: NVTX ranges and UCM_LOG lines.
 *
 * Each rank dumps four shards of a block of its own, loads four shards of
 * another block of its own (one of them hung in the sim store for hang_ms, so
 * that its copier waits for Ready), touches both blocks, reads its stats and
 * finalizes. With `nvtx=on` (run with NVTX_INJECTION64_PATH naming the
 * counting tool this program links) it then checks, on its own rank, that
 * every named range of the ucmcache domain was pushed and that pushes equal
 * pops; with `nvtx=off` (no variable) that the tool counted nothing; with
 * `nvtx=skip` it checks neither (a build without NVTX, or the log test).
 *
 * usage: obs_probe nvtx=on|off|skip [hang_ms=N (1000; 0: nothing hung)]
 * Exits 0 when every rank passed; prints one line per rank, and "ok" once. */
#include <inttypes.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "leak_check.h"
#include "ucmcache/ucm.h"
#ifndef OBS_NO_NVTX
#include "nvtx_count.h"
#endif

#define SHARDS 4
#define SHARD_BYTES (64u << 10)

static int check(int ok, int rank, const char* what) {
  if (!ok) printf("rank %d: FAIL: %s\n", rank, what);
  return ok;
}

/* A call's result: UCM_OK, or a line naming the call and its error. */
static int call(ucm_result_t r, ucm_cache_t cache, int rank, const char* what) {
  if (r != UCM_OK) printf("rank %d: FAIL: %s: %s: %s\n", rank, what, ucm_result_string(r), ucm_last_error(cache));
  return r == UCM_OK;
}

static int run_tasks(ucm_cache_t cache, int rank, unsigned char* buf) {
  ucm_dump_entry_t dumps[SHARDS];
  ucm_load_entry_t loads[SHARDS];
  ucm_block_t blocks[2];
  ucm_task_t task = 0;
  int i, ok = 1;
  memset(dumps, 0, sizeof(dumps));
  memset(loads, 0, sizeof(loads));
  memset(blocks, 0, sizeof(blocks));
  blocks[0].bytes[0] = (unsigned char)(100 + rank); /* dumped: block lo 100 + rank */
  blocks[1].bytes[0] = (unsigned char)(200 + rank); /* loaded: block lo 200 + rank, shard 0 hung */
  for (i = 0; i < SHARDS; ++i) {
    memset(buf + (size_t)i * SHARD_BYTES, 'a' + i, SHARD_BYTES);
    dumps[i].key.block = blocks[0];
    dumps[i].key.shard = (uint32_t)i;
    dumps[i].src = buf + (size_t)i * SHARD_BYTES;
    loads[i].key.block = blocks[1];
    loads[i].key.shard = (uint32_t)i;
    loads[i].dst = buf + (size_t)(SHARDS + i) * SHARD_BYTES;
  }
  ok &= call(ucm_dump_task(cache, dumps, SHARDS, &task), cache, rank, "ucm_dump_task");
  ok &= call(ucm_task_wait(cache, task, 30000), cache, rank, "ucm_task_wait (dump)");
  ok &= call(ucm_load_task(cache, loads, SHARDS, &task), cache, rank, "ucm_load_task");
  ok &= call(ucm_task_wait(cache, task, 30000), cache, rank, "ucm_task_wait (load)");
  ok &= call(ucm_touch(cache, blocks, 2), cache, rank, "ucm_touch");
  return ok;
}

#ifndef OBS_NO_NVTX
static const char* const kRanges[] = {"init", "finalize", "submit", "touch", "task wait", "dispatch",
                                      "wait for Ready", "copy", "dump", "backend load", "backend dump"};

static int check_nvtx(int rank, int on) {
  int ok = 1;
  size_t i;
  char what[256];
  if (!on) {
    ok &= check(!nvtx_count_initialized(), rank, "NVTX initialized the tool without NVTX_INJECTION64_PATH");
    ok &= check(nvtx_count_total_pushes() == 0 && nvtx_count_total_pops() == 0 && nvtx_count_foreign() == 0, rank,
                "the tool counted ranges without NVTX_INJECTION64_PATH");
    if (ok) printf("rank %d: nvtx off: nothing counted\n", rank);
    return ok;
  }
  ok &= check(nvtx_count_initialized(), rank, "NVTX never initialized the tool (is NVTX_INJECTION64_PATH set?)");
  ok &= check(nvtx_count_domain_created(), rank, "no domain named ucmcache was created");
  for (i = 0; i < sizeof(kRanges) / sizeof(kRanges[0]); ++i) {
    const uint64_t n = nvtx_count_pushes(kRanges[i]);
    /* init and finalize once; submit and task wait once per task; the rest at least once */
    const int want_exact = !strcmp(kRanges[i], "init") || !strcmp(kRanges[i], "finalize");
    const int want_two = !strcmp(kRanges[i], "submit") || !strcmp(kRanges[i], "task wait");
    const int good = want_exact ? n == 1 : want_two ? n == 2 : n >= 1;
    snprintf(what, sizeof(what), "range \"%s\" pushed %" PRIu64 " times (seen: %s)", kRanges[i], n,
             nvtx_count_names());
    ok &= check(good, rank, what);
  }
  snprintf(what, sizeof(what), "%" PRIu64 " pushes but %" PRIu64 " pops, %" PRIu64 " pops without a push",
           nvtx_count_total_pushes(), nvtx_count_total_pops(), nvtx_count_unmatched_pops());
  ok &= check(nvtx_count_total_pushes() == nvtx_count_total_pops() && nvtx_count_unmatched_pops() == 0, rank, what);
  ok &= check(nvtx_count_foreign() == 0, rank, "ranges outside the ucmcache domain, or without a name");
  if (ok)
    printf("rank %d: nvtx on: %" PRIu64 " ranges, pushes == pops: %s\n", rank, nvtx_count_total_pushes(),
           nvtx_count_names());
  return ok;
}
#endif

int main(int argc, char** argv) {
  int rank = 0, size = 1, ok = 1, all = 0, i, nvtx = -1; /* -1 skip, 0 off, 1 on */
  long hang_ms = 1000;
  ucm_config_t cfg;
  ucm_cache_t cache = NULL;
  unsigned char* buf;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (i = 1; i < argc; ++i) {
    if (!strcmp(argv[i], "nvtx=on")) nvtx = 1;
    else if (!strcmp(argv[i], "nvtx=off")) nvtx = 0;
    else if (!strcmp(argv[i], "nvtx=skip")) nvtx = -1;
    else if (!strncmp(argv[i], "hang_ms=", 8)) hang_ms = strtol(argv[i] + 8, NULL, 10);
    else {
      if (rank == 0) fprintf(stderr, "obs_probe: unknown argument %s\n", argv[i]);
      MPI_Finalize();
      return 2;
    }
  }
#ifdef OBS_NO_NVTX
  if (nvtx >= 0) {
    if (rank == 0) fprintf(stderr, "obs_probe: built without NVTX: only nvtx=skip\n");
    MPI_Finalize();
    return 2;
  }
#endif
  buf = malloc((size_t)2 * SHARDS * SHARD_BYTES);
  ucm_config_init(&cfg);
  cfg.cache_bytes = 64u * SHARD_BYTES;
  cfg.shard_bytes = SHARD_BYTES;
  cfg.hugepages = UCM_HUGEPAGES_OFF;
  cfg.copy_engine = UCM_COPY_ENGINE_HOST;
  cfg.timeout_ms = 30000;
  /* The backend spec is the node's: every rank names every rank's hung key. */
  if (hang_ms > 0) { /* hang_ms=0 in the sim store would hang the keys until finalize */
    size_t at = (size_t)snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=0,hang_ms=%ld,hang_keys=", hang_ms);
    for (i = 0; i < size && i < 16 && at < sizeof(cfg.backend); ++i)
      at += (size_t)snprintf(cfg.backend + at, sizeof(cfg.backend) - at, "%s%d.0", i ? "+" : "", 200 + i);
  } else {
    snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=0");
  }
  ok &= check(buf != NULL, rank, "malloc");
  ok &= call(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), NULL, rank, "ucm_cache_init");
  if (cache) {
    ucm_stats_t st, node;
    ucm_cache_info_t info;
    MPI_Barrier(MPI_COMM_WORLD); /* the ranks' tasks overlap */
    ok &= run_tasks(cache, rank, buf);
    MPI_Barrier(MPI_COMM_WORLD); /* every rank's tasks are done: the node's stats hold them all */
    memset(&st, 0, sizeof(st));
    memset(&node, 0, sizeof(node));
    memset(&info, 0, sizeof(info));
    st.struct_bytes = node.struct_bytes = sizeof(st);
    info.struct_bytes = sizeof(info);
    ok &= call(ucm_cache_info(cache, &info), cache, rank, "ucm_cache_info");
    ok &= call(ucm_cache_stats(cache, &st, &node), cache, rank, "ucm_cache_stats");
    ok &= check(st.tasks == 2 && node.tasks == 2 * (uint64_t)info.local_size, rank, "stats: 2 tasks per rank");
    /* The hung load cannot finish before hang_ms: the slowest task took at least that. */
    ok &= check(st.latency_max_us >= (uint64_t)hang_ms * 1000 && st.latency_p50_us <= st.latency_max_us, rank,
                "stats: latency_max_us below the hung load's hang_ms");
    ok &= check(node.latency_max_us >= st.latency_max_us && node.latency_p99_us <= node.latency_max_us, rank,
                "stats: the node's latency maximum is below this rank's");
    ok &= call(ucm_cache_finalize(&cache), NULL, rank, "ucm_cache_finalize");
  }
#ifndef OBS_NO_NVTX
  if (nvtx >= 0) ok &= check_nvtx(rank, nvtx);
#endif
  free(buf);
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (rank == 0) printf("%s\n", all ? "ok" : "FAIL: some rank failed");
  leak_check_before_mpi_finalize();
  MPI_Finalize();
  return all ? 0 : 1;
}
