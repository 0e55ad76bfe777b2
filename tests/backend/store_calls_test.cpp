// StoreCalls over a real sim store whose hang faults hold exists() and
// touch() (hang_sync=1): an ask is bounded by its deadline and keeps the
// answers it had, another ask gets another thread, touches never wait and
// reach the store in order, a touch past the queue's bound is dropped and
// counted, stop() wakes a waiting ask, and shutdown detaches a stuck thread.
#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "backend/sim_backend.h"
#include "backend/store_calls.h"
#include "backend_test_util.h"
#include "common/hang_guard.h"
#include "common/log_capture.h"
#include "common/thread_names.h"
#include "common/time.h"

namespace ucm::test {
namespace {

constexpr uint64_t kHungLo = 9;  // block 9's shard 0 hangs

Key key_of(uint64_t lo, uint32_t shard = 0) {
  Key k;
  k.block.lo = lo;
  k.shard = shard;
  return k;
}

std::unique_ptr<SimBackend> hanging_sim() {
  BackendContext c;
  c.shard_bytes = 4096;
  c.shards_per_block = 4;
  std::unique_ptr<Backend> b;
  EXPECT_EQ(res(make_backend("sim:latency_us=0,populated=dumped,hang_keys=9.0,hang_sync=1", c, &b)),
            res(Result::kOk))
      << last_error();
  return std::unique_ptr<SimBackend>(static_cast<SimBackend*>(b.release()));
}

uint64_t in_ms(uint64_t ms) { return now_ns() + ms * 1000000ull; }

TEST(StoreCalls, AnAskHeldByTheStoreEndsAtItsDeadlineWithTheAnswersItHad) {
  auto sim = hanging_sim();
  StoreCalls calls(sim.get(), 0);
  const Key keys[3] = {key_of(8), key_of(kHungLo), key_of(10)};
  StoreAnswers a;
  {
    HangGuard g("an ask of a key the store holds");
    EXPECT_EQ(res(calls.ask(keys, 3, in_ms(50), &a)), res(Result::kTimeout));
  }
  ASSERT_EQ(a.per_key.size(), 3u);
  EXPECT_EQ(a.per_key[0], StoreAnswer::kNotHeld);
  EXPECT_EQ(a.per_key[1], StoreAnswer::kUnasked);
  EXPECT_EQ(a.per_key[2], StoreAnswer::kUnasked);
  // Another thread answers the next ask while the first is still held.
  EXPECT_EQ(res(calls.ask(keys, 1, in_ms(10000), &a)), res(Result::kOk));
  EXPECT_EQ(a.per_key[0], StoreAnswer::kNotHeld);
  sim->clear_faults();
  EXPECT_EQ(calls.shutdown(kNoDeadline), 0u);
}

// With every asker held in the store, a further ask waits in the queue until
// its deadline, and then leaves it: a stuck store does not collect work.
TEST(StoreCalls, AnAskNoAskerBeganLeavesTheQueueAtItsDeadline) {
  auto sim = hanging_sim();
  StoreCalls calls(sim.get(), 0);
  const Key hung = key_of(kHungLo), other = key_of(8);
  StoreAnswers a;
  for (uint32_t i = 0; i < StoreCalls::kMaxAskers; ++i)
    EXPECT_EQ(res(calls.ask(&hung, 1, in_ms(10), &a)), res(Result::kTimeout));
  EXPECT_TRUE(eventually("every asker in the store", [&] { return sim->sync_calls_held() == StoreCalls::kMaxAskers; }));
  EXPECT_EQ(res(calls.ask(&other, 1, in_ms(10), &a)), res(Result::kTimeout));
  EXPECT_EQ(a.per_key[0], StoreAnswer::kUnasked);
  EXPECT_EQ(calls.queued_asks(), 0u);
  sim->clear_faults();
  EXPECT_EQ(res(calls.ask(&other, 1, in_ms(10000), &a)), res(Result::kOk));
  EXPECT_EQ(calls.shutdown(kNoDeadline), 0u);
}

TEST(StoreCalls, StopWakesAWaitingAskWithFinalized) {
  auto sim = hanging_sim();
  StoreCalls calls(sim.get(), 0);
  const Key k = key_of(kHungLo);
  std::atomic<int> got{-1};
  std::thread asker([&] {
    StoreAnswers a;
    got.store(static_cast<int>(calls.ask(&k, 1, kNoDeadline, &a)));
  });
  ASSERT_TRUE(eventually("the ask in the store", [&] { return sim->sync_calls_held() == 1; }));
  calls.stop();
  {
    HangGuard g("an ask without a deadline after stop()");
    asker.join();
  }
  EXPECT_EQ(got.load(), static_cast<int>(Result::kFinalized));
  StoreAnswers a;
  EXPECT_EQ(res(calls.ask(&k, 1, kNoDeadline, &a)), res(Result::kFinalized));
  sim->clear_faults();
  EXPECT_EQ(calls.shutdown(kNoDeadline), 0u);
}

TEST(StoreCalls, TouchesNeverWaitReachTheStoreInOrderAndAreDroppedPastTheBound) {
  auto sim = hanging_sim();
  StoreCalls calls(sim.get(), 0);
  const BlockId hung = key_of(kHungLo).block, other = key_of(3).block;
  std::vector<BlockId> many(StoreCalls::kMaxQueuedTouchBlocks, other);
  LogCapture log;
  {
    HangGuard g("touches while the store holds one");
    calls.touch(&hung, 1);
    calls.touch(&other, 1);
    ASSERT_TRUE(eventually("the toucher in the store", [&] { return sim->sync_calls_held() == 1; }));
    calls.touch(many.data(), many.size());  // 2 held or queued already: past the bound
  }
  EXPECT_EQ(calls.touches_dropped(), many.size());
  EXPECT_EQ(log.warnings_with("is not forwarded to it"), 1u) << log.first_lines();
  EXPECT_TRUE(sim->touched_blocks().empty());
  sim->clear_faults();
  const std::vector<BlockId> want = {hung, other};
  EXPECT_TRUE(eventually("the touches in call order", [&] { return sim->touched_blocks() == want; }));
  EXPECT_EQ(calls.shutdown(kNoDeadline), 0u);
}

// Askers and the toucher wait for different things: a wake-up meant for an
// asker must never be spent on the toucher (an ask then waited out its whole
// deadline under ApiThreads in the mpi suite).
TEST(StoreCalls, ConcurrentAsksBesideTouchesAreAllAnswered) {
  auto sim = hanging_sim();
  StoreCalls calls(sim.get(), 0);
  constexpr int kThreads = 6, kAsks = 300;
  std::atomic<int> late{0};
  std::vector<std::thread> ths;
  for (int t = 0; t < kThreads; ++t)
    ths.emplace_back([&, t] {
      for (int i = 0; i < kAsks; ++i) {
        const Key k = key_of(100 + static_cast<uint64_t>(t), static_cast<uint32_t>(i % 4));
        calls.touch(&k.block, 1);
        StoreAnswers a;
        if (calls.ask(&k, 1, in_ms(20000), &a) != Result::kOk) late.fetch_add(1);
      }
    });
  {
    HangGuard g("asks beside touches");
    for (auto& th : ths) th.join();
  }
  EXPECT_EQ(late.load(), 0);
  EXPECT_EQ(calls.shutdown(kNoDeadline), 0u);
}

// Named as common/thread_name.h says, with the local rank.
TEST(StoreCalls, ItsThreadsAreNamed) {
  auto sim = hanging_sim();
  StoreCalls calls(sim.get(), 3);
  const Key k = key_of(8);
  StoreAnswers a;
  ASSERT_EQ(res(calls.ask(&k, 1, in_ms(10000), &a)), res(Result::kOk));
  calls.touch(&k.block, 1);
  EXPECT_TRUE(eventually("the toucher's touch", [&] { return sim->touched_blocks().size() == 1; }));
  const std::multiset<std::string> names = thread_names();
  EXPECT_EQ(names.count("ucm-ask3"), 1u);
  EXPECT_EQ(names.count("ucm-touch3"), 1u);
  EXPECT_EQ(calls.shutdown(kNoDeadline), 0u);
}

TEST(StoreCalls, ShutdownDetachesAThreadStillInTheStoreAndCountsIt) {
  // Both outlive the detached thread: it returns into them.
  static auto* sim = hanging_sim().release();
  static auto* calls = new StoreCalls(sim, 0);
  const Key k = key_of(kHungLo);
  StoreAnswers a;
  EXPECT_EQ(res(calls->ask(&k, 1, in_ms(20), &a)), res(Result::kTimeout));
  {
    HangGuard g("shutdown with a thread in the store");
    EXPECT_EQ(calls->shutdown(in_ms(20)), 1u);
  }
  sim->clear_faults();
  EXPECT_TRUE(eventually("the detached thread's return", [&] { return sim->sync_calls_held() == 0; }));
}

}  // namespace
}  // namespace ucm::test
