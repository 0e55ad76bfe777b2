// A model of UCM's v1 cache index: ucm_cachebench's control group.
//
// The issue that asked for the new core gave v1's cost on this machine kind
// (35 ns per hit, 80 ns per miss with eviction, 150-190 ns per hit when two
// processes hit adjacent slots) and its shape: "a robust mutex, two spinlocks
// and a hash" per hit, per-slot locks that share cache lines, the ready state
// as plain flags read under a lock, a pure ring cursor, and a miss that
// evicts, unlinks and rehangs with a cross-bucket try-lock and retry (seed
// 2.2-2.3, 3.4). This file rebuilds that shape, so that both indexes run side
// by side in one run on whatever the machine is doing at the time, and the
// new core is judged by ratios as well as by the anchors' absolute ns.
//
// It is a model, not v1's code: the per-bucket robust mutexes, the packed
// per-slot spinlocks next to their reference counts and the flags under them
// follow the description; details the description leaves open (how a
// waiter is registered, what a failed try-lock does) take the simplest form.
// It has no crash recovery beyond what robust mutexes give and no waiting;
// the benchmark needs neither.
//
// The hash is v1's, because it is part of what a v1 hit costs (issue 15: the
// real v1 costs 2.2-2.6x the earlier model per hit): std::hash over the id's
// 16 bytes (libstdc++'s std::_Hash_bytes, 14.5% of a real v1 hit) plus the
// shard, then `%` by v1's prime bucket count, 16411 (about 12%), a hardware
// division since the count is a member read at run time. A cache of more
// than 16411 slots gets the smallest prime at least its slot count (the
// model's choice, where v1's description is silent: it keeps the chains as
// short as ucmcache's, so chain walks never make the model look slower).
//
// Memory: one MAP_SHARED anonymous mapping, made before the benchmark forks,
// so the forked rank sees the same index at the same address.
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "common/key.h"

namespace ucm::bench {

class V1Index {
 public:
  enum class Outcome { kHit, kOwner, kWaiter, kNoSpace };

  // Builds an empty index of `slots` slots in shared memory; null on failure
  // (errno set by mmap or pthread).
  static V1Index* create(uint32_t slots);
  static void destroy(V1Index* ix);

  static constexpr uint32_t kV1Buckets = 16411;  // v1's prime bucket count
  // The bucket count for a cache of `slots` slots: 16411, or the smallest
  // prime >= slots above that.
  static uint32_t buckets_for(uint32_t slots);
  uint32_t bucket_count() const { return bucket_count_; }
  // v1's bucket of a key: (std::hash of the id's 16 bytes + shard) % buckets.
  uint32_t bucket_of_key(const Key& k) const;

  // Hit: the bucket's robust mutex, the chain walk, the slot's spinlock (ref++).
  // Miss: a ring victim with no references, whose bucket is try-locked when it
  // is not ours (busy: next victim), unlinked, re-keyed, hung on our chain.
  Outcome get(const Key& k, uint32_t* slot, bool* evicted);
  void mark_ready(uint32_t slot);  // the slot's spinlock, ready = true
  void release(uint32_t slot);     // the slot's spinlock, ref--

 private:
  struct Node {
    uint64_t key_lo;
    uint64_t key_hi;
    uint32_t shard;  // kEmptyShard when the slot holds nothing
    uint32_t next;   // chain link, under the bucket mutex
    uint32_t ref;    // references, under the slot's spinlock
    uint8_t ready;   // under the slot's spinlock
    uint8_t failed;
    uint8_t pad_[2];
  };
  static_assert(sizeof(Node) == 32);

  V1Index() = default;
  void lock_bucket(uint32_t b);
  void spin_lock(uint32_t i);
  void spin_unlock(uint32_t i);
  void unlink(uint32_t b, uint32_t i);

  size_t bytes_ = 0;
  uint32_t slots_ = 0;
  uint32_t bucket_count_ = 0;
  alignas(64) std::atomic<uint64_t> cursor_{0};  // the ring
  alignas(64) pthread_mutex_t* mutexes_ = nullptr;  // one robust, process-shared mutex per bucket
  uint32_t* heads_ = nullptr;                       // bucket -> first slot, under its mutex
  Node* nodes_ = nullptr;
  std::atomic<uint32_t>* spin_ = nullptr;  // one 4-byte spinlock per slot, packed: 16 slots per line
};

}  // namespace ucm::bench
