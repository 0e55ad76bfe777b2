// The control region's pages (CtrlPages): hugetlb when the kernel has free
// 2 MiB pages, else an ordinary memfd with MADV_HUGEPAGE; reported, and seen
// the same by a peer that maps the fd.
#include <sys/vfs.h>

#include <gtest/gtest.h>

#include "common/hugepages.h"
#include "common/test_util.h"

namespace ucm::test {
namespace {

constexpr uint64_t kHuge = 2ull << 20;

long free_hugepages() {
  std::ifstream f("/proc/meminfo");
  std::string k;
  long v = 0;
  while (f >> k >> v)
    if (k == "HugePages_Free:") return v;
  return 0;
}

TEST(CtrlPages, AutoUsesHugetlbWhenTheKernelHasPagesAndAPeerSeesIt) {
  HugepageReservation pages(4);
  if (!pages.ok()) GTEST_SKIP() << pages.why();
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(4096, 0, 64, 16, 2), &c, CtrlPages::kAuto), Result::kOk) << last_error();
  EXPECT_TRUE(c.hugetlb());
  EXPECT_EQ(c.pages_note(), "2 MiB hugetlb pages");
  EXPECT_EQ(c.region_bytes() % kHuge, 0u) << "mapped whole 2 MiB pages";
  struct statfs fs;
  ASSERT_EQ(fstatfs(c.fd(), &fs), 0);
  EXPECT_EQ(static_cast<uint64_t>(fs.f_type), 0x958458f6u) << "the fd is a hugetlbfs file";
  // A peer maps the same file, sees the layout and the writes, and says so.
  BufferCtrl peer;
  const CtrlParams expect = params(4096, 0, 64, 16, 2);
  ASSERT_EQ(BufferCtrl::attach(c.fd(), &expect, &peer, CtrlPages::kOff), Result::kOk) << last_error();
  EXPECT_TRUE(peer.hugetlb()) << "told by the file, whatever the peer was asked";
  EXPECT_EQ(peer.pages_note(), "2 MiB hugetlb pages");
  ASSERT_EQ(peer.join(1), Result::kOk) << last_error();
  EXPECT_TRUE(c.rank_alive(1));
  c.accessed(4095).store(1);
  EXPECT_EQ(peer.accessed(4095).load(), 1u);
  peer.leave(1);
}

TEST(CtrlPages, WithoutFreeHugepagesAutoFallsBackToOrdinaryPagesAndSaysWhy) {
  HugepageHog hog;  // nothing free for the region, whatever the machine has
  hog.take_all();
  ASSERT_EQ(free_hugepages(), 0) << "the hog left free pages";
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(4096, 0, 64, 16, 2), &c, CtrlPages::kAuto), Result::kOk) << last_error();
  EXPECT_FALSE(c.hugetlb());
  EXPECT_NE(c.pages_note().find("MADV_HUGEPAGE"), std::string::npos) << c.pages_note();
  EXPECT_NE(c.pages_note().find("no hugetlb: "), std::string::npos) << c.pages_note();
  BufferCtrl peer;
  ASSERT_EQ(BufferCtrl::attach(c.fd(), nullptr, &peer, CtrlPages::kAuto), Result::kOk) << last_error();
  EXPECT_FALSE(peer.hugetlb());
  EXPECT_NE(peer.pages_note().find("MADV_HUGEPAGE"), std::string::npos) << peer.pages_note();
  ASSERT_EQ(c.join(0), Result::kOk) << last_error();
  CacheBuffer cb(&c, nullptr, CacheOptions{});
  EXPECT_FALSE(cb.exists(key(1, 0)));
  c.leave(0);
}

TEST(CtrlPages, OffNeverTriesHugepages) {
  HugepageReservation pages(4);  // even with pages free
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(64), &c, CtrlPages::kOff), Result::kOk) << last_error();
  EXPECT_FALSE(c.hugetlb());
  EXPECT_EQ(c.pages_note(), "4 KiB pages (hugepages=off)");
  EXPECT_EQ(c.region_bytes() % 4096, 0u);
  BufferCtrl peer;
  ASSERT_EQ(BufferCtrl::attach(c.fd(), nullptr, &peer, CtrlPages::kOff), Result::kOk) << last_error();
  EXPECT_EQ(peer.pages_note(), "4 KiB pages (hugepages=off)");
}

}  // namespace
}  // namespace ucm::test
