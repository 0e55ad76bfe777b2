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

/* A short, static, human-readable name for a result ("UCM_ERR_NO_SPACE: ..."). */
UCM_API const char* ucm_result_string(ucm_result_t result);

/* The library version, "MAJOR.MINOR.PATCH". */
UCM_API const char* ucm_version_string(void);

#ifdef __cplusplus
}
#endif

#endif /* UCMCACHE_UCM_H */
