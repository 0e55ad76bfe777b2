// RepeatTable (common/repeat_table.h): the first entry that repeats an
// earlier key, and the entry it repeats, for tasks on the stack and on the
// heap, with keys whose hashes collide (filter bit and place shared, keys
// different) and shards of one block.
#include "common/repeat_table.h"

#include <vector>

#include <gtest/gtest.h>

namespace ucm::test {
namespace {

Key key(uint64_t lo, uint64_t hi, uint32_t shard = 0) {
  Key k;
  k.block.lo = lo;
  k.block.hi = hi;
  k.shard = shard;
  return k;
}

// Two different blocks with one block_hash: lo ^ hi * C is the same.
Key colliding(uint64_t x, uint64_t hi) { return key(x ^ (hi * 0xC2B2AE3D27D4EB4Full), hi); }

// The first repeat of `keys` as (entry, earlier), or (n, n) when none.
std::pair<size_t, size_t> first_repeat(const std::vector<Key>& keys) {
  RepeatTable t(keys.size());
  auto at = [&](size_t i) -> const Key& { return keys[i]; };
  for (size_t i = 0; i < keys.size(); ++i)
    if (const size_t e = t.add(at, i); e != i) return {i, e};
  return {keys.size(), keys.size()};
}

std::vector<Key> distinct(size_t n) {
  std::vector<Key> keys;
  for (size_t i = 0; i < n; ++i) keys.push_back(key(7'000'000 + i, ~(7'000'000 + i)));
  return keys;
}

TEST(RepeatTable, DistinctKeysHaveNoRepeatOnTheStackAndOnTheHeap) {
  for (size_t n : {1, 2, 63, 64, 65, 4096}) {
    const std::vector<Key> keys = distinct(n);
    EXPECT_EQ(first_repeat(keys), std::make_pair(n, n)) << n << " entries";
  }
}

TEST(RepeatTable, NamesTheFirstRepeatInEntryOrderAndTheEntryItRepeats) {
  for (size_t n : {6, 64, 150, 4096}) {
    std::vector<Key> keys = distinct(n);
    keys[n - 1] = keys[1];
    keys[n / 2 + 1] = keys[n / 2 - 1];
    EXPECT_EQ(first_repeat(keys), std::make_pair(n / 2 + 1, n / 2 - 1)) << n << " entries";
  }
  std::vector<Key> same(100, key(5, 6, 2));
  EXPECT_EQ(first_repeat(same), std::make_pair(size_t{1}, size_t{0})) << "every entry one key";
}

TEST(RepeatTable, CollidingHashesAreToldApartByTheKey) {
  const Key a = colliding(0x1234, 11), b = colliding(0x1234, 12), c = colliding(0x1234, 13);
  ASSERT_EQ(KeyHash{}(a), KeyHash{}(b)) << "the test's keys must collide";
  ASSERT_FALSE(a == b);
  EXPECT_EQ(first_repeat({a, b, c}), std::make_pair(size_t{3}, size_t{3}));
  EXPECT_EQ(first_repeat({a, b, c, b}), std::make_pair(size_t{3}, size_t{1})) << "found behind a colliding entry";
  EXPECT_EQ(first_repeat({a, b, c, a}), std::make_pair(size_t{3}, size_t{0})) << "found at the end of the chain";
  // Many colliding entries among distinct ones, the repeat of one of them last.
  std::vector<Key> keys = distinct(200);
  for (size_t i = 0; i < 200; i += 3) keys[i] = colliding(0x99, 1000 + i);
  keys.push_back(keys[30]);
  EXPECT_EQ(first_repeat(keys), std::make_pair(size_t{200}, size_t{30}));
}

TEST(RepeatTable, TheSameShardOfAnotherBlockAndAnotherShardAreOtherKeys) {
  EXPECT_EQ(first_repeat({key(1, 2, 0), key(1, 2, 1), key(1, 3, 0), key(2, 2, 0)}), std::make_pair(size_t{4}, size_t{4}));
  EXPECT_EQ(first_repeat({key(1, 2, 0), key(1, 2, 1), key(1, 2, 0)}), std::make_pair(size_t{2}, size_t{0}));
}

}  // namespace
}  // namespace ucm::test
