// The write path under mpirun: ucm_dump_task into the posix store and back,
// one backend write per key per node, peers hitting what was dumped, a store
// that survives a restart of the cache, a failing write-through (every rank
// that dumped the key is told, and the next dump writes it again), a corrupt
// shard in the store (UCM_ERR_CORRUPT on every rank, loaded once), the Touch
// cascade, and ucm_lookup's three answers (on a scheduler rank too).
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "mpi/cache_fixture.h"
#include "mpi/mpi_test.h"
#include "mpi/store_dir.h"
#include "mpi/task_util.h"

namespace ucm::test {
namespace {

using Dump = CacheTest;


// Dumped content: the complement of the sim store's, so a copy that came from
// a sim store instead of the dump is told apart.
void fill_dumped(const ucm_key_t& k, std::vector<uint8_t>* buf) {
  buf->resize(kTaskShard);
  sim_fill(ikey(k), buf->data(), kTaskShard);
  for (uint8_t& b : *buf) b = static_cast<uint8_t>(~b);
}

bool is_dumped(const ucm_key_t& k, const std::vector<uint8_t>& buf) {
  std::vector<uint8_t> want;
  fill_dumped(k, &want);
  return buf == want;
}

struct DumpBatch {
  std::vector<ucm_dump_entry_t> entries;
  std::vector<std::vector<uint8_t>> src;

  void add(const ucm_key_t& k) {
    src.emplace_back();
    fill_dumped(k, &src.back());
    entries.push_back({k, nullptr});
    for (size_t i = 0; i < entries.size(); ++i) entries[i].src = src[i].data();
  }
};

ucm_result_t dump_and_wait(ucm_cache_t cache, DumpBatch& b) {
  ucm_task_t t = 0;
  const ucm_result_t r = ucm_dump_task(cache, b.entries.data(), b.entries.size(), &t);
  if (r != UCM_OK) return r;
  return ucm_task_wait(cache, t, kTaskWaitMs);
}

uint64_t sum_over_ranks(uint64_t v) {
  uint64_t total = 0;
  MPI_Allreduce(&v, &total, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

TEST_F(Dump, RoundTripThroughThePosixStoreOneWritePerKeyPerNodeAndARestart) {
  StoreDir store("dump-test");
  ucm_config_t cfg = task_config(128, store.spec().c_str());
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  constexpr uint64_t kKeys = 8;
  DumpBatch d;
  for (uint64_t i = 0; i < kKeys; ++i) d.add(ukey(30000 + i, static_cast<uint32_t>(i % 8)));

  // Every rank dumps the same keys: one of them writes each.
  ASSERT_EQ(dump_and_wait(cache, d), UCM_OK) << ucm_last_error(cache);
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s1 = node_stats(cache);
  EXPECT_EQ(s1.dumps, kKeys) << "exactly one backend write per key per node";
  EXPECT_EQ(s1.bytes_dumped, kKeys * kTaskShard);
  EXPECT_EQ(sum_over_ranks(impl_of(cache)->backend()->counters().dumps), kKeys)
      << "the stores saw one write per key in all";

  // Right after, every rank hits what was dumped: nothing goes to the store.
  LoadBatch l;
  for (const ucm_dump_entry_t& e : d.entries) l.add(e.key);
  ASSERT_EQ(load_and_wait(cache, l), UCM_OK) << ucm_last_error(cache);
  for (size_t i = 0; i < kKeys; ++i) EXPECT_TRUE(is_dumped(l.entries[i].key, l.dst[i])) << "entry " << i;
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s2 = node_stats(cache);
  EXPECT_EQ(s2.hits - s1.hits, kKeys * static_cast<uint64_t>(world_size())) << "every rank hit every dumped key";
  EXPECT_EQ(s2.owner_loads, s1.owner_loads) << "no backend load";
  ASSERT_EQ(finalize(), UCM_OK) << msg(nullptr);

  // A restart: a new, empty cache over the same store. The bytes come back
  // from the files.
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  LoadBatch again;
  for (const ucm_dump_entry_t& e : d.entries) again.add(e.key);
  ASSERT_EQ(load_and_wait(cache, again), UCM_OK) << ucm_last_error(cache);
  for (size_t i = 0; i < kKeys; ++i) EXPECT_TRUE(is_dumped(again.entries[i].key, again.dst[i])) << "entry " << i;
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s3 = node_stats(cache);
  EXPECT_EQ(s3.owner_loads, kKeys) << "each key read from the store once per node";
  EXPECT_EQ(s3.bytes_from_backend, kKeys * kTaskShard);
  EXPECT_EQ(s3.failed_shards, 0u);
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// A key names its bytes (ucm_base.h, ucm_dump_task): a second dump of a key
// the cache holds Ready and stored is UCM_OK at once and writes nothing, so
// the cache and the store keep the first dump's bytes, not the second's.
TEST_F(Dump, ADumpOfAKeyTheCacheHoldsWritesNothingNew) {
  StoreDir store("dump-held");
  ucm_config_t cfg = task_config(128, store.spec().c_str());
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  DumpBatch first;
  first.add(ukey(31000, 3));
  ASSERT_EQ(dump_and_wait(cache_, first), UCM_OK) << ucm_last_error(cache_);
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s1 = node_stats(cache_);
  DumpBatch second;
  second.add(ukey(31000, 3));
  for (uint8_t& b : second.src[0]) b = 0x5a;  // other bytes under the same key
  ASSERT_EQ(dump_and_wait(cache_, second), UCM_OK) << ucm_last_error(cache_);
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s2 = node_stats(cache_);
  EXPECT_EQ(s2.dumps, s1.dumps) << "no second write-through";
  LoadBatch l;
  l.add(ukey(31000, 3));
  ASSERT_EQ(load_and_wait(cache_, l), UCM_OK) << ucm_last_error(cache_);
  EXPECT_TRUE(is_dumped(l.entries[0].key, l.dst[0])) << "the cache serves the first dump's bytes";
  ASSERT_EQ(finalize(), UCM_OK) << msg(nullptr);
  // The store, read by a new cache, holds them too.
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  LoadBatch again;
  again.add(ukey(31000, 3));
  ASSERT_EQ(load_and_wait(cache_, again), UCM_OK) << ucm_last_error(cache_);
  EXPECT_TRUE(is_dumped(again.entries[0].key, again.dst[0])) << "the store holds the first dump's bytes";
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Dump, AFailedWriteThroughIsABackendErrorButTheCachedCopyIsServed) {
  // Rank r dumps (31000 + r, 1), which the sim store refuses, and a good key.
  std::string spec = "sim:latency_us=100,fail_keys=";
  for (int r = 0; r < world_size(); ++r) spec.append(r ? "+" : "").append(std::to_string(31000 + r)).append(".1");
  ucm_config_t cfg = task_config(128, spec.c_str());
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  const uint64_t me = static_cast<uint64_t>(world_rank());
  DumpBatch d;
  d.add(ukey(31100 + me, 1));
  d.add(ukey(31000 + me, 1));
  EXPECT_EQ(dump_and_wait(cache, d), UCM_ERR_BACKEND);
  const std::string err = ucm_last_error(cache);
  EXPECT_NE(err.find(key_hex(ukey(31000 + me, 1))), std::string::npos) << err;
  EXPECT_NE(err.find("write-through failed"), std::string::npos) << err;
  EXPECT_EQ(err.find(key_hex(ukey(31100 + me, 1))), std::string::npos) << "the good key is not named: " << err;
  EXPECT_EQ(rank_stats(cache).failed_shards, 1u);
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s1 = node_stats(cache);

  // Every rank loads every rank's keys: served from the cache (the store
  // would fail the bad ones, and would give the sim content, not the dump).
  LoadBatch l;
  for (int r = 0; r < world_size(); ++r) {
    l.add(ukey(31000 + static_cast<uint64_t>(r), 1));
    l.add(ukey(31100 + static_cast<uint64_t>(r), 1));
  }
  ASSERT_EQ(load_and_wait(cache, l), UCM_OK) << ucm_last_error(cache);
  for (size_t i = 0; i < l.entries.size(); ++i) EXPECT_TRUE(is_dumped(l.entries[i].key, l.dst[i])) << "entry " << i;
  MPI_Barrier(MPI_COMM_WORLD);
  const ucm_stats_t s2 = node_stats(cache);
  EXPECT_EQ(s2.owner_loads, s1.owner_loads) << "nothing went to the store";
  EXPECT_EQ(s2.dumps, static_cast<uint64_t>(world_size())) << "only the good keys were written";
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

// While it lives, this process cannot grow a file past `bytes` (writes fail
// with EFBIG instead of raising SIGXFSZ); the old limit and handler come back
// when it goes.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler_ = signal(SIGXFSZ, SIG_IGN);
    ok_ = getrlimit(RLIMIT_FSIZE, &old_) == 0;
    rlimit lim = old_;
    lim.rlim_cur = bytes;
    ok_ = ok_ && setrlimit(RLIMIT_FSIZE, &lim) == 0;
    EXPECT_TRUE(ok_) << "setrlimit(RLIMIT_FSIZE)";
  }
  ~FileSizeLimit() {
    if (ok_) {
      EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &old_), 0);
    }
    signal(SIGXFSZ, old_handler_);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;

 private:
  rlimit old_{};
  sighandler_t old_handler_ = SIG_DFL;
  bool ok_ = false;
};

bool store_has(ucm_cache_t cache, const ucm_key_t& k) {
  bool there = false;
  EXPECT_EQ(impl_of(cache)->backend()->exists(ikey(k), &there), Result::kOk) << last_error();
  return there;
}

uint64_t ranks_where(bool b) { return sum_over_ranks(b ? 1 : 0); }

TEST_F(Dump, AFailedWriteThroughIsWrittenAgainByTheNextDumpOnTheSameRankOrAPeer) {
  StoreDir store("dump-test");
  ucm_config_t cfg = task_config(128, store.spec().c_str());
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  const ucm_key_t a = ukey(34000, 1);  // retried by rank 0 itself
  const ucm_key_t b = ukey(34001, 2);  // retried by the last rank
  const int last = world_size() - 1;

  // Rank 0 cannot write a file past half a shard: both write-throughs fail.
  if (world_rank() == 0) {
    FileSizeLimit limit(kTaskShard / 2);
    DumpBatch d;
    d.add(a);
    d.add(b);
    EXPECT_EQ(dump_and_wait(cache, d), UCM_ERR_BACKEND) << ucm_last_error(cache);
    const std::string err = ucm_last_error(cache);
    EXPECT_NE(err.find("write-through failed"), std::string::npos) << err;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_FALSE(store_has(cache, a));
  EXPECT_FALSE(store_has(cache, b));
  MPI_Barrier(MPI_COMM_WORLD);

  // The limit is gone. Rank 0 dumps a again, the last rank dumps b: each
  // dump must write the key through, not answer OK for the cached copy.
  if (world_rank() == 0) {
    DumpBatch d;
    d.add(a);
    EXPECT_EQ(dump_and_wait(cache, d), UCM_OK) << ucm_last_error(cache);
  }
  if (world_rank() == last) {
    DumpBatch d;
    d.add(b);
    EXPECT_EQ(dump_and_wait(cache, d), UCM_OK) << ucm_last_error(cache);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_TRUE(store_has(cache, a)) << "the same rank's second dump of a did not write it";
  EXPECT_TRUE(store_has(cache, b)) << "a peer's dump of b did not write it";
  EXPECT_EQ(node_stats(cache).dumps, 2u) << "one write per key went through";
  ASSERT_EQ(finalize(), UCM_OK) << msg(nullptr);

  // A new cache: the keys are in the store and come back as dumped.
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  std::vector<ucm_key_t> keys{a, b};
  std::vector<uint8_t> where(keys.size(), 0xff);
  ASSERT_EQ(ucm_lookup(cache, keys.data(), keys.size(), where.data()), UCM_OK) << ucm_last_error(cache);
  EXPECT_EQ(where[0], UCM_WHERE_BACKEND);
  EXPECT_EQ(where[1], UCM_WHERE_BACKEND);
  MPI_Barrier(MPI_COMM_WORLD);  // every rank looked before any loads
  LoadBatch l;
  l.add(a);
  l.add(b);
  ASSERT_EQ(load_and_wait(cache, l), UCM_OK) << ucm_last_error(cache);
  EXPECT_TRUE(is_dumped(a, l.dst[0]));
  EXPECT_TRUE(is_dumped(b, l.dst[1]));
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Dump, EveryRankThatDumpsAKeyWhoseWriteFailsGetsTheBackendError) {
  // Every rank dumps the key the sim store refuses to write: whether a rank
  // wrote it, waited for a peer's write or came after it, it is told.
  const ucm_key_t k = ukey(35000, 1);
  ucm_config_t cfg = task_config(128, "sim:latency_us=2000,fail_keys=35000.1");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  for (int round = 0; round < 2; ++round) {
    DumpBatch d;
    d.add(k);
    EXPECT_EQ(dump_and_wait(cache, d), UCM_ERR_BACKEND) << "round " << round << ": " << ucm_last_error(cache);
    const std::string err = ucm_last_error(cache);
    EXPECT_NE(err.find(key_hex(k)), std::string::npos) << err;
    EXPECT_NE(err.find("write-through failed"), std::string::npos) << err;
    MPI_Barrier(MPI_COMM_WORLD);
  }
  EXPECT_EQ(node_stats(cache).dumps, 0u);
  MPI_Barrier(MPI_COMM_WORLD);

  // The store takes it now: the next dump writes it once for the node, and
  // a dump after that is answered at once (the slot knows it is stored).
  sim_of(cache)->clear_faults();
  MPI_Barrier(MPI_COMM_WORLD);
  for (int round = 0; round < 2; ++round) {
    DumpBatch d;
    d.add(k);
    EXPECT_EQ(dump_and_wait(cache, d), UCM_OK) << "round " << round << ": " << ucm_last_error(cache);
    MPI_Barrier(MPI_COMM_WORLD);
    EXPECT_EQ(node_stats(cache).dumps, 1u) << "round " << round;
    MPI_Barrier(MPI_COMM_WORLD);
  }
  EXPECT_EQ(ucm_cache_finalize(&cache), UCM_OK);
}

// Flips one byte of shard k in its block's file.
void corrupt_shard(const std::string& dir, const ucm_key_t& k) {
  const Key ik = ikey(k);
  char name[64];
  std::snprintf(name, sizeof(name), "/%016llx%016llx.ucmblk", static_cast<unsigned long long>(ik.block.hi),
                static_cast<unsigned long long>(ik.block.lo));
  const std::string path = dir + name;
  const int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0) << path;
  const off_t off = static_cast<off_t>(k.shard * kTaskShard + 77);
  uint8_t byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, off), 1) << path;
  byte ^= 0x10;
  ASSERT_EQ(pwrite(fd, &byte, 1, off), 1) << path;
  close(fd);
}

TEST_F(Dump, ACorruptShardIsUcmErrCorruptOnEveryRankAndLoadedOnce) {
  StoreDir store("dump-test");
  ucm_config_t cfg = task_config(128, store.spec().c_str());
  ucm_cache_t& cache = cache_;
  const ucm_key_t k = ukey(36000, 3);
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  {
    DumpBatch d;
    d.add(k);
    ASSERT_EQ(dump_and_wait(cache, d), UCM_OK) << ucm_last_error(cache);
  }
  ASSERT_EQ(finalize(), UCM_OK) << msg(nullptr);
  if (world_rank() == 0) corrupt_shard(store.path(), k);
  MPI_Barrier(MPI_COMM_WORLD);

  // A new cache: every rank loads k; one rank reads the store, once.
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  {
    LoadBatch l;
    l.add(k);
    EXPECT_EQ(load_and_wait(cache, l), UCM_ERR_CORRUPT) << ucm_last_error(cache);
    const std::string err = ucm_last_error(cache);
    EXPECT_NE(err.find(key_hex(k)), std::string::npos) << err;
    EXPECT_TRUE(l.untouched(0)) << "no byte of a corrupt shard reaches the caller";
    // The rank that read it passes on the store's words (they name the file);
    // the others say whose load found it.
    const bool store_words = err.find(".ucmblk") != std::string::npos;
    EXPECT_EQ(ranks_where(store_words), 1u) << err;
    if (!store_words) {
      EXPECT_NE(err.find("failed its checks"), std::string::npos) << err;
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  ucm_stats_t s = node_stats(cache);
  EXPECT_EQ(s.owner_loads, 1u) << "a corrupt shard is not retried";
  EXPECT_EQ(s.load_failures, 1u);
  MPI_Barrier(MPI_COMM_WORLD);

  // The verdict stands while the key is resident: asked again, no rank goes
  // back to the store.
  {
    LoadBatch l;
    l.add(k);
    EXPECT_EQ(load_and_wait(cache, l), UCM_ERR_CORRUPT) << ucm_last_error(cache);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  EXPECT_EQ(node_stats(cache).owner_loads, 1u);
  MPI_Barrier(MPI_COMM_WORLD);

  // A dump of the key replaces the bad copy, in the cache and in the store.
  {
    DumpBatch d;
    d.add(k);
    ASSERT_EQ(dump_and_wait(cache, d), UCM_OK) << ucm_last_error(cache);
    LoadBatch l;
    l.add(k);
    ASSERT_EQ(load_and_wait(cache, l), UCM_OK) << ucm_last_error(cache);
    EXPECT_TRUE(is_dumped(k, l.dst[0]));
  }
  ASSERT_EQ(finalize(), UCM_OK) << msg(nullptr);
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  {
    LoadBatch l;
    l.add(k);
    ASSERT_EQ(load_and_wait(cache, l), UCM_OK) << ucm_last_error(cache);
    EXPECT_TRUE(is_dumped(k, l.dst[0])) << "the store holds the repaired shard";
  }
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Dump, TouchForwardsExactlyTheGivenBlocksToTheStoreInOrder) {
  ucm_config_t cfg = task_config(64, "sim:latency_us=100");
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  SimBackend* sim = sim_of(cache);
  ASSERT_NE(sim, nullptr);
  // Some resident blocks first, so Touch has slots to mark too.
  LoadBatch l;
  for (uint64_t i = 0; i < 4; ++i) l.add(ukey(32000 + i, 0));
  ASSERT_EQ(load_and_wait(cache, l), UCM_OK) << ucm_last_error(cache);
  MPI_Barrier(MPI_COMM_WORLD);
  ASSERT_TRUE(sim->touched_blocks().empty());

  // Per rank: a resident block, an unknown one, a repeat, then a second call.
  const uint64_t me = static_cast<uint64_t>(world_rank());
  std::vector<ucm_block_t> first{ublock(32000 + me), ublock(32900 + me), ublock(32001), ublock(32000 + me)};
  std::vector<ucm_block_t> second{ublock(32003), ublock(7)};
  ASSERT_EQ(ucm_touch(cache, first.data(), first.size()), UCM_OK) << ucm_last_error(cache);
  ASSERT_EQ(ucm_touch(cache, second.data(), 0), UCM_OK) << "n = 0 is a no-op";
  ASSERT_EQ(ucm_touch(cache, second.data(), second.size()), UCM_OK) << ucm_last_error(cache);
  EXPECT_EQ(ucm_touch(cache, nullptr, 3), UCM_ERR_NULL_POINTER);

  std::vector<BlockId> want;
  for (const ucm_block_t& b : first) want.push_back(block_from_bytes(b.bytes));
  for (const ucm_block_t& b : second) want.push_back(block_from_bytes(b.bytes));
  // The store's touch runs on a thread of its own (a hint never holds the
  // caller): the batches reach it in call order.
  EXPECT_TRUE(eventually("the touches in the store", [&] { return sim->touched_blocks().size() >= want.size(); }));
  const std::vector<BlockId> got = sim->touched_blocks();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(got[i] == want[i]) << "block " << i << ": lo " << got[i].lo << ", want " << want[i].lo;
  EXPECT_EQ(sim->counters().touches, want.size());
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

TEST_F(Dump, LookupSaysCacheBackendOrNoneOnEveryRankTheSchedulerToo) {
  StoreDir store("dump-test");
  ucm_config_t cfg = task_config(128, store.spec().c_str());
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  ucm_cache_t& cache = cache_;
  constexpr size_t kKeys = 4;
  DumpBatch d;
  for (uint64_t i = 0; i < kKeys; ++i) d.add(ukey(33000 + i, 2));
  ASSERT_EQ(dump_and_wait(cache, d), UCM_OK) << ucm_last_error(cache);
  ASSERT_EQ(finalize(), UCM_OK) << msg(nullptr);

  // A new cache over the same store; the last rank is a scheduler.
  const bool scheduler = world_rank() == world_size() - 1;
  if (scheduler) cfg.device_id = UCM_DEVICE_NONE;
  ASSERT_NO_FATAL_FAILURE(init(cfg));
  std::vector<ucm_key_t> keys;
  for (const ucm_dump_entry_t& e : d.entries) keys.push_back(e.key);
  keys.push_back(ukey(33000, 3));  // a dumped block, a shard never dumped
  keys.push_back(ukey(33999, 2));  // a block the store never saw
  std::vector<uint8_t> where(keys.size(), 0xff);
  ASSERT_EQ(ucm_lookup(cache, keys.data(), keys.size(), where.data()), UCM_OK) << ucm_last_error(cache);
  for (size_t i = 0; i < kKeys; ++i) EXPECT_EQ(where[i], UCM_WHERE_BACKEND) << "key " << i << ": only in the store";
  EXPECT_EQ(where[kKeys], UCM_WHERE_NONE);
  EXPECT_EQ(where[kKeys + 1], UCM_WHERE_NONE);
  MPI_Barrier(MPI_COMM_WORLD);

  // The loading ranks bring the first two in.
  if (!scheduler) {
    LoadBatch l;
    l.add(keys[0]);
    l.add(keys[1]);
    ASSERT_EQ(load_and_wait(cache, l), UCM_OK) << ucm_last_error(cache);
    EXPECT_TRUE(is_dumped(l.entries[0].key, l.dst[0]));
    EXPECT_TRUE(is_dumped(l.entries[1].key, l.dst[1]));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::fill(where.begin(), where.end(), 0xff);
  ASSERT_EQ(ucm_lookup(cache, keys.data(), keys.size(), where.data()), UCM_OK) << ucm_last_error(cache);
  EXPECT_EQ(where[0], UCM_WHERE_CACHE);
  EXPECT_EQ(where[1], UCM_WHERE_CACHE);
  EXPECT_EQ(where[2], UCM_WHERE_BACKEND);
  EXPECT_EQ(where[3], UCM_WHERE_BACKEND);
  EXPECT_EQ(where[kKeys], UCM_WHERE_NONE);
  EXPECT_EQ(where[kKeys + 1], UCM_WHERE_NONE);

  // Bad lookups.
  std::vector<ucm_key_t> bad{keys[0], ukey(33000, 8)};
  EXPECT_EQ(ucm_lookup(cache, bad.data(), bad.size(), where.data()), UCM_ERR_OUT_OF_RANGE);
  EXPECT_NE(std::string(ucm_last_error(cache)).find("shard 8 >= shards_per_block 8 in key 1"), std::string::npos)
      << ucm_last_error(cache);
  EXPECT_EQ(ucm_lookup(cache, nullptr, 2, where.data()), UCM_ERR_NULL_POINTER);
  EXPECT_EQ(ucm_lookup(cache, keys.data(), 2, nullptr), UCM_ERR_NULL_POINTER);
  EXPECT_EQ(ucm_lookup(cache, keys.data(), 0, nullptr), UCM_OK) << "n = 0 is a no-op";
  EXPECT_EQ(finalize(), UCM_OK) << msg(nullptr);
}

}  // namespace
}  // namespace ucm::test
