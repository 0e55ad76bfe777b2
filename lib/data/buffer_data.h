// BufferData: the node-shared data plane, the bytes of every slot.
//
// Segments are memfds, sealed against resizing, each holding slots_per_segment
// slots back to back. With hugepages (policy auto or on) a segment is created
// with MFD_HUGETLB (2 MiB pages); the kernel may accept the memfd and ftruncate
// yet have no pages, which shows only at the mmap (or, under a hugetlb cgroup
// limit, only at the first touch, as a SIGBUS). So there is no separate probe:
// every segment is mapped and populated (MADV_POPULATE_WRITE) by its creator,
// and the first segment that fails decides. Another process may take the pages
// at any moment, so a probe that succeeded proves nothing about the mapping
// after it. With auto, a failure at any segment drops the hugetlb segments made
// so far and builds the whole plane on ordinary memfds (with MADV_HUGEPAGE);
// why is kept in pages_note() and logged. With on, it is an error naming the
// segment, the bytes and the free hugepages. Off never tries.
//
// Memory is checked before anything is made: a plane larger than the node can
// give (MemAvailable, and a memory cgroup's limit; for hugetlb, the free 2 MiB
// pages) is refused with both numbers, unless allow_overcommit says the caller
// wants lazily allocated memory (then nothing is populated either, and a page
// the kernel cannot give later is the caller's risk).
//
// slot -> address: when slot_bytes and slots_per_segment are powers of two
// (the configuration rounds toward that), a shift and a mask; otherwise a
// division and a modulo. Both give the same answer; tests check both.
//
// The creator owns the fds it passes to peers; attach() maps fds it was given
// (duplicating them). The object is move-only and unmaps/closes on destruction.
// It says nothing about what the bytes mean: the control plane does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/result.h"
#include "data/numa.h"

namespace ucm {

enum class HugePolicy : uint32_t { kAuto = 0, kOn = 1, kOff = 2 };

struct DataParams {
  uint64_t slot_bytes = 0;
  uint32_t total_slots = 0;
  uint64_t segment_bytes = 1ull << 30;  // upper bound per segment; at least one slot
  HugePolicy hugepages = HugePolicy::kAuto;
  // Skip the memory check and the populate step (the config's allow_overcommit).
  bool allow_overcommit = false;
  // NUMA placement of every segment, set before it is populated (numa.h);
  // kNone leaves the kernel's default.
  NumaPolicy numa;
  // Threads that populate the segments, one segment each at a time; 0: the
  // CPUs this process may run on (sched_getaffinity). Never more than the
  // segments.
  uint32_t populate_threads = 0;
  // Tests only: runs after segment `seg` is mapped and populated, so a test can
  // let a real competitor take hugepages at that exact point.
  void (*after_segment)(uint32_t seg, void* ctx) = nullptr;
  void* after_segment_ctx = nullptr;
};

constexpr uint64_t kHugePageBytes = 2ull << 20;

class BufferData {
 public:
  BufferData() = default;
  ~BufferData();
  BufferData(BufferData&& o) noexcept;
  BufferData& operator=(BufferData&& o) noexcept;
  BufferData(const BufferData&) = delete;
  BufferData& operator=(const BufferData&) = delete;

  [[nodiscard]] static Result create(const DataParams& params, BufferData* out);
  // Maps segments created elsewhere. `hugetlb` must be what the creator reported.
  [[nodiscard]] static Result attach(const DataParams& params, bool hugetlb, const int* fds, size_t nfds,
                                     BufferData* out);

  void* at(uint32_t slot) const {
    if (pow2_) return bases_[slot >> sps_shift_] + (static_cast<uint64_t>(slot & sps_mask_) << slot_shift_);
    return bases_[slot / sps_] + static_cast<uint64_t>(slot % sps_) * slot_bytes_;
  }

  bool valid() const { return !bases_.empty(); }
  bool hugetlb() const { return hugetlb_; }
  // How the pages were chosen, for ucm_cache_info: "2 MiB hugetlb pages", or
  // why hugepages=auto fell back to ordinary pages.
  const std::string& pages_note() const { return pages_note_; }
  // The NUMA placement this mapping reports (get_mempolicy on the first
  // segment), and how it was chosen, for ucm_cache_info.
  const std::string& numa_note() const { return numa_note_; }
  NumaMode numa_mode() const { return numa_mode_; }
  uint64_t numa_nodes() const { return numa_nodes_; }
  // Wall time of faulting this mapping in at create/attach, and on how many
  // threads (0 s and 0 threads when nothing was populated: overcommit).
  double populate_seconds() const { return populate_seconds_; }
  uint32_t populate_threads() const { return populate_threads_; }
  bool pow2_addressing() const { return pow2_; }
  uint32_t slots_per_segment() const { return sps_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t total_slots() const { return total_; }
  size_t segment_count() const { return bases_.size(); }
  int segment_fd(size_t i) const { return fds_[i]; }
  uint64_t segment_map_bytes(size_t i) const { return map_bytes_[i]; }
  void* segment_base(size_t i) const { return bases_[i]; }
  uint64_t mapped_bytes() const;
  // For a store that left threads in the kernel that may still write into
  // slots (backend.h shutdown()): replaces every segment's mapping, at the
  // same address, with an inaccessible one (PROT_NONE, no memory behind it),
  // and forgets the segments without unmapping that range. A late write from
  // the kernel then fails with EFAULT instead of landing in the node's shared
  // memory (where this rank's pins no longer keep the slot once it leaves) or
  // in whatever a later mmap would put at a freed address. The address range
  // stays reserved until the process exits; the shared pages are released.
  // Returns the segments it could not fence (their mappings are kept as
  // they are, never unmapped).
  size_t fence_off();

 private:
  Result plan(const DataParams& p);
  uint64_t segment_bytes_for(size_t seg, bool huge) const;
  Result map_segment(int fd, uint64_t bytes);
  Result make_segments(const DataParams& p, bool huge);
  Result populate_segments(const DataParams& p, const char* what);
  void read_numa(const std::string& why);
  void reset();

  std::vector<uint8_t*> bases_;
  std::vector<int> fds_;
  std::vector<uint64_t> map_bytes_;
  uint64_t slot_bytes_ = 0;
  uint32_t total_ = 0;
  uint32_t sps_ = 0;
  uint32_t sps_shift_ = 0;
  uint32_t sps_mask_ = 0;
  uint32_t slot_shift_ = 0;
  uint32_t segments_ = 0;
  bool pow2_ = false;
  bool hugetlb_ = false;
  std::string pages_note_;
  std::string numa_note_;
  NumaMode numa_mode_ = NumaMode::kNone;
  uint64_t numa_nodes_ = 0;
  double populate_seconds_ = 0;
  uint32_t populate_threads_ = 0;
};

// CPUs this process may run on (sched_getaffinity), at least 1.
uint32_t usable_cpus();
// Runs fn(i) for every i in [0, n) on up to max_threads threads (this one
// included), each taking the next index; returns the threads used. A thread
// that cannot be created leaves its share to the others; an exception inside
// fn is caught in its thread and reported through *error (the first one's
// what()), never std::terminate.
uint32_t run_parallel(size_t n, uint32_t max_threads, const std::function<void(size_t)>& fn, std::string* error);

// Whether a MFD_HUGETLB segment of `bytes` can be created and mapped right now
// (a hint: another process may take the pages the next moment).
bool hugepages_available(uint64_t bytes);

// What the node can give a new data plane now, in bytes: MemAvailable, capped
// by the memory cgroup's remaining limit (v2 memory.max, v1 limit_in_bytes),
// and the free 2 MiB hugepages. 0 when unknown. `*what` says where each came from.
struct MemoryBudget {
  uint64_t available = 0;       // ordinary pages
  uint64_t hugepages_free = 0;  // bytes of free 2 MiB hugetlb pages
  std::string available_from;   // "MemAvailable" or "memory cgroup limit"
};
MemoryBudget memory_budget();

}  // namespace ucm
