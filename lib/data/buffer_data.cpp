#include "data/buffer_data.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
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

// A value of /proc/meminfo in bytes, 0 if absent.
uint64_t meminfo_bytes(const char* field) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  const size_t n = std::strlen(field);
  while (std::getline(f, line)) {
    if (line.compare(0, n, field) != 0 || line.size() <= n || line[n] != ':') continue;
    unsigned long long v = 0;
    char unit[8] = {};
    const int got = std::sscanf(line.c_str() + n + 1, "%llu %7s", &v, unit);
    if (got < 1) return 0;
    return got == 2 && std::strcmp(unit, "kB") == 0 ? v * 1024 : v;
  }
  return 0;
}

// One number from a cgroup file; "max" (v2) and absurd v1 limits are no limit.
bool cgroup_number(const std::string& path, uint64_t* out) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v)) return false;
  if (v == "max") {
    *out = UINT64_MAX;
    return true;
  }
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0') return false;
  *out = x >= (1ull << 62) ? UINT64_MAX : x;  // v1 writes "no limit" as ~2^63
  return true;
}

// inactive_file of a cgroup's memory.stat: page cache the kernel reclaims first.
uint64_t cgroup_inactive_file(const std::string& dir, bool v2) {
  std::ifstream f(dir + "/memory.stat");
  std::string k;
  uint64_t v = 0;
  const char* want = v2 ? "inactive_file" : "total_inactive_file";
  while (f >> k >> v)
    if (k == want) return v;
  return 0;
}

// Bytes the memory cgroup of this process may still charge, UINT64_MAX when
// it has no limit or none can be read (containers often hide the path).
uint64_t cgroup_remaining() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    // "0::/path" (v2) or "N:memory:/path" (v1).
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string ctrls = line.substr(a + 1, b - a - 1);
    const std::string path = line.substr(b + 1);
    const bool v2 = ctrls.empty();
    if (!v2 && ctrls != "memory" && ctrls.find("memory") == std::string::npos) continue;
    const char* roots_v2[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
    const char* roots_v1[] = {"/sys/fs/cgroup/memory"};
    const char* const* roots = v2 ? roots_v2 : roots_v1;
    const size_t nroots = v2 ? 2 : 1;
    for (size_t i = 0; i < nroots; ++i) {
      for (const std::string& dir : {std::string(roots[i]) + path, std::string(roots[i])}) {
        uint64_t limit = 0, usage = 0;
        if (!cgroup_number(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"), &limit)) continue;
        if (!cgroup_number(dir + (v2 ? "/memory.current" : "/memory.usage_in_bytes"), &usage)) continue;
        if (limit == UINT64_MAX) break;  // this hierarchy has no limit here
        const uint64_t used = usage - std::min(usage, cgroup_inactive_file(dir, v2));
        return limit > used ? limit - used : 0;
      }
    }
  }
  return UINT64_MAX;
}

// Faults every page of a fresh mapping in now, so that a page the kernel
// cannot give is an error here rather than a SIGBUS in a copier later.
// Returns 0, or the errno; EINVAL (a kernel before 5.14) is not an error.
int populate(void* base, uint64_t bytes) {
#ifdef MADV_POPULATE_WRITE
  int e;
  do e = madvise(base, bytes, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
  while (e == EINTR);
  return e == EINVAL ? 0 : e;
#else
  (void)base;
  (void)bytes;
  return 0;
#endif
}

}  // namespace

uint32_t usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<uint32_t>(n);
  }
  const unsigned h = std::thread::hardware_concurrency();
  return h ? h : 1;
}

uint32_t run_parallel(size_t n, uint32_t max_threads, const std::function<void(size_t)>& fn, std::string* error) {
  if (n == 0) return 0;
  std::atomic<size_t> next{0};
  std::mutex mu;
  bool failed = false;
  auto work = [&]() noexcept {
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < n;) {
      try {
        fn(i);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(mu);
        if (!failed && error) *error = e.what();
        failed = true;
      } catch (...) {
        std::lock_guard<std::mutex> g(mu);
        if (!failed && error) *error = "an exception that is not a std::exception";
        failed = true;
      }
    }
  };
  const size_t want = std::min<size_t>(n, std::max<uint32_t>(1, max_threads));
  std::vector<std::thread> helpers;
  try {
    helpers.reserve(want - 1);
    for (size_t t = 1; t < want; ++t) helpers.emplace_back(work);
  } catch (...) {
    // No memory or no thread (a pids limit): fewer helpers, the same work.
  }
  work();
  for (std::thread& t : helpers) t.join();
  return static_cast<uint32_t>(helpers.size() + 1);
}

MemoryBudget memory_budget() {
  MemoryBudget m;
  m.available = meminfo_bytes("MemAvailable");
  m.available_from = "MemAvailable";
  const uint64_t cg = cgroup_remaining();
  if (cg != UINT64_MAX && (m.available == 0 || cg < m.available)) {
    m.available = cg;
    m.available_from = "the memory cgroup's remaining limit";
  }
  m.hugepages_free = meminfo_bytes("HugePages_Free") * kHugePageBytes;
  return m;
}

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
    pages_note_ = std::move(o.pages_note_);
    numa_note_ = std::move(o.numa_note_);
    numa_mode_ = o.numa_mode_;
    numa_nodes_ = o.numa_nodes_;
    populate_seconds_ = o.populate_seconds_;
    populate_threads_ = o.populate_threads_;
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

size_t BufferData::fence_off() {
  size_t failed = 0;
  for (size_t i = 0; i < bases_.size(); ++i) {
    // One call replaces the mapping atomically (MAP_FIXED): no moment where
    // the range is free for another mmap to take.
    void* m = mmap(bases_[i], map_bytes_[i], PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) {
      ++failed;
      UCM_WARN("fencing data segment %zu (%p, %" PRIu64 " bytes) off: mmap: %s; it stays mapped", i,
               static_cast<void*>(bases_[i]), map_bytes_[i], strerror(errno));
    }
  }
  // Never munmap()ed: see the header.
  bases_.clear();
  map_bytes_.clear();
  for (int fd : fds_)
    if (fd >= 0) close(fd);
  fds_.clear();
  return failed;
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

Result BufferData::make_segments(const DataParams& p, bool huge) {
  uint64_t total = 0;
  std::string numa_failed;
  for (uint32_t s = 0; s < segments_; ++s) {
    const uint64_t bytes = segment_bytes_for(s, huge);
    int fd;
    UCM_SYSCHECK(fd = make_memfd(huge), "memfd_create(data segment)");
    fds_.push_back(fd);
    UCM_SYSCHECK(ftruncate(fd, static_cast<off_t>(bytes)), "ftruncate(data segment)");
    UCM_SYSCHECK(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), "fcntl(F_ADD_SEALS, data)");
    // A shared hugetlb mapping reserves its pages here: this is where a
    // segment finds that another process took them.
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
      return fail(Result::kNoMemory, "mmap(data segment %u of %u, %" PRIu64 " bytes%s): %s", s, segments_, bytes,
                  huge ? " of 2 MiB pages" : "", strerror(errno));
    bases_.push_back(static_cast<uint8_t*>(m));
    map_bytes_.push_back(bytes);
    total += bytes;
    // Only a hint: the kernel may not back shmem with huge pages.
    if (!huge) (void)madvise(m, bytes, MADV_HUGEPAGE);
    // Placement before the first page exists (numa.h). A policy the kernel
    // refuses (no NUMA support, a node gone) leaves the default, said why.
    if (p.numa.mode != NumaMode::kNone && apply_numa_policy(m, bytes, p.numa) != Result::kOk && numa_failed.empty())
      numa_failed = last_error();
    if (p.after_segment) p.after_segment(s, p.after_segment_ctx);
  }
  if (!numa_failed.empty()) UCM_WARN("data plane: NUMA placement not set: %s", numa_failed.c_str());
  read_numa(!numa_failed.empty() ? "not set: " + numa_failed : p.numa.why);
  (void)total;
  return populate_segments(p, huge ? " of 2 MiB pages" : "");
}

void BufferData::read_numa(const std::string& why) {
  numa_mode_ = NumaMode::kNone;
  numa_nodes_ = 0;
  if (bases_.empty() || numa_policy_at(bases_[0], &numa_mode_, &numa_nodes_) != Result::kOk) {
    numa_note_ = "unknown (get_mempolicy: " + last_error() + ")";
    return;
  }
  numa_note_ = describe_numa(numa_mode_, numa_nodes_);
  if (!why.empty()) numa_note_ += " (" + why + ")";
}

Result BufferData::populate_segments(const DataParams& p, const char* what) {
  populate_seconds_ = 0;
  populate_threads_ = 0;
  if (p.allow_overcommit) return Result::kOk;
  // One segment per thread at a time, on at most the CPUs this rank may use:
  // the kernel zeroes each page in the faulting thread, so a plane of many
  // segments fills as fast as the CPUs (and memory bandwidth) allow.
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int> err(bases_.size(), 0);
  std::string threw;
  const uint32_t cap = p.populate_threads ? p.populate_threads : usable_cpus();
  populate_threads_ = run_parallel(
      bases_.size(), cap, [&](size_t s) { err[s] = populate(bases_[s], map_bytes_[s]); }, &threw);
  populate_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!threw.empty()) return fail(Result::kNoMemory, "populating the data plane: %s", threw.c_str());
  for (size_t s = 0; s < err.size(); ++s)
    if (err[s] != 0)
      return fail(Result::kNoMemory, "populating data segment %zu of %zu (%" PRIu64 " bytes%s, %" PRIu64
                  " bytes in all): %s", s, bases_.size(), map_bytes_[s], what, mapped_bytes(), strerror(err[s]));
  return Result::kOk;
}

Result BufferData::create(const DataParams& params, BufferData* out) {
  BufferData d;
  UCM_CHECK(d.plan(params));
  const MemoryBudget budget = memory_budget();
  uint64_t huge_bytes = 0, plain_bytes = 0;
  for (uint32_t s = 0; s < d.segments_; ++s) {
    huge_bytes += d.segment_bytes_for(s, true);
    plain_bytes += d.segment_bytes_for(s, false);
  }
  if (params.hugepages != HugePolicy::kOff) {
    // No probe first: the mapping itself is the only test that counts.
    Result r = d.make_segments(params, true);
    if (r == Result::kOk) {
      d.hugetlb_ = true;
      d.pages_note_ = "2 MiB hugetlb pages";
    } else {
      const std::string why = last_error();
      const uint64_t free_now = memory_budget().hugepages_free;
      d.reset();
      if (params.hugepages == HugePolicy::kOn)
        return fail(Result::kUnsupported,
                    "hugepages=on but the data plane's %" PRIu64 " bytes of 2 MiB hugepages cannot be had (%" PRIu64
                    " bytes free before, %" PRIu64 " now; %s); reserve them: echo N > /proc/sys/vm/nr_hugepages",
                    huge_bytes, budget.hugepages_free, free_now, why.c_str());
      char note[320];
      std::snprintf(note, sizeof(note),
                    "ordinary pages: hugepages=auto fell back (%" PRIu64 " bytes of 2 MiB pages wanted, %" PRIu64
                    " free: %s)", huge_bytes, budget.hugepages_free, why.c_str());
      d.pages_note_ = note;
      UCM_INFO(kData, "%s", note);
    }
  } else {
    d.pages_note_ = "ordinary pages (hugepages=off)";
  }
  if (!d.hugetlb_) {
    if (!params.allow_overcommit && budget.available != 0 && plain_bytes > budget.available)
      return fail(Result::kNoMemory,
                  "the data plane needs %" PRIu64 " bytes, more than the %" PRIu64
                  " bytes this node can give it now (%s): lower cache_bytes, or allow overcommit",
                  plain_bytes, budget.available, budget.available_from.c_str());
    UCM_CHECK(d.make_segments(params, false));
  }
  UCM_INFO(kData, "data plane: %u segments of %u slots x %" PRIu64 " bytes, %s, addressing %s%s, NUMA %s", d.segments_,
           d.sps_, d.slot_bytes_, d.hugetlb_ ? "MFD_HUGETLB 2 MiB pages" : "regular memfd + MADV_HUGEPAGE",
           d.pow2_ ? "shift/mask" : "div/mod",
           params.allow_overcommit ? ", not populated (overcommit)"
                                   : (", populated in " + std::to_string(d.populate_seconds_) + " s on " +
                                      std::to_string(d.populate_threads_) + " thread(s)")
                                         .c_str(),
           d.numa_note_.c_str());
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
  // The creator allocated the pages; this maps them (in parallel, as the
  // creator did), so the copier takes no page faults and a mapping the kernel
  // cannot complete fails here.
  UCM_CHECK(d.populate_segments(params, hugetlb ? " of 2 MiB pages, mapped" : ", mapped"));
  // A shmem segment's policy is the file's, so this mapping reports what the
  // creator set; a hugetlb one's was the creator's mapping's alone.
  d.read_numa(hugetlb ? "hugetlb: placed by local rank 0's mapping" : "set by local rank 0");
  d.pages_note_ = hugetlb                                ? "2 MiB hugetlb pages"
                  : params.hugepages == HugePolicy::kOff ? "ordinary pages (hugepages=off)"
                                                         : "ordinary pages: hugepages=auto fell back on local rank 0, "
                                                           "which made the plane (its ucm_cache_info says why)";
  *out = std::move(d);
  return Result::kOk;
}

}  // namespace ucm
