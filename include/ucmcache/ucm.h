/*
 * ucmcache: a node-shared host-memory cache of KV-cache shards for multi-GPU
 * inference. This is the public C API; everything not declared here is hidden.
 *
 * Every function returns a ucm_result_t. Nothing throws across this boundary.
 * Public names never collide with UCX's libucm (which Open MPI loads): UCX
 * exports ucm_init, ucm_strerror, ucm_mmap and ~100 other ucm_* symbols, so
 * ours are ucm_cache_*, ucm_result_*, ucm_version_* and the like.
 */
#ifndef UCMCACHE_UCM_H
#define UCMCACHE_UCM_H

#include <stddef.h>
#include <stdint.h>

/* ucm_cache_init takes an MPI communicator. Define UCM_NO_MPI before including
 * this header to use only the parts that need no MPI. */
#ifndef UCM_NO_MPI
#include <mpi.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define UCM_API __attribute__((visibility("default")))
#else
#define UCM_API
#endif

/* Result codes. Values are ABI: never renumber, only append. */
typedef enum ucm_result {
  UCM_OK = 0,
  UCM_ERR_INVALID_ARG = 1,     /* a bad argument; ucm_last_error names it */
  UCM_ERR_NO_MEMORY = 2,       /* an allocation failed */
  UCM_ERR_NO_SPACE = 3,        /* every cache slot is pinned */
  UCM_ERR_TIMEOUT = 4,         /* a bounded wait ran out */
  UCM_ERR_BACKEND = 5,         /* the backend store failed a load or dump */
  UCM_ERR_NOT_FOUND = 6,       /* the key or handle is not known */
  UCM_ERR_BAD_STATE = 7,       /* the call is not valid in the current state */
  UCM_ERR_CORRUPT = 8,         /* a shared region or message failed validation */
  UCM_ERR_ABI_MISMATCH = 9,    /* a shared region was built by another ABI */
  UCM_ERR_CONFIG_MISMATCH = 10,/* ranks disagree on a layout parameter */
  UCM_ERR_SYSTEM = 11,         /* a system call failed; errno is in the message */
  UCM_ERR_PEER_DEAD = 12,      /* a peer process died */
  UCM_ERR_UNSUPPORTED = 13,    /* not built in, or not available here */
  UCM_ERR_BUSY = 14,           /* a non-blocking attempt found the resource taken */
  UCM_ERR_FINALIZED = 15,      /* the cache was finalized */
  UCM_ERR_BAD_HANDLE = 16,     /* an unknown task or cache handle */
  UCM_ERR_DUPLICATE_KEY = 17,  /* the same key appears twice in one task */
  UCM_ERR_DEVICE = 18,         /* the device (CUDA) layer failed */
  UCM_ERR_INTERNAL = 19        /* a bug: please report it with the log */
} ucm_result_t;

/* ---- configuration ---------------------------------------------------------
 * ucm_config_init() fills every field with its default, then applies the UCM_*
 * environment variable named beside it. Change fields after that to override.
 * Every field that shapes the shared layout must be equal on all ranks of a
 * node; ucm_cache_init() checks, and names the field that differs. */

#define UCM_DEVICE_AUTO (-2147483647 - 1) /* local rank modulo visible GPUs */
#define UCM_DEVICE_NONE (-1)              /* any negative: a query-only scheduler rank */

typedef enum ucm_order { UCM_ORDER_ROTATE = 0, UCM_ORDER_NATURAL = 1 } ucm_order_t;
typedef enum ucm_evict { UCM_EVICT_CLOCK = 0, UCM_EVICT_RING = 1 } ucm_evict_t;
typedef enum ucm_wait { UCM_WAIT_FUTEX = 0, UCM_WAIT_POLL = 1 } ucm_wait_t;
typedef enum ucm_hugepages { UCM_HUGEPAGES_AUTO = 0, UCM_HUGEPAGES_ON = 1, UCM_HUGEPAGES_OFF = 2 } ucm_hugepages_t;

typedef struct ucm_config {
  uint32_t struct_bytes;     /* sizeof(ucm_config_t), set by ucm_config_init */
  uint32_t shards_per_block; /* UCM_SHARDS_PER_BLOCK (64): shard indexes are < this   [layout] */
  uint64_t shard_bytes;      /* UCM_SHARD_BYTES (1 MiB): bytes per shard and cache slot [layout] */
  uint64_t cache_bytes;      /* UCM_CACHE_BYTES (1 GiB): the node's regular pool       [layout] */
  uint32_t reserved_slots;   /* UCM_RESERVED_SLOTS (64): slots only prealloc may use   [layout] */
  uint32_t max_task_entries; /* UCM_MAX_TASK_ENTRIES (4096): entries per task at most  [layout] */
  int32_t device_id;         /* UCM_DEVICE_ID (auto): a GPU ordinal, auto, or < 0 scheduler */
  uint32_t ranks_per_node;   /* UCM_RANKS_PER_NODE (0 = the real node): split a machine
                                into pretend nodes of this many ranks (tests, studies) */
  ucm_order_t order;         /* UCM_ORDER=rotate|natural (rotate)                      [layout] */
  ucm_evict_t evict;         /* UCM_EVICT=clock|ring (clock)                           [layout] */
  ucm_wait_t wait;           /* UCM_WAIT=futex|poll (futex)                            [layout] */
  int32_t prealloc;          /* UCM_PREALLOC=1|0 (1)                                   [layout] */
  ucm_hugepages_t hugepages; /* UCM_HUGEPAGES=auto|on|off (auto)                       [layout] */
  int32_t bind_threads;      /* UCM_BIND=1|0 (1): pin queue threads near the GPU */
  uint32_t timeout_ms;       /* UCM_TIMEOUT_MS (30000): bound on init and on any wait for a peer */
  uint32_t liveness_ms;      /* UCM_LIVENESS_MS (50): how often a waiter checks its peer lives [layout] */
  uint32_t load_retries;     /* UCM_LOAD_RETRIES (2): owner retries of a failed backend load */
  uint32_t io_depth;         /* UCM_IO_DEPTH (16): backend loads in flight per rank */
  uint64_t segment_bytes;    /* UCM_SEGMENT_BYTES (1 GiB): data-plane segment size bound [layout] */
  char backend[512];         /* UCM_BACKEND: "posix:/dir[,depth=8]" or "sim:latency_us=..."
                                (no default: init names it missing)                    [layout] */
} ucm_config_t;

/* Defaults, then UCM_* variables. A variable with a bad value is an error that
 * names it ("UCM_SHARD_BYTES=12x is not a size"); the config then holds the
 * defaults for that field. */
UCM_API ucm_result_t ucm_config_init(ucm_config_t* config);

/* Checks every field on its own; the message (ucm_config_error) names the first
 * bad field and its value. */
UCM_API ucm_result_t ucm_config_check(const ucm_config_t* config);

/* The message of the last failed ucm_config_* call on this thread. */
UCM_API const char* ucm_config_error(void);

/* ---- the node-shared cache -------------------------------------------------- */

typedef struct ucm_cache_s* ucm_cache_t;

typedef struct ucm_cache_info {
  uint32_t struct_bytes;   /* set by the caller to sizeof(ucm_cache_info_t) */
  int32_t rank, size;      /* in the communicator given to ucm_cache_init */
  int32_t local_rank;      /* among the ranks that share this cache */
  int32_t local_size;
  int32_t node_id, node_count;
  int32_t device_id;       /* resolved; < 0 for a scheduler rank */
  int32_t scheduler;       /* 1: control plane only */
  int32_t hugetlb;         /* 1: data plane on MFD_HUGETLB 2 MiB pages */
  int32_t cuda_built, nccl_built, hwloc_built;
  int32_t visible_devices; /* CUDA devices this rank sees */
  int32_t threads_bound;   /* 1: queue threads pinned (see binding) */
  uint32_t regular_slots, reserved_slots;
  uint32_t segments;       /* data-plane memfd segments */
  uint64_t control_bytes;  /* size of the shared control region */
  uint64_t data_bytes;     /* bytes of the data plane mapped by this rank (0: scheduler) */
  uint64_t control_inode;  /* inode of the control memfd: equal on every rank of a node */
  char host[64];
  char copy_engine[16];    /* "host", "cuda", or "" for a scheduler */
  char binding[256];       /* where the queue threads run, or why they are not pinned */
} ucm_cache_info_t;

#ifndef UCM_NO_MPI
/* Collective over comm: every rank calls it. Ranks on one node (or pretend
 * node, see ranks_per_node) share one cache. On failure every rank returns the
 * same error, *cache is NULL, and ucm_last_error(NULL) says which rank failed
 * and why. */
UCM_API ucm_result_t ucm_cache_init(MPI_Comm comm, const ucm_config_t* config, ucm_cache_t* cache);

/* Collective over the communicator of ucm_cache_init. Sets *cache to NULL;
 * any later use of the old handle returns UCM_ERR_FINALIZED. */
UCM_API ucm_result_t ucm_cache_finalize(ucm_cache_t* cache);

UCM_API ucm_result_t ucm_cache_info(ucm_cache_t cache, ucm_cache_info_t* info);

/* The message of the last failed call on `cache` (NULL: of the last failed
 * ucm_cache_init on this thread, or of a call with a bad handle). */
UCM_API const char* ucm_last_error(ucm_cache_t cache);
#endif /* UCM_NO_MPI */

/* A short, static, human-readable name for a result ("UCM_ERR_NO_SPACE: ..."). */
UCM_API const char* ucm_result_string(ucm_result_t result);

/* The library version, "MAJOR.MINOR.PATCH". */
UCM_API const char* ucm_version_string(void);

#ifdef __cplusplus
}
#endif

#endif /* UCMCACHE_UCM_H */
