// OwnMemory: which of the cache's own mappings a buffer of shard_bytes
// overlaps (api/own_memory.h), at every edge, and near the top of the
// address space, where begin + bytes would wrap. overlapping_pair: two
// destinations of one task that share a byte, in any order.
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "api/own_memory.h"

namespace {

const void* at(uintptr_t a) { return reinterpret_cast<const void*>(a); }

TEST(OwnMemory, ABufferOverlapsARangeOnlyWhenTheyShareAByte) {
  ucm::OwnMemory m;
  m.add(at(0x30000), 0x10000, "data segment 1");
  m.add(at(0x10000), 0x10000, "data segment 0");
  m.add(at(0x80000), 0x1000, "control region");
  // Touching either end from outside: no overlap.
  EXPECT_EQ(m.overlap(at(0x0f000), 0x1000), nullptr);
  EXPECT_EQ(m.overlap(at(0x20000), 0x10000), nullptr);  // the gap between the segments
  EXPECT_EQ(m.overlap(at(0x81000), 0x1000), nullptr);
  EXPECT_EQ(m.overlap(at(0x1000), 0x1000), nullptr);    // below the hull
  EXPECT_EQ(m.overlap(at(0x90000), 0x1000), nullptr);   // above it
  // One byte in: the range that holds it.
  ASSERT_NE(m.overlap(at(0x0f000), 0x1001), nullptr);
  EXPECT_EQ(m.overlap(at(0x0f000), 0x1001)->what, "data segment 0");
  EXPECT_EQ(m.overlap(at(0x1ffff), 0x1000)->what, "data segment 0");
  EXPECT_EQ(m.overlap(at(0x2ffff), 0x1000)->what, "data segment 1");
  EXPECT_EQ(m.overlap(at(0x80fff), 1)->what, "control region");
  // Inside, and around a whole range.
  EXPECT_EQ(m.overlap(at(0x34000), 0x100)->what, "data segment 1");
  EXPECT_EQ(m.overlap(at(0x70000), 0x20000)->what, "control region");
  EXPECT_EQ(m.overlap(at(0x34000), 0), nullptr);
}

TEST(OwnMemory, NearTheTopOfTheAddressSpaceNothingWraps) {
  ucm::OwnMemory m;
  const uintptr_t top = UINTPTR_MAX - 0xfff;
  m.add(at(top), 0x10000, "store state");  // would wrap: ends at the top
  m.add(at(0x10000), 0x1000, "control region");
  EXPECT_EQ(m.overlap(at(UINTPTR_MAX - 0x10), 0x100)->what, "store state");
  EXPECT_EQ(m.overlap(at(top - 0x1000), 0x1000), nullptr);
  // A buffer whose end wraps does not reach the range at the bottom.
  EXPECT_EQ(m.overlap(at(UINTPTR_MAX - 0x100000), 0x200000)->what, "store state");
  ucm::OwnMemory empty;
  EXPECT_EQ(empty.overlap(at(0x10000), 0x1000), nullptr);
  m.clear();
  EXPECT_EQ(m.overlap(at(0x10000), 0x1000), nullptr);
}

// Two dsts of a task that share a byte: found in ascending, descending and
// shuffled orders, at one byte of overlap and not at zero, with the lower
// index first; a task cut from one buffer (the common case) has none.
TEST(OverlappingPair, TwoBuffersShareAByteOnlyWhenTheyOverlap) {
  const uint64_t sz = 0x1000;
  size_t a = 99, b = 99;
  std::vector<const void*> up{at(0x10000), at(0x11000), at(0x12000), at(0x13000)};
  EXPECT_FALSE(ucm::overlapping_pair(up.data(), up.size(), sz, &a, &b));
  std::vector<const void*> down{at(0x13000), at(0x12000), at(0x11000), at(0x10000)};
  EXPECT_FALSE(ucm::overlapping_pair(down.data(), down.size(), sz, &a, &b));
  std::vector<const void*> gaps{at(0x20000), at(0x10000), at(0x40000), at(0x11000)};
  EXPECT_FALSE(ucm::overlapping_pair(gaps.data(), gaps.size(), sz, &a, &b));
  EXPECT_FALSE(ucm::overlapping_pair(up.data(), 1, sz, &a, &b));
  EXPECT_FALSE(ucm::overlapping_pair(up.data(), 0, sz, &a, &b));

  std::vector<const void*> same{at(0x10000), at(0x30000), at(0x20000), at(0x30000)};
  ASSERT_TRUE(ucm::overlapping_pair(same.data(), same.size(), sz, &a, &b));
  EXPECT_EQ(a, 1u);
  EXPECT_EQ(b, 3u);
  std::vector<const void*> one_byte{at(0x10000), at(0x11000), at(0x12fff), at(0x12000)};
  ASSERT_TRUE(ucm::overlapping_pair(one_byte.data(), one_byte.size(), sz, &a, &b));
  EXPECT_EQ(a, 2u);
  EXPECT_EQ(b, 3u);
  std::vector<const void*> shuffled{at(0x50000), at(0x10000), at(0x30000), at(0x0f001)};
  ASSERT_TRUE(ucm::overlapping_pair(shuffled.data(), shuffled.size(), sz, &a, &b));
  EXPECT_EQ(a, 1u);
  EXPECT_EQ(b, 3u);
}

TEST(OverlappingPair, NearTheTopOfTheAddressSpaceNothingWraps) {
  const uint64_t sz = 0x1000;
  size_t a = 99, b = 99;
  // The last buffer would end past the top: it still overlaps only what it reaches.
  std::vector<const void*> top{at(UINTPTR_MAX - 0x800), at(0x1000), at(UINTPTR_MAX - 0x1800)};
  EXPECT_FALSE(ucm::overlapping_pair(top.data(), top.size(), sz, &a, &b));
  top.push_back(at(UINTPTR_MAX - 0x10));
  ASSERT_TRUE(ucm::overlapping_pair(top.data(), top.size(), sz, &a, &b));
  EXPECT_EQ(a, 0u);
  EXPECT_EQ(b, 3u);
  // A huge shard size: every pair overlaps.
  std::vector<const void*> far{at(0x1000), at(UINTPTR_MAX - 0x1000)};
  EXPECT_TRUE(ucm::overlapping_pair(far.data(), far.size(), UINT64_MAX, &a, &b));
}

}  // namespace
