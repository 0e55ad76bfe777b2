/* The MPI-free header, from C99 with -pedantic and no MPI on the include path:
 * a program or a binding can use every type, the versions, and the config
 * calls without MPI headers. Exits 0 when every check holds. */
#include <ucmcache/ucm_base.h>

#include <stdio.h>
#include <string.h>

#ifdef MPI_VERSION
#error "ucm_base.h pulled in <mpi.h>"
#endif

static int failures = 0;
#define CHECK(cond)                                               \
  do {                                                            \
    if (!(cond)) {                                                \
      fprintf(stderr, "%s:%d: FAIL: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                 \
    }                                                             \
  } while (0)

int main(void) {
  ucm_config_t cfg;
  ucm_stats_t stats;
  ucm_cache_info_t info;
  int version = 0;

  /* The generated version macros and the runtime's. */
  CHECK(UCM_VERSION_CODE == UCM_VERSION_OF(UCM_VERSION_MAJOR, UCM_VERSION_MINOR, UCM_VERSION_PATCH));
  CHECK(ucm_get_version(&version) == UCM_OK);
  CHECK(version == UCM_VERSION_CODE);
  CHECK(strcmp(ucm_version_string(), UCM_VERSION_STRING) == 0);

  /* One error for one mistake: NULL is UCM_ERR_NULL_POINTER, and its message
   * is the thread's last error (ucm_config_error is the same string). */
  CHECK(ucm_get_version(NULL) == UCM_ERR_NULL_POINTER);
  CHECK(strstr(ucm_last_error(NULL), "version is NULL") != NULL);
  CHECK(ucm_config_init(NULL) == UCM_ERR_NULL_POINTER);
  CHECK(strstr(ucm_last_error(NULL), "config is NULL") != NULL);
  CHECK(strcmp(ucm_config_error(), ucm_last_error(NULL)) == 0);

  CHECK(ucm_config_init(&cfg) == UCM_OK);
  CHECK(cfg.struct_bytes == sizeof(cfg));
  CHECK(cfg.version == UCM_VERSION_CODE);
  snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=0");
  CHECK(ucm_config_check(&cfg) == UCM_OK);
  cfg.shard_bytes = 0;
  CHECK(ucm_config_check(&cfg) == UCM_ERR_INVALID_ARG);
  CHECK(strstr(ucm_last_error(NULL), "shard_bytes") != NULL);

  /* Result values are ABI: append only, never renumber. These are the
   * values of 0.1; a new result goes after UCM_ERR_UNKNOWN_TASK. */
  CHECK(UCM_OK == 0 && UCM_ERR_INVALID_ARG == 1 && UCM_ERR_NO_MEMORY == 2 && UCM_ERR_NO_SPACE == 3);
  CHECK(UCM_ERR_TIMEOUT == 4 && UCM_ERR_BACKEND == 5 && UCM_ERR_NOT_FOUND == 6 && UCM_ERR_BAD_STATE == 7);
  CHECK(UCM_ERR_CORRUPT == 8 && UCM_ERR_ABI_MISMATCH == 9 && UCM_ERR_CONFIG_MISMATCH == 10);
  CHECK(UCM_ERR_SYSTEM == 11 && UCM_ERR_PEER_DEAD == 12 && UCM_ERR_UNSUPPORTED == 13 && UCM_ERR_BUSY == 14);
  CHECK(UCM_ERR_FINALIZED == 15 && UCM_ERR_BAD_HANDLE == 16 && UCM_ERR_DUPLICATE_KEY == 17);
  CHECK(UCM_ERR_DEVICE == 18 && UCM_ERR_INTERNAL == 19 && UCM_ERR_NULL_POINTER == 20);
  CHECK(UCM_ERR_OUT_OF_RANGE == 21 && UCM_ERR_EMPTY == 22 && UCM_ERR_TOO_LARGE == 23 && UCM_ERR_UNKNOWN_TASK == 24);
  /* So are the config's enum values (a caller stores them in ucm_config_t). */
  CHECK(UCM_ORDER_ROTATE == 0 && UCM_ORDER_NATURAL == 1 && UCM_EVICT_CLOCK == 0 && UCM_EVICT_RING == 1);
  CHECK(UCM_WAIT_FUTEX == 0 && UCM_WAIT_POLL == 1);
  CHECK(UCM_HUGEPAGES_AUTO == 0 && UCM_HUGEPAGES_ON == 1 && UCM_HUGEPAGES_OFF == 2);
  CHECK(UCM_COPY_ENGINE_AUTO == 0 && UCM_COPY_ENGINE_CUDA == 1 && UCM_COPY_ENGINE_HOST == 2 &&
        UCM_COPY_ENGINE_ASYNC_TEST == 3);

  memset(&stats, 0, sizeof(stats));
  memset(&info, 0, sizeof(info));
  CHECK(sizeof(stats.struct_bytes) == 4 && sizeof(info.struct_bytes) == 4);
  printf("%s (%d): %s\n", ucm_version_string(), version, failures ? "FAIL" : "ok");
  return failures ? 1 : 0;
}
