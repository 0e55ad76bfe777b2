// Which copy engine a rank gets, on this machine: a configured GPU that does
// not answer is an error with the runtime's reason, never a silent memcpy
// engine; the host engine runs when configured, or for `auto` on a node
// without any GPU.
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "device/copy_engine.h"

namespace ucm {
namespace {

bool gpu_node() {
  const DeviceStatus s = device_status();
  return s.visible_devices > 0 || s.driver_present;
}

TEST(EngineChoice, AConfiguredDeviceWithoutAGpuFailsWithTheRuntimesReason) {
  if (gpu_node()) GTEST_SKIP() << "this node has a GPU: the failure is not exercised";
  EngineChoice c;
  c.auto_device = false;
  c.device_id = 0;
  std::unique_ptr<CopyEngine> e;
  EngineTaken taken;
  EXPECT_EQ(make_copy_engine(c, &e, &taken), Result::kDevice);
  EXPECT_EQ(e, nullptr);
  const DeviceStatus s = device_status();
  EXPECT_NE(last_error().find(s.cuda_error), std::string::npos) << last_error();
  if (s.cuda_built) {
    EXPECT_NE(last_error().find("device_id 0"), std::string::npos) << last_error();
  }
}

TEST(EngineChoice, CudaRequiredWithAnAutoDeviceFailsWithoutAGpu) {
  if (gpu_node()) GTEST_SKIP() << "this node has a GPU";
  EngineChoice c;
  c.kind = EngineKind::kCuda;
  std::unique_ptr<CopyEngine> e;
  EngineTaken taken;
  EXPECT_EQ(make_copy_engine(c, &e, &taken), Result::kDevice);
  EXPECT_NE(last_error().find(device_status().cuda_error), std::string::npos) << last_error();
}

TEST(EngineChoice, AutoOnANodeWithoutAGpuTakesTheHostEngineAndSaysWhy) {
  if (gpu_node()) GTEST_SKIP() << "this node has a GPU";
  EngineChoice c;
  c.local_rank = 3;
  std::unique_ptr<CopyEngine> e;
  EngineTaken taken;
  ASSERT_EQ(make_copy_engine(c, &e, &taken), Result::kOk) << last_error();
  EXPECT_STREQ(e->name(), "host");
  EXPECT_EQ(taken.device_id, 3);
  EXPECT_NE(taken.why.find("no GPU on this node"), std::string::npos) << taken.why;
}

TEST(EngineChoice, ConfiguredEnginesAndSchedulers) {
  std::unique_ptr<CopyEngine> e;
  EngineTaken taken;
  EngineChoice c;
  c.kind = EngineKind::kHost;
  c.auto_device = false;
  c.device_id = 2;
  ASSERT_EQ(make_copy_engine(c, &e, &taken), Result::kOk);
  EXPECT_STREQ(e->name(), "host");
  EXPECT_EQ(taken.device_id, 2);
  c.kind = EngineKind::kAsyncTest;
  ASSERT_EQ(make_copy_engine(c, &e, &taken), Result::kOk);
  EXPECT_STREQ(e->name(), "async-test");
  c.kind = EngineKind::kAuto;
  c.device_id = -1;
  ASSERT_EQ(make_copy_engine(c, &e, &taken), Result::kOk);
  EXPECT_EQ(e, nullptr);
  EXPECT_LT(taken.device_id, 0);
}

// Fails registration of one chosen base; stands in for a driver refusing a
// segment, which cannot be provoked on a machine without one.
class RefusingEngine final : public CopyEngine {
 public:
  explicit RefusingEngine(void* refuse) : refuse_(refuse) {}
  const char* name() const override { return "refusing"; }
  int device_id() const override { return 0; }
  uint64_t alignment() const override { return 64; }
  Result register_host(void* base, uint64_t) override {
    if (base == refuse_) return fail(Result::kDevice, "refused %p", base);
    std::lock_guard<std::mutex> g(mu_);
    seen_.insert(base);
    return Result::kOk;
  }
  void unregister_host(void*) override {}
  std::string pci_bus_id() const override { return {}; }
  Result open_stream(std::unique_ptr<CopyStream>*) override { return Result::kUnsupported; }
  std::set<void*> seen() {
    std::lock_guard<std::mutex> g(mu_);
    return seen_;
  }

 private:
  void* refuse_;
  std::mutex mu_;
  std::set<void*> seen_;
};

TEST(RegisterSegments, AllSegmentsOnParallelThreadsTimed) {
  std::vector<char> mem(16);
  std::vector<std::pair<void*, uint64_t>> segs;
  for (int i = 0; i < 7; ++i) segs.emplace_back(&mem[i], 1);
  RefusingEngine e(nullptr);
  Registration reg;
  ASSERT_EQ(register_segments(&e, segs, 3, &reg), Result::kOk) << last_error();
  EXPECT_EQ(reg.registered.size(), 7u);
  EXPECT_EQ(e.seen().size(), 7u);
  EXPECT_EQ(reg.threads, 3u);
  EXPECT_GE(reg.seconds, 0.0);
}

TEST(RegisterSegments, AFailureNamesTheSegmentAndListsTheOnesToUndo) {
  std::vector<char> mem(16);
  std::vector<std::pair<void*, uint64_t>> segs;
  for (int i = 0; i < 5; ++i) segs.emplace_back(&mem[i], 1);
  RefusingEngine e(&mem[3]);
  Registration reg;
  EXPECT_EQ(register_segments(&e, segs, 8, &reg), Result::kDevice);
  EXPECT_NE(last_error().find("segment 3 of 5"), std::string::npos) << last_error();
  EXPECT_EQ(reg.registered.size(), 4u);
  EXPECT_EQ(reg.threads, 5u) << "never more threads than segments";
  for (void* p : reg.registered) EXPECT_NE(p, &mem[3]);
}

}  // namespace
}  // namespace ucm
