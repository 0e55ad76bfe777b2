// The v1 model (bench/v1_index.h) is the control group of ucm_cachebench, so
// it must cost what v1 costs: v1's hash of the key and its prime bucket
// modulo (issue 15), on top of the index's shape (hits, misses that evict).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <set>

#include "v1_index.h"

namespace ucm::bench {
namespace {

Key key(uint64_t lo, uint64_t hi, uint32_t shard) {
  Key k;
  k.block.lo = lo;
  k.block.hi = hi;
  k.shard = shard;
  return k;
}

bool is_prime(uint32_t n) {
  for (uint32_t d = 2; d * d <= n; ++d)
    if (n % d == 0) return false;
  return n >= 2;
}

TEST(V1Index, BucketCountIsV1sPrime) {
  EXPECT_EQ(V1Index::buckets_for(1), 16411u);
  EXPECT_EQ(V1Index::buckets_for(4096), 16411u);
  EXPECT_EQ(V1Index::buckets_for(16411), 16411u);
  const uint32_t big = V1Index::buckets_for(512 * 1024);
  EXPECT_GE(big, 512u * 1024u);
  EXPECT_TRUE(is_prime(big)) << big;
  for (uint32_t n = 512 * 1024; n < big; ++n) EXPECT_FALSE(is_prime(n)) << n;
}

TEST(V1Index, BucketIsStdHashOfTheIdBytesModuloThePrime) {
  V1Index* ix = V1Index::create(64);
  ASSERT_NE(ix, nullptr);
  EXPECT_EQ(ix->bucket_count(), 16411u);
  for (uint64_t i = 0; i < 1000; ++i) {
    const Key k = key(i * 0x9E3779B97F4A7C15ull, ~i, static_cast<uint32_t>(i % 7));
    unsigned char bytes[16];
    std::memcpy(bytes, &k.block.lo, 8);
    std::memcpy(bytes + 8, &k.block.hi, 8);
    // libstdc++'s std::hash of bytes is _Hash_bytes with this seed, as v1 hashed.
    const size_t h = std::_Hash_bytes(bytes, 16, static_cast<size_t>(0xc70f6907UL));
    EXPECT_EQ(ix->bucket_of_key(k), (h + k.shard) % 16411u) << i;
  }
  V1Index::destroy(ix);
}

TEST(V1Index, HitsMissesAndEvictsAcrossCollidingKeys) {
  V1Index* ix = V1Index::create(4);
  ASSERT_NE(ix, nullptr);
  // Two keys in one bucket: the chain holds both.
  const Key a = key(1, 2, 0);
  Key b = a;
  for (uint64_t i = 3; ix->bucket_of_key(b) != ix->bucket_of_key(a) || b == a; ++i) b = key(i, i, 0);
  uint32_t sa = 0, sb = 0;
  bool ev = true;
  ASSERT_EQ(ix->get(a, &sa, &ev), V1Index::Outcome::kOwner);
  EXPECT_FALSE(ev);
  ASSERT_EQ(ix->get(b, &sb, &ev), V1Index::Outcome::kOwner);
  EXPECT_NE(sa, sb);
  EXPECT_EQ(ix->get(a, &sa, &ev), V1Index::Outcome::kWaiter);  // not Ready yet
  ix->release(sa);
  ix->mark_ready(sa);
  ix->mark_ready(sb);
  ix->release(sa);
  ix->release(sb);
  uint32_t s = 0;
  EXPECT_EQ(ix->get(a, &s, &ev), V1Index::Outcome::kHit);
  EXPECT_EQ(s, sa);
  ix->release(s);
  EXPECT_EQ(ix->get(b, &s, &ev), V1Index::Outcome::kHit);
  EXPECT_EQ(s, sb);
  ix->release(s);
  // Filling past 4 slots evicts, and an evicted key misses again.
  std::set<uint32_t> slots;
  int evictions = 0;
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_EQ(ix->get(key(100 + i, 0, 1), &s, &ev), V1Index::Outcome::kOwner);
    evictions += ev ? 1 : 0;
    slots.insert(s);
    ix->mark_ready(s);
    ix->release(s);
  }
  EXPECT_EQ(slots.size(), 4u);
  EXPECT_EQ(evictions, 6);  // 2 free slots, then every get evicts
  EXPECT_EQ(ix->get(a, &s, &ev), V1Index::Outcome::kOwner);
  ix->release(s);
  V1Index::destroy(ix);
}

}  // namespace
}  // namespace ucm::bench
