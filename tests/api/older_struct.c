/* Structs from a pretend older version of ucm.h: an app built with a header
 * whose ucm_config_t, ucm_cache_info_t and ucm_stats_t ended earlier must
 * still work against this library. Its config takes the defaults (and UCM_*
 * variables) for the fields it lacks; info and stats write only struct_bytes
 * bytes (the canary behind each struct stays). struct_bytes below the first
 * layout, or above the library's, is UCM_ERR_INVALID_ARG naming both numbers;
 * headers newer than the library are UCM_ERR_UNSUPPORTED naming both versions.
 *
 * C99 with -pedantic; run with `mpirun -np 2`. Exits 0 when every check holds
 * on every rank. */
#include <ucmcache/ucm.h>

#include "../mpi/leak_check.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ucm_config_t as the older header had it: no copy_engine, no allow_overcommit. */
typedef struct old_config {
  uint32_t struct_bytes;
  uint32_t version;
  uint64_t shard_bytes;
  uint64_t cache_bytes;
  uint32_t shards_per_block;
  uint32_t reserved_slots;
  uint32_t max_task_entries;
  int32_t device_id;
  uint32_t ranks_per_node;
  ucm_order_t order;
  ucm_evict_t evict;
  ucm_wait_t wait;
  int32_t prealloc;
  ucm_hugepages_t hugepages;
  int32_t bind_threads;
  uint32_t timeout_ms;
  uint32_t liveness_ms;
  uint32_t load_retries;
  uint32_t io_depth;
  uint32_t owner_grace_us;
  uint64_t segment_bytes;
  char backend[512];
} old_config_t;

/* ucm_cache_info_t as the older header had it: up to binding. */
typedef struct old_info {
  uint32_t struct_bytes;
  int32_t rank, size, local_rank, local_size, node_id, node_count, device_id, scheduler, hugetlb;
  int32_t cuda_built, nccl_built, hwloc_built, visible_devices, threads_bound;
  uint32_t regular_slots, reserved_slots, segments;
  uint64_t control_bytes, data_bytes, control_inode;
  char host[64];
  char copy_engine[16];
  char binding[256];
} old_info_t;

/* ucm_stats_t as the older header had it: no direct_fallbacks. */
typedef struct old_stats {
  uint32_t struct_bytes, ranks;
  uint64_t tasks, shards, hits, owner_loads, load_failures, waits, wait_ns, takeovers, evictions, no_space;
  uint64_t prealloc_made, prealloc_used, failed_shards, bytes_from_backend, bytes_to_device, dumps, bytes_dumped;
  uint64_t latency_p50_us, latency_p90_us, latency_p99_us, latency_max_us;
} old_stats_t;

#define CANARY 0xA5
enum { kCanaryBytes = 64 };

static int failures = 0;
static int rank = 0;
#define CHECK(cond)                                                                   \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "rank %d: %s:%d: FAIL: %s (last error: %s)\n", rank, __FILE__, \
              __LINE__, #cond, ucm_last_error(NULL));                                 \
      ++failures;                                                                     \
    }                                                                                 \
  } while (0)

static int canary_intact(const unsigned char* p) {
  int i;
  for (i = 0; i < kCanaryBytes; ++i)
    if (p[i] != CANARY) return 0;
  return 1;
}

static int mentions(const char* text, unsigned long long n) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%llu", n);
  return strstr(text, buf) != NULL;
}

int main(int argc, char** argv) {
  struct { old_config_t c; unsigned char canary[kCanaryBytes]; } oc;
  struct { old_info_t i; unsigned char canary[kCanaryBytes]; } oi;
  struct { old_stats_t s; unsigned char canary[kCanaryBytes]; } os, on;
  ucm_config_t full;
  ucm_cache_info_t info;
  ucm_stats_t stats;
  ucm_cache_t cache = NULL;
  ucm_result_t r;
  char newer[32];
  int all = 0;

  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  /* The older layouts end where this library's first layout does. */
  CHECK(sizeof(old_config_t) == offsetof(ucm_config_t, copy_engine));
  CHECK(sizeof(old_info_t) == offsetof(ucm_cache_info_t, register_seconds));
  CHECK(sizeof(old_stats_t) == offsetof(ucm_stats_t, direct_fallbacks));

  /* Headers newer than the library: a clear error naming both versions. */
  snprintf(newer, sizeof(newer), "%d.%d.%d", UCM_VERSION_MAJOR, UCM_VERSION_MINOR + 1, UCM_VERSION_PATCH);
  CHECK(ucm_config_init_version(&full, sizeof(full), UCM_VERSION_OF(UCM_VERSION_MAJOR, UCM_VERSION_MINOR + 1,
                                                                    UCM_VERSION_PATCH)) == UCM_ERR_UNSUPPORTED);
  CHECK(strstr(ucm_last_error(NULL), newer) != NULL);
  CHECK(strstr(ucm_last_error(NULL), UCM_VERSION_STRING) != NULL);

  /* struct_bytes out of range, both ways: both numbers named. */
  CHECK(ucm_config_init_version(&full, 16, UCM_VERSION_CODE) == UCM_ERR_INVALID_ARG);
  CHECK(mentions(ucm_last_error(NULL), 16) && mentions(ucm_last_error(NULL), sizeof(old_config_t)));
  CHECK(ucm_config_init_version(&full, sizeof(full) + 8, UCM_VERSION_CODE) == UCM_ERR_INVALID_ARG);
  CHECK(mentions(ucm_last_error(NULL), sizeof(full) + 8) && mentions(ucm_last_error(NULL), sizeof(full)));
  CHECK(strcmp(ucm_config_error(), ucm_last_error(NULL)) == 0);

  /* The older app's config, made by its older header (an older version
   * code: a library newer than the header works): only its bytes are
   * written. */
  memset(&oc, CANARY, sizeof(oc));
  CHECK(ucm_config_init_version((ucm_config_t*)&oc.c, sizeof(oc.c), UCM_VERSION_CODE - 1) == UCM_OK);
  CHECK(canary_intact(oc.canary));
  CHECK(oc.c.struct_bytes == sizeof(old_config_t));
  CHECK(oc.c.version == UCM_VERSION_CODE - 1);
  CHECK(oc.c.shards_per_block == 64);
  oc.c.cache_bytes = 4u << 20;
  oc.c.shard_bytes = 64u << 10;
  oc.c.segment_bytes = 4u << 20;
  oc.c.hugepages = UCM_HUGEPAGES_OFF;
  oc.c.timeout_ms = 20000;
  snprintf(oc.c.backend, sizeof(oc.c.backend), "sim:latency_us=0");
  CHECK(ucm_config_check((const ucm_config_t*)&oc.c) == UCM_OK);
  /* A missing field takes its UCM_* variable, as ucm_config_init would. */
  setenv("UCM_OVERCOMMIT", "1", 1);

  r = ucm_cache_init(MPI_COMM_WORLD, (const ucm_config_t*)&oc.c, &cache);
  CHECK(r == UCM_OK);
  if (r == UCM_OK) {
    memset(&info, 0, sizeof(info));
    info.struct_bytes = sizeof(info);
    CHECK(ucm_cache_info(cache, &info) == UCM_OK);
    CHECK(strcmp(info.copy_engine, "host") == 0); /* copy_engine took its default, auto */
    CHECK(strstr(info.pages, "not populated (allow_overcommit)") != NULL);

    memset(&oi, CANARY, sizeof(oi));
    oi.i.struct_bytes = sizeof(oi.i);
    CHECK(ucm_cache_info(cache, (ucm_cache_info_t*)&oi.i) == UCM_OK);
    CHECK(canary_intact(oi.canary));
    CHECK(oi.i.struct_bytes == sizeof(old_info_t));
    CHECK(oi.i.rank == info.rank && oi.i.local_size == info.local_size);
    CHECK(oi.i.control_inode == info.control_inode && strcmp(oi.i.binding, info.binding) == 0);

    memset(&os, CANARY, sizeof(os));
    memset(&on, CANARY, sizeof(on));
    os.s.struct_bytes = on.s.struct_bytes = sizeof(old_stats_t);
    CHECK(ucm_cache_stats(cache, (ucm_stats_t*)&os.s, (ucm_stats_t*)&on.s) == UCM_OK);
    CHECK(canary_intact(os.canary) && canary_intact(on.canary));
    CHECK(os.s.struct_bytes == sizeof(old_stats_t) && os.s.ranks == 1 && on.s.ranks == 2);
    CHECK(os.s.tasks == 0 && on.s.latency_max_us == 0);

    /* Out of range both ways, for outputs too; nothing is written. */
    memset(&info, 0, sizeof(info));
    info.struct_bytes = 8;
    CHECK(ucm_cache_info(cache, &info) == UCM_ERR_INVALID_ARG);
    CHECK(mentions(ucm_last_error(cache), 8) && mentions(ucm_last_error(cache), sizeof(old_info_t)));
    CHECK(info.rank == 0);
    memset(&stats, 0, sizeof(stats));
    stats.struct_bytes = sizeof(stats) + 8;
    CHECK(ucm_cache_stats(cache, &stats, NULL) == UCM_ERR_INVALID_ARG);
    CHECK(mentions(ucm_last_error(cache), sizeof(stats) + 8) && mentions(ucm_last_error(cache), sizeof(stats)));
    CHECK(stats.ranks == 0);
    CHECK(ucm_cache_finalize(&cache) == UCM_OK);
  }

  MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) printf("older_struct: %s (%d failures)\n", all ? "FAIL" : "ok", all);
  leak_check_before_mpi_finalize();
  MPI_Finalize();
  return all ? 1 : 0;
}
