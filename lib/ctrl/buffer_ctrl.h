// BufferCtrl: the node-shared control plane of the cache (see layout.h).
//
// One rank creates the region (a sealed memfd), fills it, and writes the magic
// last; every other rank attaches to the fd it was given and checks magic, ABI,
// header size, region size, the fingerprint of the layout parameters and the
// seals before it trusts a byte. The object owns its mapping and its fd; it is
// move-only. It does not by itself guarantee anything about slot contents: the
// protocols live in pins.h (pin/claim), clock.h (victims) and recovery.h (dead
// ranks), and cache/ builds Get/MarkReady/... from them.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/result.h"
#include "ctrl/layout.h"

namespace ucm {

// The fields of CtrlParams (layout.h), once: the fingerprint hashes them in
// this order, and a mismatch or a corruption names them from here. The list
// covers every byte of the struct (checked at compile time in buffer_ctrl.cpp),
// so a field added to CtrlParams and forgotten here does not build.
struct CtrlParamField {
  const char* name;
  uint32_t offset;  // offsetof(CtrlParams, field)
  uint32_t bytes;   // 4 or 8
  uint64_t value(const CtrlParams& p) const;
};
std::span<const CtrlParamField> ctrl_param_fields();

// "" when `have` and `want` agree in every field, else one clause per field
// that differs, joined by "; ": "regular_slots: <have_name> has 9, <want_name>
// expects 8".
std::string ctrl_params_diff(const CtrlParams& have, const CtrlParams& want, const char* have_name,
                             const char* want_name);

// Checks every field; the error names the bad one and its value.
[[nodiscard]] Result validate_ctrl_params(const CtrlParams& p);
// bucket_count resolved (0 -> auto).
CtrlParams resolve_ctrl_params(const CtrlParams& p);
// Hash of every field of ctrl_param_fields(), of the ABI and of the shared
// structs' sizes.
uint64_t ctrl_fingerprint(const CtrlParams& resolved);

// The control region's pages. kAuto: a hugetlb memfd (2 MiB pages) when the
// kernel has free hugepages for it, else an ordinary memfd with
// MADV_HUGEPAGE (transparent hugepages for shmem, when the kernel's
// shmem_enabled allows). The hit path reads a bucket, a slot's meta, a pin
// row and an accessed byte spread over the whole region, so at 512k slots
// 4 KiB pages cost a TLB miss per line; huge pages take them away. kOff: an
// ordinary memfd, nothing asked. Neither is part of the layout: a peer finds
// out from the fd (fstatfs), and pages_note() says what was chosen and why.
enum class CtrlPages : uint8_t { kOff = 0, kAuto = 1 };

class BufferCtrl {
 public:
  BufferCtrl() = default;
  ~BufferCtrl();
  BufferCtrl(BufferCtrl&& o) noexcept;
  BufferCtrl& operator=(BufferCtrl&& o) noexcept;
  BufferCtrl(const BufferCtrl&) = delete;
  BufferCtrl& operator=(const BufferCtrl&) = delete;

  // Creates, initializes and seals a new region; the magic is written last.
  [[nodiscard]] static Result create(const CtrlParams& params, BufferCtrl* out, CtrlPages pages = CtrlPages::kOff);
  // Maps the region behind `fd` (the fd is duplicated; the caller keeps its own).
  // With `expect`, also refuses a region whose parameters differ, naming the field.
  // `pages` is what the creator was asked for (a hugetlb file is told by the
  // fd itself); it decides this mapping's hint and pages_note().
  [[nodiscard]] static Result attach(int fd, const CtrlParams* expect, BufferCtrl* out,
                                     CtrlPages pages = CtrlPages::kOff);

  bool valid() const { return base_ != nullptr; }
  int fd() const { return fd_; }
  size_t region_bytes() const { return bytes_; }  // as mapped (a hugetlb file rounds up to 2 MiB)
  bool hugetlb() const { return hugetlb_; }
  // "2 MiB hugetlb pages", or which ordinary pages and why (CtrlPages).
  const std::string& pages_note() const { return pages_note_; }
  CtrlParams params() const;

  const CtrlHeader& header() const { return *reinterpret_cast<const CtrlHeader*>(base_); }
  CtrlGlobals& globals() const { return *reinterpret_cast<CtrlGlobals*>(base_ + kCtrlGlobalsOff); }
  RankRecord& rank(uint32_t r) const { return reinterpret_cast<RankRecord*>(base_ + kRanksOff)[r]; }
  Bucket& bucket(uint32_t b) const { return buckets_[b]; }
  SlotMeta& slot(uint32_t i) const { return slots_[i]; }
  std::atomic<uint32_t>& pin(uint32_t r, uint32_t i) const {
    return reinterpret_cast<std::atomic<uint32_t>*>(pins_ + r * pin_row_bytes_)[i];
  }
  // Bytes from pin(r, i) to pin(r + 1, i): a walk of one slot's rows.
  uint64_t pin_row_bytes() const { return pin_row_bytes_; }
  std::atomic<uint8_t>& accessed(uint32_t i) const { return accessed_[i]; }
  // The stored word of slot i (layout.h).
  std::atomic<uint32_t>& stored(uint32_t i) const { return stored_[i]; }
  // The guard word of slot i: its eviction protection (protect.h).
  std::atomic<uint64_t>& guard(uint32_t i) const { return guard_[i]; }
  // The node's protection grace (protect.h); 0: no protection. Set by the
  // creator before any peer attaches (every rank agreed on it at init).
  uint32_t protect_grace_ms() const { return globals().protect_grace_ms.load(std::memory_order_relaxed); }
  void set_protect_grace_ms(uint32_t ms) const { globals().protect_grace_ms.store(ms, std::memory_order_relaxed); }
  // Rank r copies the node's collective loads (it has a queue), or no longer.
  void set_copier(uint32_t r, bool on) const;

  uint32_t regular_slots() const { return regular_; }
  uint32_t total_slots() const { return total_; }
  uint32_t bucket_count() const { return bucket_mask_ + 1; }
  uint32_t bucket_mask() const { return bucket_mask_; }
  uint32_t shards_per_block() const { return shards_per_block_; }
  uint32_t max_ranks() const { return max_ranks_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  EvictMode evict_mode() const { return evict_; }

  // Registers the calling process as local rank `r` (fails, naming the pid,
  // if a live process holds it). A record left by a dead process must be
  // reaped first (recovery.h); join reports kPeerDead in that case.
  [[nodiscard]] Result join(uint32_t r);
  // The record of rank r names a dead process: make it name this one (state
  // kJoining), so that nobody mistakes the leftovers' holder id for a dead
  // rank while this process cleans them up (join_rank in recovery.h).
  [[nodiscard]] Result adopt_dead_record(uint32_t r);
  void finish_join(uint32_t r);
  // Unregisters rank r. Its references should all be released by now; any
  // left (a pin, an owner's hold, a load it owns and never marked) are
  // released here as recovery would for a dead rank, and named in a warning,
  // so that a leak cannot outlive the process that made it. That takes a
  // walk of every slot; a caller that knows exactly that the rank holds
  // nothing (CacheBuffer::references_held() == 0 with its threads stopped)
  // passes holds_references = false and leave costs what the rank holds:
  // nothing. Returns the slots walked.
  uint32_t leave(uint32_t r, bool holds_references = true);
  // True while rank r is registered by a process that still runs.
  bool rank_alive(uint32_t r) const;

 private:
  Result map_and_check(int fd, const CtrlParams* expect, CtrlPages pages);
  Result map_region(int fd, CtrlPages pages, uint64_t* file_bytes);
  // create(): a new region of region_bytes (hugetlb when pages allow and the
  // kernel has them, else a sealed memfd), mapped into this empty object.
  [[nodiscard]] Result map_new_region(uint64_t region_bytes, CtrlPages pages);
  void cache_fields();
  void reset();

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  Bucket* buckets_ = nullptr;
  SlotMeta* slots_ = nullptr;
  uint8_t* pins_ = nullptr;
  uint64_t pin_row_bytes_ = 0;
  std::atomic<uint8_t>* accessed_ = nullptr;
  std::atomic<uint32_t>* stored_ = nullptr;
  std::atomic<uint64_t>* guard_ = nullptr;
  uint32_t regular_ = 0;
  uint32_t total_ = 0;
  uint32_t bucket_mask_ = 0;
  uint32_t shards_per_block_ = 0;
  uint32_t max_ranks_ = 0;
  uint64_t slot_bytes_ = 0;
  EvictMode evict_ = EvictMode::kClock;
  bool hugetlb_ = false;
  std::string pages_note_;
};

// Bumped whenever this process maps or unmaps a control region: per-thread
// state derived from a region (CLOCK hand runs) is stale once it changes.
extern std::atomic<uint64_t> g_ctrl_epoch;
inline uint64_t ctrl_epoch() { return g_ctrl_epoch.load(std::memory_order_relaxed); }

// Holder id used in lock words and claims for local rank r.
inline uint32_t holder_id(uint32_t rank) { return rank + 1; }

}  // namespace ucm
