// The sim store: its content function, its timing model (lower bounds only,
// which it guarantees by construction), its in-flight limit, its faults, its
// populated=dumped mode (its table of dumped keys, node-shared or private)
// and its counters.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/node_state.h"
#include "backend/shared_key_set.h"
#include "backend/sim_backend.h"
#include "backend/sim_content.h"
#include "backend_test_util.h"

namespace ucm::test {
namespace {

constexpr uint64_t kShard = 4096 + 13;  // not a multiple of 8: exercises the byte tail
constexpr uint32_t kShards = 8;

std::unique_ptr<SimBackend> make_sim(const std::string& spec, uint64_t shard_bytes = kShard,
                                     uint32_t shards = kShards, const NodeState* node = nullptr) {
  BackendContext c;
  c.shard_bytes = shard_bytes;
  c.shards_per_block = shards;
  if (node) {
    c.node_state = node->base();
    c.node_state_bytes = node->bytes();
  }
  std::unique_ptr<Backend> b;
  const Result r = make_backend(spec, c, &b);
  EXPECT_EQ(res(r), res(Result::kOk)) << spec << ": " << last_error();
  if (r != Result::kOk) return nullptr;
  EXPECT_STREQ(b->name(), "sim");
  return std::unique_ptr<SimBackend>(static_cast<SimBackend*>(b.release()));
}

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// ---- content ----------------------------------------------------------------

TEST(SimContent, IsDeterministic) {
  std::vector<uint8_t> a(kShard), b(kShard);
  sim_fill(key(3, 5), a.data(), a.size());
  sim_fill(key(3, 5), b.data(), b.size());
  EXPECT_EQ(a, b);
  for (uint64_t o = 0; o < kShard; ++o) ASSERT_EQ(a[o], sim_byte(key(3, 5), o)) << "offset " << o;
  // A shorter fill is a prefix of a longer one: content depends on the offset, not the length.
  std::vector<uint8_t> c(101);
  sim_fill(key(3, 5), c.data(), c.size());
  EXPECT_TRUE(std::equal(c.begin(), c.end(), a.begin()));
}

// Fraction of equal bytes between the contents of two keys.
double overlap(const Key& x, const Key& y) {
  std::vector<uint8_t> a(kShard), b(kShard);
  sim_fill(x, a.data(), a.size());
  sim_fill(y, b.data(), b.size());
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(a.size());
}

TEST(SimContent, DiffersAcrossBlockShardAndOffset) {
  // Unrelated content agrees on about 1 byte in 256.
  EXPECT_LT(overlap(key(3, 5), key(4, 5)), 0.02);  // block
  EXPECT_LT(overlap(key(3, 5), key(3, 6)), 0.02);  // shard
  Key hi = key(3, 5);
  hi.block.hi ^= 1;
  EXPECT_LT(overlap(key(3, 5), hi), 0.02);  // high half of the block id
  // Offset: no two 8-byte words of one shard are equal.
  std::vector<uint64_t> words(kShard / 8);
  sim_fill(key(3, 5), words.data(), words.size() * 8);
  std::sort(words.begin(), words.end());
  EXPECT_EQ(std::adjacent_find(words.begin(), words.end()), words.end());
}

TEST(SimContent, VerifyFindsTheFlippedByte) {
  std::vector<uint8_t> buf(kShard);
  const Key k = key(9, 1);
  sim_fill(k, buf.data(), buf.size());
  EXPECT_EQ(sim_verify(k, buf.data(), buf.size()), kShard);
  for (uint64_t off : {uint64_t{0}, uint64_t{7}, uint64_t{8}, uint64_t{1234}, kShard - 14, kShard - 13, kShard - 1}) {
    buf[off] ^= 0x10;
    EXPECT_EQ(sim_verify(k, buf.data(), buf.size()), off);
    buf[off] ^= 0x10;
  }
  // Two flips: the first one is reported.
  buf[2000] ^= 1;
  buf[100] ^= 0x80;
  EXPECT_EQ(sim_verify(k, buf.data(), buf.size()), 100u);
  // The right bytes under the wrong key do not verify.
  buf[2000] ^= 1;
  buf[100] ^= 0x80;
  EXPECT_LT(sim_verify(key(9, 2), buf.data(), buf.size()), 8u);
}

// ---- loads and timing -------------------------------------------------------

TEST(SimBackend, LoadFillsExactlyTheContent) {
  auto sim = make_sim("sim:latency_us=0,gbps=0");
  ASSERT_NE(sim, nullptr);
  // Guard bytes either side of the shard must stay as they were.
  std::vector<uint8_t> buf(kShard + 128, 0xEE);
  const SyncResult r = load_sync(sim.get(), key(3, 5), buf.data() + 64, kShard);
  ASSERT_EQ(res(r.result), res(Result::kOk)) << r.error;
  EXPECT_EQ(sim_verify(key(3, 5), buf.data() + 64, kShard), kShard);
  for (size_t i = 0; i < 64; ++i) {
    ASSERT_EQ(buf[i], 0xEE) << "before the shard, byte " << i;
    ASSERT_EQ(buf[64 + kShard + i], 0xEE) << "after the shard, byte " << i;
  }
}

TEST(SimBackend, LoadNeverCompletesBeforeItsLatency) {
  constexpr uint64_t kLatencyUs = 20000;
  auto sim = make_sim("sim:latency_us=20000,gbps=0");
  ASSERT_NE(sim, nullptr);
  Batch batch;
  std::vector<uint8_t> bufs(4 * kShard);
  Op ops[4];
  for (int i = 0; i < 4; ++i) {
    prepare(&ops[i], &batch, key(10 + i, 0), bufs.data() + i * kShard, kShard);
    ops[i].submit_ns = now_ns();
    sim->load(&ops[i].req);
  }
  ASSERT_TRUE(batch.wait(4));
  for (const Op& op : ops) {
    EXPECT_EQ(res(op.req.result), res(Result::kOk)) << op.req.error;
    EXPECT_GE(op.done_ns - op.submit_ns, kLatencyUs * 1000);
  }
}

TEST(SimBackend, TransferNeverCompletesBeforeBytesOverBandwidth) {
  // 1 MB at 0.5 GB/s: at least 2 ms.
  constexpr uint64_t kBytes = 1000000;
  auto sim = make_sim("sim:latency_us=0,gbps=0.5", kBytes, 1);
  ASSERT_NE(sim, nullptr);
  std::vector<uint8_t> buf(kBytes);
  for (bool is_load : {true, false}) {
    Batch batch;
    Op op;
    prepare(&op, &batch, key(1, 0), buf.data(), kBytes);
    op.submit_ns = now_ns();
    if (is_load) sim->load(&op.req);
    else sim->dump(&op.req);
    ASSERT_TRUE(batch.wait(1));
    EXPECT_EQ(res(op.req.result), res(Result::kOk)) << op.req.error;
    EXPECT_GE(op.done_ns - op.submit_ns, 2000000u) << (is_load ? "load" : "dump");
  }
}

TEST(SimBackend, InFlightLimitIsHonoured) {
  constexpr int kLoads = 48;
  auto sim = make_sim("sim:latency_us=1000,gbps=0,max_inflight=4,workers=4");
  ASSERT_NE(sim, nullptr);
  Batch batch;
  std::vector<uint8_t> bufs(kLoads * kShard);
  std::vector<Op> ops(kLoads);
  for (int i = 0; i < kLoads; ++i) {
    prepare(&ops[i], &batch, key(100 + i, i % kShards), bufs.data() + i * kShard, kShard);
    sim->load(&ops[i].req);
  }
  ASSERT_TRUE(batch.wait(kLoads));
  for (int i = 0; i < kLoads; ++i) {
    EXPECT_EQ(ops[i].calls, 1);
    EXPECT_EQ(res(ops[i].req.result), res(Result::kOk)) << ops[i].req.error;
    EXPECT_EQ(sim_verify(ops[i].req.key, ops[i].req.buf, kShard), kShard);
  }
  const BackendCounters c = sim->counters();
  EXPECT_LE(c.peak_inflight_loads, 4u);
  EXPECT_GE(c.peak_inflight_loads, 1u);
  EXPECT_EQ(c.inflight_loads, 0u);
  EXPECT_EQ(c.loads, uint64_t{kLoads});
}

// Three hung loads hold three places for good, so the next load admitted makes
// four in flight at once, deterministically; everything after it goes through
// the one remaining place, and the hung ones complete when the store goes.
TEST(SimBackend, InFlightLimitIsReachedAndNeverPassed) {
  constexpr int kLoads = 16;
  auto sim = make_sim("sim:latency_us=200,gbps=0,max_inflight=4,workers=2,hang_keys=900.0+901.0+902.0");
  ASSERT_NE(sim, nullptr);
  Batch hung_batch, batch;
  std::vector<uint8_t> bufs((kLoads + 3) * kShard);
  std::vector<Op> hung(3), ops(kLoads);
  for (int i = 0; i < 3; ++i) {
    prepare(&hung[i], &hung_batch, key(900 + i, 0), bufs.data() + i * kShard, kShard);
    sim->load(&hung[i].req);
  }
  for (int i = 0; i < kLoads; ++i) {
    prepare(&ops[i], &batch, key(10 + i, 1), bufs.data() + (3 + i) * kShard, kShard);
    sim->load(&ops[i].req);
  }
  ASSERT_TRUE(batch.wait(kLoads));
  for (const Op& op : ops) EXPECT_EQ(res(op.req.result), res(Result::kOk)) << op.req.error;
  BackendCounters c = sim->counters();
  EXPECT_EQ(c.peak_inflight_loads, 4u);
  EXPECT_EQ(c.inflight_loads, 3u);
  EXPECT_EQ(hung_batch.count(), 0u);
  sim.reset();
  ASSERT_TRUE(hung_batch.wait(3));
  for (const Op& op : hung) {
    EXPECT_EQ(op.calls, 1);
    EXPECT_EQ(res(op.req.result), res(Result::kTimeout));
  }
}

TEST(SimBackend, RequestsOverTheLimitRunInArrivalOrder) {
  constexpr int kLoads = 12;
  auto sim = make_sim("sim:latency_us=100,gbps=0,max_inflight=1,workers=3");
  ASSERT_NE(sim, nullptr);
  Batch batch;
  std::vector<uint8_t> bufs(kLoads * kShard);
  std::vector<Op> ops(kLoads);
  for (int i = 0; i < kLoads; ++i) {
    prepare(&ops[i], &batch, key(40 + i, 0), bufs.data() + i * kShard, kShard);
    sim->load(&ops[i].req);
  }
  ASSERT_TRUE(batch.wait(kLoads));
  for (int i = 0; i < kLoads; ++i) EXPECT_EQ(ops[i].order, uint64_t(i));
  EXPECT_EQ(sim->counters().peak_inflight_loads, 1u);
}

// ---- faults -----------------------------------------------------------------

TEST(SimBackend, FailKeysFromTheSpecFailNamingBlockAndShard) {
  auto sim = make_sim("sim:latency_us=0,fail_keys=7.2+9.0");
  ASSERT_NE(sim, nullptr);
  std::vector<uint8_t> buf(kShard);
  SyncResult r = load_sync(sim.get(), key(7, 2), buf.data(), kShard);
  EXPECT_EQ(res(r.result), res(Result::kBackend));
  EXPECT_TRUE(contains(r.error, "block 7") && contains(r.error, "shard 2")) << r.error;
  r = load_sync(sim.get(), key(9, 0), buf.data(), kShard);
  EXPECT_EQ(res(r.result), res(Result::kBackend));
  EXPECT_TRUE(contains(r.error, "block 9") && contains(r.error, "shard 0")) << r.error;
  r = dump_sync(sim.get(), key(7, 2), buf.data(), kShard);
  EXPECT_EQ(res(r.result), res(Result::kBackend));
  EXPECT_TRUE(contains(r.error, "block 7") && contains(r.error, "shard 2")) << r.error;
  // Neighbours in block and in shard are fine.
  for (const Key& k : {key(7, 1), key(7, 3), key(8, 2), key(9, 1)}) {
    r = load_sync(sim.get(), k, buf.data(), kShard);
    EXPECT_EQ(res(r.result), res(Result::kOk)) << r.error;
    EXPECT_EQ(sim_verify(k, buf.data(), kShard), kShard);
  }
  const BackendCounters c = sim->counters();
  EXPECT_EQ(c.load_failures, 2u);
  EXPECT_EQ(c.dump_failures, 1u);
}

TEST(SimBackend, FailKeysWithMultiDigitShardsFail) {
  auto sim = make_sim("sim:latency_us=0,fail_keys=5.12+3.10", kShard, 16);
  ASSERT_NE(sim, nullptr);
  std::vector<uint8_t> buf(kShard);
  for (const Key& k : {key(5, 12), key(3, 10)}) {
    const SyncResult r = load_sync(sim.get(), k, buf.data(), kShard);
    EXPECT_EQ(res(r.result), res(Result::kBackend)) << "block " << k.block.lo << " shard " << k.shard << ": " << r.error;
  }
  EXPECT_EQ(res(load_sync(sim.get(), key(5, 11), buf.data(), kShard).result), res(Result::kOk));
}

TEST(SimBackend, FailKeyAtRunTimeFailsUntilCleared) {
  auto sim = make_sim("sim:latency_us=0");
  ASSERT_NE(sim, nullptr);
  std::vector<uint8_t> buf(kShard);
  EXPECT_EQ(res(load_sync(sim.get(), key(5, 1), buf.data(), kShard).result), res(Result::kOk));
  sim->fail_key(key(5, 1));
  SyncResult r = load_sync(sim.get(), key(5, 1), buf.data(), kShard);
  EXPECT_EQ(res(r.result), res(Result::kBackend));
  EXPECT_TRUE(contains(r.error, "block 5") && contains(r.error, "shard 1")) << r.error;
  EXPECT_EQ(res(load_sync(sim.get(), key(5, 0), buf.data(), kShard).result), res(Result::kOk));
  sim->clear_faults();
  r = load_sync(sim.get(), key(5, 1), buf.data(), kShard);
  EXPECT_EQ(res(r.result), res(Result::kOk)) << r.error;
  EXPECT_EQ(sim_verify(key(5, 1), buf.data(), kShard), kShard);
}

// Which of n loads (issued one after another, in one FIFO) fail.
std::vector<bool> failures(const std::string& spec, int n) {
  auto sim = make_sim(spec, 64, 4);
  if (!sim) return {};
  Batch batch;
  std::vector<uint8_t> bufs(n * 64);
  std::vector<Op> ops(n);
  for (int i = 0; i < n; ++i) {
    prepare(&ops[i], &batch, key(1000 + i / 4, i % 4), bufs.data() + i * 64, 64);
    sim->load(&ops[i].req);
  }
  EXPECT_TRUE(batch.wait(n));
  std::vector<bool> failed(n);
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(ops[i].req.result == Result::kOk || ops[i].req.result == Result::kBackend) << ops[i].req.error;
    failed[i] = ops[i].req.result != Result::kOk;
  }
  EXPECT_EQ(sim->counters().load_failures, uint64_t(std::count(failed.begin(), failed.end(), true)));
  return failed;
}

TEST(SimBackend, FailFractionIsRoughlyAsConfiguredAndSeeded) {
  constexpr int kLoads = 2000;
  const std::string base = "sim:latency_us=0,gbps=0,max_inflight=1,workers=1,fail_fraction=0.25";
  const std::vector<bool> a = failures(base + ",seed=42", kLoads);
  ASSERT_EQ(a.size(), size_t{kLoads});
  const auto n = std::count(a.begin(), a.end(), true);
  EXPECT_GT(n, 400);  // 500 expected, sd about 19
  EXPECT_LT(n, 600);
  EXPECT_EQ(failures(base + ",seed=42", kLoads), a);  // same seed, same failures
  EXPECT_NE(failures(base + ",seed=43", kLoads), a);
  const std::vector<bool> none = failures("sim:latency_us=0,fail_fraction=0", 200);
  EXPECT_EQ(std::count(none.begin(), none.end(), true), 0);
  const std::vector<bool> all = failures("sim:latency_us=0,fail_fraction=1", 200);
  EXPECT_EQ(std::count(all.begin(), all.end(), true), 200);
}

TEST(SimBackend, HungLoadCompletesOnceWithTimeoutWhenTheStoreGoes) {
  auto sim = make_sim("sim:latency_us=0,hang_keys=11.3");
  ASSERT_NE(sim, nullptr);
  sim->hang_key(key(12, 0));
  std::vector<uint8_t> buf(3 * kShard);
  Batch hung_batch;
  Op hung[2];
  prepare(&hung[0], &hung_batch, key(11, 3), buf.data(), kShard);
  prepare(&hung[1], &hung_batch, key(12, 0), buf.data() + kShard, kShard);
  sim->load(&hung[0].req);
  sim->load(&hung[1].req);
  // The store keeps serving other keys meanwhile, even after a while.
  for (int round = 0; round < 3; ++round) {
    for (const Key& k : {key(11, 2), key(13, 3), key(12, 1)}) {
      const SyncResult r = load_sync(sim.get(), k, buf.data() + 2 * kShard, kShard);
      EXPECT_EQ(res(r.result), res(Result::kOk)) << r.error;
    }
    usleep(5000);
  }
  EXPECT_EQ(hung_batch.count(), 0u);
  EXPECT_EQ(sim->counters().inflight_loads, 2u);
  sim.reset();
  ASSERT_EQ(hung_batch.count(), 2u);  // the destructor completed them
  for (const Op& op : hung) {
    EXPECT_EQ(op.calls, 1);
    EXPECT_EQ(res(op.req.result), res(Result::kTimeout));
    EXPECT_TRUE(contains(op.req.error, "shut down")) << op.req.error;
  }
}

// ---- populated=dumped, counters, touch --------------------------------------

// The contract's cases (what was dumped is there, per shard and per block id)
// run over populated=dumped in store_conformance_test.cpp; here, what only
// the sim store has: its error names the block in decimal, and a dump its
// fault injection failed populates nothing.
TEST(SimBackend, PopulatedDumpedHoldsOnlyWhatWasDumped) {
  auto sim = make_sim("sim:latency_us=0,populated=dumped");
  ASSERT_NE(sim, nullptr);
  std::vector<uint8_t> buf(kShard);
  bool present = true;
  const SyncResult r = load_sync(sim.get(), key(20, 1), buf.data(), kShard);
  EXPECT_EQ(res(r.result), res(Result::kNotFound));
  EXPECT_TRUE(contains(r.error, "block 20") && contains(r.error, "shard 1")) << r.error;

  // A failed dump populates nothing.
  sim->fail_key(key(21, 0));
  EXPECT_EQ(res(dump_sync(sim.get(), key(21, 0), buf.data(), kShard).result), res(Result::kBackend));
  sim->clear_faults();
  ASSERT_EQ(res(sim->exists(key(21, 0), &present)), res(Result::kOk));
  EXPECT_FALSE(present);
  EXPECT_EQ(res(load_sync(sim.get(), key(21, 0), buf.data(), kShard).result), res(Result::kNotFound));
}

TEST(SimBackend, PopulatedAllHoldsEveryShardInRange) {
  auto sim = make_sim("sim:latency_us=0");
  ASSERT_NE(sim, nullptr);
  bool present = false;
  ASSERT_EQ(res(sim->exists(key(77, kShards - 1), &present)), res(Result::kOk));
  EXPECT_TRUE(present);
  ASSERT_EQ(res(sim->exists(key(77, kShards), &present)), res(Result::kOk));
  EXPECT_FALSE(present);
}

TEST(SimBackend, CountersAreExact) {
  auto sim = make_sim("sim:latency_us=0,populated=dumped,fail_keys=30.0");
  ASSERT_NE(sim, nullptr);
  std::vector<uint8_t> buf(kShard);
  for (const Key& k : {key(31, 0), key(31, 1), key(32, 0)})
    ASSERT_EQ(res(dump_sync(sim.get(), k, buf.data(), kShard).result), res(Result::kOk));
  EXPECT_EQ(res(dump_sync(sim.get(), key(30, 0), buf.data(), kShard).result), res(Result::kBackend));
  for (const Key& k : {key(31, 0), key(31, 1), key(32, 0)})
    EXPECT_EQ(res(load_sync(sim.get(), k, buf.data(), kShard).result), res(Result::kOk));
  EXPECT_EQ(res(load_sync(sim.get(), key(33, 0), buf.data(), kShard).result), res(Result::kNotFound));
  EXPECT_EQ(res(load_sync(sim.get(), key(30, 0), buf.data(), kShard).result), res(Result::kBackend));
  const BlockId blocks[] = {block(1), block(2), block(3), block(4)};
  sim->touch(blocks, 4);
  sim->touch(blocks + 1, 2);
  const BackendCounters c = sim->counters();
  EXPECT_EQ(c.loads, 5u);
  EXPECT_EQ(c.load_failures, 2u);
  EXPECT_EQ(c.dumps, 4u);
  EXPECT_EQ(c.dump_failures, 1u);
  EXPECT_EQ(c.touches, 6u);
  EXPECT_EQ(c.bytes_loaded, 3 * kShard);
  EXPECT_EQ(c.bytes_dumped, 3 * kShard);
  EXPECT_EQ(c.inflight_loads, 0u);
  EXPECT_EQ(c.peak_inflight_loads, 1u);  // one at a time
}

TEST(SimBackend, TouchLogsExactlyTheBlocksInOrder) {
  auto sim = make_sim("sim:latency_us=0");
  ASSERT_NE(sim, nullptr);
  const BlockId first[] = {block(3), block(1), block(3)};
  const BlockId second[] = {block(7)};
  sim->touch(first, 3);
  sim->touch(nullptr, 0);
  sim->touch(second, 1);
  const std::vector<BlockId> expect = {block(3), block(1), block(3), block(7)};
  EXPECT_EQ(sim->touched_blocks(), expect);
  EXPECT_EQ(sim->counters().touches, 4u);
  EXPECT_EQ(sim->counters().loads, 0u);
}

// ---- the table of dumped keys -----------------------------------------------

uint64_t state_bytes(const std::string& spec) {
  uint64_t b = 12345;
  EXPECT_EQ(res(backend_node_state_bytes(spec, &b)), res(Result::kOk)) << spec << ": " << last_error();
  return b;
}

TEST(SimBackend, NodeStateBytesFollowTheSpec) {
  EXPECT_EQ(state_bytes("sim:latency_us=0"), 0u) << "populated=all keeps no table";
  EXPECT_EQ(state_bytes("sim:populated=all,dumped_capacity=9"), 0u);
  EXPECT_EQ(state_bytes("posix:/tmp"), 0u) << "the posix store's state is its directory";
  EXPECT_EQ(state_bytes("sim:populated=dumped,dumped_capacity=1000"), SharedKeySet::region_bytes(1000));
  EXPECT_EQ(SharedKeySet::region_bytes(1000), sizeof(KeySetHeader) + 2048 * sizeof(KeySetSlot));
  EXPECT_EQ(state_bytes("sim:populated=dumped"), SharedKeySet::region_bytes(uint64_t{1} << 20)) << "the default";
  uint64_t b = 0;
  for (const char* bad : {"sim:populated=dumped,dumped_capacity=0", "sim:populated=dumped,dumped_capacity=16777217",
                          "sim:dumped_capacity=x", "tape:/dev/st0"}) {
    EXPECT_EQ(res(backend_node_state_bytes(bad, &b)), res(Result::kInvalidArg)) << bad;
    EXPECT_FALSE(last_error().empty()) << bad;
  }
  EXPECT_TRUE(contains(last_error(), "tape")) << last_error();
}

TEST(SimBackend, AFullDumpedTableFailsTheDumpNamingCapacityAndKey) {
  auto sim = make_sim("sim:latency_us=0,populated=dumped,dumped_capacity=3");
  ASSERT_NE(sim, nullptr);
  EXPECT_FALSE(sim->node_shared()) << "no node state given: a private table";
  std::vector<uint8_t> buf(kShard);
  for (uint64_t b = 0; b < 3; ++b)
    ASSERT_EQ(res(dump_sync(sim.get(), key(60 + b, 2), buf.data(), kShard).result), res(Result::kOk));
  // Dumping a key again takes no room.
  ASSERT_EQ(res(dump_sync(sim.get(), key(61, 2), buf.data(), kShard).result), res(Result::kOk));
  const SyncResult r = dump_sync(sim.get(), key(63, 5), buf.data(), kShard);
  EXPECT_EQ(res(r.result), res(Result::kNoSpace));
  EXPECT_TRUE(contains(r.error, "dumped_capacity=3") && contains(r.error, "block 63 shard 5")) << r.error;
  // It never pretends: the key is not there, and the others still are.
  bool present = true;
  ASSERT_EQ(res(sim->exists(key(63, 5), &present)), res(Result::kOk));
  EXPECT_FALSE(present);
  EXPECT_EQ(res(load_sync(sim.get(), key(63, 5), buf.data(), kShard).result), res(Result::kNotFound));
  for (uint64_t b = 0; b < 3; ++b) {
    const SyncResult l = load_sync(sim.get(), key(60 + b, 2), buf.data(), kShard);
    EXPECT_EQ(res(l.result), res(Result::kOk)) << l.error;
    EXPECT_EQ(sim_verify(key(60 + b, 2), buf.data(), kShard), kShard);
  }
  const BackendCounters c = sim->counters();
  EXPECT_EQ(c.dumps, 5u);
  EXPECT_EQ(c.dump_failures, 1u);
}

TEST(SimBackend, StoresOverOneNodeStateShareTheirDumpedKeys) {
  const std::string spec = "sim:latency_us=0,populated=dumped,dumped_capacity=64";
  NodeState created, mapped;
  ASSERT_EQ(res(NodeState::create(state_bytes(spec), &created)), res(Result::kOk)) << last_error();
  ASSERT_GE(created.fd(), 0);
  // A second mapping of the same memfd, as a peer rank makes it.
  ASSERT_EQ(res(NodeState::attach(created.fd(), created.bytes(), &mapped)), res(Result::kOk)) << last_error();
  ASSERT_NE(created.base(), mapped.base());
  auto a = make_sim(spec, kShard, kShards, &created);
  auto b = make_sim(spec, kShard, kShards, &mapped);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(a->node_shared());
  EXPECT_TRUE(b->node_shared());
  std::vector<uint8_t> buf(kShard);
  ASSERT_EQ(res(dump_sync(a.get(), key(70, 3), buf.data(), kShard).result), res(Result::kOk));
  bool present = false;
  ASSERT_EQ(res(b->exists(key(70, 3), &present)), res(Result::kOk));
  EXPECT_TRUE(present) << "what a dumped, b has";
  const SyncResult l = load_sync(b.get(), key(70, 3), buf.data(), kShard);
  EXPECT_EQ(res(l.result), res(Result::kOk)) << l.error;
  EXPECT_EQ(sim_verify(key(70, 3), buf.data(), kShard), kShard);
  EXPECT_EQ(res(load_sync(b.get(), key(70, 4), buf.data(), kShard).result), res(Result::kNotFound));
  ASSERT_EQ(res(dump_sync(b.get(), key(71, 0), buf.data(), kShard).result), res(Result::kOk));
  ASSERT_EQ(res(a->exists(key(71, 0), &present)), res(Result::kOk));
  EXPECT_TRUE(present) << "and the other way round";
  // The memfd is gone from the process once both are dropped; nothing was
  // ever in a file system.
  created.close_fd();
  EXPECT_EQ(created.fd(), -1);
  ASSERT_EQ(res(a->exists(key(70, 3), &present)), res(Result::kOk));
  EXPECT_TRUE(present) << "the mapping outlives the fd";
}

TEST(SimBackend, ANodeStateOfTheWrongSizeOrCapacityIsRefused) {
  const std::string spec = "sim:latency_us=0,populated=dumped,dumped_capacity=64";
  NodeState small;
  ASSERT_EQ(res(NodeState::make_private(state_bytes(spec) - 32, &small)), res(Result::kOk));
  BackendContext c;
  c.shard_bytes = kShard;
  c.shards_per_block = kShards;
  c.node_state = small.base();
  c.node_state_bytes = small.bytes();
  std::unique_ptr<Backend> b;
  EXPECT_EQ(res(make_backend(spec, c, &b)), res(Result::kInvalidArg));
  EXPECT_TRUE(contains(last_error(), "dumped_capacity=64")) << last_error();
  // A table made for another capacity.
  NodeState big;
  ASSERT_EQ(res(NodeState::make_private(state_bytes(spec) * 2, &big)), res(Result::kOk));
  c.node_state = big.base();
  c.node_state_bytes = big.bytes();
  ASSERT_EQ(res(make_backend(spec, c, &b)), res(Result::kOk)) << last_error();
  b.reset();
  EXPECT_EQ(res(make_backend("sim:populated=dumped,dumped_capacity=32", c, &b)), res(Result::kConfigMismatch));
  EXPECT_TRUE(contains(last_error(), "64") && contains(last_error(), "32")) << last_error();
  // Half a context.
  c.node_state_bytes = 0;
  EXPECT_EQ(res(make_backend(spec, c, &b)), res(Result::kInvalidArg));
  // A memfd of another size than the spec says.
  NodeState made;
  ASSERT_EQ(res(NodeState::create(4096, &made)), res(Result::kOk));
  NodeState peer;
  EXPECT_EQ(res(NodeState::attach(made.fd(), 8192, &peer)), res(Result::kConfigMismatch));
  EXPECT_TRUE(contains(last_error(), "4096") && contains(last_error(), "8192")) << last_error();
  EXPECT_EQ(res(NodeState::create(0, &made)), res(Result::kInvalidArg));
}

TEST(SimBackend, ADumpCountsOnlyOnceItCompleted) {
  // One request in flight at a time, held by a hung load: the dump behind it
  // waits in the queue and, until it has run, its key is not in the table.
  auto sim = make_sim("sim:latency_us=0,max_inflight=1,populated=dumped,hang_keys=80.0");
  ASSERT_NE(sim, nullptr);
  Batch batch;
  Op hung, dump, load;
  std::vector<uint8_t> a(kShard), b(kShard), c(kShard);
  prepare(&hung, &batch, key(80, 0), a.data(), kShard);
  prepare(&dump, &batch, key(81, 0), b.data(), kShard);
  prepare(&load, &batch, key(81, 0), c.data(), kShard);
  sim->load(&hung.req);
  sim->dump(&dump.req);
  sim->load(&load.req);
  bool present = true;
  ASSERT_EQ(res(sim->exists(key(81, 0), &present)), res(Result::kOk));
  EXPECT_FALSE(present) << "a dump still queued is not a dump";
  EXPECT_EQ(batch.count(), 0u);
  sim.reset();  // completes all three as abandoned
  ASSERT_TRUE(batch.wait(3));
  EXPECT_EQ(res(dump.req.result), res(Result::kTimeout));
  EXPECT_EQ(res(load.req.result), res(Result::kTimeout));
}

TEST(SharedKeySet, AttachRefusesAForeignOrMismatchedRegion) {
  const uint64_t bytes = SharedKeySet::region_bytes(100);
  NodeState mem;
  ASSERT_EQ(res(NodeState::make_private(bytes, &mem)), res(Result::kOk));
  SharedKeySet s;
  EXPECT_EQ(res(SharedKeySet::attach(mem.base(), bytes - 1, 100, &s)), res(Result::kInvalidArg));
  EXPECT_EQ(res(SharedKeySet::attach(mem.base(), bytes, 0, &s)), res(Result::kInvalidArg));
  EXPECT_EQ(res(SharedKeySet::attach(static_cast<uint8_t*>(mem.base()) + 8, bytes - 8, 1, &s)), res(Result::kInvalidArg));
  ASSERT_EQ(res(SharedKeySet::attach(mem.base(), bytes, 100, &s)), res(Result::kOk)) << last_error();
  ASSERT_EQ(res(s.insert(key(1, 1))), res(Result::kOk));
  SharedKeySet again;
  ASSERT_EQ(res(SharedKeySet::attach(mem.base(), bytes, 100, &again)), res(Result::kOk)) << last_error();
  EXPECT_TRUE(again.contains(key(1, 1))) << "a second attach keeps what is there";
  EXPECT_EQ(res(SharedKeySet::attach(mem.base(), bytes, 99, &again)), res(Result::kConfigMismatch));
  auto* h = static_cast<KeySetHeader*>(mem.base());
  h->abi.store(kKeySetAbi + 1);
  EXPECT_EQ(res(SharedKeySet::attach(mem.base(), bytes, 100, &again)), res(Result::kAbiMismatch));
  EXPECT_TRUE(contains(last_error(), std::to_string(kKeySetAbi + 1))) << last_error();
  h->abi.store(kKeySetAbi);
  h->magic.store(kKeySetMagic ^ 1);
  EXPECT_EQ(res(SharedKeySet::attach(mem.base(), bytes, 100, &again)), res(Result::kCorrupt));
  EXPECT_TRUE(contains(last_error(), "magic")) << last_error();
}

TEST(SharedKeySet, AnAbandonedClaimIsSteppedOver) {
  // A process killed between its claim and its publish leaves a claimed slot
  // for good. Made here by hand: claim the slot a key would take first.
  const uint64_t bytes = SharedKeySet::region_bytes(8);
  NodeState mem;
  ASSERT_EQ(res(NodeState::make_private(bytes, &mem)), res(Result::kOk));
  SharedKeySet s;
  ASSERT_EQ(res(SharedKeySet::attach(mem.base(), bytes, 8, &s)), res(Result::kOk));
  ASSERT_EQ(res(s.insert(key(5, 5))), res(Result::kOk));
  auto* slots = reinterpret_cast<KeySetSlot*>(static_cast<uint8_t*>(mem.base()) + sizeof(KeySetHeader));
  KeySetSlot* home = nullptr;
  for (uint64_t i = 0; i < 16; ++i)
    if ((slots[i].word.load() & 3) == SharedKeySet::kFull) home = &slots[i];
  ASSERT_NE(home, nullptr);
  home->word.store(SharedKeySet::kClaimed | (uint64_t{999999} << 32));  // its claimer died before R1
  EXPECT_FALSE(s.contains(key(5, 5))) << "an unpublished key is not in the set";
  ASSERT_EQ(res(s.insert(key(5, 5))), res(Result::kOk)) << last_error();
  EXPECT_TRUE(s.contains(key(5, 5))) << "inserted past the abandoned slot";
  EXPECT_EQ(s.used(), 2u) << "the abandoned claim still counts";
  for (uint64_t b = 0; b < 6; ++b) ASSERT_EQ(res(s.insert(key(100 + b, 0))), res(Result::kOk)) << b;
  EXPECT_EQ(res(s.insert(key(200, 0))), res(Result::kNoSpace)) << "8 claims made";
  EXPECT_TRUE(contains(last_error(), "capacity 8")) << last_error();
  for (uint64_t b = 0; b < 6; ++b) EXPECT_TRUE(s.contains(key(100 + b, 0))) << b;
  EXPECT_FALSE(s.contains(key(200, 0)));
}

}  // namespace
}  // namespace ucm::test
