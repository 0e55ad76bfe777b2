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

Result env_size(const char* name, uint64_t* field) {
  const char* v = std::getenv(name);
  if (!v) return Result::kOk;
  if (!parse_size(v, field)) return fail(Result::kInvalidArg, "%s=%s is not a size (bytes, or with K/M/G)", name, v);
  return Result::kOk;
}

template <typename T>
Result env_int(const char* name, int64_t lo, int64_t hi, T* field) {
  const char* v = std::getenv(name);
  if (!v) return Result::kOk;
  int64_t x = 0;
  if (!parse_int(v, lo, hi, &x))
    return fail(Result::kInvalidArg, "%s=%s is not an integer in %" PRId64 "..%" PRId64, name, v, lo, hi);
  *field = static_cast<T>(x);
  return Result::kOk;
}

template <typename T>
Result env_enum(const char* name, const char* a, const char* b, const char* c, T* field) {
  const char* v = std::getenv(name);
  if (!v) return Result::kOk;
  if (!std::strcmp(v, a)) *field = static_cast<T>(0);
  else if (!std::strcmp(v, b)) *field = static_cast<T>(1);
  else if (c && !std::strcmp(v, c)) *field = static_cast<T>(2);
  else return fail(Result::kInvalidArg, "%s=%s is not one of %s|%s%s%s", name, v, a, b, c ? "|" : "", c ? c : "");
  return Result::kOk;
}

constexpr const char* kCopyEngineNames[] = {"auto", "cuda", "host", "async-test"};

Result env_copy_engine(ucm_copy_engine_t* field) {
  const char* v = std::getenv("UCM_COPY_ENGINE");
  if (!v) return Result::kOk;
  for (int i = 0; i < 4; ++i)
    if (!std::strcmp(v, kCopyEngineNames[i])) return *field = static_cast<ucm_copy_engine_t>(i), Result::kOk;
  return fail(Result::kInvalidArg, "UCM_COPY_ENGINE=%s is not one of auto|cuda|host|async-test", v);
}

const char* order_name(ucm_order_t o) { return o == UCM_ORDER_NATURAL ? "natural" : "rotate"; }
const char* evict_name(ucm_evict_t e) { return e == UCM_EVICT_RING ? "ring" : "clock"; }
const char* wait_name(ucm_wait_t w) { return w == UCM_WAIT_POLL ? "poll" : "futex"; }
const char* huge_name(ucm_hugepages_t h) {
  return h == UCM_HUGEPAGES_ON ? "on" : h == UCM_HUGEPAGES_OFF ? "off" : "auto";
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

void config_defaults(ucm_config_t* c) {
  std::memset(c, 0, sizeof(*c));
  c->struct_bytes = sizeof(ucm_config_t);
  c->version = UCM_VERSION_CODE;
  c->shards_per_block = 64;
  c->shard_bytes = kMiB;
  c->cache_bytes = 1024 * kMiB;
  c->reserved_slots = 64;
  c->max_task_entries = 4096;
  c->device_id = UCM_DEVICE_AUTO;
  c->ranks_per_node = 0;
  c->order = UCM_ORDER_ROTATE;
  c->evict = UCM_EVICT_CLOCK;
  c->wait = UCM_WAIT_FUTEX;
  c->prealloc = 1;
  c->hugepages = UCM_HUGEPAGES_AUTO;
  c->bind_threads = 1;
  c->timeout_ms = 30000;
  c->liveness_ms = 50;
  c->load_retries = 2;
  c->io_depth = 16;
  c->owner_grace_us = 1000;
  c->segment_bytes = 1024 * kMiB;
  c->copy_engine = UCM_COPY_ENGINE_AUTO;
  c->allow_overcommit = 0;
}

Result config_from_env(ucm_config_t* c) {
  UCM_CHECK(env_int("UCM_SHARDS_PER_BLOCK", 1, 0xfffffffe, &c->shards_per_block));
  UCM_CHECK(env_size("UCM_SHARD_BYTES", &c->shard_bytes));
  UCM_CHECK(env_size("UCM_CACHE_BYTES", &c->cache_bytes));
  UCM_CHECK(env_int("UCM_RESERVED_SLOTS", 0, 1 << 24, &c->reserved_slots));
  UCM_CHECK(env_int("UCM_MAX_TASK_ENTRIES", 1, 1 << 24, &c->max_task_entries));
  if (const char* v = std::getenv("UCM_DEVICE_ID"); v && !std::strcmp(v, "auto")) c->device_id = UCM_DEVICE_AUTO;
  else UCM_CHECK(env_int("UCM_DEVICE_ID", -1, 1 << 20, &c->device_id));
  UCM_CHECK(env_int("UCM_RANKS_PER_NODE", 0, kMaxRanks, &c->ranks_per_node));
  UCM_CHECK(env_enum("UCM_ORDER", "rotate", "natural", nullptr, &c->order));
  UCM_CHECK(env_enum("UCM_EVICT", "clock", "ring", nullptr, &c->evict));
  UCM_CHECK(env_enum("UCM_WAIT", "futex", "poll", nullptr, &c->wait));
  UCM_CHECK(env_int("UCM_PREALLOC", 0, 1, &c->prealloc));
  UCM_CHECK(env_enum("UCM_HUGEPAGES", "auto", "on", "off", &c->hugepages));
  UCM_CHECK(env_int("UCM_BIND", 0, 1, &c->bind_threads));
  UCM_CHECK(env_int("UCM_TIMEOUT_MS", 1, 86400000, &c->timeout_ms));
  UCM_CHECK(env_int("UCM_LIVENESS_MS", 1, 60000, &c->liveness_ms));
  UCM_CHECK(env_int("UCM_LOAD_RETRIES", 0, 100, &c->load_retries));
  UCM_CHECK(env_int("UCM_IO_DEPTH", 1, 1 << 16, &c->io_depth));
  UCM_CHECK(env_int("UCM_OWNER_GRACE_US", 0, 10000000, &c->owner_grace_us));
  UCM_CHECK(env_size("UCM_SEGMENT_BYTES", &c->segment_bytes));
  UCM_CHECK(env_copy_engine(&c->copy_engine));
  UCM_CHECK(env_int("UCM_OVERCOMMIT", 0, 1, &c->allow_overcommit));
  if (const char* v = std::getenv("UCM_BACKEND")) {
    if (std::strlen(v) >= sizeof(c->backend))
      return fail(Result::kInvalidArg, "UCM_BACKEND is %zu characters, at most %zu fit", std::strlen(v),
                  sizeof(c->backend) - 1);
    std::snprintf(c->backend, sizeof(c->backend), "%s", v);
  }
  return Result::kOk;
}

Result check_config(const ucm_config_t& c) {
  if (c.shards_per_block == 0 || c.shards_per_block >= kEmptyShard)
    return fail(Result::kInvalidArg, "shards_per_block %u is out of range 1..%u", c.shards_per_block, kEmptyShard - 1);
  if (c.shard_bytes == 0) return fail(Result::kInvalidArg, "shard_bytes is 0");
  if (c.shard_bytes > (1ull << 32))
    return fail(Result::kInvalidArg, "shard_bytes %" PRIu64 " exceeds 4 GiB", c.shard_bytes);
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
  if (c.max_task_entries == 0) return fail(Result::kInvalidArg, "max_task_entries is 0");
  if (c.ranks_per_node > kMaxRanks)
    return fail(Result::kInvalidArg, "ranks_per_node %u exceeds %u ranks per node", c.ranks_per_node, kMaxRanks);
  if (c.order != UCM_ORDER_ROTATE && c.order != UCM_ORDER_NATURAL)
    return fail(Result::kInvalidArg, "order %d is neither rotate (0) nor natural (1)", static_cast<int>(c.order));
  if (c.evict != UCM_EVICT_CLOCK && c.evict != UCM_EVICT_RING)
    return fail(Result::kInvalidArg, "evict %d is neither clock (0) nor ring (1)", static_cast<int>(c.evict));
  if (c.wait != UCM_WAIT_FUTEX && c.wait != UCM_WAIT_POLL)
    return fail(Result::kInvalidArg, "wait %d is neither futex (0) nor poll (1)", static_cast<int>(c.wait));
  if (c.prealloc != 0 && c.prealloc != 1) return fail(Result::kInvalidArg, "prealloc %d is neither 0 nor 1", c.prealloc);
  if (c.allow_overcommit != 0 && c.allow_overcommit != 1)
    return fail(Result::kInvalidArg, "allow_overcommit %d is neither 0 nor 1", c.allow_overcommit);
  if (c.hugepages != UCM_HUGEPAGES_AUTO && c.hugepages != UCM_HUGEPAGES_ON && c.hugepages != UCM_HUGEPAGES_OFF)
    return fail(Result::kInvalidArg, "hugepages %d is not auto (0), on (1) or off (2)", static_cast<int>(c.hugepages));
  if (c.timeout_ms == 0) return fail(Result::kInvalidArg, "timeout_ms is 0");
  if (c.liveness_ms == 0) return fail(Result::kInvalidArg, "liveness_ms is 0");
  if (c.io_depth == 0) return fail(Result::kInvalidArg, "io_depth is 0");
  if (c.segment_bytes < c.shard_bytes)
    return fail(Result::kInvalidArg, "segment_bytes %" PRIu64 " is smaller than one shard (%" PRIu64 " bytes)",
                c.segment_bytes, c.shard_bytes);
  // One cudaHostRegister of 512 GiB or more fails on recent drivers.
  if (c.segment_bytes > (256ull << 30))
    return fail(Result::kInvalidArg, "segment_bytes %" PRIu64 " exceeds 256 GiB (one registration of 512 GiB or "
                "more fails on recent CUDA drivers)", c.segment_bytes);
  if (static_cast<uint32_t>(c.copy_engine) > UCM_COPY_ENGINE_ASYNC_TEST)
    return fail(Result::kInvalidArg, "copy_engine %d is not auto (0), cuda (1), host (2) or async-test (3)",
                static_cast<int>(c.copy_engine));
  if (memchr(c.backend, '\0', sizeof(c.backend)) == nullptr)
    return fail(Result::kInvalidArg, "backend is not NUL-terminated within %zu bytes", sizeof(c.backend));
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
  char buf[1400];
  char dev[32];
  if (c.device_id == UCM_DEVICE_AUTO) std::snprintf(dev, sizeof(dev), "auto");
  else std::snprintf(dev, sizeof(dev), "%d", c.device_id);
  std::snprintf(buf, sizeof(buf),
                "shards_per_block=%u shard_bytes=%" PRIu64 " cache_bytes=%" PRIu64 " reserved_slots=%u "
                "max_task_entries=%u device_id=%s ranks_per_node=%u order=%s evict=%s wait=%s prealloc=%d "
                "hugepages=%s bind_threads=%d timeout_ms=%u liveness_ms=%u load_retries=%u io_depth=%u owner_grace_us=%u "
                "segment_bytes=%" PRIu64 " backend=%s",
                c.shards_per_block, c.shard_bytes, c.cache_bytes, c.reserved_slots, c.max_task_entries, dev,
                c.ranks_per_node, order_name(c.order), evict_name(c.evict), wait_name(c.wait), c.prealloc,
                huge_name(c.hugepages), c.bind_threads, c.timeout_ms, c.liveness_ms, c.load_retries, c.io_depth, c.owner_grace_us,
                c.segment_bytes, c.backend);
  return std::string(buf) + " copy_engine=" +
         kCopyEngineNames[c.copy_engine <= UCM_COPY_ENGINE_ASYNC_TEST ? c.copy_engine : 0] +
         " allow_overcommit=" + std::to_string(c.allow_overcommit);
}

namespace {
constexpr const char* kAgreementNames[AgreementRecord::kFields] = {
    "shards_per_block", "shard_bytes", "cache_bytes", "reserved_slots", "max_task_entries",
    "ranks_per_node",   "order",       "evict",       "wait",           "prealloc",
    "hugepages",        "liveness_ms", "segment_bytes", "backend"};
}

AgreementRecord agreement_record(const ucm_config_t& c) {
  AgreementRecord r;
  const uint64_t v[AgreementRecord::kFields] = {
      c.shards_per_block, c.shard_bytes, c.cache_bytes, c.reserved_slots, c.max_task_entries,
      c.ranks_per_node, static_cast<uint64_t>(c.order), static_cast<uint64_t>(c.evict),
      static_cast<uint64_t>(c.wait), static_cast<uint64_t>(c.prealloc), static_cast<uint64_t>(c.hugepages),
      c.liveness_ms, c.segment_bytes, fnv1a(c.backend, strnlen(c.backend, sizeof(c.backend)))};
  std::memcpy(r.values, v, sizeof(v));
  return r;
}

const char* agreement_field_name(int i) { return i >= 0 && i < AgreementRecord::kFields ? kAgreementNames[i] : "?"; }

}  // namespace ucm
