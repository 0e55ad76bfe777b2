// Result codes and the error model shared by every layer.
//
// Internally every fallible function returns `Result` (mirrors the public
// ucm_result_t value for value). The human-readable detail of the most recent
// failure on this thread ("shard 17 >= shards_per_block 16 in entry 3") is kept
// in a thread-local buffer by `fail()`; the C API copies it into the per-cache
// last-error string. Exceptions never cross a layer boundary that returns Result.
#pragma once

#include <cstdint>
#include <string>

// The MPI-free half of the public header: the cache core (sync, ctrl, data,
// cache) never sees <mpi.h> (tests/api/core_no_mpi_test.py checks it).
#include "ucmcache/ucm_base.h"

namespace ucm {

enum class Result : int32_t {
  kOk = UCM_OK,
  kInvalidArg = UCM_ERR_INVALID_ARG,
  kNoMemory = UCM_ERR_NO_MEMORY,
  kNoSpace = UCM_ERR_NO_SPACE,
  kTimeout = UCM_ERR_TIMEOUT,
  kBackend = UCM_ERR_BACKEND,
  kNotFound = UCM_ERR_NOT_FOUND,
  kBadState = UCM_ERR_BAD_STATE,
  kCorrupt = UCM_ERR_CORRUPT,
  kAbiMismatch = UCM_ERR_ABI_MISMATCH,
  kConfigMismatch = UCM_ERR_CONFIG_MISMATCH,
  kSystem = UCM_ERR_SYSTEM,
  kPeerDead = UCM_ERR_PEER_DEAD,
  kUnsupported = UCM_ERR_UNSUPPORTED,
  kBusy = UCM_ERR_BUSY,
  kFinalized = UCM_ERR_FINALIZED,
  kBadHandle = UCM_ERR_BAD_HANDLE,
  kDuplicateKey = UCM_ERR_DUPLICATE_KEY,
  kDevice = UCM_ERR_DEVICE,
  kInternal = UCM_ERR_INTERNAL,
  kNullPointer = UCM_ERR_NULL_POINTER,
  kOutOfRange = UCM_ERR_OUT_OF_RANGE,
  kEmpty = UCM_ERR_EMPTY,
  kTooLarge = UCM_ERR_TOO_LARGE,
  kUnknownTask = UCM_ERR_UNKNOWN_TASK,
};

const char* result_name(Result r);

inline bool ok(Result r) { return r == Result::kOk; }

// Records a formatted detail for `r` on this thread and returns `r`, so a
// failure reads `return fail(Result::kInvalidArg, "slot_bytes %zu is zero", n);`.
[[nodiscard]] Result fail(Result r, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// The detail recorded by the last fail() on this thread ("" if none).
const std::string& last_error();
void clear_last_error();

}  // namespace ucm
