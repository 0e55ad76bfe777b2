// Configuration: one table of tunables, and from it the defaults, the UCM_*
// variables, the checks, the record ranks compare to agree on the layout,
// the printed configuration and ucm_info's list; plus the layout it implies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "boot/agreement.h"
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

// ---- the tunables --------------------------------------------------------
// Each field of ucm_config_t (but struct_bytes and version) is one row here,
// and only here: name, variable, type, default, bounds, whether every rank of
// a node must agree on it (it shapes the shared layout), one line of help.
// Bounds are inclusive and the same for a UCM_* variable and for the struct.
enum class TunableType : uint8_t {
  kUint,    // uint32_t, decimal
  kInt,     // int32_t, decimal with an optional '-' (0|1 switches too)
  kSize,    // uint64_t, bytes with an optional K/M/G/T suffix
  kEnum,    // int32_t enum, by name (names[value])
  kDevice,  // int32_t device ordinal, or "auto" (UCM_DEVICE_AUTO)
  kString,  // char[], NUL-terminated within the field
};

struct Tunable {
  const char* name;          // the field of ucm_config_t
  const char* env;           // its UCM_* variable
  TunableType type;
  uint32_t offset;           // offsetof(ucm_config_t, field)
  uint32_t bytes;            // sizeof the field
  int64_t def;               // default (kString: empty)
  int64_t lo, hi;            // inclusive bounds (kEnum: 0..count-1; kString: length 0..bytes-1)
  const char* const* names;  // kEnum: the value names, by value
  bool layout;               // every rank of a node must agree on it
  const char* help;          // one line
};

// The table, in the order of ucm_config_t.
const Tunable* tunables(size_t* count);

// The field's value as a number (kString: its length).
int64_t tunable_value(const ucm_config_t& c, const Tunable& t);
// "64", "1048576", "rotate", "auto", "posix:/x".
std::string tunable_text(const ucm_config_t& c, const Tunable& t);
// The values the row takes: "1..65536", "rotate|natural", "auto or -2147483648..1048576",
// "length 0..511".
std::string tunable_bounds(const Tunable& t);
// "uint", "int", "size", "enum", "device", "string".
const char* tunable_type_name(TunableType type);

// The per-field bounds of the table only (check_config adds the checks that
// relate fields); the message names the field and its value.
[[nodiscard]] Result check_fields(const ucm_config_t& c);

void config_defaults(ucm_config_t* c);
[[nodiscard]] Result config_from_env(ucm_config_t* c);
[[nodiscard]] Result check_config(const ucm_config_t& c);
// UCM_ASYNC_TEST_DELAY_US, the async test engine's delay (tests only, not a
// field of ucm_config_t): unset leaves *us as it is; a value that is not
// 0-1000000 digits is kInvalidArg naming it. config_from_env checks it too.
[[nodiscard]] Result async_test_delay_from_env(uint64_t* us);
// UCM_FANOUT_TEST_STALL=<local rank>:<turn> (tests only, fanout.h): unset
// leaves both as they are; anything else is kInvalidArg naming it.
[[nodiscard]] Result fanout_test_stall_from_env(int64_t* local_rank, uint64_t* turn);

// Layout of the shared planes for a node of `local_size` ranks.
[[nodiscard]] Result layout_from_config(const ucm_config_t& c, uint32_t local_size, CtrlParams* ctrl, DataParams* data);

// One line per field, for the effective configuration printed at init.
std::string describe_config(const ucm_config_t& c);

// The fields every rank of a node must agree on (the table's layout rows),
// as (name, value) rows in table order; `backend` is compared by its hash.
AgreementRecord agreement_record(const ucm_config_t& c);
const char* agreement_field_name(int i);
// What boot's agree_on_config compares: c's record, the names, c's backend.
Agreement agreement(const ucm_config_t& c);

// A hash of every layout row of the table: its name, type and value (the
// agreement record's). layout_from_config puts it into CtrlParams, so the
// control header's fingerprint covers every layout tunable, including one
// added to the table later: no list of fields to keep in step.
uint64_t tunables_layout_hash(const ucm_config_t& c);

}  // namespace ucm
