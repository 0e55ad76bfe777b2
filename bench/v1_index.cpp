#include "v1_index.h"

#include <errno.h>
#include <sys/mman.h>

#include <functional>
#include <new>
#include <string_view>

#include "ctrl/layout.h"
#include "sync/spin.h"

namespace ucm::bench {
namespace {

size_t align64(size_t x) { return (x + 63) & ~size_t{63}; }

bool is_prime(uint32_t n) {
  if (n < 2) return false;
  for (uint32_t d = 2; static_cast<uint64_t>(d) * d <= n; ++d)
    if (n % d == 0) return false;
  return true;
}

}  // namespace

uint32_t V1Index::buckets_for(uint32_t slots) {
  uint32_t b = kV1Buckets;
  if (slots > b)
    for (b = slots; !is_prime(b); ++b) {
    }
  return b;
}

V1Index* V1Index::create(uint32_t slots) {
  const uint32_t buckets = buckets_for(slots);
  const size_t obj = align64(sizeof(V1Index));
  const size_t mtx = align64(sizeof(pthread_mutex_t) * buckets);
  const size_t heads = align64(sizeof(uint32_t) * buckets);
  const size_t nodes = align64(sizeof(Node) * slots);
  const size_t spins = align64(sizeof(std::atomic<uint32_t>) * slots);
  const size_t bytes = obj + mtx + heads + nodes + spins;
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  auto* base = static_cast<uint8_t*>(m);
  auto* ix = new (base) V1Index();
  ix->bytes_ = bytes;
  ix->slots_ = slots;
  ix->bucket_count_ = buckets;
  ix->mutexes_ = reinterpret_cast<pthread_mutex_t*>(base + obj);
  ix->heads_ = reinterpret_cast<uint32_t*>(base + obj + mtx);
  ix->nodes_ = reinterpret_cast<Node*>(base + obj + mtx + heads);
  ix->spin_ = reinterpret_cast<std::atomic<uint32_t>*>(base + obj + mtx + heads + nodes);
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  for (uint32_t b = 0; b < buckets; ++b) {
    const int rc = pthread_mutex_init(&ix->mutexes_[b], &a);
    if (rc != 0) {
      pthread_mutexattr_destroy(&a);
      munmap(m, bytes);
      errno = rc;
      return nullptr;
    }
    ix->heads_[b] = kNoSlot;
  }
  pthread_mutexattr_destroy(&a);
  for (uint32_t i = 0; i < slots; ++i) {
    ix->nodes_[i] = Node{0, 0, kEmptyShard, kNoSlot, 0, 0, 0, {0, 0}};
    new (&ix->spin_[i]) std::atomic<uint32_t>(0);
  }
  return ix;
}

void V1Index::destroy(V1Index* ix) {
  if (!ix) return;
  const size_t bytes = ix->bytes_;
  for (uint32_t b = 0; b < ix->bucket_count_; ++b) pthread_mutex_destroy(&ix->mutexes_[b]);
  ix->~V1Index();
  munmap(ix, bytes);
}

uint32_t V1Index::bucket_of_key(const Key& k) const {
  static_assert(sizeof(BlockId) == 16, "v1 hashes the id's 16 bytes");
  const size_t h = std::hash<std::string_view>{}(
      std::string_view(reinterpret_cast<const char*>(&k.block), sizeof(BlockId)));
  return static_cast<uint32_t>((h + k.shard) % bucket_count_);
}

void V1Index::lock_bucket(uint32_t b) {
  // A holder that died leaves EOWNERDEAD: take the mutex over as v1 did.
  if (pthread_mutex_lock(&mutexes_[b]) == EOWNERDEAD) pthread_mutex_consistent(&mutexes_[b]);
}

void V1Index::spin_lock(uint32_t i) {
  std::atomic<uint32_t>& s = spin_[i];
  while (s.exchange(1, std::memory_order_acquire) != 0)
    while (s.load(std::memory_order_relaxed) != 0) cpu_relax();
}

void V1Index::spin_unlock(uint32_t i) { spin_[i].store(0, std::memory_order_release); }

void V1Index::unlink(uint32_t b, uint32_t i) {
  uint32_t* link = &heads_[b];
  while (*link != kNoSlot && *link != i) link = &nodes_[*link].next;
  if (*link == i) *link = nodes_[i].next;
}

V1Index::Outcome V1Index::get(const Key& k, uint32_t* slot, bool* evicted) {
  const uint32_t b = bucket_of_key(k);
  lock_bucket(b);
  for (uint32_t i = heads_[b]; i != kNoSlot; i = nodes_[i].next) {
    const Node& n = nodes_[i];
    if (n.key_lo != k.block.lo || n.key_hi != k.block.hi || n.shard != k.shard) continue;
    spin_lock(i);
    ++nodes_[i].ref;
    const bool ready = nodes_[i].ready != 0;
    spin_unlock(i);
    pthread_mutex_unlock(&mutexes_[b]);
    *slot = i;
    *evicted = false;
    return ready ? Outcome::kHit : Outcome::kWaiter;
  }
  // Miss: the ring cursor, cursor + 1 mod N, skipping referenced slots and
  // slots whose bucket is busy (v1's cross-bucket try-lock and retry).
  for (uint64_t step = 0; step < 2ull * slots_; ++step) {
    const uint32_t v = static_cast<uint32_t>(cursor_.fetch_add(1, std::memory_order_relaxed) % slots_);
    spin_lock(v);
    Node& n = nodes_[v];
    if (n.ref != 0) {
      spin_unlock(v);
      continue;
    }
    bool had_key = false;
    if (n.shard != kEmptyShard) {
      Key old;
      old.block.lo = n.key_lo;
      old.block.hi = n.key_hi;
      old.shard = n.shard;
      const uint32_t ob = bucket_of_key(old);
      if (ob != b) {
        const int rc = pthread_mutex_trylock(&mutexes_[ob]);
        if (rc == EOWNERDEAD) pthread_mutex_consistent(&mutexes_[ob]);
        else if (rc != 0) {
          spin_unlock(v);
          continue;
        }
      }
      unlink(ob, v);
      if (ob != b) pthread_mutex_unlock(&mutexes_[ob]);
      had_key = true;
    }
    n.key_lo = k.block.lo;
    n.key_hi = k.block.hi;
    n.shard = k.shard;
    n.ref = 1;
    n.ready = 0;
    n.failed = 0;
    spin_unlock(v);
    n.next = heads_[b];
    heads_[b] = v;
    pthread_mutex_unlock(&mutexes_[b]);
    *slot = v;
    *evicted = had_key;
    return Outcome::kOwner;
  }
  pthread_mutex_unlock(&mutexes_[b]);
  return Outcome::kNoSpace;
}

void V1Index::mark_ready(uint32_t slot) {
  spin_lock(slot);
  nodes_[slot].ready = 1;
  spin_unlock(slot);
}

void V1Index::release(uint32_t slot) {
  spin_lock(slot);
  --nodes_[slot].ref;
  spin_unlock(slot);
}

}  // namespace ucm::bench
