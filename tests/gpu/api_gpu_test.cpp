// Suite `gpu`, the public API on a real device: run under `mpirun -np 2`, so
// two real processes share one node cache and register the same segments
// with the same GPU (DESIGN.md's "several ranks per GPU" case). Destinations
// and sources are cudaMalloc memory. Every test skips, saying why, where no
// device answers (this machine: "CUDA driver version is insufficient").
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "device/copy_engine.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

class GpuApi : public MpiTest {};

#define SKIP_WITHOUT_GPU()                                                                         \
  do {                                                                                             \
    const DeviceStatus s_ = device_status();                                                       \
    if (s_.visible_devices == 0) GTEST_SKIP() << "no CUDA device: " << s_.cuda_error;              \
  } while (0)

struct DeviceBuffer {
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess); }
  ~DeviceBuffer() {
    if (p) (void)cudaFree(p);
  }
  uint8_t* at(size_t off) const { return static_cast<uint8_t*>(p) + off; }
  void* p = nullptr;
};

ucm_config_t gpu_config() {
  ucm_config_t c = task_config(256, "sim:latency_us=100");
  c.copy_engine = UCM_COPY_ENGINE_CUDA;
  c.shard_bytes = 64 << 10;  // a multiple of the CUDA engine's 4 KiB
  c.cache_bytes = 256 * c.shard_bytes;
  return c;
}

TEST_F(GpuApi, LoadsLandByteExactInDeviceMemoryAndLeaveNoCudaError) {
  SKIP_WITHOUT_GPU();
  ucm_config_t cfg = gpu_config();
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(cudaGetLastError(), cudaSuccess) << "dirty before the test";
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "ucm_cache_init left a pending CUDA error on the app's thread";
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  ASSERT_EQ(ucm_cache_info(cache, &info), UCM_OK);
  EXPECT_STREQ(info.copy_engine, "cuda");
  EXPECT_GT(info.register_seconds, 0.0);
  std::printf("[rank %d] device %d (%s), registered %llu bytes in %.3f s on %u threads\n", world_rank(),
              info.device_id, info.device_choice, static_cast<unsigned long long>(info.data_bytes),
              info.register_seconds, info.register_threads);

  constexpr uint32_t kN = 48;
  const uint64_t sb = cfg.shard_bytes;
  DeviceBuffer dev(kN * sb);
  std::vector<ucm_load_entry_t> es(kN);
  for (uint32_t i = 0; i < kN; ++i) {
    es[i].key = ukey(9000 + i, 1);
    es[i].dst = dev.at(i * sb);
  }
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_load_task(cache, es.data(), kN, &t), UCM_OK) << ucm_last_error(cache);
  ASSERT_EQ(ucm_task_wait(cache, t, kTaskWaitMs), UCM_OK) << ucm_last_error(cache);
  std::vector<uint8_t> back(kN * sb);
  ASSERT_EQ(cudaMemcpy(back.data(), dev.p, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint32_t i = 0; i < kN; ++i)
    EXPECT_EQ(sim_verify(ikey(es[i].key), back.data() + i * sb, sb), sb) << "entry " << i;
  // Every pin of this rank is gone once the task is finished.
  EXPECT_EQ(rank_stats(cache).failed_shards, 0u);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "ucm_cache_finalize left a pending CUDA error";
}

TEST_F(GpuApi, DumpsFromDeviceMemoryComeBackByteExact) {
  SKIP_WITHOUT_GPU();
  ucm_config_t cfg = gpu_config();
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  constexpr uint32_t kN = 16;
  const uint64_t sb = cfg.shard_bytes;
  DeviceBuffer src(kN * sb), dst(kN * sb);
  std::vector<uint8_t> host(kN * sb);
  std::vector<ucm_dump_entry_t> ds(kN);
  for (uint32_t i = 0; i < kN; ++i) {
    ds[i].key = ukey(9500 + i, 2);
    sim_fill(ikey(ds[i].key), host.data() + i * sb, sb);
    ds[i].src = src.at(i * sb);
  }
  // The source is complete before ucm_dump_task (ucm.h's rule).
  ASSERT_EQ(cudaMemcpy(src.p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_dump_task(cache, ds.data(), kN, &t), UCM_OK) << ucm_last_error(cache);
  ASSERT_EQ(ucm_task_wait(cache, t, kTaskWaitMs), UCM_OK) << ucm_last_error(cache);
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<ucm_load_entry_t> ls(kN);
  for (uint32_t i = 0; i < kN; ++i) ls[i] = ucm_load_entry_t{ds[i].key, dst.at(i * sb)};
  ASSERT_EQ(ucm_load_task(cache, ls.data(), kN, &t), UCM_OK) << ucm_last_error(cache);
  ASSERT_EQ(ucm_task_wait(cache, t, kTaskWaitMs), UCM_OK) << ucm_last_error(cache);
  std::vector<uint8_t> back(kN * sb);
  ASSERT_EQ(cudaMemcpy(back.data(), dst.p, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, host);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

TEST_F(GpuApi, ABadDestinationIsRefusedNamingTheEntry) {
  SKIP_WITHOUT_GPU();
  ucm_config_t cfg = gpu_config();
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  const uint64_t sb = cfg.shard_bytes;
  DeviceBuffer good(2 * sb);
  std::vector<uint8_t> host(sb);
  void* pinned = nullptr;
  ASSERT_EQ(cudaMallocHost(&pinned, sb), cudaSuccess);
  void* freed = nullptr;
  ASSERT_EQ(cudaMalloc(&freed, sb), cudaSuccess);
  ASSERT_EQ(cudaFree(freed), cudaSuccess);
  struct Case {
    void* dst;
    const char* what;
  } cases[] = {{host.data(), "pageable host memory"},
               {pinned, "pinned host memory"},
               {freed, "a freed device pointer"},
               {good.at(sb + 4096), "a range past the end of its allocation"}};
  for (const Case& c : cases) {
    ucm_load_entry_t es[2] = {{ukey(9900, 0), good.at(0)}, {ukey(9901, 0), c.dst}};
    ucm_task_t t = 0;
    EXPECT_EQ(ucm_load_task(cache, es, 2, &t), UCM_ERR_INVALID_ARG) << c.what;
    EXPECT_NE(std::string(ucm_last_error(cache)).find("entry 1"), std::string::npos)
        << c.what << ": " << ucm_last_error(cache);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess) << c.what << ": the check left a pending CUDA error";
  }
  (void)cudaFreeHost(pinned);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

TEST_F(GpuApi, TheAppsCurrentDeviceIsRestoredAndTakenByAuto) {
  SKIP_WITHOUT_GPU();
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  const int mine = n - 1;  // not local rank % n for every rank
  ASSERT_EQ(cudaSetDevice(mine), cudaSuccess);
  ASSERT_EQ(cudaFree(nullptr), cudaSuccess);  // make the context current
  ucm_config_t cfg = gpu_config();
  cfg.device_id = UCM_DEVICE_AUTO;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  int now = -1;
  EXPECT_EQ(cudaGetDevice(&now), cudaSuccess);
  EXPECT_EQ(now, mine) << "init changed the app's current device";
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  ASSERT_EQ(ucm_cache_info(cache, &info), UCM_OK);
  EXPECT_EQ(info.device_id, mine) << info.device_choice;
  EXPECT_NE(std::string(info.device_choice).find("the app's current device"), std::string::npos) << info.device_choice;
  if (n > 1) {
    // A configured device other than the app's: still restored.
    EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
    cfg.device_id = 0;
    ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
    EXPECT_EQ(cudaGetDevice(&now), cudaSuccess);
    EXPECT_EQ(now, mine) << "init on device 0 left the app on it";
  }
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
  EXPECT_EQ(cudaGetDevice(&now), cudaSuccess);
  EXPECT_EQ(now, mine) << "finalize changed the app's current device";
}

}  // namespace
}  // namespace ucm::test
