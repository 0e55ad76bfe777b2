// C API: result names and the library version.
#include "ucmcache/ucm_base.h"

extern "C" {

UCM_API const char* ucm_result_string(ucm_result_t result) {
  switch (result) {
    case UCM_OK: return "UCM_OK: success";
    case UCM_ERR_INVALID_ARG: return "UCM_ERR_INVALID_ARG: invalid argument";
    case UCM_ERR_NO_MEMORY: return "UCM_ERR_NO_MEMORY: out of memory";
    case UCM_ERR_NO_SPACE: return "UCM_ERR_NO_SPACE: every cache slot is pinned";
    case UCM_ERR_TIMEOUT: return "UCM_ERR_TIMEOUT: a bounded wait ran out";
    case UCM_ERR_BACKEND: return "UCM_ERR_BACKEND: the backend store failed";
    case UCM_ERR_NOT_FOUND: return "UCM_ERR_NOT_FOUND: not found";
    case UCM_ERR_BAD_STATE: return "UCM_ERR_BAD_STATE: not valid in the current state";
    case UCM_ERR_CORRUPT: return "UCM_ERR_CORRUPT: shared region or message failed validation";
    case UCM_ERR_ABI_MISMATCH: return "UCM_ERR_ABI_MISMATCH: built by another ABI version";
    case UCM_ERR_CONFIG_MISMATCH: return "UCM_ERR_CONFIG_MISMATCH: ranks disagree on a layout parameter";
    case UCM_ERR_SYSTEM: return "UCM_ERR_SYSTEM: a system call failed";
    case UCM_ERR_PEER_DEAD: return "UCM_ERR_PEER_DEAD: a peer process died";
    case UCM_ERR_UNSUPPORTED: return "UCM_ERR_UNSUPPORTED: not built in or not available";
    case UCM_ERR_BUSY: return "UCM_ERR_BUSY: resource taken";
    case UCM_ERR_FINALIZED: return "UCM_ERR_FINALIZED: the cache was finalized";
    case UCM_ERR_BAD_HANDLE: return "UCM_ERR_BAD_HANDLE: unknown handle";
    case UCM_ERR_DUPLICATE_KEY: return "UCM_ERR_DUPLICATE_KEY: the same key twice in one task";
    case UCM_ERR_DEVICE: return "UCM_ERR_DEVICE: the device layer failed";
    case UCM_ERR_INTERNAL: return "UCM_ERR_INTERNAL: internal error";
    case UCM_ERR_NULL_POINTER: return "UCM_ERR_NULL_POINTER: a required pointer is NULL";
    case UCM_ERR_OUT_OF_RANGE: return "UCM_ERR_OUT_OF_RANGE: a shard index is >= shards_per_block";
    case UCM_ERR_EMPTY: return "UCM_ERR_EMPTY: a task of 0 entries";
    case UCM_ERR_TOO_LARGE: return "UCM_ERR_TOO_LARGE: more than max_task_entries items in one call";
    case UCM_ERR_UNKNOWN_TASK: return "UCM_ERR_UNKNOWN_TASK: not a task of this cache, or already waited for";
  }
  return "UCM_ERR_UNKNOWN: unknown result code";
}

UCM_API const char* ucm_version_string(void) { return UCM_VERSION_STRING; }

}  // extern "C"
