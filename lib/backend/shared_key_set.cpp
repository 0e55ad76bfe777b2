#include "backend/shared_key_set.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cinttypes>
#include <cstddef>

#include "common/log.h"

namespace ucm {
namespace {

constexpr uint64_t kStateMask = 0x3;

uint64_t slot_count_for(uint64_t capacity) { return std::bit_ceil(capacity * 2); }

// Sets a header field that is still 0 to `want`; true when it holds `want`
// now (set here or by another process), else *found is what it holds.
bool agree(std::atomic<uint64_t>& field, uint64_t want, uint64_t* found) {
  uint64_t cur = 0;
  if (field.compare_exchange_strong(cur, want, std::memory_order_acq_rel, std::memory_order_acquire)) return true;
  *found = cur;
  return cur == want;
}

bool holds(const KeySetSlot& s, const Key& k) {
  return s.lo.load(std::memory_order_relaxed) == k.block.lo && s.hi.load(std::memory_order_relaxed) == k.block.hi &&
         s.shard.load(std::memory_order_relaxed) == k.shard;
}

}  // namespace

uint64_t SharedKeySet::region_bytes(uint64_t capacity) {
  return sizeof(KeySetHeader) + slot_count_for(std::max<uint64_t>(capacity, 1)) * sizeof(KeySetSlot);
}

Result SharedKeySet::attach(void* base, uint64_t bytes, uint64_t capacity, SharedKeySet* out) {
  if (capacity == 0 || capacity > kKeySetMaxCapacity)
    return fail(Result::kInvalidArg, "key set capacity %" PRIu64 " is not in [1, %" PRIu64 "]", capacity,
                kKeySetMaxCapacity);
  if (!base || reinterpret_cast<uintptr_t>(base) % alignof(KeySetHeader) != 0)
    return fail(Result::kInvalidArg, "key set region at %p is not 64-byte aligned", base);
  const uint64_t need = region_bytes(capacity);
  if (bytes < need)
    return fail(Result::kInvalidArg, "key set of capacity %" PRIu64 " needs %" PRIu64 " bytes; the region has %" PRIu64,
                capacity, need, bytes);
  auto* h = static_cast<KeySetHeader*>(base);
  uint64_t found = 0;
  if (!agree(h->magic, kKeySetMagic, &found))
    return fail(Result::kCorrupt, "key set region has magic 0x%016" PRIx64 ", not 0x%016" PRIx64, found, kKeySetMagic);
  if (!agree(h->abi, kKeySetAbi, &found))
    return fail(Result::kAbiMismatch, "key set region has ABI %" PRIu64 "; this build speaks %" PRIu64, found,
                kKeySetAbi);
  if (!agree(h->capacity, capacity, &found))
    return fail(Result::kConfigMismatch, "key set region holds %" PRIu64 " keys; this process expects %" PRIu64, found,
                capacity);
  const uint64_t slots = slot_count_for(capacity);
  if (!agree(h->slot_count, slots, &found))
    return fail(Result::kCorrupt, "key set region of capacity %" PRIu64 " has %" PRIu64 " slots, not %" PRIu64,
                capacity, found, slots);
  SharedKeySet s;
  s.header_ = h;
  s.slots_ = reinterpret_cast<KeySetSlot*>(static_cast<uint8_t*>(base) + sizeof(KeySetHeader));
  s.capacity_ = capacity;
  s.mask_ = slots - 1;
  *out = s;
  return Result::kOk;
}

uint64_t SharedKeySet::home(const Key& k) const {
  // A cross-process contract like bucket_of(): a fixed mix of the key's own bits.
  uint64_t z = k.block.lo ^ (k.block.hi * 0xC2B2AE3D27D4EB4Full) ^ (uint64_t{k.shard} * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) & mask_;
}

bool SharedKeySet::contains(const Key& k) const {
  const uint64_t h = home(k);
  for (uint64_t i = 0; i <= mask_; ++i) {
    const KeySetSlot& s = slots_[(h + i) & mask_];
    const uint64_t w = s.word.load(std::memory_order_acquire);  // A2, pairs with R1
    const uint64_t state = w & kStateMask;
    if (state == kEmpty) return false;
    if (state == kFull && holds(s, k)) return true;
  }
  return false;
}

Result SharedKeySet::insert(const Key& k) {
  if (contains(k)) return Result::kOk;
  if (header_->reserved.fetch_add(1, std::memory_order_acq_rel) >= capacity_) {
    header_->reserved.fetch_sub(1, std::memory_order_acq_rel);
    return fail(Result::kNoSpace,
                "key set full: capacity %" PRIu64 " keys; cannot add block %016" PRIx64 "%016" PRIx64 " shard %u",
                capacity_, k.block.hi, k.block.lo, k.shard);
  }
  const uint64_t me = static_cast<uint64_t>(static_cast<uint32_t>(getpid())) << 32;
  const uint64_t h = home(k);
  for (uint64_t i = 0; i <= mask_; ++i) {
    KeySetSlot& s = slots_[(h + i) & mask_];
    uint64_t w = s.word.load(std::memory_order_acquire);
    for (;;) {
      const uint64_t state = w & kStateMask;
      if (state == kEmpty) {
        // A1: on failure w is reloaded and the slot examined again.
        if (!s.word.compare_exchange_weak(w, kClaimed | me, std::memory_order_acq_rel, std::memory_order_acquire))
          continue;
        s.lo.store(k.block.lo, std::memory_order_relaxed);
        s.hi.store(k.block.hi, std::memory_order_relaxed);
        s.shard.store(k.shard, std::memory_order_relaxed);
        s.word.store(kFull | me, std::memory_order_release);  // R1: the key is in
        return Result::kOk;
      }
      if (state == kFull && holds(s, k)) {
        header_->reserved.fetch_sub(1, std::memory_order_acq_rel);  // another process put it in meanwhile
        return Result::kOk;
      }
      break;  // another key, or a claim in progress (or abandoned): probe on
    }
  }
  // Unreachable while claims <= capacity <= half the slots; a corrupt region otherwise.
  header_->reserved.fetch_sub(1, std::memory_order_acq_rel);
  return fail(Result::kCorrupt, "key set of capacity %" PRIu64 " has no empty slot left among %" PRIu64, capacity_,
              mask_ + 1);
}

uint64_t SharedKeySet::used() const {
  return std::min(header_->reserved.load(std::memory_order_acquire), capacity_);
}

}  // namespace ucm
