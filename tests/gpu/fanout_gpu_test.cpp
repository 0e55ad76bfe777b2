// Suite `gpu`: fan-out over NCCL (UCM_FANOUT=nccl) with cudaMalloc
// destinations, one rank per visible GPU (NCCL refuses two ranks on one GPU).
// Run under mpirun with as many ranks as GPUs (tests/gpu/fanout_gpu_check.sh
// does; meson runs -np 1 and -np 2). Every test skips, saying why, where there
// are fewer GPUs than ranks (this machine: no CUDA device at all).
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "device/copy_engine.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

class FanoutGpu : public MpiTest {};

// Every rank decides alike: the same world size, the same node's GPU count.
#define SKIP_WITHOUT_GPUS()                                                                           \
  do {                                                                                                \
    const DeviceStatus s_ = device_status();                                                          \
    if (s_.visible_devices < world_size())                                                            \
      GTEST_SKIP() << "too few GPUs for a rank each: " << s_.visible_devices << " visible, " << world_size() \
                   << " ranks" << (s_.visible_devices == 0 ? " (" + s_.cuda_error + ")" : std::string());     \
    if (!s_.nccl_built) GTEST_SKIP() << "the library was built without NCCL";                        \
  } while (0)

constexpr uint64_t kShard = 64 << 10;  // a multiple of the CUDA engine's alignment

ucm_config_t nccl_config(const char* backend) {
  ucm_config_t c = task_config(256, backend);
  c.copy_engine = UCM_COPY_ENGINE_CUDA;
  c.shard_bytes = kShard;
  c.cache_bytes = 256 * kShard;
  c.max_task_entries = 256;
  c.fanout = UCM_FANOUT_NCCL;
  return c;
}

struct DeviceShards {
  explicit DeviceShards(size_t n) : n(n) {
    EXPECT_EQ(cudaMalloc(&p, n * kShard), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0xee, n * kShard), cudaSuccess);
  }
  ~DeviceShards() {
    if (p) (void)cudaFree(p);
  }
  void* at(size_t i) const { return static_cast<uint8_t*>(p) + i * kShard; }
  std::vector<uint8_t> host() const {
    std::vector<uint8_t> h(n * kShard);
    EXPECT_EQ(cudaMemcpy(h.data(), p, h.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  size_t n;
  void* p = nullptr;
};

TEST_F(FanoutGpu, BroadcastsLandByteExactWithOneHostReadPerShard) {
  SKIP_WITHOUT_GPUS();
  ucm_config_t cfg = nccl_config("sim:latency_us=50");
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  ASSERT_EQ(ucm_cache_info(cache, &info), UCM_OK);
  EXPECT_EQ(std::string(info.fanout).rfind("nccl", 0), 0u) << info.fanout;
  EXPECT_EQ(info.nccl_built, 1);
  constexpr size_t kKeys = 100;  // two chunks
  DeviceShards dst(kKeys);
  std::vector<ucm_load_entry_t> e(kKeys);
  for (size_t i = 0; i < kKeys; ++i) e[i] = {ukey(80000 + i / 8, static_cast<uint32_t>(i % 8)), dst.at(i)};
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_load_task(cache, e.data(), e.size(), &t), UCM_OK) << ucm_last_error(cache);
  ASSERT_EQ(ucm_task_wait(cache, t, kTaskWaitMs), UCM_OK) << ucm_last_error(cache);
  const std::vector<uint8_t> h = dst.host();
  for (size_t i = 0; i < kKeys; ++i)
    EXPECT_EQ(sim_verify(ikey(e[i].key), h.data() + i * kShard, kShard), kShard) << "entry " << i;
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(node_stats(cache).bytes_to_device, kKeys * kShard) << "one host-slot read per shard per node";
  EXPECT_EQ(rank_stats(cache).fanout_fallbacks, 0u);
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
}

TEST_F(FanoutGpu, FailedLoadIsNotBroadcast) {
  SKIP_WITHOUT_GPUS();
  ucm_config_t cfg = nccl_config("sim:latency_us=50,fail_keys=81000.3");
  cfg.load_retries = 0;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  DeviceShards dst(8);
  std::vector<ucm_load_entry_t> e(8);
  for (size_t i = 0; i < 8; ++i) e[i] = {ukey(81000, static_cast<uint32_t>(i)), dst.at(i)};
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_load_task(cache, e.data(), e.size(), &t), UCM_OK) << ucm_last_error(cache);
  EXPECT_EQ(ucm_task_wait(cache, t, kTaskWaitMs), UCM_ERR_BACKEND);
  const std::vector<uint8_t> h = dst.host();
  for (size_t i = 0; i < 8; ++i) {
    if (i != 3) {
      EXPECT_EQ(sim_verify(ikey(e[i].key), h.data() + i * kShard, kShard), kShard) << "entry " << i;
    }
  }
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
}

// A rank that stops calling (UCM_FANOUT_TEST_STALL): its peers' broadcast
// passes its bound, NCCL is aborted and its stream drained, and every rank
// falls back to per-rank copies: byte-exact, counted, the cache usable.
TEST_F(FanoutGpu, StalledRankAbortsNcclAndFallsBack) {
  SKIP_WITHOUT_GPUS();
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  setenv("UCM_FANOUT_TEST_STALL", "1:1", 1);
  ucm_config_t cfg = nccl_config("sim:latency_us=50");
  cfg.timeout_ms = 3000;
  ucm_cache_t cache = nullptr;
  const ucm_result_t init = ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache);
  unsetenv("UCM_FANOUT_TEST_STALL");
  ASSERT_EQ(init, UCM_OK) << ucm_last_error(nullptr);
  DeviceShards dst(16);
  std::vector<ucm_load_entry_t> e(16);
  for (size_t i = 0; i < 16; ++i) e[i] = {ukey(82000 + i / 8, static_cast<uint32_t>(i % 8)), dst.at(i)};
  ucm_task_t t = 0;
  ASSERT_EQ(ucm_load_task(cache, e.data(), e.size(), &t), UCM_OK) << ucm_last_error(cache);
  ASSERT_EQ(ucm_task_wait(cache, t, kTaskWaitMs), UCM_OK) << ucm_last_error(cache);
  const std::vector<uint8_t> h = dst.host();
  for (size_t i = 0; i < 16; ++i)
    EXPECT_EQ(sim_verify(ikey(e[i].key), h.data() + i * kShard, kShard), kShard) << "entry " << i;
  EXPECT_GE(rank_stats(cache).fanout_fallbacks, 1u);
  MPI_Barrier(MPI_COMM_WORLD);  // the stalled rank finishes first: finalize's bound starts together
  ASSERT_EQ(ucm_cache_finalize(&cache), UCM_OK) << ucm_last_error(nullptr);
}

}  // namespace
}  // namespace ucm::test
