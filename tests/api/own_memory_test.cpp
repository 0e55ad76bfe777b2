// OwnMemory: which of the cache's own mappings a buffer of shard_bytes
// overlaps (api/own_memory.h), at every edge, and near the top of the
// address space, where begin + bytes would wrap.
#include <cstdint>

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

}  // namespace
