// A fixed-capacity set of keys in memory that several processes map: the sim
// store's dumped keys, kept for the whole node (node_state.h).
//
// Lock-free open addressing with linear probing. Inserts claim a slot by
// compare-and-swap; lookups are loads only and never wait for anybody. Keys
// are never removed. The memory starts zeroed (a fresh memfd or anonymous
// mapping), and zero means empty, so there is no initialisation step a dying
// process could leave half done.
//
// Region layout (ABI between the ranks of a node; change it, bump kKeySetAbi):
//   [KeySetHeader: 128 bytes][KeySetSlot x slot_count]
// slot_count is the power of two >= 2 * capacity: at most `capacity` slots are
// ever claimed, so at least half stay empty and every probe run ends at an
// empty slot within a few steps.
//
// The slot word, who writes it, and the pairs (DPDK's labels):
//   kEmpty   -> kClaimed|pid  CAS by an inserter that holds a reservation (A1)
//   kClaimed -> kFull|pid     release store by that inserter, after it wrote
//                             the key fields (R1)
//   nothing else: a full slot never changes, a slot is never emptied.
// A reader's acquire load of the word (A2) pairs with R1, so a reader that
// sees kFull sees the whole key. A claimed slot is skipped: its key is not in
// the set yet (an insert is complete only at R1).
//
// Capacity: `reserved` counts the inserts allowed to claim a slot. An insert
// first looks the key up (present: done, nothing reserved), then takes a
// reservation (fetch_add; over capacity: undo and fail "full"), then probes
// for an empty slot or its own key (put there meanwhile by another process:
// give the reservation back).
//
// A process killed mid-insert leaves the set usable by the others: killed
// holding only a reservation, it costs one unit of capacity; killed after its
// claim, it leaves a claimed slot forever, which every reader and inserter
// steps over (a tombstone that still counts against capacity). Two processes
// inserting one key at once may both claim a slot; a lookup finds either, and
// the duplicate costs one unit of capacity. "Full" therefore means "capacity
// claims made", which is at most capacity distinct keys.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/key.h"
#include "common/result.h"

namespace ucm {

constexpr uint64_t kKeySetMagic = 0x3154455359454b55ull;  // "UKEYSET1"
constexpr uint64_t kKeySetAbi = 1;
constexpr uint64_t kKeySetMaxCapacity = uint64_t{1} << 24;

// Written once by whichever process attaches first: each field goes from 0 to
// its value by one CAS, and a process that finds another value refuses the
// region, so there is no window in which a half-written header is believed.
struct alignas(64) KeySetHeader {
  std::atomic<uint64_t> magic;       // kKeySetMagic
  std::atomic<uint64_t> abi;         // kKeySetAbi
  std::atomic<uint64_t> capacity;    // keys
  std::atomic<uint64_t> slot_count;  // power of two >= 2 * capacity
  uint64_t pad0[4];
  std::atomic<uint64_t> reserved;    // inserts allowed to claim a slot; any inserter
  uint64_t pad1[7];
};
static_assert(sizeof(KeySetHeader) == 128);
static_assert(offsetof(KeySetHeader, reserved) == 64);

struct KeySetSlot {
  std::atomic<uint64_t> word;  // state (bits 0-1) | claimer's pid << 32; see above
  std::atomic<uint64_t> lo;    // key fields: written by the claimer before R1
  std::atomic<uint64_t> hi;
  std::atomic<uint32_t> shard;
  uint32_t pad;
};
static_assert(sizeof(KeySetSlot) == 32);

class SharedKeySet {
 public:
  static constexpr uint64_t kEmpty = 0, kClaimed = 1, kFull = 2;

  // Bytes of region a set of `capacity` keys needs.
  static uint64_t region_bytes(uint64_t capacity);
  // Uses the region at `base` (zeroed, or already used by another process
  // with the same capacity). The region stays owned by the caller.
  [[nodiscard]] static Result attach(void* base, uint64_t bytes, uint64_t capacity, SharedKeySet* out);

  // kOk when k is in the set on return (inserted now or before); kNoSpace,
  // naming the capacity and the key, when it is full.
  [[nodiscard]] Result insert(const Key& k);
  bool contains(const Key& k) const;

  uint64_t capacity() const { return capacity_; }
  // Claims made so far (keys, duplicates and tombstones), at most capacity.
  uint64_t used() const;

 private:
  uint64_t home(const Key& k) const;
  KeySetHeader* header_ = nullptr;
  KeySetSlot* slots_ = nullptr;
  uint64_t capacity_ = 0;
  uint64_t mask_ = 0;
};

}  // namespace ucm
