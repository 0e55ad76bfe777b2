/*
 * ucmcache: the MPI-free part of the public C API. Every type, result,
 * configuration and statistics struct, and every call that takes no MPI
 * object. It includes no MPI header, so a C program or a language binding
 * built without MPI headers can use it; the cache core of the library sees
 * only this header. Applications include <ucmcache/ucm.h>, which includes this
 * one and adds ucm_cache_init (the one call that takes an MPI_Comm).
 *
 * Every function returns a ucm_result_t. Nothing throws across this boundary:
 * an exception inside becomes a result (std::bad_alloc UCM_ERR_NO_MEMORY, a
 * failed system call such as a thread that cannot be created UCM_ERR_SYSTEM,
 * anything else UCM_ERR_INTERNAL) with its text in the last error. A required
 * pointer that is NULL is UCM_ERR_NULL_POINTER in every call.
 *
 * Threads. Each call says beside it which threads may make it. In short:
 * every call but ucm_cache_init and ucm_cache_finalize may run on any thread,
 * at the same time as any other call on the same cache (waits for the same
 * task included). ucm_cache_finalize may overlap any of them too: a call that
 * starts once finalize has begun returns UCM_ERR_FINALIZED, a ucm_task_wait
 * blocked in it returns UCM_ERR_FINALIZED, and the calls in flight finish
 * before the cache is freed (see ucm_cache_finalize). The MPI calls happen in
 * ucm_cache_init and ucm_cache_finalize only, on the calling thread.
 *
 * Versions. UCM_VERSION_CODE (ucm_version.h) is the version of these headers;
 * ucm_get_version() the library's. A library at least as new as the headers
 * works; an older one refuses ucm_config_init (UCM_ERR_UNSUPPORTED, naming
 * both versions).
 *
 * Structs that grow. ucm_config_t, ucm_cache_info_t and ucm_stats_t start
 * with struct_bytes, and later versions only append fields. The library
 * reads or writes the first struct_bytes bytes only: an app built with an
 * older header passes its smaller struct, and the fields it does not have
 * take their defaults (input) or are not written (output). struct_bytes
 * smaller than the first version's struct, or larger than the library's
 * (an app built against a newer header), is UCM_ERR_INVALID_ARG naming both.
 *
 * Public names never collide with UCX's libucm (which Open MPI loads): UCX
 * exports ucm_init, ucm_strerror, ucm_mmap and ~100 other ucm_* symbols, so
 * ours are ucm_cache_*, ucm_result_*, ucm_version_* and the like.
 */
#ifndef UCMCACHE_UCM_BASE_H
#define UCMCACHE_UCM_BASE_H

#include <stddef.h>
#include <stdint.h>

#include <ucmcache/ucm_version.h>

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
  UCM_ERR_INTERNAL = 19,       /* a bug: please report it with the log */
  UCM_ERR_NULL_POINTER = 20,   /* a required pointer (config, entries, keys, dst, src, an output) is NULL */
  UCM_ERR_OUT_OF_RANGE = 21,   /* a shard index is >= shards_per_block */
  UCM_ERR_EMPTY = 22,          /* a task of 0 entries */
  UCM_ERR_TOO_LARGE = 23,      /* more than max_task_entries entries, blocks or keys in one call */
  UCM_ERR_UNKNOWN_TASK = 24    /* not a task of this cache, or already waited for */
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
/* Which engine copies slots to the app's buffers (see copy_engine in ucm_config_t). */
typedef enum ucm_copy_engine {
  UCM_COPY_ENGINE_AUTO = 0,      /* CUDA on a node with GPUs; memcpy only on a node without any */
  UCM_COPY_ENGINE_CUDA = 1,      /* CUDA, or init fails with the driver's reason */
  UCM_COPY_ENGINE_HOST = 2,      /* memcpy: destinations and sources are host memory */
  UCM_COPY_ENGINE_ASYNC_TEST = 3 /* tests only: host memory, copies land later on a worker thread */
} ucm_copy_engine_t;
/* Fan-out (see fanout in ucm_config_t): how a node's ranks share each loaded shard. */
typedef enum ucm_fanout {
  UCM_FANOUT_OFF = 0,  /* every rank copies every shard from the host slot (the default) */
  UCM_FANOUT_NCCL = 1, /* the shard's root copies it, then NCCL broadcasts it GPU to GPU */
  UCM_FANOUT_MPI = 2   /* the same protocol over MPI_Ibcast, for host destinations (no GPU needed) */
} ucm_fanout_t;

typedef struct ucm_config {
  uint32_t struct_bytes;     /* sizeof(ucm_config_t) as the app was built: set by ucm_config_init */
  uint32_t version;          /* UCM_VERSION_CODE of the app's header: set by ucm_config_init */
  uint64_t shard_bytes;      /* UCM_SHARD_BYTES (1 MiB): bytes per shard and cache slot [layout] */
  uint64_t cache_bytes;      /* UCM_CACHE_BYTES (1 GiB): the node's regular pool       [layout] */
  uint32_t shards_per_block; /* UCM_SHARDS_PER_BLOCK (64): shard indexes are < this   [layout] */
  uint32_t reserved_slots;   /* UCM_RESERVED_SLOTS (64): slots only prealloc may use   [layout] */
  uint32_t max_task_entries; /* UCM_MAX_TASK_ENTRIES (4096): entries per task at most  [layout] */
  int32_t device_id;         /* UCM_DEVICE_ID (auto): a GPU ordinal, auto, or < 0 scheduler */
  uint32_t ranks_per_node;   /* UCM_RANKS_PER_NODE (0 = the real node): split a machine
                                into pretend nodes of this many ranks (tests, studies)  [layout] */
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
  uint32_t owner_grace_us;   /* UCM_OWNER_GRACE_US (1000): how long a peer's share of a task
                                waits for that peer to load it before this rank does
                                (keeps ownership balanced when ranks arrive skewed) */
  uint64_t segment_bytes;    /* UCM_SEGMENT_BYTES (1 GiB): data-plane segment size bound [layout] */
  char backend[512];         /* UCM_BACKEND: "posix:/dir[,depth=8]" or "sim:latency_us=..."
                                (no default: init names it missing)                    [layout] */
  ucm_copy_engine_t copy_engine; /* UCM_COPY_ENGINE=auto|cuda|host|async-test (auto). A configured
                                device_id, or auto on a node with a GPU driver, needs CUDA: init
                                fails with the driver's reason rather than copy with memcpy into
                                device pointers. The host engine runs when configured, or with
                                auto on a node that has no GPU. async-test is for tests only. */
  int32_t allow_overcommit;  /* UCM_OVERCOMMIT=1|0 (0): 0 refuses at init a data plane larger
                                than the node can give (MemAvailable or the memory cgroup's
                                limit; for hugepages=on, the free 2 MiB pages) and populates
                                every page at init, so memory the kernel cannot give is an
                                init error, not a SIGBUS later; 1 maps it lazily, unchecked */
  int32_t protect;           /* UCM_PROTECT=1|0 (1): ucm_load_task is node-collective, so a shard
                                loaded for a task (or still held and asked for again by a later
                                task) stays in the cache until every local rank (with a copy
                                engine) has taken it for that task, or protect_grace_ms
                                passed: ranks that drift apart still load it once  [layout] */
  uint32_t protect_grace_ms; /* UCM_PROTECT_GRACE_MS (1000): the bound on that protection, so a
                                rank that never asks for a shard cannot hold it, and a rank with
                                no load task that let a shard's grace run out holds nothing
                                until it asks again                                 [layout] */
  ucm_fanout_t fanout;       /* UCM_FANOUT=off|nccl|mpi (off): in nccl or mpi mode each shard is
                                read from the host slot once per node (by its root, entry i's
                                root being local rank i mod local_size) and broadcast to the
                                other ranks' destinations; ucm_load_task is then collective in
                                time: every local rank submits the same keys in the same task
                                order (mpi needs MPI_THREAD_MULTIPLE; nccl the cuda engine) [layout] */
  uint32_t max_unfinished_tasks; /* UCM_MAX_UNFINISHED_TASKS (65536): a rank's tasks submitted and not
                                finished (no ucm_task_wait or ucm_task_test returned their result;
                                each keeps its entries) at most: then a submit is UCM_ERR_BUSY */
} ucm_config_t;

/* ---- the node-shared cache -------------------------------------------------- */

/* A cache belongs to the process that called ucm_cache_init. A child forked
 * from it (a data-loader worker) inherits the handle but none of the cache's
 * threads: every call it makes with the handle, ucm_cache_finalize included,
 * is UCM_ERR_BAD_STATE naming the fork, and changes nothing of the parent's. */
typedef struct ucm_cache_s* ucm_cache_t;

/* Defaults, then UCM_* variables. A variable with a bad value is an error that
 * names it ("UCM_SHARD_BYTES=12x is not a size"); the config then holds the
 * defaults. Sizes are digits with an optional K/M/G/T (KiB, ...) suffix and
 * integers digits with an optional '-': no blanks, no '+' (" -1" is not a
 * size). Records the app's sizeof(ucm_config_t) and UCM_VERSION_CODE in
 * struct_bytes and version: a library older than the header is
 * UCM_ERR_UNSUPPORTED naming both versions. NULL: UCM_ERR_NULL_POINTER.
 * Threads: any, at any time (it reads the environment). */
UCM_API ucm_result_t ucm_config_init_version(ucm_config_t* config, size_t struct_bytes, uint32_t version);
static inline ucm_result_t ucm_config_init(ucm_config_t* config) {
  return ucm_config_init_version(config, sizeof(ucm_config_t), UCM_VERSION_CODE);
}

/* Checks every field on its own; the message (ucm_last_error(NULL)) names the
 * first bad field and its value. Also: shards_per_block x shard_bytes (one
 * block's file) must fit in off_t. NULL: UCM_ERR_NULL_POINTER.
 * Threads: any, at any time. */
UCM_API ucm_result_t ucm_config_check(const ucm_config_t* config);

/* The message of this thread's last failed call on `cache`, also when other
 * threads' calls on it failed since; from a thread that had no failed call
 * on it, the last failed call on `cache` of any thread (NULL: of the last
 * failed call on this thread that had no usable cache: ucm_config_*,
 * ucm_cache_init, ucm_get_version, or a call with a bad handle). Valid until
 * the next call on this thread. Threads: any, at any time. */
UCM_API const char* ucm_last_error(ucm_cache_t cache);

/* Kept for callers of 0.1: the same as ucm_last_error(NULL).
 * Threads: any, at any time. */
UCM_API const char* ucm_config_error(void);

/* A short, static, human-readable name for a result ("UCM_ERR_NO_SPACE: ...").
 * Threads: any, at any time. */
UCM_API const char* ucm_result_string(ucm_result_t result);

/* The library's version, "MAJOR.MINOR.PATCH". Threads: any, at any time. */
UCM_API const char* ucm_version_string(void);

/* The library's UCM_VERSION_CODE (which may be newer than the header's).
 * NULL: UCM_ERR_NULL_POINTER. Threads: any, at any time. */
UCM_API ucm_result_t ucm_get_version(int* version);

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
  double register_seconds; /* wall time registering the data plane with the device (cudaHostRegister) */
  uint32_t register_threads; /* threads that registered the segments in parallel */
  uint32_t reserved0;
  char device_choice[160]; /* how device_id was taken ("auto: the app's current device 1",
                              "configured device_id 0", "no GPU on this node (...)") */
  char pages[256];         /* how the data plane's pages were chosen: "2 MiB hugetlb pages",
                              or why hugepages=auto fell back to ordinary pages; and whether
                              they were populated at init (allow_overcommit) */
  double init_seconds;       /* wall time of ucm_cache_init on this rank */
  double populate_seconds;   /* wall time faulting this rank's mapping of the data plane in at init */
  uint32_t populate_threads; /* threads that populated the segments in parallel (0: not populated) */
  uint32_t numa_mode;        /* the data plane's NUMA policy as the kernel reports it for this rank's
                                mapping: 0 default, 1 preferred, 2 interleave, 3 bind */
  uint64_t numa_nodes;       /* bit n: NUMA node n of that policy */
  char numa[160];            /* that policy and how it was chosen ("preferred node 0 (every GPU of
                                the node is on NUMA node 0)") */
  char control_pages[160];   /* how the control region's pages were chosen ("2 MiB hugetlb pages",
                                "4 KiB pages + MADV_HUGEPAGE (...)") */
  char fanout[128];        /* the fan-out mode and its communicator ("off", "mpi: MPI_Ibcast over
                              4 local ranks"), or why it stopped ("off since task 7: ...") */
} ucm_cache_info_t;

/* ---- tasks ------------------------------------------------------------------
 * A task is a batch of shards, one per entry, each (block, shard) at most once.
 * ucm_load_task is node-collective in meaning: every local rank submits the
 * same keys with its own destinations, and each shard is loaded from the
 * backend once per node. It never waits for the other ranks and returns at
 * once; ucm_task_wait / ucm_task_test finish it. Tasks complete in any order.
 * Bad input (each its own result, the message in ucm_last_error):
 *   UCM_ERR_NULL_POINTER  entries, a dst/src, or the task output is NULL
 *   UCM_ERR_EMPTY         n == 0
 *   UCM_ERR_TOO_LARGE     n > max_task_entries
 *   UCM_ERR_INVALID_ARG   a key's reserved field is not 0, a dst/src that
 *                         overlaps the cache's own memory (below), or two dsts
 *                         of one load that share a byte (naming both entries)
 *   UCM_ERR_OUT_OF_RANGE  a shard index >= shards_per_block
 *   UCM_ERR_DUPLICATE_KEY the same (block, shard) twice in one task
 *   UCM_ERR_BAD_STATE     a load or dump on a scheduler rank, or in a forked child
 *   UCM_ERR_BUSY          too many tasks already wait for this rank's
 *                         dispatcher (1024; they drain on their own), or
 *                         max_unfinished_tasks were submitted and not
 *                         finished (each keeps its entries until
 *                         ucm_task_wait or ucm_task_test returns its
 *                         result: finish some)
 *   UCM_ERR_BAD_HANDLE / UCM_ERR_FINALIZED   for the cache handle
 * A bad call changes nothing: the cache stays usable.
 * Threads: every task call may run on any thread, at the same time as any
 * other call on the same cache, including waits for the same task. */

typedef struct ucm_block { uint8_t bytes[16]; } ucm_block_t; /* the engine's block id (a hash) */
typedef struct ucm_key {
  ucm_block_t block;
  uint32_t shard;
  uint32_t reserved; /* set to 0 */
} ucm_key_t;
typedef struct ucm_load_entry {
  ucm_key_t key;
  void* dst;       /* shard_bytes of memory on this rank's device (host memory with the
                      host engine). With CUDA each dst is checked at submit: memory of
                      another device, host memory or a freed pointer is refused with
                      UCM_ERR_INVALID_ARG naming the entry. With any engine, a dst that
                      overlaps the cache's own memory as this process maps it (the
                      control region, a data-plane segment, the store's node state:
                      the memfds in /proc/self/maps) is refused the same way, naming
                      the entry and the region: a copy there would overwrite slots that
                      every local rank reads. Two dsts of one load must not share a
                      byte (each key's shard would hold the other's bytes there);
                      dsts of different tasks in flight at once must not either (not
                      checked). The destination must stay
                      valid until the task is finished (ucm_task_wait returned other
                      than UCM_ERR_TIMEOUT, or ucm_task_test said done): also after a
                      timed-out wait, copies into it may still be in flight. */
} ucm_load_entry_t;
typedef struct ucm_dump_entry {
  ucm_key_t key;
  const void* src; /* shard_bytes to store, on this rank's device (checked as dst is,
                      the cache's own memory included).
                      Its content must be complete when ucm_dump_task is called: the
                      library copies on its own stream, so synchronize the stream that
                      wrote it first. It must stay valid until the task is finished. */
} ucm_dump_entry_t;
typedef uint64_t ucm_task_t;

#define UCM_WHERE_NONE 0    /* neither in the cache nor in the backend */
#define UCM_WHERE_BACKEND 1 /* not in the cache; the backend has it */
#define UCM_WHERE_CACHE 2   /* resident and Ready in the node's cache */
#define UCM_WHERE_ERROR 3   /* not in the cache; the backend could not say (the file
                               under the key's name is unreadable, or not a file of
                               the store's, e.g. a directory) */

typedef struct ucm_stats {
  uint32_t struct_bytes;      /* set by the caller to sizeof(ucm_stats_t) */
  uint32_t ranks;             /* ranks summed (1 for a rank's own) */
  uint64_t tasks, shards;     /* submitted */
  uint64_t hits;              /* Ready when asked */
  uint64_t owner_loads;       /* backend loads issued as owner */
  uint64_t load_failures;
  uint64_t waits;             /* found a peer loading it */
  uint64_t wait_ns;           /* copier time spent waiting for Ready */
  uint64_t takeovers;         /* Failed/preallocated slots re-owned */
  uint64_t evictions;
  uint64_t no_space;          /* get() found every slot pinned (then retried) */
  uint64_t prealloc_made, prealloc_used;
  uint64_t failed_shards;
  uint64_t bytes_from_backend, bytes_to_device;
  uint64_t dumps, bytes_dumped;
  /* task latency, submit to completion, in us: p50/p90/p99 within 1/32 of the exact value, max exact */
  uint64_t latency_p50_us, latency_p90_us, latency_p99_us, latency_max_us;
  uint64_t direct_fallbacks;  /* backend transfers the file system refused as direct I/O,
                                 redone buffered (the store then stays buffered) */
  /* Fan-out (UCM_FANOUT). Kept per process: in the node struct they are the
     calling rank's own too (sum the ranks' for a node total). */
  uint64_t fanout_mode;         /* ucm_fanout_t in effect: UCM_FANOUT_OFF after init without it */
  uint64_t fanout_host_bytes;   /* bytes this rank read from host slots for fanned-out tasks */
  uint64_t fanout_bcast_bytes;  /* bytes this rank received by broadcast */
  uint64_t fanout_fallbacks;    /* tasks that fell back to per-rank copies (timeout, communicator error) */
  uint64_t fanout_mismatches;   /* tasks failed because the ranks submitted different tasks */
  uint64_t inline_tasks;        /* load tasks whose every entry was a hit, copied and completed by
                                   the thread that submitted them (host engine, fan-out off): done
                                   when ucm_load_task returns */
  uint64_t protect_overrides;   /* waits for a free cache slot that outlasted half of their task's
                                   time and from then on looked with no eviction protection
                                   (UCM_PROTECT): a slot kept for a local rank that had not come may
                                   go, and that rank reloads it; protection never fails a task */
} ucm_stats_t;

/* The cache calls exist in a library built with MPI (ucmcache.pc then sets no
 * UCM_NO_MPI); none needs an MPI header to be called. */
#ifndef UCM_NO_MPI

/* Collective over the communicator of ucm_cache_init. Sets *cache to NULL;
 * any later use of the old handle returns UCM_ERR_FINALIZED. In steps:
 *   1. calls that start from now on return UCM_ERR_FINALIZED;
 *   2. this rank's queue threads stop (no copy into a task's destinations
 *      starts after this), and every ucm_task_wait blocked on this cache
 *      returns UCM_ERR_FINALIZED (its task is abandoned);
 *   3. the calls still in flight on other threads get timeout_ms to return;
 *   4. the node's ranks meet through the shared control region (not an MPI
 *      barrier), and the cache is torn down.
 * The whole call is bounded by timeout_ms. A peer that died before it came is
 * UCM_ERR_PEER_DEAD naming its local rank; a live one that had not come by
 * then UCM_ERR_TIMEOUT naming it; this rank releases what it holds either way.
 * If calls are still running after timeout_ms (a thread stuck in the kernel),
 * the ranks still meet, but the cache's memory and threads are left in place
 * rather than freed under those calls, until the process exits: the result is
 * UCM_ERR_TIMEOUT, naming how many. The store's I/O threads get what is left
 * of the same timeout_ms (never a second one), as do the threads of its
 * synchronous calls (ucm_lookup's, ucm_touch's): any still in the kernel at the
 * deadline (a hard-mounted NFS that stopped answering) are detached, never
 * joined, and the result is UCM_ERR_TIMEOUT naming how many, also when a peer
 * did not come (the result names both); the store object they return into
 * stays allocated, and
 * this rank's mapping of the cache is replaced by an inaccessible one at the
 * same address, so that a read the kernel completes late fails (EFAULT)
 * instead of writing into the cache. A second finalize of the same handle
 * (another thread's, or a later one through a copy of it) returns
 * UCM_ERR_FINALIZED; through the same variable, which the first set to NULL,
 * UCM_ERR_BAD_HANDLE saying so; a NULL argument UCM_ERR_NULL_POINTER.
 * Threads: the thread that calls MPI for the app, as any collective; it may
 * overlap any other call on the cache, on other threads (steps 1 to 3). */
UCM_API ucm_result_t ucm_cache_finalize(ucm_cache_t* cache);

/* What this rank got at init. The caller sets info->struct_bytes; the library
 * fills that many bytes (see "Structs that grow"). NULL: UCM_ERR_NULL_POINTER.
 * Threads: any, at the same time as any other call. */
UCM_API ucm_result_t ucm_cache_info(ucm_cache_t cache, ucm_cache_info_t* info);

/* Submits a load (see above). NULL entries (n > 0), a NULL dst or a NULL task:
 * UCM_ERR_NULL_POINTER. A task whose every entry is in the cache already is
 * copied by the calling thread before this returns, over the host engine with
 * fan-out off (ucm_stats_t.inline_tasks counts them); any other task is copied
 * by the rank's queue while this returns at once. Threads: any, concurrently. */
UCM_API ucm_result_t ucm_load_task(ucm_cache_t cache, const ucm_load_entry_t* entries, size_t n, ucm_task_t* task);
/* Copies each shard into a cache slot (Ready at once, so peers hit it) and
 * writes it through to the backend. When several ranks dump the same key, one
 * writes, and each gets that write's outcome: an entry is UCM_OK only once
 * the store holds the key. After UCM_ERR_BACKEND the cached copy is still
 * served, and the next dump of the key (any rank) writes it through again.
 * A key names its bytes (as a prefix hash does): once the cache holds a key
 * Ready, a dump of it writes nothing new: stored already, the entry is UCM_OK
 * at once; not stored, the cached copy is what is written through, not src.
 * Only a Failed or Corrupt slot is filled from src. To replace a key's bytes,
 * dump them under a new key.
 * NULL entries (n > 0), a NULL src or a NULL task: UCM_ERR_NULL_POINTER.
 * Threads: any, concurrently. */
UCM_API ucm_result_t ucm_dump_task(ucm_cache_t cache, const ucm_dump_entry_t* entries, size_t n, ucm_task_t* task);
/* Waits up to timeout_ms (< 0, or too large to add to the clock, such as
 * INT64_MAX: no bound). Returns the task's result (UCM_OK, or the first
 * failure: UCM_ERR_BACKEND names the keys that failed; UCM_ERR_CORRUPT a shard
 * whose stored copy failed its checks, not retried while it stays in the
 * cache, replaced by a dump of the key) and retires the handle;
 * UCM_ERR_TIMEOUT of this wait's own bound ("still running after N ms")
 * leaves it valid. A task whose shards missed their deadline (timeout_ms of
 * the config) has UCM_ERR_TIMEOUT as its result, retired as any result: to
 * tell the two apart, ucm_task_test the handle (UCM_ERR_UNKNOWN_TASK once
 * retired). UCM_ERR_UNKNOWN_TASK for a handle that is
 * not (or no longer) a task of this cache; UCM_ERR_FINALIZED when
 * ucm_cache_finalize begins, even during an unbounded wait.
 * Threads: any; several threads may wait for the same task (one gets its
 * result, the others UCM_ERR_UNKNOWN_TASK once it is retired). */
UCM_API ucm_result_t ucm_task_wait(ucm_cache_t cache, ucm_task_t task, int64_t timeout_ms);
/* Never blocks: *done = 0 and UCM_OK while it runs; once done, *done = 1 and
 * the task's result, as ucm_task_wait. NULL done: UCM_ERR_NULL_POINTER.
 * Threads: any, concurrently. */
UCM_API ucm_result_t ucm_task_test(ucm_cache_t cache, ucm_task_t task, int* done);

/* Marks every resident shard of each block as recently used, then hands the
 * same batch to the backend's touch (which keeps its copy warm where its loads
 * read a cache of its own: the posix store's page cache when it reads buffered;
 * a posix store that reads direct warms only the files' shard headers) on a
 * thread of the cache's, and returns without waiting for the store: touch is a hint, and
 * a slow or stuck store never holds the caller. Batches reach the store in
 * call order; while it is held, at most 2^20 blocks wait, and a batch past
 * that is dropped (one warning). n == 0 does
 * nothing; n > max_task_entries is UCM_ERR_TOO_LARGE;
 * NULL blocks with n > 0: UCM_ERR_NULL_POINTER. Threads: any, concurrently. */
UCM_API ucm_result_t ucm_touch(ucm_cache_t cache, const ucm_block_t* blocks, size_t n);

/* Per key: where it is. The cache is asked first, the backend about the rest
 * (on a thread of the cache's, so the wait for the store is bounded by
 * timeout_ms). Works on a scheduler rank. Every entry of where[] is filled: a
 * key the backend cannot answer for gets UCM_WHERE_ERROR and the others their
 * answer; the call then returns UCM_ERR_BACKEND, and ucm_last_error says how
 * many keys are unknown and names the first (its index, key and file). A store
 * that has not answered by timeout_ms (stuck in the kernel): UCM_ERR_TIMEOUT,
 * with the keys it answered by then filled and UCM_WHERE_ERROR for the rest,
 * naming the first of those; its call goes on, on that thread, and a later
 * lookup gets another (at most 4 per rank are in the store at once; past that
 * a lookup waits for one, within its timeout_ms). UCM_ERR_FINALIZED when
 * ucm_cache_finalize begins during the wait. A stored
 * copy that fails its checks (corrupt, another key's, an older format) is not
 * a usable copy: UCM_WHERE_NONE. n > max_task_entries is UCM_ERR_TOO_LARGE; a
 * key whose reserved field is not 0 UCM_ERR_INVALID_ARG;
 * NULL keys or where with n > 0: UCM_ERR_NULL_POINTER. Threads: any, concurrently. */
UCM_API ucm_result_t ucm_lookup(ucm_cache_t cache, const ucm_key_t* keys, size_t n, uint8_t* where);

/* This rank's counters and the node's (the sum over its ranks); either or both
 * may be NULL. Each struct's struct_bytes, set by the caller, says how much
 * the library fills (see "Structs that grow"). Threads: any, concurrently. */
UCM_API ucm_result_t ucm_cache_stats(ucm_cache_t cache, ucm_stats_t* rank, ucm_stats_t* node);
#endif /* UCM_NO_MPI */

#ifdef __cplusplus
}
#endif

#endif /* UCMCACHE_UCM_BASE_H */
