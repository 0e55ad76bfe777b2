// The sim store's populated=dumped under mpirun: what one rank dumped exists
// for every rank of the node. Rank 0 dumps keys through the cache, pushes
// them out of the cache with more dumps, and the other ranks then load them
// from the store: the bytes arrive, a key nobody dumped is still "never
// dumped", and ucm_lookup gives the same answer on every rank.
#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "mpi/mpi_test.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

using SimNode = MpiTest;

constexpr uint64_t kSlots = 32;  // regular slots of the cache (16 reserved on top)

struct SimDumpBatch {
  std::vector<ucm_dump_entry_t> entries;
  std::vector<std::vector<uint8_t>> src;

  // The sim content itself: whether a later read hits the cache or the
  // store, the bytes are the same.
  void add(const ucm_key_t& k) {
    src.emplace_back(kTaskShard);
    sim_fill(ikey(k), src.back().data(), kTaskShard);
    entries.push_back({k, nullptr});
    for (size_t i = 0; i < entries.size(); ++i) entries[i].src = src[i].data();
  }
};

ucm_result_t dump_keys(ucm_cache_t cache, const std::vector<ucm_key_t>& keys) {
  SimDumpBatch b;
  for (const ucm_key_t& k : keys) b.add(k);
  ucm_task_t t = 0;
  const ucm_result_t r = ucm_dump_task(cache, b.entries.data(), b.entries.size(), &t);
  if (r != UCM_OK) return r;
  return ucm_task_wait(cache, t, kTaskWaitMs);
}

std::vector<uint8_t> where_is(ucm_cache_t cache, const std::vector<ucm_key_t>& keys) {
  std::vector<uint8_t> where(keys.size(), 0xff);
  EXPECT_EQ(ucm_lookup(cache, keys.data(), keys.size(), where.data()), UCM_OK) << ucm_last_error(cache);
  return where;
}

TEST_F(SimNode, WhatOneRankDumpedLoadsOnEveryRank) {
  ucm_config_t cfg = task_config(kSlots, "sim:latency_us=200,populated=dumped");
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  ASSERT_NE(sim_of(cache), nullptr);
  EXPECT_TRUE(sim_of(cache)->node_shared()) << "the dumped keys are the node's";
  constexpr uint64_t kKeys = 8;
  std::vector<ucm_key_t> dumped, never;
  for (uint64_t i = 0; i < kKeys; ++i) dumped.push_back(ukey(40000 + i, static_cast<uint32_t>(i % 8)));
  for (uint64_t i = 0; i < 2; ++i) never.push_back(ukey(41000 + i, 3));

  // Rank 0 dumps the keys, then enough others (in tasks of 64, the limit) to
  // push them out of the cache: from then on only the store has them.
  if (world_rank() == 0) {
    EXPECT_EQ(dump_keys(cache, dumped), UCM_OK) << ucm_last_error(cache);
    for (uint64_t round = 0; round < 8; ++round) {
      std::vector<ucm_key_t> filler;
      for (uint64_t i = 0; i < 64; ++i) filler.push_back(ukey(50000 + round * 64 + i, 0));
      EXPECT_EQ(dump_keys(cache, filler), UCM_OK) << ucm_last_error(cache);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);

  // Every rank sees the same thing: the dumped keys in the store, the others nowhere.
  const std::vector<uint8_t> w1 = where_is(cache, dumped);
  const std::vector<uint8_t> w2 = where_is(cache, never);
  for (size_t i = 0; i < kKeys; ++i)
    EXPECT_EQ(w1[i], UCM_WHERE_BACKEND) << "rank " << world_rank() << ", dumped key " << i;
  for (size_t i = 0; i < never.size(); ++i)
    EXPECT_EQ(w2[i], UCM_WHERE_NONE) << "rank " << world_rank() << ", never dumped key " << i;
  MPI_Barrier(MPI_COMM_WORLD);

  // The ranks that did not dump load them from the store.
  if (world_rank() != 0) {
    LoadBatch l;
    for (const ucm_key_t& k : dumped) l.add(k);
    EXPECT_EQ(load_and_wait(cache, l), UCM_OK) << ucm_last_error(cache);
    for (size_t i = 0; i < kKeys; ++i) EXPECT_EQ(l.verify(i), kTaskShard) << "entry " << i;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s = node_stats(cache);
  EXPECT_EQ(s.failed_shards, 0u);
  if (world_size() > 1) {
    EXPECT_EQ(s.bytes_from_backend, kKeys * kTaskShard) << "each key read from the store once per node";
  }

  // A key nobody dumped still fails, as never dumped, on every rank.
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == world_size() - 1) {
    LoadBatch l;
    l.add(never[0]);
    EXPECT_EQ(load_and_wait(cache, l), UCM_ERR_BACKEND);
    const std::string err = ucm_last_error(cache);
    EXPECT_NE(err.find("never dumped"), std::string::npos) << err;
    EXPECT_NE(err.find(key_hex(never[0])), std::string::npos) << err;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

TEST_F(SimNode, ASchedulerRankSeesWhatTheOthersDumped) {
  // The last rank queries only; it still gets the store's node state.
  ucm_config_t cfg = task_config(kSlots, "sim:latency_us=0,populated=dumped,dumped_capacity=1000");
  const bool scheduler = world_rank() == world_size() - 1;
  if (scheduler) cfg.device_id = UCM_DEVICE_NONE;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  ASSERT_NE(sim_of(cache), nullptr);
  EXPECT_TRUE(sim_of(cache)->node_shared());
  const std::vector<ucm_key_t> dumped{ukey(42000, 1), ukey(42001, 2)};
  const std::vector<ucm_key_t> never{ukey(42002, 1)};
  if (world_rank() == 0) {
    EXPECT_EQ(dump_keys(cache, dumped), UCM_OK) << ucm_last_error(cache);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // Ready in the node's cache for every rank; and in the store, which is
  // what the scheduler's own store says.
  const std::vector<uint8_t> w = where_is(cache, dumped);
  for (size_t i = 0; i < dumped.size(); ++i) EXPECT_EQ(w[i], UCM_WHERE_CACHE) << "rank " << world_rank();
  EXPECT_EQ(where_is(cache, never)[0], UCM_WHERE_NONE) << "rank " << world_rank();
  bool present = false;
  EXPECT_EQ(sim_of(cache)->exists(ikey(dumped[1]), &present), Result::kOk);
  EXPECT_TRUE(present) << "rank " << world_rank() << ": the store knows what rank 0 dumped";
  EXPECT_EQ(sim_of(cache)->exists(ikey(never[0]), &present), Result::kOk);
  EXPECT_FALSE(present) << "rank " << world_rank();
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

}  // namespace
}  // namespace ucm::test
