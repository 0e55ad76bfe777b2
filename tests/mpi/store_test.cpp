// The posix store through the C API under mpirun: a block file under another
// block's name is never served as that block, and ucm_lookup answers per key
// when the store cannot answer for one of them.
#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "mpi/cache_fixture.h"
#include "mpi/mpi_test.h"
#include "mpi/store_dir.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

using Store = CacheTest;


ucm_result_t dump_sim_content(ucm_cache_t cache, const std::vector<ucm_key_t>& keys) {
  std::vector<std::vector<uint8_t>> src;
  std::vector<ucm_dump_entry_t> entries;
  for (const ucm_key_t& k : keys) {
    src.emplace_back(kTaskShard);
    sim_fill(ikey(k), src.back().data(), kTaskShard);
  }
  for (size_t i = 0; i < keys.size(); ++i) entries.push_back({keys[i], src[i].data()});
  ucm_task_t t = 0;
  const ucm_result_t r = ucm_dump_task(cache, entries.data(), entries.size(), &t);
  if (r != UCM_OK) return r;
  return ucm_task_wait(cache, t, kTaskWaitMs);
}

// The case: block A's file copied under block B's name gave back all
// of B's shards as UCM_OK, holding A's bytes.
TEST_F(Store, ABlockFileUnderAnotherBlocksNameIsNeverServed) {
  StoreDir store;
  ucm_config_t cfg = task_config(128, store.spec().c_str());
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  constexpr uint64_t kA = 41000, kB = 41001;
  std::vector<ucm_key_t> a_keys;
  for (uint32_t s = 0; s < 8; ++s) a_keys.push_back(ukey(kA, s));
  ASSERT_EQ(dump_sim_content(cache, a_keys), UCM_OK) << ucm_last_error(cache);
  ASSERT_EQ(finalize(), UCM_OK) << msg(nullptr);
  if (world_rank() == 0) std::filesystem::copy_file(store.file_of(kA), store.file_of(kB));
  MPI_Barrier(MPI_COMM_WORLD);

  // A new, empty cache over the store: B's shards must come from the files.
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  LoadBatch l;
  for (uint32_t s = 0; s < 8; ++s) l.add(ukey(kB, s));
  const ucm_result_t r = load_and_wait(cache, l);
  const std::string err = ucm_last_error(cache);
  EXPECT_EQ(r, UCM_ERR_CORRUPT) << "block A's bytes under block B's name must be corrupt, not served: " << err;
  size_t wrong = 0;
  for (size_t i = 0; i < l.entries.size(); ++i) {
    std::vector<uint8_t> a_bytes(kTaskShard);
    sim_fill(ikey(ukey(kA, static_cast<uint32_t>(i))), a_bytes.data(), kTaskShard);
    if (l.dst[i] == a_bytes) ++wrong;
  }
  EXPECT_EQ(wrong, 0u) << "entries holding block A's bytes";
  EXPECT_NE(err.find(key_hex(ukey(kB, 0)).substr(0, 32)), std::string::npos) << err;
  // The rank that read the files says which file and which key it holds.
  const bool named = err.find(store.file_of(kB)) != std::string::npos;
  int any_named = 0, mine = named ? 1 : 0;
  MPI_Allreduce(&mine, &any_named, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  EXPECT_EQ(any_named, 1) << "no rank's error names " << store.file_of(kB) << "; this rank's: " << err;
  // Block A itself is still whole.
  LoadBatch a;
  for (const ucm_key_t& k : a_keys) a.add(k);
  ASSERT_EQ(load_and_wait(cache, a), UCM_OK) << ucm_last_error(cache);
  for (size_t i = 0; i < a.entries.size(); ++i) EXPECT_EQ(a.verify(i), kTaskShard) << "entry " << i;
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// A directory under one block's name: that key is UCM_WHERE_ERROR, every other
// key is answered, and the call says some keys are unknown.
TEST_F(Store, LookupAnswersPerKeyWhenTheStoreCannotAnswerForOne) {
  StoreDir store;
  ucm_config_t cfg = task_config(128, store.spec().c_str());
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  ASSERT_EQ(dump_sim_content(cache, {ukey(42000, 1), ukey(42002, 1)}), UCM_OK) << ucm_last_error(cache);
  ASSERT_EQ(finalize(), UCM_OK) << msg(nullptr);
  if (world_rank() == 0) {
    EXPECT_EQ(mkdir(store.file_of(42001).c_str(), 0700), 0);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  ASSERT_NO_FATAL_FAILURE(init(cfg));
  const std::vector<ucm_key_t> keys{ukey(42000, 1), ukey(42001, 1), ukey(42003, 1), ukey(42002, 1), ukey(42001, 2)};
  std::vector<uint8_t> where(keys.size(), 0xff);
  EXPECT_EQ(ucm_lookup(cache, keys.data(), keys.size(), where.data()), UCM_ERR_BACKEND);
  const std::string err = ucm_last_error(cache);
  EXPECT_EQ(where[0], UCM_WHERE_BACKEND);
  EXPECT_EQ(where[1], UCM_WHERE_ERROR);
  EXPECT_EQ(where[2], UCM_WHERE_NONE);
  EXPECT_EQ(where[3], UCM_WHERE_BACKEND);
  EXPECT_EQ(where[4], UCM_WHERE_ERROR);
  EXPECT_NE(err.find("2 of 5 keys"), std::string::npos) << err;
  EXPECT_NE(err.find("key 1"), std::string::npos) << err;
  EXPECT_NE(err.find(store.file_of(42001)), std::string::npos) << err;
  // Without the bad key, the call is UCM_OK again.
  const std::vector<ucm_key_t> good{keys[0], keys[2]};
  EXPECT_EQ(ucm_lookup(cache, good.data(), good.size(), where.data()), UCM_OK) << ucm_last_error(cache);
  EXPECT_EQ(where[0], UCM_WHERE_BACKEND);
  EXPECT_EQ(where[1], UCM_WHERE_NONE);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

}  // namespace
}  // namespace ucm::test
