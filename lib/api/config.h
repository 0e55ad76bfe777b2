// Configuration: defaults, UCM_* variables, checks, the layout it implies, and
// the record ranks compare to agree on it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/result.h"
#include "ctrl/buffer_ctrl.h"
#include "data/buffer_data.h"
#include "ucmcache/ucm_base.h"

namespace ucm {

// Public structs that grow (see "Structs that grow" in ucm_base.h). The
// smallest struct_bytes a caller may pass is the first layout the library
// accepted: fields appended since (copy_engine, allow_overcommit; the info's
// registration and page notes; direct_fallbacks) take their defaults or are
// left unwritten when an older caller's struct ends before them.
inline constexpr size_t kConfigFirstBytes = offsetof(ucm_config_t, copy_engine);
inline constexpr size_t kCacheInfoFirstBytes = offsetof(ucm_cache_info_t, register_seconds);
inline constexpr size_t kStatsFirstBytes = offsetof(ucm_stats_t, direct_fallbacks);

// `bytes` (the caller's struct_bytes of `what`, a `type`) is within
// [first, current]; else kInvalidArg naming both numbers and what to do.
[[nodiscard]] Result check_struct_bytes(const char* what, const char* type, uint64_t bytes, size_t first,
                                        size_t current);

// ucm_config_init's work: defaults, then UCM_* variables, into the caller's
// first `struct_bytes` bytes; `version` is the caller's UCM_VERSION_CODE (a
// newer one than the library's is kUnsupported, naming both).
[[nodiscard]] Result config_init(ucm_config_t* out, size_t struct_bytes, uint32_t version);

// A caller's config (of in->struct_bytes bytes, made by ucm_config_init of
// in->version) as a whole one of this library: the fields it lacks take
// their defaults and UCM_* variables. *out is whole (defaults) even on failure.
[[nodiscard]] Result config_read(const ucm_config_t* in, ucm_config_t* out);

void config_defaults(ucm_config_t* c);
[[nodiscard]] Result config_from_env(ucm_config_t* c);
[[nodiscard]] Result check_config(const ucm_config_t& c);

// Layout of the shared planes for a node of `local_size` ranks.
[[nodiscard]] Result layout_from_config(const ucm_config_t& c, uint32_t local_size, CtrlParams* ctrl, DataParams* data);

// One line per field, for the effective configuration printed at init.
std::string describe_config(const ucm_config_t& c);

// The fields every rank of a node must agree on, as (name, value) rows in a
// fixed order; `backend` is compared by its hash and printed in full.
struct AgreementRecord {
  static constexpr int kFields = 14;
  uint64_t values[kFields];
};
AgreementRecord agreement_record(const ucm_config_t& c);
const char* agreement_field_name(int i);

}  // namespace ucm
