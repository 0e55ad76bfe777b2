// The contract every store keeps, run over each store as typed tests: a
// dumped shard loads back byte-exact, a malformed request fails at once
// naming the bad value, a shard never dumped is not found (per shard),
// touch never fails, the counters are exact, destroying the store completes
// every pending request exactly once, and threads may dump and load at once.
// A later store joins by adding a traits class to `Stores`; what only one
// store does stays in that store's own file.
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_content.h"
#include "backend_test_util.h"
#include "ucm_build_config.h"

namespace ucm::test {
namespace {

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// What a contract case asks of a store.
enum class Shape {
  kPlain,       // one request at a time is enough
  kConcurrent,  // up to 4 requests in flight
  kStalled,     // requests stay queued (certainly, where kStallIsCertain) until the store goes
};

std::unique_ptr<Backend> make_store(const std::string& spec, uint64_t shard_bytes, uint32_t shards,
                                    const char* name) {
  BackendContext c;
  c.shard_bytes = shard_bytes;
  c.shards_per_block = shards;
  std::unique_ptr<Backend> b;
  const Result r = make_backend(spec, c, &b);
  EXPECT_EQ(res(r), res(Result::kOk)) << spec << ": " << last_error();
  if (r != Result::kOk) return nullptr;
  EXPECT_STREQ(b->name(), name);
  return b;
}

// The sim store holding exactly what was dumped (populated=dumped), as a real
// store does. Its shard is not a multiple of 8: the byte tail is exercised.
struct SimStore {
  static constexpr const char* kName = "sim";
  static constexpr uint64_t kShard = 4096 + 13;
  static constexpr bool kStallIsCertain = true;  // a 60 s latency outlives any test
  static std::string label() { return kName; }
  std::unique_ptr<Backend> make(uint32_t shards, Shape shape) {
    const char* spec = shape == Shape::kStalled      ? "sim:latency_us=60000000,gbps=0,max_inflight=4"
                       : shape == Shape::kConcurrent ? "sim:latency_us=0,gbps=0,populated=dumped,max_inflight=4,workers=4"
                                                     : "sim:latency_us=0,populated=dumped";
    return make_store(spec, kShard, shards, kName);
  }
};

// The posix store on real files in a fresh directory, its loads on the I/O
// threads (engine=threads) or on an io_uring (engine=uring).
template <const char* Engine>
struct PosixStoreOn {
  static constexpr const char* kName = "posix";
  static constexpr uint64_t kShard = 4096;
  static constexpr bool kStallIsCertain = false;  // one I/O thread may already have run some
  static std::string label() { return std::string("posix_") + Engine; }
  TempDir dir;
  std::unique_ptr<Backend> make(uint32_t shards, Shape shape) {
    EXPECT_TRUE(dir.ok());
    const char* extra = shape == Shape::kStalled ? ",depth=1" : shape == Shape::kConcurrent ? ",depth=4" : "";
    return make_store("posix:" + dir.path + extra + ",engine=" + Engine, kShard, shards, kName);
  }
};
constexpr char kThreads[] = "threads";
constexpr char kUring[] = "uring";
using PosixStore = PosixStoreOn<kThreads>;
using PosixUringStore = PosixStoreOn<kUring>;

template <class S>
class StoreContract : public ::testing::Test {
 protected:
  static constexpr uint64_t kShard = S::kShard;
  std::unique_ptr<Backend> make(uint32_t shards, Shape shape = Shape::kPlain) { return store_.make(shards, shape); }
  S store_;
};

struct StoreName {
  template <class S>
  static std::string GetName(int) {
    return S::label();
  }
};

#if UCM_HAVE_URING
using Stores = ::testing::Types<SimStore, PosixStore, PosixUringStore>;
#else
using Stores = ::testing::Types<SimStore, PosixStore>;
#endif
TYPED_TEST_SUITE(StoreContract, Stores, StoreName);

TYPED_TEST(StoreContract, DumpedShardsLoadBackByteExact) {
  constexpr uint64_t kBytes = TestFixture::kShard;
  auto b = this->make(4);
  ASSERT_NE(b, nullptr);
  dump_blocks(b.get(), {1, 2, 3}, 4, kBytes);
  expect_blocks(b.get(), {1, 2, 3}, 4, kBytes);
  for (uint64_t blk : {1, 2, 3})
    for (uint32_t s = 0; s < 4; ++s) EXPECT_TRUE(exists(b.get(), key(blk, s))) << "block " << blk << " shard " << s;
}

TYPED_TEST(StoreContract, MalformedRequestsFailAtOnce) {
  constexpr uint64_t kBytes = TestFixture::kShard;
  constexpr uint32_t kShards = 4;
  auto b = this->make(kShards);
  ASSERT_NE(b, nullptr);
  AlignedBuf buf(2 * kBytes);
  Batch batch;
  // More bytes than a shard holds, on either path: the error names the size.
  for (const uint64_t bytes : {kBytes + 1, 2 * kBytes})
    for (const bool is_load : {true, false}) {
      SCOPED_TRACE(std::string(is_load ? "load" : "dump") + " of " + std::to_string(bytes) + " bytes");
      Op op;
      prepare(&op, &batch, key(1, 0), buf.get(), bytes);
      if (is_load) b->load(&op.req);
      else b->dump(&op.req);
      EXPECT_EQ(op.calls, 1);  // inline, before load()/dump() returned
      EXPECT_EQ(res(op.req.result), res(Result::kInvalidArg));
      EXPECT_TRUE(contains(op.req.error, std::to_string(bytes))) << op.req.error;
    }
  // A shard past the block: the error names the shard.
  for (const bool is_load : {true, false}) {
    SCOPED_TRACE(is_load ? "load" : "dump");
    Op op;
    prepare(&op, &batch, key(1, kShards), buf.get(), kBytes);
    if (is_load) b->load(&op.req);
    else b->dump(&op.req);
    EXPECT_EQ(op.calls, 1);
    EXPECT_EQ(res(op.req.result), res(Result::kInvalidArg));
    EXPECT_TRUE(contains(op.req.error, "shard " + std::to_string(kShards))) << op.req.error;
  }
  EXPECT_FALSE(exists(b.get(), key(1, kShards)));
  EXPECT_FALSE(exists(b.get(), key(1, kShards - 1))) << "nothing was dumped";
}

TYPED_TEST(StoreContract, NeverDumpedShardIsNotFoundPerShard) {
  constexpr uint64_t kBytes = TestFixture::kShard;
  auto b = this->make(4);
  ASSERT_NE(b, nullptr);
  EXPECT_FALSE(exists(b.get(), key(3, 2)));
  AlignedBuf buf(kBytes);
  sim_fill(key(3, 2), buf.get(), kBytes);
  ASSERT_EQ(res(dump_sync(b.get(), key(3, 2), buf.get(), kBytes).result), res(Result::kOk));
  EXPECT_TRUE(exists(b.get(), key(3, 2)));
  for (uint32_t s : {0u, 1u, 3u}) {
    EXPECT_FALSE(exists(b.get(), key(3, s))) << "shard " << s;
    const SyncResult r = load_one(b.get(), key(3, s), kBytes);
    EXPECT_EQ(res(r.result), res(Result::kNotFound)) << "shard " << s << ": " << res(r.result) << " " << r.error;
    EXPECT_TRUE(contains(r.error, "shard " + std::to_string(s))) << r.error;
  }
  // Per whole block id: the same low half under another high half is another block.
  Key other_hi = key(3, 2);
  other_hi.block.hi ^= 1;
  EXPECT_FALSE(exists(b.get(), other_hi));
  // A block never stored at all.
  EXPECT_FALSE(exists(b.get(), key(4, 0)));
  const SyncResult r = load_one(b.get(), key(4, 0), kBytes);
  EXPECT_EQ(res(r.result), res(Result::kNotFound)) << r.error;
  BackendCounters c = b->counters();
  EXPECT_EQ(c.loads, 4u);
  EXPECT_EQ(c.load_failures, 4u);
  EXPECT_EQ(c.bytes_loaded, 0u);
  // The dumped one loads back.
  std::memset(buf.get(), 0, kBytes);
  const SyncResult l = load_sync(b.get(), key(3, 2), buf.get(), kBytes);
  EXPECT_EQ(res(l.result), res(Result::kOk)) << l.error;
  EXPECT_EQ(sim_verify(key(3, 2), buf.get(), kBytes), kBytes);
}

TYPED_TEST(StoreContract, TouchNeverFailsAndCounts) {
  constexpr uint64_t kBytes = TestFixture::kShard;
  auto b = this->make(2);
  ASSERT_NE(b, nullptr);
  dump_blocks(b.get(), {1, 2}, 2, kBytes);
  const BlockId blocks[] = {block(1), block(404), block(2), block(1)};
  b->touch(blocks, 4);
  b->touch(nullptr, 0);
  b->touch(blocks + 1, 1);
  EXPECT_EQ(b->counters().touches, 5u);
  expect_blocks(b.get(), {1, 2}, 2, kBytes);
  EXPECT_FALSE(exists(b.get(), key(404, 0))) << "a touch stores nothing";
}

TYPED_TEST(StoreContract, CountersAreExact) {
  constexpr uint64_t kBytes = TestFixture::kShard;
  auto b = this->make(2);
  ASSERT_NE(b, nullptr);
  dump_blocks(b.get(), {1}, 2, kBytes);
  expect_blocks(b.get(), {1}, 2, kBytes);
  EXPECT_EQ(res(load_one(b.get(), key(2, 0), kBytes).result), res(Result::kNotFound));
  const BackendCounters c = b->counters();
  EXPECT_EQ(c.dumps, 2u);
  EXPECT_EQ(c.dump_failures, 0u);
  EXPECT_EQ(c.bytes_dumped, 2 * kBytes);
  EXPECT_EQ(c.loads, 3u);
  EXPECT_EQ(c.load_failures, 1u);
  EXPECT_EQ(c.bytes_loaded, 2 * kBytes);
  EXPECT_EQ(c.touches, 0u);
  EXPECT_EQ(c.inflight_loads, 0u);
  EXPECT_EQ(c.peak_inflight_loads, 1u);  // one at a time
}

// n requests of blocks first.. into a stalled store, loads and dumps in
// turn, each with its own buffer (kept in *bufs).
void submit_stalled(Backend* b, int n, uint64_t first, uint64_t bytes, Batch* batch, std::vector<AlignedBuf>* bufs,
                    std::vector<Op>* ops) {
  ops->resize(n);
  for (int i = 0; i < n; ++i) {
    bufs->emplace_back(bytes);
    prepare(&(*ops)[i], batch, key(first + i, 0), bufs->back().get(), bytes);
    if (i % 2) b->dump(&(*ops)[i].req);
    else b->load(&(*ops)[i].req);
  }
}

TYPED_TEST(StoreContract, DestroyingTheStoreCompletesEveryPendingRequestOnce) {
  constexpr uint64_t kBytes = TestFixture::kShard;
  constexpr int kOps = 32;
  auto b = this->make(1, Shape::kStalled);
  ASSERT_NE(b, nullptr);
  Batch batch;
  std::vector<AlignedBuf> bufs;
  std::vector<Op> ops;
  submit_stalled(b.get(), kOps, 500, kBytes, &batch, &bufs, &ops);
  if (TypeParam::kStallIsCertain) {
    EXPECT_EQ(batch.count(), 0u);
  }
  b.reset();
  ASSERT_EQ(batch.count(), size_t{kOps});
  for (int i = 0; i < kOps; ++i) {
    EXPECT_EQ(ops[i].calls, 1) << i;
    if (TypeParam::kStallIsCertain) {
      EXPECT_EQ(res(ops[i].req.result), res(Result::kTimeout)) << i << ": " << ops[i].req.error;
      continue;
    }
    // Where a request may have run before the store went, it ran whole.
    const Result expect_done = i % 2 ? Result::kOk : Result::kNotFound;
    EXPECT_TRUE(ops[i].req.result == expect_done || ops[i].req.result == Result::kTimeout)
        << i << ": " << res(ops[i].req.result) << " " << ops[i].req.error;
  }
}

// shutdown() returning 0 says the store is idle: every request it held has
// had its one completion by then, not at its destruction (finalize keeps a
// store whose synchronous call is stuck, and frees what the requests point
// into). The sim store's did nothing before session 24 (helper-20).
TYPED_TEST(StoreContract, AShutdownThatReturnsZeroHasCompletedEveryRequest) {
  constexpr uint64_t kBytes = TestFixture::kShard;
  constexpr int kOps = 32;
  auto b = this->make(1, Shape::kStalled);
  ASSERT_NE(b, nullptr);
  Batch batch;
  std::vector<AlignedBuf> bufs;
  std::vector<Op> ops;
  submit_stalled(b.get(), kOps, 600, kBytes, &batch, &bufs, &ops);
  ASSERT_EQ(b->shutdown(deadline_after_ms(20000)), 0u) << "no thread of this store is held in the kernel";
  EXPECT_EQ(batch.count(), size_t{kOps}) << "shutdown() returned 0 with requests still to complete";
  // A request after shutdown completes at once, and destruction completes
  // nothing twice.
  Op late;
  AlignedBuf late_buf(kBytes);
  prepare(&late, &batch, key(700, 0), late_buf.get(), kBytes);
  b->load(&late.req);
  EXPECT_EQ(late.calls, 1) << "a load after shutdown() did not complete at once";
  EXPECT_NE(res(late.req.result), res(Result::kOk));
  b.reset();
  ASSERT_EQ(batch.count(), size_t{kOps + 1});
  for (int i = 0; i < kOps; ++i) EXPECT_EQ(ops[i].calls, 1) << i;
  EXPECT_EQ(late.calls, 1);
}

TYPED_TEST(StoreContract, ConcurrentDumpsAndLoadsFromSeveralThreads) {
  constexpr int kThreads = 4;
  constexpr uint32_t kShards = kThreads;
  constexpr uint64_t kBytes = TestFixture::kShard;
  constexpr int kBlocks = 6;
  auto b = this->make(kShards, Shape::kConcurrent);
  ASSERT_NE(b, nullptr);
  Backend* store = b.get();
  // Thread t owns blocks 100t.. (all their shards) and shard t of the shared blocks 1..
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::vector<AlignedBuf> bufs;
      std::vector<Key> keys;
      for (int i = 0; i < kBlocks; ++i) {
        for (uint32_t s = 0; s < kShards; ++s) keys.push_back(key(100 * (t + 1) + i, s));
        keys.push_back(key(1 + i, t));
      }
      for (size_t i = 0; i < keys.size(); ++i) bufs.emplace_back(kBytes);
      std::vector<Op> ops(keys.size());
      Batch dumps;
      for (size_t i = 0; i < keys.size(); ++i) {
        sim_fill(keys[i], bufs[i].get(), kBytes);
        prepare(&ops[i], &dumps, keys[i], bufs[i].get(), kBytes);
        store->dump(&ops[i].req);
      }
      ASSERT_TRUE(dumps.wait(keys.size()));
      for (const Op& op : ops) ASSERT_EQ(res(op.req.result), res(Result::kOk)) << op.req.error;
      Batch loads;
      for (size_t i = 0; i < keys.size(); ++i) {
        std::memset(bufs[i].get(), 0, kBytes);
        prepare(&ops[i], &loads, keys[i], bufs[i].get(), kBytes);
        store->load(&ops[i].req);
      }
      ASSERT_TRUE(loads.wait(keys.size()));
      for (size_t i = 0; i < keys.size(); ++i) {
        ASSERT_EQ(res(ops[i].req.result), res(Result::kOk)) << ops[i].req.error;
        ASSERT_EQ(sim_verify(keys[i], bufs[i].get(), kBytes), kBytes) << "block " << keys[i].block.lo;
      }
    });
  for (auto& th : threads) th.join();
  // Every shard of the shared blocks, written by four threads at once, is whole.
  std::vector<uint64_t> shared;
  for (int i = 0; i < kBlocks; ++i) shared.push_back(1 + i);
  expect_blocks(b.get(), shared, kShards, kBytes);
  const BackendCounters c = b->counters();
  EXPECT_EQ(c.dumps, uint64_t{kThreads} * kBlocks * (kShards + 1));
  EXPECT_EQ(c.dump_failures, 0u);
  EXPECT_LE(c.peak_inflight_loads, 4u);  // depth / max_inflight
}

}  // namespace
}  // namespace ucm::test
