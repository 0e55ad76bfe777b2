// BufferData: the node-shared data plane, the bytes of every slot.
//
// Segments are memfds, sealed against resizing, each holding slots_per_segment
// slots back to back. With hugepages (policy auto or on) a segment is created
// with MFD_HUGETLB (2 MiB pages) and a trial mmap; the kernel may accept the
// memfd and ftruncate yet have no pages, which shows only there. Without them
// (auto falls back, off never tries) it is an ordinary memfd with
// MADV_HUGEPAGE. Which one was used is reported by hugetlb() and logged.
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
#include <vector>

#include "common/result.h"

namespace ucm {

enum class HugePolicy : uint32_t { kAuto = 0, kOn = 1, kOff = 2 };

struct DataParams {
  uint64_t slot_bytes = 0;
  uint32_t total_slots = 0;
  uint64_t segment_bytes = 1ull << 30;  // upper bound per segment; at least one slot
  HugePolicy hugepages = HugePolicy::kAuto;
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
  bool pow2_addressing() const { return pow2_; }
  uint32_t slots_per_segment() const { return sps_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t total_slots() const { return total_; }
  size_t segment_count() const { return bases_.size(); }
  int segment_fd(size_t i) const { return fds_[i]; }
  uint64_t segment_map_bytes(size_t i) const { return map_bytes_[i]; }
  void* segment_base(size_t i) const { return bases_[i]; }
  uint64_t mapped_bytes() const;

 private:
  Result plan(const DataParams& p);
  uint64_t segment_bytes_for(size_t seg, bool huge) const;
  Result map_segment(int fd, uint64_t bytes);
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
};

// Whether a MFD_HUGETLB segment of `bytes` can be created and mapped right now.
bool hugepages_available(uint64_t bytes);

}  // namespace ucm
