// Suite `gpu`: the CUDA copy engine on a real device. Skips, saying why, where
// there is none (CI, this machine): the code still compiles everywhere.
#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_content.h"
#include "common/key.h"
#include "data/buffer_data.h"
#include "device/copy_engine.h"

namespace ucm {
namespace {

std::unique_ptr<CopyEngine> engine_or_skip() {
  const DeviceStatus s = device_status();
  if (!s.cuda_built) return nullptr;
  if (s.visible_devices == 0) return nullptr;
  std::unique_ptr<CopyEngine> e;
  EngineChoice c;
  c.kind = EngineKind::kCuda;
  c.auto_device = false;
  c.device_id = 0;
  EngineTaken taken;
  EXPECT_EQ(make_copy_engine(c, &e, &taken), Result::kOk) << last_error();
  return e;
}

#define SKIP_WITHOUT_GPU(engine)                                                        \
  if (!(engine)) GTEST_SKIP() << "no CUDA device: " << device_status().cuda_error;

Key key(uint64_t b, uint32_t s) {
  Key k;
  k.block.lo = b;
  k.block.hi = b * 3;
  k.shard = s;
  return k;
}

TEST(CudaCopy, RegisteredSharedSlotsCopyToTheDeviceByteExact) {
  auto engine = engine_or_skip();
  SKIP_WITHOUT_GPU(engine);
  EXPECT_STREQ(engine->name(), "cuda");
  EXPECT_EQ(engine->alignment(), 4096u);
  EXPECT_FALSE(engine->pci_bus_id().empty());

  constexpr uint64_t kShard = 1 << 20;
  constexpr uint32_t kSlots = 32;
  DataParams dp;
  dp.slot_bytes = kShard;
  dp.total_slots = kSlots;
  dp.segment_bytes = 8 * kShard;
  BufferData data;
  ASSERT_EQ(BufferData::create(dp, &data), Result::kOk) << last_error();
  for (size_t s = 0; s < data.segment_count(); ++s)
    ASSERT_EQ(engine->register_host(data.segment_base(s), data.segment_map_bytes(s)), Result::kOk) << last_error();
  for (uint32_t i = 0; i < kSlots; ++i) sim_fill(key(i, 1), data.at(i), kShard);

  void* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, kSlots * kShard), cudaSuccess);
  std::unique_ptr<CopyStream> stream;
  ASSERT_EQ(engine->open_stream(&stream), Result::kOk) << last_error();
  // Batches of 8 per flush, as the copier issues them.
  uint64_t last = 0;
  for (uint32_t i = 0; i < kSlots; ++i) {
    ASSERT_EQ(stream->copy(static_cast<uint8_t*>(dev) + i * kShard, data.at(kSlots - 1 - i), kShard, &last),
              Result::kOk);
    if (i % 8 == 7) {
      ASSERT_EQ(stream->flush(), Result::kOk) << last_error();
    }
  }
  ASSERT_EQ(stream->wait(last), Result::kOk) << last_error();
  EXPECT_TRUE(stream->done(last));

  std::vector<uint8_t> back(kSlots * kShard);
  ASSERT_EQ(cudaMemcpy(back.data(), dev, back.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (uint32_t i = 0; i < kSlots; ++i)
    EXPECT_EQ(sim_verify(key(kSlots - 1 - i, 1), back.data() + i * kShard, kShard), kShard) << "device shard " << i;

  // Device to host: the dump direction, into a registered slot.
  ASSERT_EQ(stream->copy(data.at(0), static_cast<uint8_t*>(dev) + 5 * kShard, kShard, &last), Result::kOk);
  ASSERT_EQ(stream->wait(last), Result::kOk);
  EXPECT_EQ(sim_verify(key(kSlots - 1 - 5, 1), data.at(0), kShard), kShard);

  stream.reset();
  cudaFree(dev);
  for (size_t s = 0; s < data.segment_count(); ++s) engine->unregister_host(data.segment_base(s));
}

TEST(CudaCopy, AnOutOfRangeDeviceIsAClearError) {
  auto engine = engine_or_skip();
  SKIP_WITHOUT_GPU(engine);
  std::unique_ptr<CopyEngine> e;
  EngineChoice c;
  c.auto_device = false;
  c.device_id = 1 << 20;
  EngineTaken taken;
  EXPECT_EQ(make_copy_engine(c, &e, &taken), Result::kDevice);
  EXPECT_NE(last_error().find("CUDA devices are visible"), std::string::npos) << last_error();
}

}  // namespace
}  // namespace ucm
