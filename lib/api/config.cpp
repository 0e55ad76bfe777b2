#include "api/config.h"

#include <sys/types.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backend/spec.h"
#include "common/hash.h"
#include "common/log.h"

namespace ucm {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// "4096", "64K", "2M", "1G" (powers of 1024). Digits first: strtoull would
// skip blanks and wrap a minus sign around (" -1" is 2^64-1).
bool parse_size(const char* s, uint64_t* out) {
  errno = 0;
  char* end = nullptr;
  if (!is_digit(*s)) return false;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno || end == s) return false;
  uint64_t mul = 1;
  if (*end == 'K' || *end == 'k') mul = 1ull << 10, ++end;
  else if (*end == 'M' || *end == 'm') mul = 1ull << 20, ++end;
  else if (*end == 'G' || *end == 'g') mul = 1ull << 30, ++end;
  else if (*end == 'T' || *end == 't') mul = 1ull << 40, ++end;
  if (*end == 'i' && end[1] == 'B') end += 2;
  else if (*end == 'B') ++end;
  if (*end != '\0' || (v != 0 && mul > UINT64_MAX / v)) return false;
  *out = v * mul;
  return true;
}

// An optional '-', then digits: no blanks, no '+'.
bool parse_int(const char* s, int64_t lo, int64_t hi, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  if (!is_digit(*s == '-' ? s[1] : *s)) return false;
  long long v = std::strtoll(s, &end, 10);
  if (errno || end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

constexpr int64_t kGiB = int64_t{1} << 30;

constexpr const char* kOrderNames[] = {"rotate", "natural", nullptr};
constexpr const char* kEvictNames[] = {"clock", "ring", nullptr};
constexpr const char* kWaitNames[] = {"futex", "poll", nullptr};
constexpr const char* kHugeNames[] = {"auto", "on", "off", nullptr};
constexpr const char* kCopyEngineNames[] = {"auto", "cuda", "host", "async-test", nullptr};
constexpr const char* kFanoutNames[] = {"off", "nccl", "mpi", nullptr};

#define UCM_FIELD(f) static_cast<uint32_t>(offsetof(ucm_config_t, f)), static_cast<uint32_t>(sizeof(ucm_config_t::f))
using T = TunableType;

// The one table. Bounds: what the library can hold (a slot count below 2^31,
// a block addressable by off_t, one registration below 512 GiB) is checked
// across fields in check_config; the rows bound each field alone.
constexpr Tunable kTable[] = {
    {"shard_bytes", "UCM_SHARD_BYTES", T::kSize, UCM_FIELD(shard_bytes), int64_t{kMiB}, 1, int64_t{1} << 32, nullptr,
     true, "bytes per shard and per cache slot (at most 4 GiB)"},
    {"cache_bytes", "UCM_CACHE_BYTES", T::kSize, UCM_FIELD(cache_bytes), kGiB, 1, int64_t{1} << 50, nullptr, true,
     "the node's regular pool of slots"},
    {"shards_per_block", "UCM_SHARDS_PER_BLOCK", T::kUint, UCM_FIELD(shards_per_block), 64, 1, kEmptyShard - 1,
     nullptr, true, "shard indexes of a block are below this"},
    {"reserved_slots", "UCM_RESERVED_SLOTS", T::kUint, UCM_FIELD(reserved_slots), 64, 0, 1 << 24, nullptr, true,
     "slots only preallocation may use"},
    {"max_task_entries", "UCM_MAX_TASK_ENTRIES", T::kUint, UCM_FIELD(max_task_entries), 4096, 1, 1 << 24, nullptr,
     true, "entries, blocks or keys in one call at most"},
    {"device_id", "UCM_DEVICE_ID", T::kDevice, UCM_FIELD(device_id), UCM_DEVICE_AUTO, INT32_MIN, 1 << 20, nullptr,
     false, "a GPU ordinal, auto (local rank modulo visible GPUs), or < 0: a scheduler rank"},
    {"ranks_per_node", "UCM_RANKS_PER_NODE", T::kUint, UCM_FIELD(ranks_per_node), 0, 0, kMaxRanks, nullptr, true,
     "split a machine into pretend nodes of this many ranks (0: the real node)"},
    {"order", "UCM_ORDER", T::kEnum, UCM_FIELD(order), UCM_ORDER_ROTATE, 0, 1, kOrderNames, true,
     "the order each rank walks a task's shards"},
    {"evict", "UCM_EVICT", T::kEnum, UCM_FIELD(evict), UCM_EVICT_CLOCK, 0, 1, kEvictNames, true,
     "the eviction policy"},
    {"wait", "UCM_WAIT", T::kEnum, UCM_FIELD(wait), UCM_WAIT_FUTEX, 0, 1, kWaitNames, true,
     "how a rank waits for a peer's shard"},
    {"prealloc", "UCM_PREALLOC", T::kInt, UCM_FIELD(prealloc), 1, 0, 1, nullptr, true,
     "1: owners claim slots ahead of their loads"},
    {"hugepages", "UCM_HUGEPAGES", T::kEnum, UCM_FIELD(hugepages), UCM_HUGEPAGES_AUTO, 0, 2, kHugeNames, true,
     "2 MiB pages for the data plane"},
    {"bind_threads", "UCM_BIND", T::kInt, UCM_FIELD(bind_threads), 1, 0, 1, nullptr, false,
     "1: pin queue threads near the GPU"},
    {"timeout_ms", "UCM_TIMEOUT_MS", T::kUint, UCM_FIELD(timeout_ms), 30000, 1, 86400000, nullptr, false,
     "bound on init and on any wait for a peer"},
    {"liveness_ms", "UCM_LIVENESS_MS", T::kUint, UCM_FIELD(liveness_ms), 50, 1, 60000, nullptr, true,
     "how often a waiter checks that its peer lives"},
    {"load_retries", "UCM_LOAD_RETRIES", T::kUint, UCM_FIELD(load_retries), 2, 0, 100, nullptr, false,
     "owner retries of a failed backend load"},
    {"io_depth", "UCM_IO_DEPTH", T::kUint, UCM_FIELD(io_depth), 16, 1, 1 << 16, nullptr, false,
     "backend loads in flight per rank"},
    {"owner_grace_us", "UCM_OWNER_GRACE_US", T::kUint, UCM_FIELD(owner_grace_us), 1000, 0, 10000000, nullptr, false,
     "how long a peer's share of a task waits for that peer before this rank loads it"},
    {"segment_bytes", "UCM_SEGMENT_BYTES", T::kSize, UCM_FIELD(segment_bytes), kGiB, 1, int64_t{256} << 30, nullptr,
     true, "data-plane segment size bound (one registration of 512 GiB or more fails on recent CUDA drivers)"},
    {"backend", "UCM_BACKEND", T::kString, UCM_FIELD(backend), 0, 0, sizeof(ucm_config_t::backend) - 1, nullptr,
     true, "the store: posix:/dir[,depth=8] or sim:latency_us=... (no default)"},
    {"copy_engine", "UCM_COPY_ENGINE", T::kEnum, UCM_FIELD(copy_engine), UCM_COPY_ENGINE_AUTO, 0, 3,
     kCopyEngineNames, false, "what copies slots to the app's buffers (async-test: tests only)"},
    {"allow_overcommit", "UCM_OVERCOMMIT", T::kInt, UCM_FIELD(allow_overcommit), 0, 0, 1, nullptr, false,
     "1: map the data plane lazily, unchecked against the node's memory"},
    {"protect", "UCM_PROTECT", T::kInt, UCM_FIELD(protect), 1, 0, 1, nullptr, true,
     "1: a loaded shard, or one a later task asks for again, stays until every local rank has taken it (or the grace passes)"},
    {"protect_grace_ms", "UCM_PROTECT_GRACE_MS", T::kUint, UCM_FIELD(protect_grace_ms), 1000, 1, 600000, nullptr,
     true, "bound on that protection: a rank that never asks for a shard holds it no longer, and an idle rank that let one lapse holds nothing until it asks again"},
    {"fanout", "UCM_FANOUT", T::kEnum, UCM_FIELD(fanout), UCM_FANOUT_OFF, 0, 2, kFanoutNames, true,
     "read each shard from host memory once per node and broadcast it (loads are then collective in time)"},
    {"max_unfinished_tasks", "UCM_MAX_UNFINISHED_TASKS", T::kUint, UCM_FIELD(max_unfinished_tasks), 65536, 1,
     1 << 24, nullptr, false,
     "a rank's tasks submitted and not yet finished by a wait or test, at most (then a submit is UCM_ERR_BUSY)"},
};
#undef UCM_FIELD

constexpr size_t kTableSize = sizeof(kTable) / sizeof(kTable[0]);

constexpr int layout_rows() {
  int n = 0;
  for (const Tunable& t : kTable) n += t.layout ? 1 : 0;
  return n;
}
static_assert(layout_rows() == AgreementRecord::kFields, "AgreementRecord::kFields must count the table's layout rows");
// Every field but struct_bytes and version is a row (their sizes add up).
constexpr size_t row_bytes() {
  size_t n = 0;
  for (const Tunable& t : kTable) n += t.bytes;
  return n;
}
// (Rounded up to the struct's 8-byte alignment: its tail may be padding.)
static_assert((row_bytes() + 2 * sizeof(uint32_t) + 7) / 8 * 8 == sizeof(ucm_config_t),
              "a ucm_config_t field has no tunable row");

void* field(ucm_config_t* c, const Tunable& t) { return reinterpret_cast<char*>(c) + t.offset; }
const void* field(const ucm_config_t& c, const Tunable& t) { return reinterpret_cast<const char*>(&c) + t.offset; }

void set_value(ucm_config_t* c, const Tunable& t, int64_t v) {
  switch (t.type) {
    case T::kUint: {
      const uint32_t x = static_cast<uint32_t>(v);
      std::memcpy(field(c, t), &x, sizeof(x));
      break;
    }
    case T::kInt:
    case T::kEnum:
    case T::kDevice: {
      const int32_t x = static_cast<int32_t>(v);
      std::memcpy(field(c, t), &x, sizeof(x));
      break;
    }
    case T::kSize: {
      const uint64_t x = static_cast<uint64_t>(v);
      std::memcpy(field(c, t), &x, sizeof(x));
      break;
    }
    case T::kString:
      std::memset(field(c, t), 0, t.bytes);
      break;
  }
}

// The bounds as text, for messages: "1..65536", "rotate|natural".
std::string bounds_text(const Tunable& t) {
  if (t.type == T::kEnum) {
    std::string s;
    for (int i = 0; t.names[i]; ++i) s.append(i ? "|" : "").append(t.names[i]);
    return s;
  }
  std::string s = std::to_string(t.lo) + ".." + std::to_string(t.hi);
  return t.type == T::kDevice ? "auto or " + s : s;
}

// One variable into its field; an error names the variable and its value.
Result env_one(const Tunable& t, ucm_config_t* c) {
  const char* v = std::getenv(t.env);
  if (!v) return Result::kOk;
  switch (t.type) {
    case T::kSize: {
      uint64_t x = 0;
      if (!parse_size(v, &x) || x < static_cast<uint64_t>(t.lo) || x > static_cast<uint64_t>(t.hi))
        return fail(Result::kInvalidArg, "%s=%s is not a size in %s (bytes, or with K/M/G/T)", t.env, v,
                    bounds_text(t).c_str());
      set_value(c, t, static_cast<int64_t>(x));
      return Result::kOk;
    }
    case T::kUint:
    case T::kInt:
    case T::kDevice: {
      if (t.type == T::kDevice && !std::strcmp(v, "auto")) return set_value(c, t, UCM_DEVICE_AUTO), Result::kOk;
      int64_t x = 0;
      if (!parse_int(v, t.lo, t.hi, &x))
        return fail(Result::kInvalidArg, "%s=%s is not an integer in %s", t.env, v, bounds_text(t).c_str());
      set_value(c, t, x);
      return Result::kOk;
    }
    case T::kEnum:
      for (int i = 0; t.names[i]; ++i)
        if (!std::strcmp(v, t.names[i])) return set_value(c, t, i), Result::kOk;
      return fail(Result::kInvalidArg, "%s=%s is not one of %s", t.env, v, bounds_text(t).c_str());
    case T::kString:
      if (std::strlen(v) > static_cast<size_t>(t.hi))
        return fail(Result::kInvalidArg, "%s is %zu characters, at most %" PRId64 " fit", t.env, std::strlen(v), t.hi);
      std::memset(field(c, t), 0, t.bytes);
      std::memcpy(field(c, t), v, std::strlen(v));
      return Result::kOk;
  }
  return Result::kOk;
}

// The caller's header version against the library's: newer headers than the
// library cannot work (they may rely on fields or calls it lacks).
Result check_version(uint32_t version) {
  if (version == 0)
    return fail(Result::kInvalidArg, "config.version is 0: the config was not made by ucm_config_init()");
  if (version > UCM_VERSION_CODE)
    return fail(Result::kUnsupported,
                "the app was built with ucmcache %u.%u.%u headers (UCM_VERSION_CODE %u), newer than this library, "
                "ucmcache %s (%d): run it with a library at least as new as the headers it was built with",
                version / 10000, version / 100 % 100, version % 100, version, UCM_VERSION_STRING, UCM_VERSION_CODE);
  return Result::kOk;
}

}  // namespace

Result check_struct_bytes(const char* what, const char* type, uint64_t bytes, size_t first, size_t current) {
  if (bytes < first)
    return fail(Result::kInvalidArg,
                "%s %" PRIu64 " is smaller than %zu, the first %s this library accepts (ucmcache %s, whose %s is %zu "
                "bytes): %s",
                what, bytes, first, type, UCM_VERSION_STRING, type, current,
                std::strcmp(type, "ucm_config_t") == 0 ? "initialize the config with ucm_config_init()"
                                                       : "set it to sizeof the struct");
  if (bytes > current)
    return fail(Result::kInvalidArg,
                "%s %" PRIu64 " is larger than %zu, the %s of this library (ucmcache %s): the app was built with a "
                "newer ucmcache header than the library it runs with",
                what, bytes, current, type, UCM_VERSION_STRING);
  return Result::kOk;
}

Result config_init(ucm_config_t* out, size_t struct_bytes, uint32_t version) {
  if (!out) return fail(Result::kNullPointer, "config is NULL");
  UCM_CHECK(check_version(version));
  UCM_CHECK(check_struct_bytes("sizeof(ucm_config_t) in the app", "ucm_config_t", struct_bytes, kConfigFirstBytes,
                               sizeof(ucm_config_t)));
  ucm_config_t defaults;
  config_defaults(&defaults);
  defaults.struct_bytes = static_cast<uint32_t>(struct_bytes);
  defaults.version = version;
  ucm_config_t with_env = defaults;
  const Result r = config_from_env(&with_env);
  // An older caller's struct ends early: only its own bytes are written.
  std::memcpy(out, ok(r) ? &with_env : &defaults, struct_bytes);
  return r;
}

Result config_read(const ucm_config_t* in, ucm_config_t* out) {
  config_defaults(out);
  if (!in) return fail(Result::kNullPointer, "config is NULL (use ucm_config_init)");
  UCM_CHECK(check_struct_bytes("config.struct_bytes", "ucm_config_t", in->struct_bytes, kConfigFirstBytes,
                               sizeof(ucm_config_t)));
  UCM_CHECK(check_version(in->version));
  ucm_config_t whole = *out;
  // The fields an older caller's struct lacks: defaults, then their UCM_*
  // variables, as ucm_config_init would have set them.
  if (in->struct_bytes < sizeof(ucm_config_t)) UCM_CHECK(config_from_env(&whole));
  std::memcpy(&whole, in, in->struct_bytes);
  whole.struct_bytes = sizeof(ucm_config_t);
  *out = whole;
  return Result::kOk;
}

const Tunable* tunables(size_t* count) {
  if (count) *count = kTableSize;
  return kTable;
}

int64_t tunable_value(const ucm_config_t& c, const Tunable& t) {
  switch (t.type) {
    case T::kUint: {
      uint32_t x;
      std::memcpy(&x, field(c, t), sizeof(x));
      return x;
    }
    case T::kInt:
    case T::kEnum:
    case T::kDevice: {
      int32_t x;
      std::memcpy(&x, field(c, t), sizeof(x));
      return x;
    }
    case T::kSize: {
      uint64_t x;
      std::memcpy(&x, field(c, t), sizeof(x));
      return x > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(x);
    }
    case T::kString:
      return static_cast<int64_t>(strnlen(static_cast<const char*>(field(c, t)), t.bytes));
  }
  return 0;
}

std::string tunable_bounds(const Tunable& t) {
  return t.type == T::kString ? "length " + bounds_text(t) : bounds_text(t);
}

const char* tunable_type_name(TunableType type) {
  switch (type) {
    case T::kUint: return "uint";
    case T::kInt: return "int";
    case T::kSize: return "size";
    case T::kEnum: return "enum";
    case T::kDevice: return "device";
    case T::kString: return "string";
  }
  return "?";
}

std::string tunable_text(const ucm_config_t& c, const Tunable& t) {
  const int64_t v = tunable_value(c, t);
  if (t.type == T::kString) return std::string(static_cast<const char*>(field(c, t)), static_cast<size_t>(v));
  if (t.type == T::kDevice && v == UCM_DEVICE_AUTO) return "auto";
  if (t.type == T::kEnum && v >= t.lo && v <= t.hi) return t.names[v];
  if (t.type == T::kSize) {
    uint64_t x;
    std::memcpy(&x, field(c, t), sizeof(x));
    return std::to_string(x);
  }
  return std::to_string(v);
}

Result check_fields(const ucm_config_t& c) {
  for (const Tunable& t : kTable) {
    if (t.type == T::kString) {
      if (memchr(field(c, t), '\0', t.bytes) == nullptr)
        return fail(Result::kInvalidArg, "%s is not NUL-terminated within %u bytes", t.name, t.bytes);
      continue;
    }
    const int64_t v = tunable_value(c, t);
    if (t.type == T::kSize) {
      uint64_t x;
      std::memcpy(&x, field(c, t), sizeof(x));
      if (x < static_cast<uint64_t>(t.lo) || x > static_cast<uint64_t>(t.hi))
        return fail(Result::kInvalidArg, "%s %" PRIu64 " is out of range %s", t.name, x, bounds_text(t).c_str());
      continue;
    }
    if (v < t.lo || v > t.hi) {
      if (t.type == T::kEnum) {
        std::string names;
        for (int i = 0; t.names[i]; ++i) names += (i ? ", " : "") + std::string(t.names[i]) + " (" + std::to_string(i) + ")";
        return fail(Result::kInvalidArg, "%s %" PRId64 " is not one of %s", t.name, v, names.c_str());
      }
      return fail(Result::kInvalidArg, "%s %" PRId64 " is out of range %s", t.name, v, bounds_text(t).c_str());
    }
  }
  return Result::kOk;
}

void config_defaults(ucm_config_t* c) {
  std::memset(c, 0, sizeof(*c));
  c->struct_bytes = sizeof(ucm_config_t);
  c->version = UCM_VERSION_CODE;
  for (const Tunable& t : kTable) set_value(c, t, t.def);
}

Result async_test_delay_from_env(uint64_t* us) {
  constexpr int64_t kMaxUs = 1000000;
  const char* v = std::getenv("UCM_ASYNC_TEST_DELAY_US");
  if (!v) return Result::kOk;
  int64_t parsed = 0;
  if (!parse_int(v, 0, kMaxUs, &parsed))
    return fail(Result::kInvalidArg, "UCM_ASYNC_TEST_DELAY_US=%s is not a delay in microseconds (0-%" PRId64 ")", v,
                kMaxUs);
  *us = static_cast<uint64_t>(parsed);
  return Result::kOk;
}

Result fanout_test_stall_from_env(int64_t* local_rank, uint64_t* turn) {
  const char* v = std::getenv("UCM_FANOUT_TEST_STALL");
  if (!v) return Result::kOk;
  const char* colon = std::strchr(v, ':');
  const std::string rank_text = colon ? std::string(v, static_cast<size_t>(colon - v)) : std::string(v);
  int64_t r = 0, t = 0;
  if (!colon || !parse_int(rank_text.c_str(), 0, kMaxRanks - 1, &r) || !parse_int(colon + 1, 0, INT64_MAX, &t))
    return fail(Result::kInvalidArg, "UCM_FANOUT_TEST_STALL=%s is not <local rank 0-%u>:<turn>", v, kMaxRanks - 1);
  *local_rank = r;
  *turn = static_cast<uint64_t>(t);
  return Result::kOk;
}

Result config_from_env(ucm_config_t* c) {
  UCM_CHECK(log_check_env());
  uint64_t delay_us = 0;
  UCM_CHECK(async_test_delay_from_env(&delay_us));
  int64_t stall_rank = -1;
  uint64_t stall_turn = 0;
  UCM_CHECK(fanout_test_stall_from_env(&stall_rank, &stall_turn));
  for (const Tunable& t : kTable) UCM_CHECK(env_one(t, c));
  return Result::kOk;
}

Result check_config(const ucm_config_t& c) {
  UCM_CHECK(check_fields(c));
  // Across fields.
  if (c.cache_bytes < c.shard_bytes)
    return fail(Result::kInvalidArg, "cache_bytes %" PRIu64 " is smaller than one shard (%" PRIu64 " bytes)",
                c.cache_bytes, c.shard_bytes);
  if (c.cache_bytes / c.shard_bytes + c.reserved_slots >= (1ull << 31))
    return fail(Result::kInvalidArg, "cache_bytes %" PRIu64 " / shard_bytes %" PRIu64 " gives too many slots",
                c.cache_bytes, c.shard_bytes);
  // A block's file holds shards_per_block shards at offsets s * shard_bytes:
  // the whole block must be addressable by off_t. (The product fits in 64
  // bits: both factors are below 2^32 here.)
  constexpr uint64_t kMaxOffset = static_cast<uint64_t>(std::numeric_limits<off_t>::max());
  if (c.shard_bytes > kMaxOffset / c.shards_per_block)
    return fail(Result::kInvalidArg,
                "shards_per_block %u x shard_bytes %" PRIu64 " = %" PRIu64
                " bytes per block exceeds the largest file offset (%" PRIu64 ")",
                c.shards_per_block, c.shard_bytes, uint64_t{c.shards_per_block} * c.shard_bytes, kMaxOffset);
  if (c.segment_bytes < c.shard_bytes)
    return fail(Result::kInvalidArg, "segment_bytes %" PRIu64 " is smaller than one shard (%" PRIu64 " bytes)",
                c.segment_bytes, c.shard_bytes);
  if (c.backend[0] == '\0')
    return fail(Result::kInvalidArg, "no backend configured: set config.backend or UCM_BACKEND to posix:/dir or sim:...");
  Spec spec;
  UCM_CHECK(parse_spec(c.backend, &spec));
  return Result::kOk;
}

Result layout_from_config(const ucm_config_t& c, uint32_t local_size, CtrlParams* ctrl, DataParams* data) {
  const uint64_t regular = c.cache_bytes / c.shard_bytes;
  if (regular < local_size)
    return fail(Result::kInvalidArg,
                "cache_bytes %" PRIu64 " holds %" PRIu64 " slots of %" PRIu64 " bytes, fewer than one per rank (%u ranks)",
                c.cache_bytes, regular, c.shard_bytes, local_size);
  CtrlParams p;
  p.slot_bytes = c.shard_bytes;
  p.regular_slots = static_cast<uint32_t>(regular);
  p.reserved_slots = c.reserved_slots;
  p.shards_per_block = c.shards_per_block;
  p.max_ranks = local_size;
  p.evict = c.evict == UCM_EVICT_RING ? EvictMode::kRing : EvictMode::kClock;
  p.tunables_hash = tunables_layout_hash(c);
  UCM_CHECK(validate_ctrl_params(p));
  DataParams d;
  d.slot_bytes = c.shard_bytes;
  d.total_slots = p.regular_slots + p.reserved_slots;
  d.segment_bytes = c.segment_bytes;
  d.allow_overcommit = c.allow_overcommit != 0;
  d.hugepages = c.hugepages == UCM_HUGEPAGES_ON ? HugePolicy::kOn
                : c.hugepages == UCM_HUGEPAGES_OFF ? HugePolicy::kOff
                                                   : HugePolicy::kAuto;
  *ctrl = p;
  *data = d;
  return Result::kOk;
}

std::string describe_config(const ucm_config_t& c) {
  std::string s;
  for (const Tunable& t : kTable) s.append(s.empty() ? "" : " ").append(t.name).append("=").append(tunable_text(c, t));
  return s;
}

AgreementRecord agreement_record(const ucm_config_t& c) {
  AgreementRecord r{};
  int i = 0;
  for (const Tunable& t : kTable) {
    if (!t.layout) continue;
    if (t.type == T::kString) {
      const char* s = static_cast<const char*>(field(c, t));
      r.values[i++] = fnv1a(s, strnlen(s, t.bytes));
    } else if (t.type == T::kSize) {
      std::memcpy(&r.values[i++], field(c, t), sizeof(uint64_t));
    } else {
      r.values[i++] = static_cast<uint64_t>(tunable_value(c, t));
    }
  }
  return r;
}

uint64_t tunables_layout_hash(const ucm_config_t& c) {
  const AgreementRecord r = agreement_record(c);
  uint64_t h = kFnvOffset;
  int i = 0;
  for (const Tunable& t : kTable) {
    if (!t.layout) continue;
    h = fnv1a(t.name, std::strlen(t.name), h);
    h = fnv1a_u64(h, static_cast<uint64_t>(t.type));
    h = fnv1a_u64(h, r.values[i++]);
  }
  return h;
}

const char* agreement_field_name(int i) {
  int k = 0;
  for (const Tunable& t : kTable) {
    if (!t.layout) continue;
    if (k++ == i) return t.name;
  }
  return "?";
}

Agreement agreement(const ucm_config_t& c) { return {agreement_record(c), agreement_field_name, c.backend, sizeof(c.backend)}; }

}  // namespace ucm
