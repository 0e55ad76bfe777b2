// The data plane: slot addressing (shift/mask and div/mod), sharing through
// fds, seals, and the hugepage choice.
#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "common/hugepages.h"
#include "common/test_util.h"

namespace ucm::test {
namespace {

DataParams dparams(uint64_t slot_bytes, uint32_t slots, uint64_t segment_bytes, HugePolicy h = HugePolicy::kOff) {
  DataParams p;
  p.slot_bytes = slot_bytes;
  p.total_slots = slots;
  p.segment_bytes = segment_bytes;
  p.hugepages = h;
  return p;
}

// Every slot gets its own non-overlapping range inside some segment, and the
// address is what a plain div/mod over the segments gives.
void check_addressing(const BufferData& d) {
  std::set<uintptr_t> starts;
  for (uint32_t s = 0; s < d.total_slots(); ++s) {
    auto* p = static_cast<uint8_t*>(d.at(s));
    const uint32_t seg = s / d.slots_per_segment();
    auto* want = static_cast<uint8_t*>(d.segment_base(seg)) + uint64_t{s % d.slots_per_segment()} * d.slot_bytes();
    ASSERT_EQ(p, want) << "slot " << s;
    ASSERT_LE((p - static_cast<uint8_t*>(d.segment_base(seg))) + d.slot_bytes(), d.segment_map_bytes(seg));
    starts.insert(reinterpret_cast<uintptr_t>(p));
  }
  EXPECT_EQ(starts.size(), d.total_slots());
}

TEST(DataPlane, PowerOfTwoSizesUseShiftAndMask) {
  BufferData d;
  ASSERT_EQ(BufferData::create(dparams(4096, 1000, 64 * 4096), &d), Result::kOk) << last_error();
  EXPECT_TRUE(d.pow2_addressing());
  EXPECT_EQ(d.slots_per_segment(), 64u);
  EXPECT_EQ(d.segment_count(), 16u);  // ceil(1000 / 64)
  check_addressing(d);
}

TEST(DataPlane, SegmentBoundThatIsNoPowerOfTwoRoundsSlotsPerSegmentDown) {
  BufferData d;
  ASSERT_EQ(BufferData::create(dparams(4096, 1000, 100 * 4096), &d), Result::kOk) << last_error();
  EXPECT_TRUE(d.pow2_addressing());
  EXPECT_EQ(d.slots_per_segment(), 64u) << "100 rounds down to 64";
  check_addressing(d);
}

TEST(DataPlane, OddSlotSizeUsesDivMod) {
  BufferData d;
  ASSERT_EQ(BufferData::create(dparams(3000, 1000, 100 * 3000), &d), Result::kOk) << last_error();
  EXPECT_FALSE(d.pow2_addressing());
  EXPECT_EQ(d.slots_per_segment(), 100u);
  EXPECT_EQ(d.segment_count(), 10u);
  check_addressing(d);
}

TEST(DataPlane, BothPathsAgreeOnContent) {
  for (uint64_t slot_bytes : {uint64_t{4096}, uint64_t{3000}}) {
    BufferData d;
    ASSERT_EQ(BufferData::create(dparams(slot_bytes, 300, 32 * slot_bytes), &d), Result::kOk);
    for (uint32_t s = 0; s < 300; ++s) std::memset(d.at(s), static_cast<int>(s & 0xff), slot_bytes);
    for (uint32_t s = 0; s < 300; ++s) {
      auto* p = static_cast<const uint8_t*>(d.at(s));
      ASSERT_EQ(p[0], s & 0xff) << "slot " << s << " first byte, slot_bytes " << slot_bytes;
      ASSERT_EQ(p[slot_bytes - 1], s & 0xff) << "slot " << s << " last byte, slot_bytes " << slot_bytes;
    }
  }
}

TEST(DataPlane, AnotherMappingOfTheFdsSeesTheSameBytes) {
  BufferData d;
  ASSERT_EQ(BufferData::create(dparams(4096, 256, 64 * 4096), &d), Result::kOk);
  std::vector<int> fds;
  for (size_t i = 0; i < d.segment_count(); ++i) fds.push_back(d.segment_fd(i));
  BufferData e;
  ASSERT_EQ(BufferData::attach(dparams(4096, 256, 64 * 4096), d.hugetlb(), fds.data(), fds.size(), &e), Result::kOk)
      << last_error();
  pid_t child = fork_child([&] {
    for (uint32_t s = 0; s < 256; ++s) std::memset(e.at(s), static_cast<int>(255 - s), 4096);
    return 0;
  });
  ASSERT_EQ(wait_child(child, 10000), 0);
  for (uint32_t s = 0; s < 256; ++s)
    ASSERT_EQ(static_cast<const uint8_t*>(d.at(s))[4095], 255 - s) << "slot " << s;
}

TEST(DataPlane, AttachRefusesAWrongSegmentCountOrUnsealedSegment) {
  BufferData d;
  ASSERT_EQ(BufferData::create(dparams(4096, 256, 64 * 4096), &d), Result::kOk);
  std::vector<int> fds;
  for (size_t i = 0; i < d.segment_count(); ++i) fds.push_back(d.segment_fd(i));
  BufferData e;
  EXPECT_EQ(BufferData::attach(dparams(4096, 256, 64 * 4096), false, fds.data(), 3, &e), Result::kConfigMismatch);
  EXPECT_NE(last_error().find("3 segment fds, this layout needs 4"), std::string::npos) << last_error();
  int loose = memfd_create("loose", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(loose, 64 * 4096), 0);
  fds[2] = loose;
  EXPECT_EQ(BufferData::attach(dparams(4096, 256, 64 * 4096), false, fds.data(), fds.size(), &e), Result::kCorrupt);
  EXPECT_NE(last_error().find("segment 2 is not sealed"), std::string::npos) << last_error();
  close(loose);
}

TEST(DataPlane, SegmentsAreSealedAgainstResizing) {
  BufferData d;
  ASSERT_EQ(BufferData::create(dparams(4096, 16, 16 * 4096), &d), Result::kOk);
  EXPECT_EQ(ftruncate(d.segment_fd(0), 4096), -1) << "shrinking would SIGBUS every rank";
  EXPECT_EQ(errno, EPERM);
}

TEST(DataPlane, BadParametersAreNamed) {
  BufferData d;
  EXPECT_EQ(BufferData::create(dparams(0, 16, 4096), &d), Result::kInvalidArg);
  EXPECT_NE(last_error().find("slot_bytes is 0"), std::string::npos);
  EXPECT_EQ(BufferData::create(dparams(8192, 16, 4096), &d), Result::kInvalidArg);
  EXPECT_NE(last_error().find("segment_bytes 4096 is smaller than one slot (8192 bytes)"), std::string::npos)
      << last_error();
}

TEST(DataPlane, HugepagesAreUsedWhenTheKernelHasThemAndReported) {
  const long before = read_nr_hugepages();
  if (before < 0) GTEST_SKIP() << "no /proc/sys/vm/nr_hugepages on this kernel";
  // Reserve a few 2 MiB pages (root only); restore the old count afterwards.
  if (!write_nr_hugepages(before + 8) || read_nr_hugepages() < before + 8) {
    write_nr_hugepages(before);
    GTEST_SKIP() << "cannot reserve hugepages here (not root, or a read-only /proc/sys)";
  }
  BufferData d;
  Result r = BufferData::create(dparams(1 << 20, 8, 4 << 20, HugePolicy::kAuto), &d);
  const bool huge = d.hugetlb();
  d = BufferData();
  write_nr_hugepages(before);
  ASSERT_EQ(r, Result::kOk) << last_error();
  EXPECT_TRUE(huge) << "8 MiB fit in the 16 MiB just reserved";
}

TEST(DataPlane, WithoutHugepagesAutoFallsBackAndOnIsAClearError) {
  if (hugepages_available(64ull << 30))
    GTEST_SKIP() << "this machine has 64 GiB of free hugepages; the fallback cannot be provoked";
  BufferData d;
  // 64 GiB of hugepages are not there: auto falls back, on refuses.
  DataParams big = dparams(1 << 20, 8, 4 << 20, HugePolicy::kOn);
  big.total_slots = 64 * 1024;
  EXPECT_EQ(BufferData::create(big, &d), Result::kUnsupported);
  EXPECT_NE(last_error().find("hugepages=on"), std::string::npos) << last_error();
  ASSERT_EQ(BufferData::create(dparams(4096, 16, 16 * 4096, HugePolicy::kOff), &d), Result::kOk);
  EXPECT_FALSE(d.hugetlb());
}

// Two segments of two 2 MiB pages each; the hog takes every free page right
// after segment 0 is mapped, so segment 1 finds none: the pages a probe saw
// were gone by the mapping.
void create_with_pages_taken_after_segment_0(HugePolicy policy, BufferData* d, Result* r) {
  HugepageHog hog;
  DataParams p = dparams(2 << 20, 4, 4 << 20, policy);
  p.after_segment = [](uint32_t seg, void* ctx) {
    if (seg == 0) static_cast<HugepageHog*>(ctx)->take_all();
  };
  p.after_segment_ctx = &hog;
  *r = BufferData::create(p, d);
}

TEST(DataPlane, HugepagesTakenBetweenSegmentsMakeAutoFallBackToOrdinaryPages) {
  HugepageReservation pages(4);
  if (!pages.ok()) GTEST_SKIP() << pages.why();
  BufferData d;
  Result r;
  create_with_pages_taken_after_segment_0(HugePolicy::kAuto, &d, &r);
  ASSERT_EQ(r, Result::kOk) << last_error();
  EXPECT_FALSE(d.hugetlb());
  EXPECT_EQ(d.segment_count(), 2u);
  EXPECT_NE(d.pages_note().find("hugepages=auto fell back"), std::string::npos) << d.pages_note();
  EXPECT_NE(d.pages_note().find("data segment 1 of 2"), std::string::npos) << d.pages_note();
  for (uint32_t s = 0; s < 4; ++s) std::memset(d.at(s), 0x5a, 2 << 20);  // every byte is usable
}

TEST(DataPlane, HugepagesTakenBetweenSegmentsMakeOnAClearError) {
  HugepageReservation pages(4);
  if (!pages.ok()) GTEST_SKIP() << pages.why();
  BufferData d;
  Result r;
  create_with_pages_taken_after_segment_0(HugePolicy::kOn, &d, &r);
  EXPECT_EQ(r, Result::kUnsupported);
  EXPECT_NE(last_error().find("hugepages=on"), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("data segment 1 of 2"), std::string::npos) << last_error();
  EXPECT_NE(last_error().find("nr_hugepages"), std::string::npos) << last_error();
  EXPECT_FALSE(d.valid());
}

// Every page is there when create() returns: a page the kernel cannot give is
// an error of create(), never a SIGBUS in a copier later.
TEST(DataPlane, SegmentsArePopulatedWhenCreatedAndAttached) {
  BufferData d;
  ASSERT_EQ(BufferData::create(dparams(4096, 512, 128 * 4096), &d), Result::kOk) << last_error();
  auto resident = [](void* base, uint64_t bytes) {
    std::vector<unsigned char> v(bytes / 4096);
    EXPECT_EQ(mincore(base, bytes, v.data()), 0) << strerror(errno);
    size_t n = 0;
    for (unsigned char c : v) n += c & 1;
    return n;
  };
  for (size_t s = 0; s < d.segment_count(); ++s)
    EXPECT_EQ(resident(d.segment_base(s), d.segment_map_bytes(s)), d.segment_map_bytes(s) / 4096) << "segment " << s;
}

TEST(DataPlane, APlaneLargerThanTheNodeCanGiveIsRefusedUnlessOvercommitIsAllowed) {
  const MemoryBudget m = memory_budget();
  ASSERT_GT(m.available, 0u) << "MemAvailable unreadable";
  // Twice what the node has, in 1 GiB segments; sparse, so asking costs nothing.
  const uint64_t slot = 1 << 20;
  DataParams p = dparams(slot, static_cast<uint32_t>(std::min<uint64_t>(2 * m.available / slot + 1, 1u << 31)), 1ull << 30,
                         HugePolicy::kOff);
  BufferData d;
  EXPECT_EQ(BufferData::create(p, &d), Result::kNoMemory);
  const std::string need = std::to_string(uint64_t{p.total_slots} * slot);
  EXPECT_NE(last_error().find("needs " + need + " bytes, more than the "), std::string::npos)
      << "the message names both numbers: " << last_error();
  EXPECT_NE(last_error().find("allow overcommit"), std::string::npos) << last_error();
  EXPECT_FALSE(d.valid());
  p.allow_overcommit = true;
  ASSERT_EQ(BufferData::create(p, &d), Result::kOk) << last_error();
  std::memset(d.at(0), 1, slot);  // lazily allocated, still usable
}

}  // namespace
}  // namespace ucm::test
