// The data plane at init: segments populated in parallel (at most the CPUs
// this process may use), exceptions in those threads reported, and the NUMA
// placement set before the pages exist, checked with get_mempolicy.
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "data/numa.h"

namespace ucm::test {
namespace {

DataParams dparams(uint32_t slots, uint64_t segment_bytes) {
  DataParams p;
  p.slot_bytes = 4096;
  p.total_slots = slots;
  p.segment_bytes = segment_bytes;
  p.hugepages = HugePolicy::kOff;
  return p;
}

size_t resident_pages(void* base, uint64_t bytes) {
  std::vector<unsigned char> v(bytes / 4096);
  EXPECT_EQ(mincore(base, bytes, v.data()), 0) << strerror(errno);
  size_t n = 0;
  for (unsigned char c : v) n += c & 1;
  return n;
}

TEST(Populate, SegmentsArePopulatedInParallelOnAtMostTheUsableCpus) {
  BufferData d;
  ASSERT_EQ(BufferData::create(dparams(8 * 64, 64 * 4096), &d), Result::kOk) << last_error();
  ASSERT_EQ(d.segment_count(), 8u);
  EXPECT_EQ(d.populate_threads(), std::min<uint32_t>(8, usable_cpus()));
  EXPECT_GT(d.populate_seconds(), 0.0);
  for (size_t s = 0; s < d.segment_count(); ++s)
    EXPECT_EQ(resident_pages(d.segment_base(s), d.segment_map_bytes(s)), d.segment_map_bytes(s) / 4096) << s;
  // A peer's mapping is populated the same way.
  std::vector<int> fds;
  for (size_t i = 0; i < d.segment_count(); ++i) fds.push_back(d.segment_fd(i));
  BufferData peer;
  ASSERT_EQ(BufferData::attach(dparams(8 * 64, 64 * 4096), false, fds.data(), fds.size(), &peer), Result::kOk)
      << last_error();
  EXPECT_EQ(peer.populate_threads(), std::min<uint32_t>(8, usable_cpus()));
  for (size_t s = 0; s < peer.segment_count(); ++s)
    EXPECT_EQ(resident_pages(peer.segment_base(s), peer.segment_map_bytes(s)), peer.segment_map_bytes(s) / 4096);
}

TEST(Populate, ThreadsNeverExceedTheCapOrTheSegments) {
  DataParams p = dparams(8 * 64, 64 * 4096);
  p.populate_threads = 1;
  BufferData d;
  ASSERT_EQ(BufferData::create(p, &d), Result::kOk) << last_error();
  EXPECT_EQ(d.populate_threads(), 1u);
  BufferData one;
  ASSERT_EQ(BufferData::create(dparams(64, 64 * 4096), &one), Result::kOk) << last_error();
  EXPECT_EQ(one.populate_threads(), 1u) << "one segment, one thread";
  p.allow_overcommit = true;
  p.populate_threads = 0;
  BufferData lazy;
  ASSERT_EQ(BufferData::create(p, &lazy), Result::kOk) << last_error();
  EXPECT_EQ(lazy.populate_threads(), 0u) << "overcommit populates nothing";
}

TEST(Populate, UsableCpusIsTheAffinityMask) {
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_EQ(usable_cpus(), static_cast<uint32_t>(CPU_COUNT(&set)));
}

TEST(RunParallel, EveryIndexRunsOnceAndAnExceptionInAThreadIsReportedNotFatal) {
  std::vector<std::atomic<int>> ran(64);
  std::string error;
  const uint32_t used = run_parallel(
      ran.size(), 4,
      [&](size_t i) {
        ran[i].fetch_add(1);
        if (i == 5) throw std::bad_alloc();
        if (i == 9) throw std::runtime_error("segment 9 went wrong");
      },
      &error);
  EXPECT_GE(used, 1u);
  EXPECT_LE(used, 4u);
  for (size_t i = 0; i < ran.size(); ++i) EXPECT_EQ(ran[i].load(), 1) << "index " << i;
  EXPECT_TRUE(error == "std::bad_alloc" || error == "segment 9 went wrong") << error;
  EXPECT_EQ(run_parallel(0, 4, [](size_t) {}, &error), 0u);
}

TEST(NumaChoice, FollowsTheGpusNodesElseEveryNodeWithMemory) {
  NumaPolicy p = choose_numa_policy(0b10, 0b11);
  EXPECT_EQ(p.mode, NumaMode::kPreferred);
  EXPECT_EQ(p.nodes, 0b10u);
  p = choose_numa_policy(0b11, 0b11);
  EXPECT_EQ(p.mode, NumaMode::kInterleave);
  EXPECT_EQ(p.nodes, 0b11u);
  p = choose_numa_policy(0, 0b1);
  EXPECT_EQ(p.mode, NumaMode::kPreferred);
  EXPECT_EQ(p.nodes, 0b1u);
  EXPECT_NE(p.why.find("no GPU NUMA node known"), std::string::npos) << p.why;
  p = choose_numa_policy(0, 0b11);
  EXPECT_EQ(p.mode, NumaMode::kInterleave);
  EXPECT_EQ(p.nodes, 0b11u);
  p = choose_numa_policy(0b100, 0b11);  // a GPU on a node without memory
  EXPECT_EQ(p.mode, NumaMode::kInterleave);
  EXPECT_EQ(p.nodes, 0b11u);
  p = choose_numa_policy(0, 0);
  EXPECT_EQ(p.mode, NumaMode::kNone);
  EXPECT_EQ(describe_numa(NumaMode::kInterleave, 0b1011), "interleave nodes 0-1,3");
}

// A sysfs tree of real files with three NVIDIA GPUs on nodes 0, 1, 1 and one
// other PCI device.
class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ucm-sysfs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    add("0000:01:00.0", "0x10de", "0x030200", "0");
    add("0000:41:00.0", "0x10de", "0x030000", "1");
    add("0000:81:00.0", "0x10de", "0x030200", "1");
    add("0000:02:00.0", "0x15b3", "0x020700", "0");  // a NIC
    if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES")) saved_ = v, had_ = true;
  }
  void TearDown() override {
    if (had_) setenv("CUDA_VISIBLE_DEVICES", saved_.c_str(), 1);
    else unsetenv("CUDA_VISIBLE_DEVICES");
    std::filesystem::remove_all(root_);
  }
  void add(const std::string& dev, const char* vendor, const char* cls, const char* node) {
    const std::string d = root_ + "/bus/pci/devices/" + dev;
    std::filesystem::create_directories(d);
    std::ofstream(d + "/vendor") << vendor << "\n";
    std::ofstream(d + "/class") << cls << "\n";
    std::ofstream(d + "/numa_node") << node << "\n";
  }
  std::string root_, saved_;
  bool had_ = false;
};

TEST_F(FakeSysfs, GpuNodesRespectCudaVisibleDevices) {
  uint32_t gpus = 0;
  std::string note;
  unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_EQ(gpu_numa_nodes(root_.c_str(), &gpus, &note), 0b11u) << note;
  EXPECT_EQ(gpus, 3u);
  setenv("CUDA_VISIBLE_DEVICES", "0", 1);
  EXPECT_EQ(gpu_numa_nodes(root_.c_str(), &gpus, &note), 0b01u) << note;
  EXPECT_EQ(gpus, 1u);
  setenv("CUDA_VISIBLE_DEVICES", "2,1", 1);
  EXPECT_EQ(gpu_numa_nodes(root_.c_str(), &gpus, &note), 0b10u) << note;
  EXPECT_EQ(gpus, 2u);
  setenv("CUDA_VISIBLE_DEVICES", "", 1);
  EXPECT_EQ(gpu_numa_nodes(root_.c_str(), &gpus, &note), 0u) << note;
  EXPECT_EQ(gpus, 0u);
  setenv("CUDA_VISIBLE_DEVICES", "GPU-6f2b1c3e", 1);  // a UUID: cannot be matched from /sys
  EXPECT_EQ(gpu_numa_nodes(root_.c_str(), &gpus, &note), 0b11u) << note;
  EXPECT_NE(note.find("names no indexes"), std::string::npos) << note;
}

void expect_policy_everywhere(const BufferData& d, NumaMode mode, uint64_t nodes) {
  for (size_t s = 0; s < d.segment_count(); ++s) {
    for (uint64_t off : {uint64_t{0}, d.segment_map_bytes(s) - 4096}) {
      NumaMode m = NumaMode::kNone;
      uint64_t n = 0;
      ASSERT_EQ(numa_policy_at(static_cast<uint8_t*>(d.segment_base(s)) + off, &m, &n), Result::kOk) << last_error();
      EXPECT_EQ(m, mode) << "segment " << s << " +" << off;
      EXPECT_EQ(n, nodes) << "segment " << s << " +" << off;
    }
  }
  EXPECT_EQ(d.numa_mode(), mode);
  EXPECT_EQ(d.numa_nodes(), nodes);
}

TEST(NumaPlacement, TheChosenPolicyIsWhatTheKernelReportsForEverySegmentAndAPeer) {
  const uint64_t mem = memory_numa_nodes("/sys");
  if (mem == 0) GTEST_SKIP() << "no NUMA node information in /sys";
  DataParams p = dparams(4 * 64, 64 * 4096);
  p.numa = choose_numa_policy(0, mem);
  BufferData d;
  ASSERT_EQ(BufferData::create(p, &d), Result::kOk) << last_error();
  expect_policy_everywhere(d, p.numa.mode, p.numa.nodes);
  EXPECT_NE(d.numa_note().find(describe_numa(p.numa.mode, p.numa.nodes)), std::string::npos) << d.numa_note();
  // A shmem segment's policy is the file's: the peer's mapping reports it too.
  std::vector<int> fds;
  for (size_t i = 0; i < d.segment_count(); ++i) fds.push_back(d.segment_fd(i));
  BufferData peer;
  ASSERT_EQ(BufferData::attach(p, false, fds.data(), fds.size(), &peer), Result::kOk) << last_error();
  expect_policy_everywhere(peer, p.numa.mode, p.numa.nodes);
}

TEST(NumaPlacement, InterleaveIsSetAndReportedEvenOnOneNode) {
  const uint64_t mem = memory_numa_nodes("/sys");
  if (mem == 0) GTEST_SKIP() << "no NUMA node information in /sys";
  DataParams p = dparams(2 * 64, 64 * 4096);
  p.numa.mode = NumaMode::kInterleave;
  p.numa.nodes = mem;
  p.numa.why = "test";
  BufferData d;
  ASSERT_EQ(BufferData::create(p, &d), Result::kOk) << last_error();
  expect_policy_everywhere(d, NumaMode::kInterleave, mem);
}

TEST(NumaPlacement, WithoutAPolicyTheKernelDefaultStays) {
  BufferData d;
  ASSERT_EQ(BufferData::create(dparams(64, 64 * 4096), &d), Result::kOk) << last_error();
  expect_policy_everywhere(d, NumaMode::kNone, 0);
  EXPECT_NE(d.numa_note().find("default"), std::string::npos) << d.numa_note();
}

}  // namespace
}  // namespace ucm::test
