// Which copy engine ucm_cache_init takes, through the C API under mpirun: a
// configured GPU that does not answer fails init on every rank with the
// runtime's reason (never a silent memcpy engine writing device pointers);
// auto on a node without a GPU takes the host engine and says why; the
// async-test engine carries real loads with late completions.
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "device/copy_engine.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

class Engine : public MpiTest {};

bool gpu_node() {
  const DeviceStatus s = device_status();
  return s.visible_devices > 0 || s.driver_present;
}

TEST_F(Engine, AConfiguredDeviceWithoutAGpuFailsInitWithTheDriversReason) {
  if (gpu_node()) GTEST_SKIP() << "this node has a GPU: the failure is not exercised";
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  cfg.device_id = 0;
  ucm_cache_t cache = nullptr;
  EXPECT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_ERR_DEVICE);
  EXPECT_EQ(cache, nullptr);
  const std::string e = ucm_last_error(nullptr);
  EXPECT_NE(e.find(device_status().cuda_error), std::string::npos) << e;
  EXPECT_NE(e.find("device_id 0"), std::string::npos) << e;
  if (cache) (void)ucm_cache_finalize(&cache);
}

TEST_F(Engine, CopyEngineCudaFailsInitWithoutAGpuEvenWithAnAutoDevice) {
  if (gpu_node()) GTEST_SKIP() << "this node has a GPU";
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  cfg.copy_engine = UCM_COPY_ENGINE_CUDA;
  ucm_cache_t cache = nullptr;
  EXPECT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_ERR_DEVICE);
  EXPECT_NE(std::string(ucm_last_error(nullptr)).find(device_status().cuda_error), std::string::npos)
      << ucm_last_error(nullptr);
  if (cache) (void)ucm_cache_finalize(&cache);
}

TEST_F(Engine, AutoWithoutAGpuTakesTheHostEngineAndReportsRegistration) {
  if (gpu_node()) GTEST_SKIP() << "this node has a GPU";
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  ASSERT_EQ(ucm_cache_info(cache, &info), UCM_OK);
  EXPECT_STREQ(info.copy_engine, "host");
  EXPECT_NE(std::string(info.device_choice).find("no GPU on this node"), std::string::npos) << info.device_choice;
  EXPECT_GE(info.register_threads, 1u);
  EXPECT_GE(info.register_seconds, 0.0);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

TEST_F(Engine, AConfiguredHostEngineRunsWhateverTheDevice) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  cfg.device_id = 0;
  cfg.copy_engine = UCM_COPY_ENGINE_HOST;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  ASSERT_EQ(ucm_cache_info(cache, &info), UCM_OK);
  EXPECT_STREQ(info.copy_engine, "host");
  EXPECT_NE(std::string(info.device_choice).find("copy_engine=host configured"), std::string::npos)
      << info.device_choice;
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

TEST_F(Engine, ABadCopyEngineValueIsRefusedByName) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=0");
  cfg.copy_engine = static_cast<ucm_copy_engine_t>(9);
  EXPECT_EQ(ucm_config_check(&cfg), UCM_ERR_INVALID_ARG);
  EXPECT_NE(std::string(ucm_config_error()).find("copy_engine 9"), std::string::npos) << ucm_config_error();
}

TEST_F(Engine, TheAsyncTestEngineLoadsByteExactOnEveryRank) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=200");
  cfg.copy_engine = UCM_COPY_ENGINE_ASYNC_TEST;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  constexpr uint32_t kN = 24;
  std::vector<std::vector<uint8_t>> dst(kN, std::vector<uint8_t>(kTaskShard));
  std::vector<ucm_load_entry_t> es(kN);
  for (uint32_t i = 0; i < kN; ++i) {
    es[i].key = ukey(7000 + i, 2);
    es[i].dst = dst[i].data();
  }
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_load_task(cache, es.data(), kN, &t), UCM_OK) << ucm_last_error(cache);
  ASSERT_EQ(ucm_task_wait(cache, t, kTaskWaitMs), UCM_OK) << ucm_last_error(cache);
  for (uint32_t i = 0; i < kN; ++i)
    EXPECT_EQ(sim_verify(ikey(es[i].key), dst[i].data(), kTaskShard), kTaskShard) << "entry " << i;
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  ASSERT_EQ(ucm_cache_info(cache, &info), UCM_OK);
  EXPECT_STREQ(info.copy_engine, "async-test");
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

}  // namespace
}  // namespace ucm::test
