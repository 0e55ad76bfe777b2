// The posix store's io_uring load engine (lib/backend/posix_uring.h) under
// attack through its real interface: real files in a temporary directory,
// real threads, the real ring. A wake-up reaps the reads that landed, refills
// the kernel with queued loads, and only then checks and completes the landed
// ones; these tests aim at that window. Every request's done() must run
// exactly once (backend.h), a kOk must carry exactly the key's bytes, damage
// on disk is kCorrupt or kNotFound naming the key, never data, the kernel
// never holds more than `depth` reads, and every shutdown is bounded.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "backend/posix_backend.h"
#include "backend/sim_content.h"
#include "backend_test_util.h"
#include "common/hang_guard.h"
#include "ucm_build_config.h"

namespace ucm::test {
namespace {

constexpr uint64_t kShard = 8192;
constexpr uint32_t kShards = 4;

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

// A store in `dir` whose loads run on the ring, `depth` reads deep, direct
// reads `mode` (auto, off, on), with `blocks` dumped whole (every shard).
std::unique_ptr<PosixBackend> make_ring(const std::string& dir, uint32_t depth, const std::string& mode,
                                        const std::vector<uint64_t>& blocks = {},
                                        std::vector<std::pair<void*, uint64_t>> buffers = {}) {
  BackendContext c;
  c.shard_bytes = kShard;
  c.shards_per_block = kShards;
  c.buffers = std::move(buffers);
  std::unique_ptr<Backend> b;
  const std::string spec = "posix:" + dir + ",engine=uring,depth=" + std::to_string(depth) + ",direct=" + mode;
  const Result r = make_backend(spec, c, &b);
  EXPECT_EQ(res(r), res(Result::kOk)) << spec << ": " << last_error();
  if (r != Result::kOk) return nullptr;
  auto* p = static_cast<PosixBackend*>(b.release());
  EXPECT_STREQ(p->load_engine(), "uring");
  if (!blocks.empty()) dump_blocks(p, blocks, kShards, kShard);
  return std::unique_ptr<PosixBackend>(p);
}

// The block's id as every message about one of its keys spells it.
std::string block_hex(const Key& k) {
  char s[40];
  std::snprintf(s, sizeof(s), "%016" PRIx64 "%016" PRIx64, k.block.hi, k.block.lo);
  return s;
}

// A load whose done() can hold the ring's thread (the only thread that runs
// done() for the ring) until the test lets it go.
struct Gate {
  std::atomic<bool> entered{false};
  std::atomic<bool> open{false};
};

// Holds the ring's thread in a done() until `g->open`; true if let go in time.
bool hold(Gate* g) {
  g->entered = true;
  return eventually("the gate opened", [g] { return g->open.load(); }, 10);
}

// The gate of the one ring a test holds at a time.
Gate g_gate;

// Loads `p` (key(1, 0) into `buf`) with a done() that holds the ring's thread
// until g_gate opens, and returns once the thread is inside it: the loads made
// next queue behind it.
::testing::AssertionResult hold_the_ring(Backend* b, Op* p, Batch* batch, void* buf) {
  g_gate.entered = false;
  g_gate.open = false;
  prepare(p, batch, key(1, 0), buf, kShard);
  p->req.done = [](IoRequest* r) {
    (void)hold(&g_gate);
    op_done(r);
  };
  b->load(&p->req);
  if (!eventually("P's done() entered", [] { return g_gate.entered.load(); }, 10))
    return ::testing::AssertionFailure() << "the ring's thread never entered P's done()";
  return ::testing::AssertionSuccess();
}

// What every batch must end with: each done() exactly once, nothing extra.
void expect_each_done_once(Batch* batch, const std::vector<Op>& ops) {
  EXPECT_EQ(batch->count(), ops.size()) << "completions counted in the batch (a done() ran twice, or never)";
  for (size_t i = 0; i < ops.size(); ++i) EXPECT_EQ(ops[i].calls, 1) << "request " << i;
}

// ---- many submitters, every depth --------------------------------------------

// Loads of good, never-written and corrupt shards from several threads at
// once, at depth 1, 2, 64 and 1024, direct (where /tmp takes it) and
// buffered, into registered buffers and not: every request completes once,
// with the result its shard deserves, exact bytes for each kOk, and never
// more than `depth` reads in the kernel.
void many_submitters(uint32_t depth, const std::string& mode, bool registered) {
  SCOPED_TRACE("depth=" + std::to_string(depth) + " direct=" + mode + (registered ? " registered" : ""));
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  constexpr int kThreads = 4;
  constexpr int kPerThread = 48;
  constexpr uint64_t kBlocks = 7;  // 1..4 good, 5 corrupt in shard 2, 6 never written, 7 only shard 0 written
  AlignedBuf plane(uint64_t{kThreads} * kPerThread * kShard);
  std::vector<std::pair<void*, uint64_t>> bufs;
  if (registered) bufs.push_back({plane.get(), plane.bytes});
  auto b = make_ring(dir.path, depth, mode, {1, 2, 3, 4, 5}, bufs);
  ASSERT_NE(b, nullptr);
  const Key bad = key(5, 2);
  xor_byte_at(b->block_path(bad.block), static_cast<off_t>(bad.shard * kShard + 777), 0x40);
  {
    AlignedBuf one(kShard);
    sim_fill(key(7, 0), one.get(), kShard);
    ASSERT_EQ(res(dump_sync(b.get(), key(7, 0), one.get(), kShard).result), res(Result::kOk));
  }
  if (mode != "off") {
    EXPECT_TRUE(b->direct_io()) << "/tmp takes O_DIRECT here: the direct path is under test";
  }
  const BackendCounters before = b->counters();

  Batch batch;
  std::vector<Op> ops(kThreads * kPerThread);
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t)
    ts.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const size_t n = static_cast<size_t>(t * kPerThread + i);
        const Key k = key(1 + (n * 5 + static_cast<size_t>(t)) % kBlocks, static_cast<uint32_t>(n % kShards));
        uint8_t* dst = plane.get() + n * kShard;
        std::memset(dst, 0x5A, kShard);
        prepare(&ops[n], &batch, k, dst, kShard);
        b->load(&ops[n].req);
      }
    });
  for (auto& t : ts) t.join();
  ASSERT_TRUE(batch.wait(ops.size(), hang_ms()));
  uint64_t oks = 0;
  for (size_t n = 0; n < ops.size(); ++n) {
    const IoRequest& r = ops[n].req;
    const uint64_t blk = r.key.block.lo;
    SCOPED_TRACE("request " + std::to_string(n) + " " + block_hex(r.key) + " shard " + std::to_string(r.key.shard));
    if (r.key == bad) {
      EXPECT_EQ(res(r.result), res(Result::kCorrupt)) << r.error;
      EXPECT_TRUE(contains(r.error, block_hex(r.key))) << r.error;
      EXPECT_TRUE(contains(r.error, "checksum")) << r.error;
    } else if (r.key.block == key(6, 0).block || (r.key.block == key(7, 0).block && r.key.shard != 0)) {
      EXPECT_EQ(res(r.result), res(Result::kNotFound)) << r.error;
      EXPECT_TRUE(contains(r.error, block_hex(r.key))) << r.error;
    } else {
      ASSERT_EQ(res(r.result), res(Result::kOk)) << r.error << " (block " << blk << ")";
      EXPECT_EQ(sim_verify(r.key, plane.get() + n * kShard, kShard), kShard) << "a kOk with bytes not the key's";
      ++oks;
    }
  }
  EXPECT_EQ(b->shutdown(kNoDeadline), 0u);
  expect_each_done_once(&batch, ops);
  const BackendCounters c = b->counters();
  EXPECT_LE(c.peak_inflight_loads, depth) << "more reads in the kernel than depth";
  EXPECT_EQ(c.inflight_loads, 0u);
  EXPECT_EQ(c.loads - before.loads, ops.size());
  EXPECT_EQ(c.load_failures - before.load_failures, ops.size() - oks);
}

TEST(PosixRingAdversarial, ManySubmittersAtDepthOne) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  many_submitters(1, "off", false);
  many_submitters(1, "auto", true);
}

TEST(PosixRingAdversarial, ManySubmittersAtDepthTwo) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  many_submitters(2, "auto", false);
}

TEST(PosixRingAdversarial, ManySubmittersAtLargeDepths) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  many_submitters(64, "auto", true);
  many_submitters(64, "off", false);
  many_submitters(1024, "auto", false);
}

// ---- done() that loads again, on the ring's own thread -------------------------

struct Chain {
  PosixBackend* store = nullptr;
  std::atomic<int> left{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::unique_ptr<Op>> ops;  // every request made, owned here
  std::vector<std::unique_ptr<AlignedBuf>> bufs;
  std::vector<std::thread::id> threads;  // where each done() ran
  Batch batch;
  uint64_t blocks = 4;
};
Chain* g_chain = nullptr;

void chain_next(Chain* ch, uint64_t seed);

void chain_done(IoRequest* r) {
  Chain* ch = g_chain;
  {
    std::lock_guard<std::mutex> g(ch->mu);
    ch->threads.push_back(std::this_thread::get_id());
  }
  // Two more loads from inside done() while the chain runs: the ring's thread
  // submits into its own queue, ahead of its next wake-up.
  const bool go_on = r->result == Result::kOk && !ch->stop.load();
  const uint64_t seed = reinterpret_cast<uintptr_t>(r) >> 4;
  op_done(r);
  if (!go_on) return;
  for (int i = 0; i < 2; ++i)
    if (ch->left.fetch_sub(1) > 0) chain_next(ch, seed + static_cast<uint64_t>(i));
}

void chain_next(Chain* ch, uint64_t seed) {
  Op* op = nullptr;
  void* dst = nullptr;
  {
    std::lock_guard<std::mutex> g(ch->mu);
    ch->ops.push_back(std::make_unique<Op>());
    ch->bufs.push_back(std::make_unique<AlignedBuf>(kShard));
    op = ch->ops.back().get();
    dst = ch->bufs.back()->get();
  }
  prepare(op, &ch->batch, key(1 + seed % ch->blocks, static_cast<uint32_t>(seed % kShards)), dst, kShard);
  op->req.done = &chain_done;
  ch->store->load(&op->req);
}

// done() callbacks that load again run on the ring's thread, between its
// refill and its next wait: every chained load completes once, with its
// bytes, at depth 1 (where a done() that submits finds the kernel full) and 3.
void reentrant_chains(uint32_t depth) {
  SCOPED_TRACE("depth=" + std::to_string(depth));
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto b = make_ring(dir.path, depth, "auto", {1, 2, 3, 4});
  ASSERT_NE(b, nullptr);
  Chain ch;
  ch.store = b.get();
  ch.left = 200;
  g_chain = &ch;
  for (uint64_t s = 0; s < 3; ++s) chain_next(&ch, s * 5);
  // 3 roots and 200 chained; a chained load is made only while `left` was > 0.
  ASSERT_TRUE(eventually("every chained load done", [&] { return ch.batch.count() >= 203; }, 30));
  EXPECT_EQ(b->shutdown(kNoDeadline), 0u);
  std::lock_guard<std::mutex> g(ch.mu);
  ASSERT_EQ(ch.ops.size(), 203u);
  EXPECT_EQ(ch.batch.count(), 203u);
  for (size_t i = 0; i < ch.ops.size(); ++i) {
    const IoRequest& r = ch.ops[i]->req;
    EXPECT_EQ(ch.ops[i]->calls, 1) << i;
    ASSERT_EQ(res(r.result), res(Result::kOk)) << i << ": " << r.error;
    EXPECT_EQ(sim_verify(r.key, ch.bufs[i]->get(), kShard), kShard) << i;
  }
  std::set<std::thread::id> on(ch.threads.begin(), ch.threads.end());
  EXPECT_EQ(on.size(), 1u) << "every done() on the ring's one thread";
  EXPECT_LE(b->counters().peak_inflight_loads, depth);
  g_chain = nullptr;
}

TEST(PosixRingAdversarial, DoneThatLoadsAgainAtDepthOne) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  reentrant_chains(1);
}

TEST(PosixRingAdversarial, DoneThatLoadsAgainAtDepthThree) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  reentrant_chains(3);
}

// One request submitted again from its own done(), 300 times, on keys that
// load (a read that lands) and keys never written (a load that fails in its
// preparation, completed inside the refill loop): each pass completes once,
// with its own key's result and bytes, never the previous pass's.
struct Relay {
  PosixBackend* store = nullptr;
  IoRequest req;
  AlignedBuf buf{kShard};
  int pass = 0;
  std::vector<Result> results;
  std::vector<bool> bytes_ok;
  std::atomic<bool> finished{false};
  static Key key_of(int pass) {
    // Blocks 1..4 are stored; block 9 never was.
    return pass % 3 == 2 ? key(9, static_cast<uint32_t>(pass % kShards))
                         : key(1 + static_cast<uint64_t>(pass) % 4, static_cast<uint32_t>(pass % kShards));
  }
  void start() {
    req.key = key_of(pass);
    req.buf = buf.get();
    req.bytes = kShard;
    req.result = Result::kBadState;
    req.error[0] = '\0';
    // The previous pass's bytes stay: a pass that did not read would show them.
    store->load(&req);
  }
  static void done(IoRequest* r) {
    Relay* self = static_cast<Relay*>(r->user);
    self->results.push_back(r->result);
    self->bytes_ok.push_back(r->result != Result::kOk || sim_verify(r->key, r->buf, kShard) == kShard);
    if (++self->pass == 300) {
      self->finished = true;
      return;
    }
    self->start();
  }
};

TEST(PosixRingAdversarial, ARequestReloadedFromItsOwnDone) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  for (uint32_t depth : {1u, 2u}) {
    SCOPED_TRACE("depth=" + std::to_string(depth));
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    auto b = make_ring(dir.path, depth, "auto", {1, 2, 3, 4});
    ASSERT_NE(b, nullptr);
    Relay relay;
    relay.store = b.get();
    relay.req.done = &Relay::done;
    relay.req.user = &relay;
    relay.start();
    ASSERT_TRUE(eventually("300 passes of one request", [&] { return relay.finished.load(); }, 30));
    EXPECT_EQ(b->shutdown(kNoDeadline), 0u);
    ASSERT_EQ(relay.results.size(), 300u) << "a pass completed twice, or never";
    for (int p = 0; p < 300; ++p) {
      const Result want = p % 3 == 2 ? Result::kNotFound : Result::kOk;
      EXPECT_EQ(res(relay.results[static_cast<size_t>(p)]), res(want)) << "pass " << p;
      EXPECT_TRUE(relay.bytes_ok[static_cast<size_t>(p)]) << "pass " << p << ": a kOk with bytes not the key's";
    }
  }
}

// Destroying the store while done() callbacks keep loading from the ring's
// thread: the loads queued then complete kTimeout, the ones in the kernel
// land and complete; each exactly once, and destruction returns.
TEST(PosixRingAdversarial, DestroyedWhileDoneCallbacksKeepLoading) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  for (uint32_t depth : {1u, 4u}) {
    SCOPED_TRACE("depth=" + std::to_string(depth));
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    auto b = make_ring(dir.path, depth, "auto", {1, 2, 3, 4});
    ASSERT_NE(b, nullptr);
    Chain ch;
    ch.store = b.get();
    ch.left = 1 << 30;  // endless until the store refuses
    g_chain = &ch;
    for (uint64_t s = 0; s < 4; ++s) chain_next(&ch, s * 3);
    ASSERT_TRUE(eventually("the chains running", [&] { return ch.batch.count() >= 50; }, 30));
    {
      HangGuard guard("destroying a store whose done() callbacks load");
      b.reset();
    }
    std::lock_guard<std::mutex> g(ch.mu);
    size_t timeouts = 0;
    EXPECT_EQ(ch.batch.count(), ch.ops.size()) << "every request made completed, once";
    for (size_t i = 0; i < ch.ops.size(); ++i) {
      const IoRequest& r = ch.ops[i]->req;
      EXPECT_EQ(ch.ops[i]->calls, 1) << i;
      if (r.result == Result::kTimeout) {
        ++timeouts;
        continue;
      }
      ASSERT_EQ(res(r.result), res(Result::kOk)) << i << ": " << r.error;
      EXPECT_EQ(sim_verify(r.key, ch.bufs[i]->get(), kShard), kShard) << i;
    }
    EXPECT_GE(timeouts, 1u) << "the chains end only where the store refuses them";
    g_chain = nullptr;
  }
}

// ---- shutdown with landed reads not yet checked ----------------------------------

// depth=4: load P's done() holds the ring's thread while the next reads are
// in the kernel and more are queued; they land (out of the kernel's count)
// with their checks and done() still to run when shutdown begins. Shutdown
// without a deadline completes every one exactly once: the landed ones kOk
// with their bytes, the queued ones kTimeout (or kOk where the ring took them).
TEST(PosixRingAdversarial, ShutdownWhileLandedReadsWaitForTheirChecks) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto b = make_ring(dir.path, 4, "auto", {1, 2, 3, 4});
  ASSERT_NE(b, nullptr);
  Batch batch;
  std::vector<Op> ops(12);
  std::vector<std::unique_ptr<AlignedBuf>> bufs;
  for (size_t i = 0; i < ops.size(); ++i) bufs.push_back(std::make_unique<AlignedBuf>(kShard));
  ASSERT_TRUE(hold_the_ring(b.get(), &ops[0], &batch, bufs[0]->get()));
  // The ring's thread is inside P's done(): these queue behind it.
  for (size_t i = 1; i < ops.size(); ++i) {
    prepare(&ops[i], &batch, key(1 + i % 4, static_cast<uint32_t>(i % kShards)), bufs[i]->get(), kShard);
    b->load(&ops[i].req);
  }
  std::thread opener([&] {
    // Let P go only once shutdown has begun (its stop() refuses new loads).
    (void)eventually("shutdown began", [&] {
      Op probe;
      AlignedBuf pb(kShard);
      Batch pbatch;
      prepare(&probe, &pbatch, key(1, 0), pb.get(), kShard);
      b->load(&probe.req);
      (void)pbatch.wait(1, hang_ms());
      return probe.req.result == Result::kTimeout;
    }, 10);
    g_gate.open = true;
  });
  uint32_t left = 0;
  {
    HangGuard guard("shutdown with landed reads");
    left = b->shutdown(kNoDeadline);
  }
  opener.join();
  EXPECT_EQ(left, 0u);
  ASSERT_TRUE(batch.wait(ops.size(), hang_ms()));
  expect_each_done_once(&batch, ops);
  for (size_t i = 0; i < ops.size(); ++i) {
    const IoRequest& r = ops[i].req;
    if (r.result == Result::kTimeout) continue;
    ASSERT_EQ(res(r.result), res(Result::kOk)) << i << ": " << r.error;
    EXPECT_EQ(sim_verify(r.key, bufs[i]->get(), kShard), kShard) << i;
  }
  EXPECT_EQ(b->counters().inflight_loads, 0u);
}

// The same with a deadline that passes while P's done() holds the ring: the
// store reports the ring left behind, and from shutdown's return on no done()
// runs, and none ever runs twice. The store then may not be destroyed
// (backend.h): it is left for the process's life.
TEST(PosixRingAdversarial, ShutdownPastItsDeadlineCallsNoDoneAfterItReturns) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  auto dir = std::make_unique<TempDir>();  // emptied once the ring is idle; the store itself is never freed
  ASSERT_TRUE(dir->ok());
  auto b = make_ring(dir->path, 4, "off", {1, 2});
  ASSERT_NE(b, nullptr);
  // Kept with the store for the process's life (reachable, not leaked): its
  // requests may never complete, and it may never be destroyed.
  struct LeftBehind {
    std::unique_ptr<PosixBackend> store;
    Batch batch;
    std::vector<Op> ops = std::vector<Op>(8);
    std::vector<std::unique_ptr<AlignedBuf>> bufs;
  };
  static auto* kept = new std::vector<LeftBehind*>;
  kept->push_back(new LeftBehind);
  Batch* batch = &kept->back()->batch;
  std::vector<Op>* ops = &kept->back()->ops;
  std::vector<std::unique_ptr<AlignedBuf>>* bufs = &kept->back()->bufs;
  for (size_t i = 0; i < ops->size(); ++i) bufs->push_back(std::make_unique<AlignedBuf>(kShard));
  ASSERT_TRUE(hold_the_ring(b.get(), &(*ops)[0], batch, (*bufs)[0]->get()));
  for (size_t i = 1; i < ops->size(); ++i) {
    prepare(&(*ops)[i], batch, key(1 + i % 2, static_cast<uint32_t>(i % kShards)), (*bufs)[i]->get(), kShard);
    b->load(&(*ops)[i].req);
  }
  const uint64_t deadline = now_ns() + 20'000'000;
  std::thread opener([&] {
    (void)eventually("the deadline passed", [&] { return now_ns() > deadline + 20'000'000; }, 10);
    g_gate.open = true;
  });
  uint32_t left = 0;
  {
    HangGuard guard("shutdown past its deadline");
    left = b->shutdown(deadline);
  }
  opener.join();
  EXPECT_EQ(left, 1u) << "the ring was inside a request at the deadline";
  const size_t at_return = batch->count();
  // Whatever the ring still does now, it completes nothing: give it time to
  // land and check what is left (bounded: the count must not move).
  for (int i = 0; i < 100; ++i) {
    usleep(1000);
    ASSERT_EQ(batch->count(), at_return) << "a done() ran after shutdown returned";
  }
  for (size_t i = 0; i < ops->size(); ++i) EXPECT_LE((*ops)[i].calls, 1) << i;
  for (size_t i = 0; i < ops->size(); ++i) {
    const IoRequest& r = (*ops)[i].req;
    if ((*ops)[i].calls == 1 && r.result == Result::kOk) {
      EXPECT_EQ(sim_verify(r.key, (*bufs)[i]->get(), kShard), kShard) << i;
    }
  }
  ASSERT_TRUE(eventually("the left-behind ring idle", [&] { return b->counters().inflight_loads == 0; }, 10));
  kept->back()->store = std::move(b);  // threads left behind: never destroyed (backend.h)
}

// ---- damage between the queue and the read -----------------------------------------

// With the ring's thread held in a done(), loads queue; meanwhile their files
// are removed, replaced by another block's file, emptied, cut into the
// index, punched with a hole (a sparse range: zeros) or flipped. Each then
// fails with what its file deserves, naming the key, and never delivers a
// kOk: the destinations are filled beforehand with the key's right bytes, so
// a load that skipped the read, or checked stale memory, would pass.
void damage_while_queued(const std::string& mode, uint32_t depth) {
  SCOPED_TRACE("direct=" + mode + " depth=" + std::to_string(depth));
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto b = make_ring(dir.path, depth, mode, {1, 2, 3, 4, 5, 6, 7, 8});
  ASSERT_NE(b, nullptr);
  Batch batch;
  std::vector<Op> ops(9);
  std::vector<std::unique_ptr<AlignedBuf>> bufs;
  for (size_t i = 0; i < ops.size(); ++i) bufs.push_back(std::make_unique<AlignedBuf>(kShard));
  ASSERT_TRUE(hold_the_ring(b.get(), &ops[0], &batch, bufs[0]->get()));
  // 1: removed; 2: replaced by block 8's file; 3: emptied; 4: cut into its
  // index; 5: a hole punched over shard 1; 6: a byte flipped in shard 3;
  // 7: untouched (the control); 8 is the replacement (gone from its name).
  struct Case {
    Key k;
    Result want;
    const char* says;
  };
  const std::vector<Case> cases = {
      {key(1, 2), Result::kNotFound, ""},
      {key(2, 1), Result::kCorrupt, "another block"},
      {key(3, 0), Result::kNotFound, "never completely written"},
      {key(4, 3), Result::kNotFound, ""},
      {key(5, 1), Result::kCorrupt, "checksum"},
      {key(6, 3), Result::kCorrupt, "checksum"},
      {key(7, 2), Result::kOk, ""},
      {key(8, 0), Result::kNotFound, ""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    sim_fill(cases[i].k, bufs[i + 1]->get(), kShard);  // the right bytes, before the load
    prepare(&ops[i + 1], &batch, cases[i].k, bufs[i + 1]->get(), kShard);
    b->load(&ops[i + 1].req);
  }
  ASSERT_EQ(unlink(b->block_path(key(1, 0).block).c_str()), 0);
  ASSERT_EQ(rename(b->block_path(key(8, 0).block).c_str(), b->block_path(key(2, 0).block).c_str()), 0);
  ASSERT_EQ(truncate(b->block_path(key(3, 0).block).c_str(), 0), 0);
  ASSERT_EQ(truncate(b->block_path(key(4, 0).block).c_str(), static_cast<off_t>(b->index_offset())), 0);
  {
    const std::string p = b->block_path(key(5, 0).block);
    const int fd = open(p.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0) << p;
    const int f = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1 * kShard, kShard);
    close(fd);
    if (f != 0) GTEST_SKIP() << "no hole punching here: " << strerror(errno);
  }
  xor_byte_at(b->block_path(key(6, 0).block), static_cast<off_t>(3 * kShard + kShard - 1), 0x01);
  g_gate.open = true;
  ASSERT_TRUE(batch.wait(ops.size(), hang_ms()));
  EXPECT_EQ(res(ops[0].req.result), res(Result::kOk)) << ops[0].req.error;
  for (size_t i = 0; i < cases.size(); ++i) {
    const IoRequest& r = ops[i + 1].req;
    SCOPED_TRACE("case " + std::to_string(i) + " block " + block_hex(r.key));
    EXPECT_EQ(res(r.result), res(cases[i].want)) << r.error;
    if (cases[i].want == Result::kOk) {
      EXPECT_EQ(sim_verify(r.key, bufs[i + 1]->get(), kShard), kShard);
      continue;
    }
    EXPECT_TRUE(contains(r.error, block_hex(r.key))) << r.error;
    EXPECT_TRUE(contains(r.error, cases[i].says)) << r.error;
  }
  EXPECT_EQ(b->shutdown(kNoDeadline), 0u);
  expect_each_done_once(&batch, ops);
  EXPECT_EQ(b->counters().inflight_loads, 0u);
  EXPECT_LE(b->counters().peak_inflight_loads, depth);
}

TEST(PosixRingAdversarial, FilesDamagedWhileLoadsAreQueuedBuffered) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  damage_while_queued("off", 1);
  damage_while_queued("off", 8);
}

TEST(PosixRingAdversarial, FilesDamagedWhileLoadsAreQueuedDirect) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  damage_while_queued("auto", 1);
  damage_while_queued("auto", 8);
}

// Files cut short (and rewritten) by another thread while loads of them are
// prepared, in the kernel and landed: a read that meets the cut comes back
// short (truncated) or with a hole's zeros; the load is then kCorrupt or
// kNotFound, and a kOk always carries exactly the key's bytes.
TEST(PosixRingAdversarial, TruncationRacingTheReadsIsNeverAnOkWithWrongBytes) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  for (const char* mode : {"off", "auto"}) {
    SCOPED_TRACE(std::string("direct=") + mode);
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    auto b = make_ring(dir.path, 6, mode, {1, 2});
    ASSERT_NE(b, nullptr);
    std::vector<uint8_t> image;  // block 1's file as dumped
    {
      const std::string p = b->block_path(key(1, 0).block);
      const int fd = open(p.c_str(), O_RDONLY | O_CLOEXEC);
      ASSERT_GE(fd, 0);
      struct stat st;
      ASSERT_EQ(fstat(fd, &st), 0);
      image.resize(static_cast<size_t>(st.st_size));
      ASSERT_EQ(pread(fd, image.data(), image.size(), 0), static_cast<ssize_t>(image.size()));
      close(fd);
    }
    std::atomic<bool> stop{false};
    std::thread cutter([&] {
      const std::string p = b->block_path(key(1, 0).block);
      uint32_t i = 0;
      while (!stop.load()) {
        // Cut into a shard, then restore the file as it was, in place.
        (void)truncate(p.c_str(), static_cast<off_t>((i++ % kShards) * kShard + 512));
        const int fd = open(p.c_str(), O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
          (void)!pwrite(fd, image.data(), image.size(), 0);
          close(fd);
        }
      }
    });
    uint64_t ok = 0, bad = 0;
    for (int round = 0; round < 40; ++round) {
      Batch batch;
      std::vector<Op> ops(24);
      std::vector<std::unique_ptr<AlignedBuf>> bufs;
      for (size_t i = 0; i < ops.size(); ++i) {
        bufs.push_back(std::make_unique<AlignedBuf>(kShard));
        const Key k = key(1 + i % 2, static_cast<uint32_t>(i % kShards));
        prepare(&ops[i], &batch, k, bufs[i]->get(), kShard);
        b->load(&ops[i].req);
      }
      ASSERT_TRUE(batch.wait(ops.size(), hang_ms()));
      for (size_t i = 0; i < ops.size(); ++i) {
        const IoRequest& r = ops[i].req;
        ASSERT_EQ(ops[i].calls, 1);
        if (r.result == Result::kOk) {
          ++ok;
          ASSERT_EQ(sim_verify(r.key, bufs[i]->get(), kShard), kShard) << "a kOk with bytes not the key's";
        } else {
          ++bad;
          ASSERT_TRUE(r.result == Result::kCorrupt || r.result == Result::kNotFound) << res(r.result) << ": " << r.error;
          EXPECT_TRUE(contains(r.error, block_hex(r.key))) << r.error;
        }
      }
    }
    stop = true;
    cutter.join();
    EXPECT_GT(ok, 0u) << "block 2 is never cut";
    EXPECT_EQ(b->shutdown(kNoDeadline), 0u);
    EXPECT_LE(b->counters().peak_inflight_loads, 6u);
    EXPECT_EQ(b->counters().inflight_loads, 0u);
  }
}

// A file another process rewrites under the same key (another content, the
// store's own format) while loads of it run: each kOk is one whole version
// of the shard, never a mix nor another key's.
TEST(PosixRingAdversarial, ARedumpRacingTheLoadsGivesOneWholeVersion) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto b = make_ring(dir.path, 4, "auto");
  ASSERT_NE(b, nullptr);
  // Two versions of key (1, s): A (sim content) and B (its complement).
  AlignedBuf va(kShard), vb(kShard);
  std::vector<std::string> images;
  for (int v = 0; v < 2; ++v) {
    for (uint32_t s = 0; s < kShards; ++s) {
      sim_fill(key(1, s), va.get(), kShard);
      for (uint64_t j = 0; j < kShard; ++j) vb.get()[j] = static_cast<uint8_t>(~va.get()[j]);
      ASSERT_EQ(res(dump_sync(b.get(), key(1, s), v == 0 ? va.get() : vb.get(), kShard).result), res(Result::kOk));
    }
    const std::string p = b->block_path(key(1, 0).block);
    std::string img;
    const int fd = open(p.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    struct stat st;
    ASSERT_EQ(fstat(fd, &st), 0);
    img.resize(static_cast<size_t>(st.st_size));
    ASSERT_EQ(pread(fd, img.data(), img.size(), 0), static_cast<ssize_t>(img.size()));
    close(fd);
    images.push_back(img);
  }
  std::atomic<bool> stop{false};
  std::thread swapper([&] {
    // Whole files renamed into place, A and B in turn.
    const std::string p = b->block_path(key(1, 0).block);
    for (uint32_t i = 0; !stop.load(); ++i) {
      const std::string tmp = dir.path + "/swap.tmp";
      const int fd = open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
      if (fd < 0) continue;
      (void)!pwrite(fd, images[i % 2].data(), images[i % 2].size(), 0);
      close(fd);
      (void)rename(tmp.c_str(), p.c_str());
    }
  });
  uint64_t ok = 0;
  for (int round = 0; round < 30; ++round) {
    Batch batch;
    std::vector<Op> ops(16);
    std::vector<std::unique_ptr<AlignedBuf>> bufs;
    for (size_t i = 0; i < ops.size(); ++i) {
      bufs.push_back(std::make_unique<AlignedBuf>(kShard));
      prepare(&ops[i], &batch, key(1, static_cast<uint32_t>(i % kShards)), bufs[i]->get(), kShard);
      b->load(&ops[i].req);
    }
    ASSERT_TRUE(batch.wait(ops.size(), hang_ms()));
    for (size_t i = 0; i < ops.size(); ++i) {
      const IoRequest& r = ops[i].req;
      ASSERT_EQ(ops[i].calls, 1);
      // Between unlink and rename there is no gap (rename is atomic): the
      // name always holds a whole file.
      ASSERT_EQ(res(r.result), res(Result::kOk)) << r.error;
      ++ok;
      const uint8_t* got = bufs[i]->get();
      sim_fill(r.key, va.get(), kShard);
      for (uint64_t j = 0; j < kShard; ++j) vb.get()[j] = static_cast<uint8_t>(~va.get()[j]);
      const bool is_a = std::memcmp(got, va.get(), kShard) == 0;
      const bool is_b = std::memcmp(got, vb.get(), kShard) == 0;
      ASSERT_TRUE(is_a || is_b) << "load " << i << " of shard " << r.key.shard << ": neither version whole";
    }
  }
  stop = true;
  swapper.join();
  EXPECT_EQ(ok, 30u * 16u);
  EXPECT_EQ(b->shutdown(kNoDeadline), 0u);
}

// touch() on a direct store (it warms only the header indexes now) and on a
// buffered one, from other threads while loads run: it changes no load's
// result nor bytes, fails on nothing (a block never stored, a removed file),
// and is counted.
TEST(PosixRingAdversarial, TouchBesideLoadsChangesNoLoad) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  for (const char* mode : {"auto", "off"}) {
    SCOPED_TRACE(std::string("direct=") + mode);
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    auto b = make_ring(dir.path, 4, mode, {1, 2, 3});
    ASSERT_NE(b, nullptr);
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> touched{0};
    std::thread toucher([&] {
      const BlockId blocks[] = {key(1, 0).block, key(2, 0).block, key(3, 0).block, key(9, 0).block};
      while (!stop.load()) {
        b->touch(blocks, 4);
        touched += 4;
      }
    });
    Batch batch;
    std::vector<Op> ops(64);
    std::vector<std::unique_ptr<AlignedBuf>> bufs;
    for (size_t i = 0; i < ops.size(); ++i) {
      bufs.push_back(std::make_unique<AlignedBuf>(kShard));
      prepare(&ops[i], &batch, key(1 + i % 3, static_cast<uint32_t>(i % kShards)), bufs[i]->get(), kShard);
      b->load(&ops[i].req);
    }
    ASSERT_TRUE(batch.wait(ops.size(), hang_ms()));
    stop = true;
    toucher.join();
    for (size_t i = 0; i < ops.size(); ++i) {
      ASSERT_EQ(res(ops[i].req.result), res(Result::kOk)) << ops[i].req.error;
      EXPECT_EQ(sim_verify(ops[i].req.key, bufs[i]->get(), kShard), kShard) << i;
    }
    EXPECT_EQ(b->counters().touches, touched.load());
    EXPECT_EQ(b->shutdown(kNoDeadline), 0u);
    expect_each_done_once(&batch, ops);
  }
}

// ---- open files ----------------------------------------------------------------------

// Sets RLIMIT_NOFILE so that exactly `free_fds` descriptors can still be
// opened (the lowest free numbers), and restores it when it goes.
struct FdBudget {
  rlimit old{};
  bool ok = false;
  explicit FdBudget(int free_fds) {
    if (getrlimit(RLIMIT_NOFILE, &old) != 0) return;
    int end = 0, free_seen = 0;
    for (; end < 65536 && free_seen < free_fds; ++end)
      if (fcntl(end, F_GETFD) < 0) ++free_seen;
    rlimit lim = old;
    lim.rlim_cur = static_cast<rlim_t>(end);
    ok = free_seen == free_fds && lim.rlim_cur <= old.rlim_cur && setrlimit(RLIMIT_NOFILE, &lim) == 0;
  }
  ~FdBudget() {
    if (ok) (void)setrlimit(RLIMIT_NOFILE, &old);
  }
};

// A load needs one open file from its preparation to its end, and at most
// `depth` loads are in the store at once: a process with `depth` (and one)
// descriptors to spare loads without "Too many open files", on either
// engine. The ring holds a landed read's file past the refill that follows
// it (its checks and close run after), so without care it holds up to
// 2 x depth files, and loads that the thread engine serves fail (kBackend,
// EMFILE) under the same budget.
TEST(PosixRingAdversarial, ALoadedRingNeedsNoMoreOpenFilesThanDepth) {
  if (const std::string why = no_ring_here(); !why.empty()) GTEST_SKIP() << why;
  constexpr uint32_t kDepth = 8;
  for (const char* engine : {"threads", "uring"}) {
    SCOPED_TRACE(std::string("engine=") + engine);
    TempDir dir;
    ASSERT_TRUE(dir.ok());
    BackendContext c{kShard, kShards};
    std::unique_ptr<Backend> b;
    ASSERT_EQ(res(make_backend("posix:" + dir.path + ",depth=8,direct=off,engine=" + engine, c, &b)),
              res(Result::kOk)) << last_error();
    dump_blocks(b.get(), {1, 2, 3, 4, 5, 6, 7, 8}, kShards, kShard);
    uint64_t failed = 0;
    std::string first_error;
    {
      FdBudget budget(kDepth + 1);
      ASSERT_TRUE(budget.ok) << "could not lower RLIMIT_NOFILE";
      for (int round = 0; round < 50 && failed == 0; ++round) {
        Batch batch;
        std::vector<Op> ops(32);
        std::vector<std::unique_ptr<AlignedBuf>> bufs;
        for (size_t i = 0; i < ops.size(); ++i) {
          bufs.push_back(std::make_unique<AlignedBuf>(kShard));
          prepare(&ops[i], &batch, key(1 + i % 8, static_cast<uint32_t>(i % kShards)), bufs[i]->get(), kShard);
          b->load(&ops[i].req);
        }
        ASSERT_TRUE(batch.wait(ops.size(), hang_ms()));
        for (size_t i = 0; i < ops.size(); ++i) {
          if (ops[i].req.result == Result::kOk) {
            EXPECT_EQ(sim_verify(ops[i].req.key, bufs[i]->get(), kShard), kShard) << i;
            continue;
          }
          if (failed++ == 0) first_error = ops[i].req.error;
        }
      }
    }
    EXPECT_EQ(failed, 0u) << "loads failed under a budget of depth + 1 open files, the first: " << first_error;
    EXPECT_LE(b->counters().peak_inflight_loads, kDepth);
  }
}

}  // namespace
}  // namespace ucm::test
