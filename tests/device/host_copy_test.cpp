// host_copy (device/host_copy.h): byte for byte what memcpy writes, at every
// alignment of either side and every size around the loop's steps, nothing
// written outside the destination; the vector path taken exactly where the
// header says, and by the host engine's copies.
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "device/host_copy.h"
#include "device/host_engine.h"

namespace ucm::test {
namespace {

constexpr uint8_t kGuard = 0xa5;

// A page-aligned mapping, so that the offsets below are offsets from a page.
struct Pages {
  explicit Pages(size_t bytes) : n(bytes) {
    void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p = m == MAP_FAILED ? nullptr : static_cast<uint8_t*>(m);
  }
  ~Pages() {
    if (p != nullptr) munmap(p, n);
  }
  uint8_t* p;
  size_t n;
};

void check_copy(void (*copy)(void*, const void*, size_t), const char* what) {
  const size_t sizes[] = {0, 1, 31, 32, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256, 257, 383, 4095, 4096, 16391, 70001};
  const size_t src_offsets[] = {0, 1, 16, 63};
  Pages src(80 * 1024), dst(80 * 1024 + 256);
  ASSERT_NE(src.p, nullptr);
  ASSERT_NE(dst.p, nullptr);
  for (size_t i = 0; i < src.n; ++i) src.p[i] = static_cast<uint8_t>(i * 131 + 7);
  // The guard bytes checked by memcmp against this, one call per side: a
  // gtest assertion per byte made the test 40 s under TSan (5460 copies x 80 KiB).
  const std::vector<uint8_t> guard(dst.n, kGuard);
  auto first_bad = [&](const uint8_t* p, size_t n) {
    if (std::memcmp(p, guard.data(), n) == 0) return n;
    size_t k = 0;
    while (p[k] == kGuard) ++k;
    return k;
  };
  for (size_t so : src_offsets)
    for (size_t dof = 0; dof <= 64; ++dof)
      for (size_t n : sizes) {
        std::memset(dst.p, kGuard, dst.n);
        copy(dst.p + 64 + dof, src.p + so, n);
        const uint8_t* d = dst.p + 64 + dof;
        ASSERT_EQ(std::memcmp(d, src.p + so, n), 0) << what << ": " << n << " bytes, dst +" << dof << ", src +" << so;
        const size_t head = 64 + dof, tail = dst.n - head - n;
        ASSERT_EQ(first_bad(dst.p, head), head)
            << what << ": wrote before the destination (" << n << " bytes, dst +" << dof << ", src +" << so << ")";
        ASSERT_EQ(first_bad(d + n, tail), tail)
            << what << ": wrote past the destination (" << n << " bytes, dst +" << dof << ", src +" << so << ")";
      }
}

TEST(HostCopy, WritesWhatMemcpyWritesAtEveryAlignmentAndNothingElse) { check_copy(&host_copy, "host_copy"); }

TEST(HostCopy, TheVectorLoopAloneWritesWhatMemcpyWrites) {
  if (!vector_copy_available()) GTEST_SKIP() << "this CPU has no AVX2: host_copy is memcpy";
  check_copy(&vector_copy, "vector_copy");
}

// The vector loop preferred (as before any calibration, or where it won)
// for the test's scope; the process's choice back after it.
struct PreferVector {
  explicit PreferVector(bool v) : was(vector_copy_preferred()) { set_vector_copy_preferred(v); }
  ~PreferVector() { set_vector_copy_preferred(was); }
  bool was;
};

TEST(HostCopy, TakesTheVectorPathOnlyBetweenMutuallyMisalignedBuffersOfAShardsSize) {
  if (!vector_copy_available()) GTEST_SKIP() << "this CPU has no AVX2: host_copy is memcpy";
  PreferVector prefer(true);
  Pages a(4096), b(4096);
  ASSERT_NE(a.p, nullptr);
  EXPECT_EQ(host_copy_path(b.p + 16, a.p, 16384), CopyPath::kVector) << "a slot (page) into malloc's +16";
  EXPECT_EQ(host_copy_path(b.p + 16, a.p + 16, 16384), CopyPath::kMemcpy) << "aligned alike";
  EXPECT_EQ(host_copy_path(b.p + 64, a.p, 16384), CopyPath::kMemcpy) << "64 apart: aligned alike";
  EXPECT_EQ(host_copy_path(b.p + 1, a.p, kVectorCopyMin), CopyPath::kVector);
  EXPECT_EQ(host_copy_path(b.p + 1, a.p, kVectorCopyMin - 1), CopyPath::kMemcpy) << "too small";
  EXPECT_EQ(host_copy_path(b.p + 1, a.p, kVectorCopyMax), CopyPath::kVector);
  EXPECT_EQ(host_copy_path(b.p + 1, a.p, kVectorCopyMax + 1), CopyPath::kMemcpy) << "memcpy's non-temporal stores";
}

TEST(HostCopy, TheHostEnginesCopiesTakeIt) {
  if (!vector_copy_available()) GTEST_SKIP() << "this CPU has no AVX2: host_copy is memcpy";
  PreferVector prefer(true);
  auto engine = make_host_engine(0);
  std::unique_ptr<CopyStream> stream;
  ASSERT_EQ(engine->open_stream(&stream), Result::kOk);
  Pages src(16384), dst(16384 + 4096);
  ASSERT_NE(src.p, nullptr);
  for (size_t i = 0; i < src.n; ++i) src.p[i] = static_cast<uint8_t>(i ^ 0x5c);
  const uint64_t before = vector_copies_on_this_thread();
  uint64_t ticket = 0;
  ASSERT_EQ(stream->copy(dst.p + 16, src.p, 16384, &ticket), Result::kOk);
  ASSERT_EQ(stream->wait(ticket), Result::kOk);
  EXPECT_EQ(vector_copies_on_this_thread(), before + 1);
  EXPECT_EQ(std::memcmp(dst.p + 16, src.p, 16384), 0);
}

TEST(HostCopy, WhereMemcpyWonEveryCopyIsMemcpy) {
  PreferVector prefer(false);
  Pages a(4096), b(4096);
  ASSERT_NE(a.p, nullptr);
  EXPECT_EQ(host_copy_path(b.p + 16, a.p, 16384), CopyPath::kMemcpy);
  EXPECT_EQ(host_copy_path(b.p + 1, a.p, kVectorCopyMin), CopyPath::kMemcpy);
  check_copy(&host_copy, "host_copy with memcpy preferred");
}

// The calibration measures both paths and keeps the faster; host_copy then
// takes what it kept. Which one wins is this CPU's (never asserted).
TEST(HostCopy, TheCalibrationKeepsThePathThatWasFasterAndHostCopyTakesIt) {
  if (!vector_copy_available()) GTEST_SKIP() << "this CPU has no AVX2: host_copy is memcpy";
  PreferVector restore(true);
  const CopyCalibration c = calibrate_host_copy(16384);
  EXPECT_EQ(c.bytes, 16384u);
  EXPECT_GT(c.memcpy_gbs, 0);
  EXPECT_GT(c.vector_gbs, 0);
  EXPECT_EQ(c.vector, c.vector_gbs > c.memcpy_gbs * kVectorCopyMargin);
  EXPECT_EQ(vector_copy_preferred(), c.vector) << "what host_copy takes from now on";
  Pages a(4096), b(4096);
  EXPECT_EQ(host_copy_path(b.p + 16, a.p, 16384), c.vector ? CopyPath::kVector : CopyPath::kMemcpy);
  std::printf("[HostCopy] 16 KiB shards, misaligned: vector loop %.1f GB/s, memcpy %.1f GB/s: %s kept\n", c.vector_gbs,
              c.memcpy_gbs, c.vector ? "the vector loop" : "memcpy");
  EXPECT_EQ(calibrate_host_copy(kVectorCopyMin - 1).bytes, 0u) << "a size that takes memcpy anyway is not measured";
  EXPECT_EQ(calibrate_host_copy(kVectorCopyMax + 1).bytes, 0u);
}

// Cache::check_app_buffers skips gathering a task's pointers for an engine
// whose check accepts everything: the engines over host memory say so, and
// accept any pointer; an engine that checks (CUDA) says nothing and is asked.
TEST(HostCopy, EnginesOverHostMemoryAcceptEveryAppBufferAndSaySo) {
  std::unique_ptr<CopyEngine> engines[] = {make_host_engine(0), make_async_test_engine(0, AsyncTestOptions{})};
  int x = 0;
  const void* ptrs[] = {&x, reinterpret_cast<const void*>(uintptr_t{1}), nullptr};
  for (const auto& e : engines) {
    EXPECT_FALSE(e->checks_app_buffers()) << e->name();
    size_t bad = 99;
    EXPECT_EQ(e->check_app_buffers(ptrs, 3, 16384, &bad), Result::kOk) << e->name();
    EXPECT_EQ(bad, 99u) << e->name();
  }
  struct Checking final : CopyEngine {
    const char* name() const override { return "checking"; }
    int device_id() const override { return 0; }
    uint64_t alignment() const override { return 64; }
    Result register_host(void*, uint64_t) override { return Result::kOk; }
    void unregister_host(void*) override {}
    std::string pci_bus_id() const override { return {}; }
    Result open_stream(std::unique_ptr<CopyStream>*) override { return Result::kUnsupported; }
    Result check_app_buffers(const void* const*, size_t, uint64_t, size_t* bad) override {
      *bad = 0;
      return Result::kInvalidArg;
    }
  } checking;
  EXPECT_TRUE(checking.checks_app_buffers()) << "an engine is asked unless it says otherwise";
}

}  // namespace
}  // namespace ucm::test
