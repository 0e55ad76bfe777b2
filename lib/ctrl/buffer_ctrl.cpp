#include "ctrl/buffer_ctrl.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "common/hash.h"
#include "common/log.h"
#include "ctrl/pins.h"
#include "ctrl/space_bell.h"
#include "sync/process_identity.h"

namespace ucm {
namespace {

struct RegionLayout {
  uint64_t buckets_off;
  uint64_t slots_off;
  uint64_t pins_off;
  uint64_t pin_row_bytes;
  uint64_t accessed_off;
  uint64_t stored_off;
  uint64_t guard_off;
  uint64_t region_bytes;
};

constexpr uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) & ~(a - 1); }
constexpr uint64_t kHugetlbfsMagic = 0x958458f6;

// The guard array follows the stored words (its offset is not in the header:
// it is a function of what is, and the region size checks it).
uint64_t guard_offset(uint64_t stored_off, uint64_t total) { return align_up(stored_off + 4 * total, 64); }

RegionLayout compute_layout(const CtrlParams& p) {
  RegionLayout l{};
  uint64_t total = uint64_t{p.regular_slots} + p.reserved_slots;
  uint64_t off = kRanksOff + sizeof(RankRecord) * kMaxRanks;
  l.buckets_off = align_up(off, 64);
  off = l.buckets_off + sizeof(Bucket) * uint64_t{p.bucket_count};
  l.slots_off = align_up(off, 64);
  off = l.slots_off + sizeof(SlotMeta) * total;
  // One row of 32-bit pin counts per rank, each row on its own cache lines so
  // that two ranks pinning the same slot never write the same line.
  l.pin_row_bytes = align_up(4 * total, 64);
  l.pins_off = align_up(off, 64);
  off = l.pins_off + l.pin_row_bytes * p.max_ranks;
  l.accessed_off = align_up(off, 64);
  off = l.accessed_off + total;
  // Apart from the hit path's lines: only dumps and recovery touch it.
  l.stored_off = align_up(off, 64);
  off = l.stored_off + 4 * total;
  // Read by evictors after a claim, written once per rank per residency.
  l.guard_off = guard_offset(l.stored_off, total);
  off = l.guard_off + 8 * total;
  l.region_bytes = align_up(off, 4096);
  return l;
}

uint32_t next_pow2(uint64_t x) {
  uint64_t p = 1;
  while (p < x) p <<= 1;
  return static_cast<uint32_t>(p);
}

const char* evict_name(EvictMode m) { return m == EvictMode::kClock ? "clock" : m == EvictMode::kRing ? "ring" : "?"; }

#define UCM_PARAM(f) {#f, offsetof(CtrlParams, f), sizeof(CtrlParams::f)}
constexpr CtrlParamField kParamFields[] = {
    UCM_PARAM(slot_bytes),       UCM_PARAM(regular_slots), UCM_PARAM(reserved_slots), UCM_PARAM(bucket_count),
    UCM_PARAM(shards_per_block), UCM_PARAM(max_ranks),     UCM_PARAM(evict),          UCM_PARAM(tunables_hash),
};
#undef UCM_PARAM

// Every byte of CtrlParams is in exactly one field of the list, in order:
// a field added to the struct and not to the list fails here.
constexpr bool fields_tile_the_struct() {
  uint32_t next = 0;
  for (const CtrlParamField& f : kParamFields) {
    if (f.offset != next || (f.bytes != 4 && f.bytes != 8)) return false;
    next += f.bytes;
  }
  return next == sizeof(CtrlParams);
}
static_assert(fields_tile_the_struct(), "ctrl_param_fields() must list every field of CtrlParams, in order");

}  // namespace

uint64_t CtrlParamField::value(const CtrlParams& p) const {
  const auto* at = reinterpret_cast<const uint8_t*>(&p) + offset;
  if (bytes == 8) {
    uint64_t v;
    std::memcpy(&v, at, 8);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, at, 4);
  return v;
}

std::span<const CtrlParamField> ctrl_param_fields() { return kParamFields; }

std::string ctrl_params_diff(const CtrlParams& have, const CtrlParams& want, const char* have_name,
                             const char* want_name) {
  std::string out;
  for (const CtrlParamField& f : kParamFields) {
    const uint64_t h = f.value(have), w = f.value(want);
    if (h == w) continue;
    char clause[256];
    std::snprintf(clause, sizeof(clause), "%s: %s has %" PRIu64 ", %s expects %" PRIu64, f.name, have_name, h,
                  want_name, w);
    out += (out.empty() ? "" : "; ") + std::string(clause);
  }
  return out;
}

Result validate_ctrl_params(const CtrlParams& p) {
  if (p.slot_bytes == 0) return fail(Result::kInvalidArg, "slot_bytes is 0: a slot must hold at least one byte");
  if (p.regular_slots == 0) return fail(Result::kInvalidArg, "regular_slots is 0: the cache needs at least one slot");
  uint64_t total = uint64_t{p.regular_slots} + p.reserved_slots;
  if (total >= (1ull << 31))
    return fail(Result::kInvalidArg, "regular_slots + reserved_slots = %" PRIu64 " exceeds 2^31 - 1", total);
  if (p.bucket_count != 0 && ((p.bucket_count & (p.bucket_count - 1)) != 0 || p.bucket_count > (1u << 31)))
    return fail(Result::kInvalidArg, "bucket_count %u is not a power of two (or 0 for automatic)", p.bucket_count);
  if (p.shards_per_block == 0 || p.shards_per_block >= kEmptyShard)
    return fail(Result::kInvalidArg, "shards_per_block %u is out of range 1..%u", p.shards_per_block, kEmptyShard - 1);
  if (p.max_ranks == 0 || p.max_ranks > kMaxRanks)
    return fail(Result::kInvalidArg, "max_ranks %u is out of range 1..%u", p.max_ranks, kMaxRanks);
  if (p.evict != EvictMode::kClock && p.evict != EvictMode::kRing)
    return fail(Result::kInvalidArg, "evict mode %u is neither clock (0) nor ring (1)", static_cast<uint32_t>(p.evict));
  return Result::kOk;
}

CtrlParams resolve_ctrl_params(const CtrlParams& p) {
  CtrlParams r = p;
  if (r.bucket_count == 0) r.bucket_count = next_pow2(uint64_t{p.regular_slots} + p.reserved_slots);
  return r;
}

uint64_t ctrl_fingerprint(const CtrlParams& p) {
  uint64_t h = kFnvOffset;
  h = fnv1a_u64(h, kCtrlAbi);
  h = fnv1a_u64(h, sizeof(CtrlHeader));
  h = fnv1a_u64(h, sizeof(SlotMeta));
  h = fnv1a_u64(h, sizeof(RankRecord));
  for (const CtrlParamField& f : kParamFields) h = fnv1a_u64(h, f.value(p));
  return h;
}

std::atomic<uint64_t> g_ctrl_epoch{1};

namespace {
// A forked child inherits the parent's mappings and its per-thread state:
// without a new epoch, parent and child would sweep the same hand run.
const int g_fork_epoch = pthread_atfork(nullptr, nullptr, [] { g_ctrl_epoch.fetch_add(1, std::memory_order_relaxed); });
}  // namespace

BufferCtrl::~BufferCtrl() { reset(); }

BufferCtrl::BufferCtrl(BufferCtrl&& o) noexcept { *this = std::move(o); }

BufferCtrl& BufferCtrl::operator=(BufferCtrl&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.fd_;
    base_ = o.base_;
    bytes_ = o.bytes_;
    buckets_ = o.buckets_;
    slots_ = o.slots_;
    pins_ = o.pins_;
    pin_row_bytes_ = o.pin_row_bytes_;
    accessed_ = o.accessed_;
    stored_ = o.stored_;
    guard_ = o.guard_;
    regular_ = o.regular_;
    total_ = o.total_;
    bucket_mask_ = o.bucket_mask_;
    shards_per_block_ = o.shards_per_block_;
    max_ranks_ = o.max_ranks_;
    slot_bytes_ = o.slot_bytes_;
    evict_ = o.evict_;
    hugetlb_ = o.hugetlb_;
    pages_note_ = std::move(o.pages_note_);
    o.fd_ = -1;
    o.base_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void BufferCtrl::reset() {
  if (base_) {
    munmap(base_, bytes_);
    g_ctrl_epoch.fetch_add(1, std::memory_order_relaxed);
  }
  if (fd_ >= 0) close(fd_);
  base_ = nullptr;
  fd_ = -1;
  bytes_ = 0;
}

CtrlParams BufferCtrl::params() const { return header().params; }

void BufferCtrl::cache_fields() {
  const CtrlHeader& h = header();
  buckets_ = reinterpret_cast<Bucket*>(base_ + h.buckets_off);
  slots_ = reinterpret_cast<SlotMeta*>(base_ + h.slots_off);
  pins_ = base_ + h.pins_off;
  pin_row_bytes_ = h.pin_row_bytes;
  accessed_ = reinterpret_cast<std::atomic<uint8_t>*>(base_ + h.accessed_off);
  stored_ = reinterpret_cast<std::atomic<uint32_t>*>(base_ + h.stored_off);
  const CtrlParams& p = h.params;
  guard_ = reinterpret_cast<std::atomic<uint64_t>*>(
      base_ + guard_offset(h.stored_off, uint64_t{p.regular_slots} + p.reserved_slots));
  regular_ = p.regular_slots;
  total_ = p.regular_slots + p.reserved_slots;
  bucket_mask_ = p.bucket_count - 1;
  shards_per_block_ = p.shards_per_block;
  max_ranks_ = p.max_ranks;
  slot_bytes_ = p.slot_bytes;
  evict_ = p.evict;
}

namespace {

constexpr uint64_t kCtrlHugeBytes = 2ull << 20;

// A sealed, mapped and populated hugetlb memfd of `bytes` (rounded up to
// 2 MiB), or false with *why. memfd_create and ftruncate succeed with no
// hugepages reserved; the mapping (which reserves them) and the populate
// (which takes them, and meets a hugetlb cgroup limit) are the tests.
bool make_huge_region(uint64_t bytes, int* fd_out, void** base_out, uint64_t* mapped, std::string* why) {
  const uint64_t rounded = align_up(bytes, kCtrlHugeBytes);
  const int fd = memfd_create("ucmcache-ctrl-huge", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_HUGETLB | MFD_HUGE_2MB);
  if (fd < 0) {
    *why = std::string("memfd_create(MFD_HUGETLB): ") + strerror(errno);
    return false;
  }
  auto give_up = [&](const char* what) {
    *why = std::string(what) + ": " + strerror(errno);
    close(fd);
    return false;
  };
  if (ftruncate(fd, static_cast<off_t>(rounded)) != 0) return give_up("ftruncate(hugetlb)");
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) return give_up("F_ADD_SEALS(hugetlb)");
  void* m = mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return give_up("mmap(hugetlb)");
#ifdef MADV_POPULATE_WRITE
  int e;
  do e = madvise(m, rounded, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
  while (e == EINTR);
  if (e != 0 && e != EINVAL) {
    munmap(m, rounded);
    errno = e;
    return give_up("populating hugetlb pages");
  }
#endif
  *fd_out = fd;
  *base_out = m;
  *mapped = rounded;
  return true;
}

std::string shmem_thp_mode() {
  FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
  if (!f) return "unknown";
  char buf[128] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // The chosen one is in brackets: "always within_size advise [never] deny force".
  const char* a = std::strchr(buf, '[');
  const char* b = a ? std::strchr(a, ']') : nullptr;
  return a && b ? std::string(a + 1, b) : "unknown";
}

std::string ordinary_note(bool asked) {
  if (!asked) return "4 KiB pages (hugepages=off)";
  const std::string mode = shmem_thp_mode();
  const bool honoured = mode == "always" || mode == "advise" || mode == "within_size" || mode == "force";
  return "4 KiB pages + MADV_HUGEPAGE (shmem THP \"" + mode + "\"" +
         (honoured ? ": the kernel may back it with 2 MiB pages)" : ": no effect)");
}

}  // namespace

Result BufferCtrl::map_new_region(uint64_t region_bytes, CtrlPages pages) {
  std::string huge_why;
  int hfd = -1;
  void* hbase = nullptr;
  uint64_t hbytes = 0;
  if (pages == CtrlPages::kAuto && make_huge_region(region_bytes, &hfd, &hbase, &hbytes, &huge_why)) {
    fd_ = hfd;
    base_ = static_cast<uint8_t*>(hbase);
    bytes_ = hbytes;
    hugetlb_ = true;
    pages_note_ = "2 MiB hugetlb pages";
    return Result::kOk;
  }
  int fd;
  UCM_SYSCHECK(fd = memfd_create("ucmcache-ctrl", MFD_CLOEXEC | MFD_ALLOW_SEALING), "memfd_create(ucmcache-ctrl)");
  fd_ = fd;
  UCM_SYSCHECK(ftruncate(fd, static_cast<off_t>(region_bytes)), "ftruncate(control region)");
  UCM_SYSCHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), "fcntl(F_ADD_SEALS, control)");
  void* m = mmap(nullptr, region_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED)
    return fail(Result::kSystem, "mmap(control region, %" PRIu64 " bytes): %s", region_bytes, strerror(errno));
  base_ = static_cast<uint8_t*>(m);
  bytes_ = region_bytes;
  if (pages == CtrlPages::kAuto) (void)madvise(m, region_bytes, MADV_HUGEPAGE);  // a hint
  pages_note_ = ordinary_note(pages == CtrlPages::kAuto);
  if (!huge_why.empty()) pages_note_ += "; no hugetlb: " + huge_why;
  return Result::kOk;
}

Result BufferCtrl::create(const CtrlParams& params, BufferCtrl* out, CtrlPages pages) {
  UCM_CHECK(validate_ctrl_params(params));
  const CtrlParams p = resolve_ctrl_params(params);
  const RegionLayout l = compute_layout(p);

  BufferCtrl c;
  UCM_CHECK(c.map_new_region(l.region_bytes, pages));
  g_ctrl_epoch.fetch_add(1, std::memory_order_relaxed);

  // The memfd is zero-filled: fill in what is not zero, header last.
  auto* h = reinterpret_cast<CtrlHeader*>(c.base_);
  h->abi = kCtrlAbi;
  h->header_bytes = sizeof(CtrlHeader);
  h->fingerprint = ctrl_fingerprint(p);
  h->region_bytes = l.region_bytes;
  h->params = p;
  h->buckets_off = l.buckets_off;
  h->slots_off = l.slots_off;
  h->pins_off = l.pins_off;
  h->pin_row_bytes = l.pin_row_bytes;
  h->accessed_off = l.accessed_off;
  h->stored_off = l.stored_off;
  c.cache_fields();
  for (uint32_t b = 0; b < p.bucket_count; ++b) c.buckets_[b].head.store(kNoSlot, std::memory_order_relaxed);
  for (uint32_t i = 0; i < c.total_; ++i) {
    SlotMeta& s = c.slots_[i];
    s.shard.store(kEmptyShard, std::memory_order_relaxed);
    s.next.store(kNoSlot, std::memory_order_relaxed);
    s.word.store(word_initial(), std::memory_order_relaxed);  // T0 (slot_word.h), published by [R0] below
  }
  std::atomic_ref<uint64_t>(h->magic).store(kCtrlMagic, std::memory_order_release);  // [R0]
  UCM_INFO(kCtrl, "control region: %" PRIu64 " bytes, %u+%u slots of %" PRIu64 " bytes, %u buckets, %u ranks, evict=%s, %s",
           l.region_bytes, p.regular_slots, p.reserved_slots, p.slot_bytes, p.bucket_count, p.max_ranks,
           evict_name(p.evict), c.pages_note_.c_str());
  *out = std::move(c);
  return Result::kOk;
}

Result BufferCtrl::attach(int fd, const CtrlParams* expect, BufferCtrl* out, CtrlPages pages) {
  BufferCtrl c;
  int dup_fd;
  UCM_SYSCHECK(dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0), "dup(control fd)");
  c.fd_ = dup_fd;
  UCM_CHECK(c.map_and_check(dup_fd, expect, pages));
  *out = std::move(c);
  return Result::kOk;
}

namespace {

// The header's magic, ABI and size: a region this library can read at all.
Result check_header_format(const CtrlHeader& h) {
  const uint64_t magic = std::atomic_ref<const uint64_t>(h.magic).load(std::memory_order_acquire);  // [A0]
  if (magic != kCtrlMagic)
    return fail(Result::kCorrupt, "control region has bad magic 0x%016" PRIx64 " (expected 0x%016" PRIx64 "%s)", magic,
                kCtrlMagic, magic == 0 ? ": never initialized" : "");
  if (h.abi != kCtrlAbi)
    return fail(Result::kAbiMismatch, "control region has ABI %u, this library speaks ABI %u", h.abi, kCtrlAbi);
  if (h.header_bytes != sizeof(CtrlHeader))
    return fail(Result::kAbiMismatch, "control header is %u bytes, this library's is %zu", h.header_bytes, sizeof(CtrlHeader));
  return Result::kOk;
}

// The header's offsets are the ones its parameters give, inside the file.
Result check_header_layout(const CtrlHeader& h, const CtrlParams& found, uint64_t file_bytes) {
  const RegionLayout l = compute_layout(found);
  if (l.region_bytes != h.region_bytes || l.buckets_off != h.buckets_off || l.slots_off != h.slots_off ||
      l.pins_off != h.pins_off || l.pin_row_bytes != h.pin_row_bytes || l.accessed_off != h.accessed_off ||
      l.stored_off != h.stored_off)
    return fail(Result::kCorrupt, "control header offsets disagree with its parameters");
  if (h.region_bytes > file_bytes)
    return fail(Result::kCorrupt, "control region truncated: the file has %" PRIu64 " bytes, the header says %" PRIu64,
                file_bytes, h.region_bytes);
  return Result::kOk;
}

// The header's parameters: sound, fingerprinted, laid out as they say, and
// (with `expect`) the ones this rank expects.
Result check_header_params(const CtrlHeader& h, const CtrlParams* expect, uint64_t file_bytes) {
  const CtrlParams found = h.params;
  CtrlParams want;
  if (expect) {
    UCM_CHECK(validate_ctrl_params(*expect));
    want = resolve_ctrl_params(*expect);
  }
  // A corrupt header names the fields that differ from what this rank
  // expects (when it knows): a flipped bit is then a precise error.
  const std::string corrupt_fields =
      expect ? ctrl_params_diff(found, want, "the control header", "this rank") : std::string();
  const auto corrupt_note = [&] {
    if (!expect) return std::string();
    return corrupt_fields.empty() ? std::string("; its parameters are the ones this rank expects")
                                  : "; " + corrupt_fields;
  };
  if (validate_ctrl_params(found) != Result::kOk || (found.bucket_count & (found.bucket_count - 1)) != 0 ||
      found.bucket_count == 0)
    return fail(Result::kCorrupt, "control header holds invalid parameters: %s%s",
                found.bucket_count == 0 ? "bucket_count 0 is not resolved" : last_error().c_str(),
                corrupt_note().c_str());
  const uint64_t fp = ctrl_fingerprint(found);
  if (fp != h.fingerprint)
    return fail(Result::kCorrupt,
                "control header fingerprint 0x%016" PRIx64 " does not match its own parameters (0x%016" PRIx64
                "): the header is corrupt%s",
                h.fingerprint, fp, corrupt_note().c_str());
  UCM_CHECK(check_header_layout(h, found, file_bytes));
  if (expect && !corrupt_fields.empty())
    return fail(Result::kConfigMismatch, "%s",
                ctrl_params_diff(found, want, "the control region", "this rank").c_str());
  return Result::kOk;
}

}  // namespace

Result BufferCtrl::map_and_check(int fd, const CtrlParams* expect, CtrlPages pages) {
  uint64_t file_bytes = 0;
  UCM_CHECK(map_region(fd, pages, &file_bytes));
  UCM_CHECK(check_header_format(header()));
  UCM_CHECK(check_header_params(header(), expect, file_bytes));
  cache_fields();
  return Result::kOk;
}

// Maps the whole file (a truncated or unsealed one is refused first), with
// the pages the creator chose.
Result BufferCtrl::map_region(int fd, CtrlPages pages, uint64_t* file_bytes_out) {
  struct stat st;
  UCM_SYSCHECK(fstat(fd, &st), "fstat(control fd)");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  if (file_bytes < sizeof(CtrlHeader))
    return fail(Result::kCorrupt, "control region truncated: %" PRIu64 " bytes, the header alone needs %zu",
                file_bytes, sizeof(CtrlHeader));
  int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK))
    return fail(Result::kCorrupt, "control region is not sealed against shrinking (seals 0x%x)", seals < 0 ? 0 : seals);
  struct statfs fs;
  hugetlb_ = fstatfs(fd, &fs) == 0 && static_cast<uint64_t>(fs.f_type) == kHugetlbfsMagic;
  void* m = mmap(nullptr, file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return fail(Result::kSystem, "mmap(control region, %" PRIu64 " bytes): %s", file_bytes, strerror(errno));
  base_ = static_cast<uint8_t*>(m);
  bytes_ = file_bytes;
  if (hugetlb_) {
    pages_note_ = "2 MiB hugetlb pages";
  } else if (pages == CtrlPages::kAuto) {
    (void)madvise(m, file_bytes, MADV_HUGEPAGE);  // as the creator did; a hint
    pages_note_ = ordinary_note(true) + "; the creator found no hugetlb pages";
  } else {
    pages_note_ = ordinary_note(false);
  }
  g_ctrl_epoch.fetch_add(1, std::memory_order_relaxed);
  *file_bytes_out = file_bytes;
  return Result::kOk;
}

namespace {

// This process's identity for rank r's record. Peers tell a rank from a later
// process with its pid by the start time: without one it would look dead to
// all of them, who would then steal its locks and zero its pins while it runs.
Result identity_for_record(uint32_t r, ProcessIdentity* out) {
  *out = self_identity();
  if (out->start_ticks == 0)
    return fail(Result::kSystem,
                "local rank %u cannot establish its own identity: /proc/self/stat of pid %d is unreadable (is /proc "
                "mounted in this mount namespace?)",
                r, out->pid);
  return Result::kOk;
}

}  // namespace

Result BufferCtrl::join(uint32_t r) {
  if (r >= max_ranks_) return fail(Result::kInvalidArg, "local rank %u >= max_ranks %u", r, max_ranks_);
  ProcessIdentity self;
  UCM_CHECK(identity_for_record(r, &self));
  RankRecord& rec = rank(r);
  uint32_t st = static_cast<uint32_t>(RankState::kFree);
  if (!rec.state.compare_exchange_strong(st, static_cast<uint32_t>(RankState::kJoining), std::memory_order_acq_rel)) {
    int32_t pid = rec.pid.load(std::memory_order_relaxed);
    if (rank_alive(r))
      return fail(Result::kBadState, "local rank %u is already attached by live pid %d", r, pid);
    return fail(Result::kPeerDead, "local rank %u is still held by dead pid %d: reap it first", r, pid);
  }
  // Start time before the pid (released): a prober that reads the pid
  // (acquire) then reads the matching start time.
  rec.start_ticks.store(self.start_ticks, std::memory_order_relaxed);
  rec.pid.store(self.pid, std::memory_order_release);
  rec.generation.fetch_add(1, std::memory_order_relaxed);
  rec.tasks_passed.store(0, std::memory_order_relaxed);  // a new queue numbers its tasks from 0 (protect.h)
  rec.idle_since_ms.store(0, std::memory_order_relaxed);  // no queue yet: never idle (protect.h)
  rec.lapsed_ms.store(0, std::memory_order_relaxed);
  rec.state.store(static_cast<uint32_t>(RankState::kAlive), std::memory_order_release);
  return Result::kOk;
}

Result BufferCtrl::adopt_dead_record(uint32_t r) {
  if (r >= max_ranks_) return fail(Result::kInvalidArg, "local rank %u >= max_ranks %u", r, max_ranks_);
  RankRecord& rec = rank(r);
  const uint32_t st = rec.state.load(std::memory_order_acquire);
  if (st == static_cast<uint32_t>(RankState::kFree) || rank_alive(r))
    return fail(Result::kBadState, "local rank %u is not held by a dead process", r);
  // The caller holds the recovery lock (join_rank), so no reaper frees the
  // record under us. Identity first (start time, then the pid, released):
  // a prober then sees this process, never the dead one in a live state.
  ProcessIdentity self;
  UCM_CHECK(identity_for_record(r, &self));
  rec.start_ticks.store(self.start_ticks, std::memory_order_relaxed);
  rec.pid.store(self.pid, std::memory_order_release);
  rec.state.store(static_cast<uint32_t>(RankState::kJoining), std::memory_order_release);
  return Result::kOk;
}

void BufferCtrl::finish_join(uint32_t r) {
  RankRecord& rec = rank(r);
  rec.generation.fetch_add(1, std::memory_order_relaxed);
  rec.tasks_passed.store(0, std::memory_order_relaxed);  // a new queue numbers its tasks from 0 (protect.h)
  rec.idle_since_ms.store(0, std::memory_order_relaxed);  // no queue yet: never idle (protect.h)
  rec.lapsed_ms.store(0, std::memory_order_relaxed);
  rec.state.store(static_cast<uint32_t>(RankState::kAlive), std::memory_order_release);
}

uint32_t BufferCtrl::leave(uint32_t r, bool holds_references) {
  if (r >= max_ranks_) return 0;
  // It copies nothing more: no shard waits for it (protect.h).
  set_copier(r, false);
  globals().deferring.fetch_and(~(1u << r), std::memory_order_relaxed);
  space_wait_end(*this, r);
  DroppedRefs d;
  const uint32_t walked = holds_references ? total_ : 0;
  for (uint32_t i = 0; i < walked; ++i) drop_rank_refs(*this, i, 1u << r, &d);
  if (d.pins + d.holds + d.loads + d.writes != 0)
    UCM_WARN("local rank %u left %" PRIu64 " pin(s), %" PRIu64 " owner hold(s), %" PRIu64
             " unfinished load(s) and %" PRIu64
             " unfinished write-through(s) behind: released (loads marked Failed, writes NotStored)",
             r, d.pins, d.holds, d.loads, d.writes);
  RankRecord& rec = rank(r);
  rec.pid.store(0, std::memory_order_relaxed);
  rec.start_ticks.store(0, std::memory_order_relaxed);
  rec.state.store(static_cast<uint32_t>(RankState::kFree), std::memory_order_release);
  note_space_freed(*this);  // what it held or was owed is free now (space_bell.h)
  return walked;
}

void BufferCtrl::set_copier(uint32_t r, bool on) const {
  if (r >= max_ranks_) return;
  if (on) globals().copiers.fetch_or(1u << r, std::memory_order_seq_cst);
  else globals().copiers.fetch_and(~(1u << r), std::memory_order_seq_cst);
}

bool BufferCtrl::rank_alive(uint32_t r) const {
  if (r >= max_ranks_) return false;
  const RankRecord& rec = rank(r);
  if (rec.state.load(std::memory_order_acquire) == static_cast<uint32_t>(RankState::kFree)) return false;
  ProcessIdentity id;
  id.pid = rec.pid.load(std::memory_order_acquire);
  id.start_ticks = rec.start_ticks.load(std::memory_order_relaxed);
  if (id.pid == 0) return true;  // joining: identity not written yet
  return is_alive(id);
}

}  // namespace ucm
