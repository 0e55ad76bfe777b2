// ucm_cache_init / finalize for real: mpirun, several ranks, one machine.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "api/handles.h"
#include "backend/sim_content.h"
#include "common/key.h"
#include "data/buffer_data.h"
#include "data/numa.h"
#include "mpi/mpi_test.h"
#include "mpi/task_util.h"
#include "ucmcache/ucm.h"

namespace ucm::test {
namespace {

ucm_config_t small_config() {
  ucm_config_t c;
  EXPECT_EQ(ucm_config_init(&c), UCM_OK) << ucm_config_error();
  c.shard_bytes = 64 << 10;
  c.cache_bytes = 4 << 20;
  c.reserved_slots = 8;
  c.shards_per_block = 8;
  c.timeout_ms = 20000;
  c.hugepages = UCM_HUGEPAGES_OFF;
  std::snprintf(c.backend, sizeof(c.backend), "sim:latency_us=0");
  return c;
}

ucm_cache_info_t info_of(ucm_cache_t cache) {
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  EXPECT_EQ(ucm_cache_info(cache, &info), UCM_OK) << ucm_last_error(cache);
  return info;
}

CacheBuffer* buffer_of(ucm_cache_t cache) {
  Cache* c = nullptr;
  EXPECT_EQ(resolve_handle(cache, &c), Result::kOk);
  return c ? c->buffer() : nullptr;
}

Key key_of(uint64_t b, uint32_t s) {
  Key k;
  k.block.lo = b;
  k.block.hi = ~b;
  k.shard = s;
  return k;
}

// Loads k as owner with the sim content, or returns false if it was there.
void publish(CacheBuffer* cb, const Key& k, uint64_t bytes) {
  GetResult g;
  ASSERT_EQ(cb->get(k, &g), Result::kOk) << last_error();
  ASSERT_EQ(g.kind, GetKind::kOwner);
  sim_fill(k, cb->data_at(g.slot), bytes);
  ASSERT_EQ(cb->mark_ready(g.slot), Result::kOk);
  cb->release(g.slot);
}

using Boot = MpiTest;

TEST_F(Boot, AllRanksOfANodeShareOneControlRegionAndSeeEachOthersWrites) {
  ucm_config_t cfg = small_config();
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  const ucm_cache_info_t info = info_of(cache);
  EXPECT_EQ(info.local_size, world_size());
  EXPECT_EQ(info.node_count, 1);
  EXPECT_EQ(info.local_rank, world_rank());
  for (uint64_t inode : allgather_u64(info.control_inode)) EXPECT_EQ(inode, info.control_inode) << "one memfd";

  CacheBuffer* cb = buffer_of(cache);
  ASSERT_NE(cb, nullptr);
  publish(cb, key_of(1000 + world_rank(), 3), cfg.shard_bytes);
  MPI_Barrier(MPI_COMM_WORLD);
  for (int r = 0; r < world_size(); ++r) {
    const Key k = key_of(1000 + r, 3);
    GetResult g;
    ASSERT_EQ(cb->get(k, &g), Result::kOk);
    EXPECT_EQ(g.kind, GetKind::kHit) << "rank " << r << "'s write";
    EXPECT_EQ(sim_verify(k, cb->data_at(g.slot), cfg.shard_bytes), cfg.shard_bytes);
    cb->release(g.slot);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
  EXPECT_EQ(cache, nullptr);
}

TEST_F(Boot, PretendNodesOfTwoGetTwoRegionsWithoutCrossTalk) {
  if (world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  ucm_config_t cfg = small_config();
  cfg.ranks_per_node = 2;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  const ucm_cache_info_t info = info_of(cache);
  EXPECT_EQ(info.local_size, 2);
  EXPECT_EQ(info.node_count, 2);
  EXPECT_EQ(info.node_id, world_rank() / 2);
  EXPECT_EQ(info.local_rank, world_rank() % 2);
  const std::vector<uint64_t> inodes = allgather_u64(info.control_inode);
  EXPECT_EQ(inodes[0], inodes[1]);
  EXPECT_EQ(inodes[2], inodes[3]);
  EXPECT_NE(inodes[0], inodes[2]) << "two nodes, two regions";

  CacheBuffer* cb = buffer_of(cache);
  const Key mine = key_of(77 + info.node_id, 0);
  if (info.local_rank == 0) publish(cb, mine, cfg.shard_bytes);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_TRUE(cb->exists(mine)) << "my node's key";
  EXPECT_FALSE(cb->exists(key_of(77 + (1 - info.node_id), 0))) << "the other node's key is not here";
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

// The backend row is compared by hash; the message shows both specs as text
// (boot gathers the text the api layer hands it with the record).
TEST_F(Boot, ARankWithAnotherStoreSpecFailsEveryRankShowingBothSpecs) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  ucm_config_t cfg = small_config();
  if (world_rank() == world_size() - 1) std::snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=7");
  ucm_cache_t cache = nullptr;
  EXPECT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_ERR_CONFIG_MISMATCH);
  EXPECT_EQ(cache, nullptr);
  const std::string e = ucm_last_error(nullptr);
  EXPECT_NE(e.find("config field backend differs"), std::string::npos) << e;
  EXPECT_NE(e.find("\"sim:latency_us=0\""), std::string::npos) << e;
  EXPECT_NE(e.find("\"sim:latency_us=7\""), std::string::npos) << e;
}

TEST_F(Boot, ARankWithAnotherShardSizeFailsEveryRankNamingTheField) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  ucm_config_t cfg = small_config();
  if (world_rank() == world_size() - 1) cfg.shard_bytes = 128 << 10;
  ucm_cache_t cache = nullptr;
  EXPECT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_ERR_CONFIG_MISMATCH);
  EXPECT_EQ(cache, nullptr);
  const std::string e = ucm_last_error(nullptr);
  EXPECT_NE(e.find("shard_bytes"), std::string::npos) << e;
  EXPECT_NE(e.find("65536"), std::string::npos) << e;
  EXPECT_NE(e.find("131072"), std::string::npos) << e;
  // The job goes on: a good init right after works.
  cfg = small_config();
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

TEST_F(Boot, BadConfigValuesAreTheSameClearErrorOnEveryRank) {
  struct Case {
    const char* what;
    void (*edit)(ucm_config_t*);
    ucm_result_t want;
    const char* needle;
  };
  const Case cases[] = {
      {"zero shard size", [](ucm_config_t* c) { c->shard_bytes = 0; }, UCM_ERR_INVALID_ARG, "shard_bytes 0 is out of range"},
      {"zero shards per block", [](ucm_config_t* c) { c->shards_per_block = 0; }, UCM_ERR_INVALID_ARG,
       "shards_per_block 0"},
      {"cache below one slot per rank", [](ucm_config_t* c) { c->cache_bytes = c->shard_bytes; },
       UCM_ERR_INVALID_ARG, "fewer than one per rank"},
      {"shard not aligned for the copy engine", [](ucm_config_t* c) { c->shard_bytes = 1000; }, UCM_ERR_INVALID_ARG,
       "not a multiple of 64"},
      {"no backend", [](ucm_config_t* c) { c->backend[0] = '\0'; }, UCM_ERR_INVALID_ARG, "no backend configured"},
      {"unknown backend", [](ucm_config_t* c) { std::snprintf(c->backend, sizeof(c->backend), "s3:bucket"); },
       UCM_ERR_INVALID_ARG, "unknown backend \"s3\""},
      {"missing posix directory",
       [](ucm_config_t* c) { std::snprintf(c->backend, sizeof(c->backend), "posix:/nonexistent/ucm-store"); },
       UCM_ERR_INVALID_ARG, "/nonexistent/ucm-store"},
      {"uninitialized config", [](ucm_config_t* c) { c->struct_bytes = 12; }, UCM_ERR_INVALID_ARG,
       "ucm_config_init"},
  };
  for (const Case& k : cases) {
    ucm_config_t cfg = small_config();
    k.edit(&cfg);
    if (world_size() == 1 && std::strstr(k.what, "one slot per rank")) continue;
    ucm_cache_t cache = nullptr;
    EXPECT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), k.want) << k.what;
    EXPECT_EQ(cache, nullptr) << k.what;
    const std::string e = ucm_last_error(nullptr);
    EXPECT_NE(e.find(k.needle), std::string::npos) << k.what << ": " << e;
  }
  ucm_cache_t cache = nullptr;
  EXPECT_EQ(ucm_cache_init(MPI_COMM_WORLD, nullptr, &cache), UCM_ERR_NULL_POINTER);
  EXPECT_NE(std::string(ucm_last_error(nullptr)).find("config is NULL"), std::string::npos) << ucm_last_error(nullptr);
}

TEST_F(Boot, ASchedulerRankMapsTheControlPlaneOnly) {
  if (world_size() < 2) GTEST_SKIP() << "needs 2 ranks";
  ucm_config_t cfg = small_config();
  const bool sched = world_rank() == world_size() - 1;
  if (sched) cfg.device_id = UCM_DEVICE_NONE;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  const ucm_cache_info_t info = info_of(cache);
  EXPECT_EQ(info.scheduler, sched ? 1 : 0);
  if (sched) {
    EXPECT_EQ(info.data_bytes, 0u);
    EXPECT_STREQ(info.copy_engine, "");
  } else {
    EXPECT_GT(info.data_bytes, 0u);
  }
  CacheBuffer* cb = buffer_of(cache);
  if (world_rank() == 0) publish(cb, key_of(5, 5), cfg.shard_bytes);
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_TRUE(cb->exists(key_of(5, 5)));
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

TEST_F(Boot, AFinalizedOrForeignHandleIsADistinctError) {
  ucm_config_t cfg = small_config();
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  ucm_cache_t stale = cache;
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  EXPECT_EQ(ucm_cache_info(stale, &info), UCM_ERR_FINALIZED);
  EXPECT_EQ(ucm_cache_finalize(&stale), UCM_ERR_FINALIZED);
  int not_a_cache = 0;
  EXPECT_EQ(ucm_cache_info(reinterpret_cast<ucm_cache_t>(&not_a_cache), &info), UCM_ERR_BAD_HANDLE);
  EXPECT_EQ(ucm_cache_info(nullptr, &info), UCM_ERR_BAD_HANDLE);
  EXPECT_EQ(ucm_cache_finalize(nullptr), UCM_ERR_NULL_POINTER);
}

long read_long(const char* path) {
  std::ifstream f(path);
  long v = -1;
  f >> v;
  return v;
}

bool write_long(const char* path, long v) {
  FILE* f = std::fopen(path, "w");
  if (!f) return false;
  std::fprintf(f, "%ld\n", v);
  return std::fclose(f) == 0;
}

constexpr const char* kNr = "/proc/sys/vm/nr_hugepages";

// Puts nr_hugepages back (on world rank 0, which changes it) when the test
// ends, however it ends: an ASSERT returns from the body, past any restore
// written at its end.
class RestoreHugepages {
 public:
  RestoreHugepages() : before_(world_rank() == 0 ? read_long(kNr) : -1) {}
  ~RestoreHugepages() {
    if (before_ >= 0 && read_long(kNr) != before_ && !write_long(kNr, before_))
      ADD_FAILURE() << "could not restore " << kNr << " to " << before_;
  }
  RestoreHugepages(const RestoreHugepages&) = delete;
  RestoreHugepages& operator=(const RestoreHugepages&) = delete;

 private:
  long before_;
};

TEST_F(Boot, StartsWithAndWithoutHugepagesAndReportsWhich) {
  const RestoreHugepages restore;
  // Without reserved pages: auto falls back, on is a clear error everywhere.
  int no_pages = 0;
  if (world_rank() == 0) no_pages = write_long(kNr, 0) && read_long(kNr) == 0;
  MPI_Bcast(&no_pages, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (no_pages) {
    ucm_config_t cfg = small_config();
    cfg.hugepages = UCM_HUGEPAGES_AUTO;
    ucm_cache_t cache = nullptr;
    ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
    EXPECT_EQ(info_of(cache).hugetlb, 0);
    // The control region fell back too, and says why.
    const std::string ctrl_pages = info_of(cache).control_pages;
    EXPECT_NE(ctrl_pages.find("MADV_HUGEPAGE"), std::string::npos) << ctrl_pages;
    EXPECT_EQ(ctrl_pages.find("2 MiB hugetlb"), std::string::npos) << ctrl_pages;
    EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
    cfg.hugepages = UCM_HUGEPAGES_ON;
    EXPECT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_ERR_UNSUPPORTED);
    EXPECT_NE(std::string(ucm_last_error(nullptr)).find("hugepages=on"), std::string::npos) << ucm_last_error(nullptr);
  }
  // With pages reserved: they are used, on every rank.
  int have_pages = 0;
  if (world_rank() == 0) have_pages = write_long(kNr, 16) && read_long(kNr) >= 16;
  MPI_Bcast(&have_pages, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (have_pages) {
    ucm_config_t cfg = small_config();
    cfg.hugepages = UCM_HUGEPAGES_AUTO;
    ucm_cache_t cache = nullptr;
    ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
    EXPECT_EQ(info_of(cache).hugetlb, 1) << "4.5 MiB of slots fit in 32 MiB of reserved pages";
    EXPECT_STREQ(info_of(cache).control_pages, "2 MiB hugetlb pages") << "and the control region in one more page";
    // Every rank reads what another wrote through the hugepage mapping.
    CacheBuffer* cb = buffer_of(cache);
    publish(cb, key_of(900 + world_rank(), 0), cfg.shard_bytes);
    MPI_Barrier(MPI_COMM_WORLD);
    const Key k = key_of(900 + (world_rank() + 1) % world_size(), 0);
    GetResult g;
    ASSERT_EQ(cb->get(k, &g), Result::kOk);
    EXPECT_EQ(sim_verify(k, cb->data_at(g.slot), cfg.shard_bytes), cfg.shard_bytes);
    cb->release(g.slot);
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (!no_pages && !have_pages) GTEST_SKIP() << "cannot change /proc/sys/vm/nr_hugepages here (not root?)";
}

// A cache larger than the node can give is refused at init, with both
// numbers, on every rank; the configuration may allow overcommit explicitly.
// ucm_cache_info says how the pages were chosen.
TEST_F(Boot, ACacheLargerThanTheNodeCanGiveIsRefusedUnlessOvercommitIsAllowed) {
  ucm_config_t cfg = small_config();
  cfg.shard_bytes = 1 << 20;
  cfg.cache_bytes = 1ull << 40;  // 1 TiB, on a machine that has far less
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0 && static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) >= (1ull << 40))
    GTEST_SKIP() << "this machine has 1 TiB of memory";
  ucm_cache_t cache = nullptr;
  EXPECT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_ERR_NO_MEMORY);
  const std::string e = ucm_last_error(nullptr);
  EXPECT_NE(e.find("more than the"), std::string::npos) << e;
  EXPECT_NE(e.find("allow overcommit"), std::string::npos) << e;
  EXPECT_EQ(cache, nullptr);
  if (cache) (void)ucm_cache_finalize(&cache);
  cfg.allow_overcommit = 1;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  const ucm_cache_info_t info = info_of(cache);
  EXPECT_NE(std::string(info.pages).find("hugepages=off"), std::string::npos) << info.pages;
  EXPECT_NE(std::string(info.pages).find("overcommit"), std::string::npos) << info.pages;
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

// ucm_cache_info says what init cost and where the data plane lies: the init
// and populate times, the populate threads (at most the CPUs the rank may
// use), the NUMA policy the kernel reports for this rank's mapping, and how
// the control region's pages were chosen.
TEST_F(Boot, InfoReportsInitAndPopulateTimesNumaPlacementAndControlPages) {
  ucm_config_t cfg = small_config();
  cfg.cache_bytes = 8 << 20;
  cfg.hugepages = UCM_HUGEPAGES_OFF;
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  const ucm_cache_info_t info = info_of(cache);
  EXPECT_GT(info.init_seconds, 0.0);
  EXPECT_GE(info.init_seconds, info.populate_seconds);
  EXPECT_GE(info.populate_threads, 1u);
  EXPECT_LE(info.populate_threads, std::max<uint32_t>(info.segments, 1));
  EXPECT_LE(info.populate_threads, usable_cpus());
  EXPECT_STREQ(info.control_pages, "4 KiB pages (hugepages=off)");
  if (memory_numa_nodes("/sys") != 0) {
    // No GPU here (or some): a policy is set either way, and it is the one
    // the kernel reports for this rank's own mapping.
    EXPECT_NE(info.numa_mode, 0u) << info.numa;
    EXPECT_NE(info.numa_nodes, 0u) << info.numa;
    NumaMode mode;
    uint64_t nodes = 0;
    ASSERT_EQ(numa_policy_at(buffer_of(cache)->data_at(0), &mode, &nodes), Result::kOk) << last_error();
    EXPECT_EQ(static_cast<uint32_t>(mode), info.numa_mode);
    EXPECT_EQ(nodes, info.numa_nodes);
    EXPECT_NE(std::string(info.numa).find(describe_numa(mode, nodes)), std::string::npos) << info.numa;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

std::set<std::string> entries_named_ucm(const char* dir) {
  std::set<std::string> out;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d))
      if (std::strstr(e->d_name, "ucm")) out.insert(std::string(dir) + "/" + e->d_name);
    closedir(d);
  }
  return out;
}

TEST_F(Boot, LeavesNothingInAnyFileSystem) {
  const char* dirs[] = {"/dev/shm", "/tmp", "/dev/hugepages", "/run", "/var/tmp"};
  std::set<std::string> before;
  for (const char* d : dirs)
    for (const auto& e : entries_named_ucm(d)) before.insert(e);
  MPI_Barrier(MPI_COMM_WORLD);
  ucm_config_t cfg = small_config();
  ucm_cache_t cache = nullptr;
  ASSERT_EQ(ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache), UCM_OK) << ucm_last_error(nullptr);
  // While it runs: the planes are memfds, the boot socket was abstract.
  std::set<std::string> during;
  for (const char* d : dirs)
    for (const auto& e : entries_named_ucm(d)) during.insert(e);
  EXPECT_EQ(during, before);
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
  std::set<std::string> after;
  for (const char* d : dirs)
    for (const auto& e : entries_named_ucm(d)) after.insert(e);
  EXPECT_EQ(after, before);
}

}  // namespace
}  // namespace ucm::test
