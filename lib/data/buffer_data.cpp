#include "data/buffer_data.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cinttypes>
#include <cstring>
#include <utility>

#include "common/log.h"

namespace ucm {
namespace {

constexpr uint64_t kPageBytes = 4096;

bool is_pow2(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }
uint32_t log2_of(uint64_t x) { return static_cast<uint32_t>(__builtin_ctzll(x)); }
uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

int make_memfd(bool huge) {
  unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  if (huge) flags |= MFD_HUGETLB | MFD_HUGE_2MB;
  return memfd_create(huge ? "ucmcache-data-huge" : "ucmcache-data", flags);
}

}  // namespace

bool hugepages_available(uint64_t bytes) {
  bytes = round_up(bytes, kHugePageBytes);
  int fd = make_memfd(true);
  if (fd < 0) return false;
  bool ok = false;
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m != MAP_FAILED) {
      ok = true;
      munmap(m, bytes);
    }
  }
  close(fd);
  return ok;
}

BufferData::~BufferData() { reset(); }

BufferData::BufferData(BufferData&& o) noexcept { *this = std::move(o); }

BufferData& BufferData::operator=(BufferData&& o) noexcept {
  if (this != &o) {
    reset();
    bases_ = std::move(o.bases_);
    fds_ = std::move(o.fds_);
    map_bytes_ = std::move(o.map_bytes_);
    slot_bytes_ = o.slot_bytes_;
    total_ = o.total_;
    sps_ = o.sps_;
    sps_shift_ = o.sps_shift_;
    sps_mask_ = o.sps_mask_;
    slot_shift_ = o.slot_shift_;
    segments_ = o.segments_;
    pow2_ = o.pow2_;
    hugetlb_ = o.hugetlb_;
    o.bases_.clear();
    o.fds_.clear();
    o.map_bytes_.clear();
  }
  return *this;
}

void BufferData::reset() {
  for (size_t i = 0; i < bases_.size(); ++i) munmap(bases_[i], map_bytes_[i]);
  for (int fd : fds_)
    if (fd >= 0) close(fd);
  bases_.clear();
  fds_.clear();
  map_bytes_.clear();
}

uint64_t BufferData::mapped_bytes() const {
  uint64_t n = 0;
  for (uint64_t b : map_bytes_) n += b;
  return n;
}

Result BufferData::plan(const DataParams& p) {
  if (p.slot_bytes == 0) return fail(Result::kInvalidArg, "slot_bytes is 0");
  if (p.total_slots == 0) return fail(Result::kInvalidArg, "total_slots is 0");
  if (p.segment_bytes < p.slot_bytes)
    return fail(Result::kInvalidArg, "segment_bytes %" PRIu64 " is smaller than one slot (%" PRIu64 " bytes)",
                p.segment_bytes, p.slot_bytes);
  slot_bytes_ = p.slot_bytes;
  total_ = p.total_slots;
  uint64_t sps = p.segment_bytes / p.slot_bytes;
  if (sps > p.total_slots) sps = p.total_slots;
  // Round slots per segment down to a power of two so addressing is shift+mask
  // when slot_bytes is one too; a non-pow2 count needs div/mod anyway.
  uint64_t pow = 1;
  while (pow * 2 <= sps) pow *= 2;
  const bool total_fits = sps == p.total_slots;  // one segment: keep it exact
  if (is_pow2(p.slot_bytes) && !total_fits) sps = pow;
  if (is_pow2(p.slot_bytes) && total_fits) sps = is_pow2(sps) ? sps : pow * 2;  // one segment, rounded up
  sps_ = static_cast<uint32_t>(sps);
  pow2_ = is_pow2(p.slot_bytes) && is_pow2(sps_);
  if (pow2_) {
    sps_shift_ = log2_of(sps_);
    sps_mask_ = sps_ - 1;
    slot_shift_ = log2_of(p.slot_bytes);
  }
  segments_ = static_cast<uint32_t>((uint64_t{total_} + sps_ - 1) / sps_);
  return Result::kOk;
}

uint64_t BufferData::segment_bytes_for(size_t seg, bool huge) const {
  uint64_t first = uint64_t{seg} * sps_;
  uint64_t slots = std::min<uint64_t>(sps_, total_ - first);
  return round_up(slots * slot_bytes_, huge ? kHugePageBytes : kPageBytes);
}

Result BufferData::map_segment(int fd, uint64_t bytes) {
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED)
    return fail(Result::kSystem, "mmap(data segment, %" PRIu64 " bytes): %s", bytes, strerror(errno));
  bases_.push_back(static_cast<uint8_t*>(m));
  map_bytes_.push_back(bytes);
  return Result::kOk;
}

Result BufferData::create(const DataParams& params, BufferData* out) {
  BufferData d;
  UCM_CHECK(d.plan(params));
  bool huge = false;
  if (params.hugepages != HugePolicy::kOff) {
    uint64_t all = 0;
    for (uint32_t s = 0; s < d.segments_; ++s) all += d.segment_bytes_for(s, true);
    huge = hugepages_available(all);
    if (!huge && params.hugepages == HugePolicy::kOn)
      return fail(Result::kUnsupported,
                  "hugepages=on but %" PRIu64 " bytes of 2 MiB hugepages cannot be mapped "
                  "(reserve them: echo N > /proc/sys/vm/nr_hugepages)",
                  all);
  }
  d.hugetlb_ = huge;
  for (uint32_t s = 0; s < d.segments_; ++s) {
    const uint64_t bytes = d.segment_bytes_for(s, huge);
    int fd;
    UCM_SYSCHECK(fd = make_memfd(huge), "memfd_create(data segment)");
    d.fds_.push_back(fd);
    UCM_SYSCHECK(ftruncate(fd, static_cast<off_t>(bytes)), "ftruncate(data segment)");
    UCM_SYSCHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), "fcntl(F_ADD_SEALS, data)");
    UCM_CHECK(d.map_segment(fd, bytes));
    // Only a hint: the kernel may not back shmem with huge pages.
    if (!huge) (void)madvise(d.bases_.back(), bytes, MADV_HUGEPAGE);
  }
  UCM_INFO(kData, "data plane: %u segments of %u slots x %" PRIu64 " bytes, %s, addressing %s", d.segments_, d.sps_,
           d.slot_bytes_, huge ? "MFD_HUGETLB 2 MiB pages" : "regular memfd + MADV_HUGEPAGE",
           d.pow2_ ? "shift/mask" : "div/mod");
  *out = std::move(d);
  return Result::kOk;
}

Result BufferData::attach(const DataParams& params, bool hugetlb, const int* fds, size_t nfds, BufferData* out) {
  BufferData d;
  UCM_CHECK(d.plan(params));
  d.hugetlb_ = hugetlb;
  if (nfds != d.segments_)
    return fail(Result::kConfigMismatch, "data plane has %zu segment fds, this layout needs %u", nfds, d.segments_);
  for (uint32_t s = 0; s < d.segments_; ++s) {
    const uint64_t bytes = d.segment_bytes_for(s, hugetlb);
    struct stat st;
    UCM_SYSCHECK(fstat(fds[s], &st), "fstat(data segment)");
    if (static_cast<uint64_t>(st.st_size) < bytes)
      return fail(Result::kCorrupt, "data segment %u is %" PRIu64 " bytes, the layout needs %" PRIu64, s,
                  static_cast<uint64_t>(st.st_size), bytes);
    int seals = fcntl(fds[s], F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK))
      return fail(Result::kCorrupt, "data segment %u is not sealed against shrinking", s);
    int fd;
    UCM_SYSCHECK(fd = fcntl(fds[s], F_DUPFD_CLOEXEC, 0), "dup(data segment fd)");
    d.fds_.push_back(fd);
    UCM_CHECK(d.map_segment(fd, bytes));
  }
  *out = std::move(d);
  return Result::kOk;
}

}  // namespace ucm
