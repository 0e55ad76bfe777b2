// Seed scenario B across real processes: non-owners block on the slot's futex
// word (no CPU while blocked) and wake on the owner's completion, and a
// completion that races the waiter's check-then-block is never lost.
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <random>

#include "common/mp_util.h"
#include "common/test_util.h"

namespace ucm::test {
namespace {

constexpr uint64_t kChildDeadlineMs = 10000;

// ---- (a) blocked waiters use no CPU -------------------------------------------

constexpr uint32_t kWaiters = 3;

struct BlockedShared {
  ShmSignal owned;       // the owner holds the key (value 1)
  ShmSignal registered;  // waiters that got kWaiter and are about to block
  ShmSignal finished;    // waiters done reading
  ShmSignal sampled;     // the parent has seen the waiters' /proc states (value 1)
  std::atomic<uint64_t> mark_ns{0};  // owner: just before mark_ready
  struct Waiter {
    std::atomic<uint64_t> cpu_ns;    // process CPU time spent inside the wait
    std::atomic<uint64_t> begin_ns;  // wall clock: wait began
    std::atomic<uint64_t> end_ns;    // wall clock: wait returned Ready
    std::atomic<uint32_t> state;     // State of the word that ended the wait
    std::atomic<uint32_t> changes;   // wait_for_change calls that returned a change
  } w[kWaiters];
  ShmError error;
};

TEST(ScenarioB, BlockedWaitersUseNoCpuAndWakeReadyOnMarkReady) {
  TestCache tc;
  make_cache(params(16, 0, 4096), &tc);
  Shared<BlockedShared> sh;
  const Key K = key(42, 3);
  constexpr uint64_t kBlockMs = 300;
  Children ch;

  const pid_t owner = ch.spawn([&] {
    TestCache mine;
    attach_copy(tc, &mine);
    ASSERT_EQ(mine.ctrl.join(0), Result::kOk) << last_error();
    CacheOptions o;
    o.rank = 0;
    CacheBuffer cb(&mine.ctrl, &mine.data, o);
    GetResult g;
    ASSERT_EQ(cb.get(K, &g), Result::kOk) << last_error();
    ASSERT_EQ(g.kind, GetKind::kOwner);
    sh->owned.set(1);
    ASSERT_TRUE(sh->registered.wait_ge(kWaiters, deadline_after_ms(kChildDeadlineMs)));
    // The waiters are blocked now; the backend is slow. The load completes
    // only once the parent has sampled the waiters (a step, not a time: a
    // loaded machine may run the parent late, and the samples must fall
    // while the waiters are blocked).
    usleep(kBlockMs * 1000);
    ASSERT_TRUE(sh->sampled.wait_ge(1, deadline_after_ms(kChildDeadlineMs)));
    fill_pattern(cb.data_at(g.slot), mine.ctrl.slot_bytes(), K);
    sh->mark_ns.store(now_ns());
    ASSERT_EQ(cb.mark_ready(g.slot), Result::kOk) << last_error();
    ASSERT_TRUE(sh->finished.wait_ge(kWaiters, deadline_after_ms(kChildDeadlineMs)));
    cb.release(g.slot);
    mine.ctrl.leave(0);
  });

  pid_t waiters[kWaiters];
  for (uint32_t i = 0; i < kWaiters; ++i) {
    waiters[i] = ch.spawn([&, i] {
      const uint32_t rank = 1 + i;
      TestCache mine;
      attach_copy(tc, &mine);
      ASSERT_EQ(mine.ctrl.join(rank), Result::kOk) << last_error();
      CacheOptions o;
      o.rank = rank;
      CacheBuffer cb(&mine.ctrl, &mine.data, o);
      ASSERT_TRUE(sh->owned.wait_ge(1, deadline_after_ms(kChildDeadlineMs)));
      GetResult g;
      ASSERT_EQ(cb.get(K, &g), Result::kOk) << last_error();
      ASSERT_EQ(g.kind, GetKind::kWaiter) << "the owner cannot have finished: it waits for us";
      BlockedShared::Waiter& me = sh->w[i];
      const uint64_t deadline = deadline_after_ms(kChildDeadlineMs);
      sh->registered.add();
      const uint64_t cpu0 = process_cpu_ns();
      me.begin_ns.store(now_ns());
      uint32_t w = g.word;
      while (word_state(w) != State::kReady) {
        uint32_t now_word = 0;
        ASSERT_EQ(cb.wait_for_change(g.slot, w, deadline, &now_word), Result::kOk) << last_error();
        ASSERT_NE(word_state(now_word), State::kFailed) << "nobody failed this load";
        me.changes.fetch_add(1);
        w = now_word;
      }
      me.end_ns.store(now_ns());
      me.cpu_ns.store(process_cpu_ns() - cpu0);
      me.state.store(static_cast<uint32_t>(word_state(w)));
      EXPECT_EQ(check_pattern(cb.data_at(g.slot), mine.ctrl.slot_bytes(), K), -1) << "woken to Ready: the bytes are K's";
      sh->finished.add();
      cb.release(g.slot);
      mine.ctrl.leave(rank);
    });
  }

  // While the owner holds the load, every waiter should be asleep in the
  // kernel. The owner cannot mark before `sampled`, so every sample falls
  // while the waiters are blocked; sampling goes on (bounded) until one is
  // seen asleep, as a waiter that registered may still be on its way in.
  ASSERT_TRUE(sh->registered.wait_ge(kWaiters, deadline_after_ms(kChildDeadlineMs)));
  usleep(60 * 1000);
  std::string states;
  uint32_t sleeping_samples = 0;
  const uint64_t sample_until = deadline_after_ms(kChildDeadlineMs / 2);
  for (int sample = 0; sample < 5 || (sleeping_samples == 0 && now_ns() < sample_until); ++sample) {
    for (uint32_t i = 0; i < kWaiters; ++i) {
      const char s = proc_state(waiters[i]);
      states += s;
      sleeping_samples += s == 'S';
    }
    states += ' ';
    usleep(30 * 1000);
  }
  sh->sampled.set(1);

  for (uint32_t i = 0; i < kWaiters; ++i) EXPECT_EQ(ch.wait(waiters[i], kChildDeadlineMs), 0) << "waiter " << i;
  EXPECT_EQ(ch.wait(owner, kChildDeadlineMs), 0) << "owner";
  const uint64_t mark = sh->mark_ns.load();
  std::printf("[ScenarioB] waiter /proc states while blocked: %s\n", states.c_str());
  for (uint32_t i = 0; i < kWaiters; ++i) {
    const BlockedShared::Waiter& w = sh->w[i];
    const double blocked_ms = static_cast<double>(w.end_ns.load() - w.begin_ns.load()) / 1e6;
    const double cpu_ms = static_cast<double>(w.cpu_ns.load()) / 1e6;
    const double wake_us = static_cast<double>(static_cast<int64_t>(w.end_ns.load() - mark)) / 1e3;
    std::printf("[ScenarioB] waiter %u: blocked %.1f ms, CPU %.3f ms, woke %.1f us after mark_ready, %u change(s)\n", i,
                blocked_ms, cpu_ms, wake_us, w.changes.load());
    EXPECT_EQ(w.state.load(), static_cast<uint32_t>(State::kReady)) << "waiter " << i;
    // A resource check, not a timing one: ~300 ms blocked must cost next to no CPU.
    EXPECT_LT(w.cpu_ns.load(), 20'000'000u) << "waiter " << i << " burned CPU while blocked";
    EXPECT_GE(w.end_ns.load(), mark) << "waiter " << i << " saw Ready before the owner marked it";
    EXPECT_GE(w.changes.load(), 1u);
  }
  EXPECT_GE(sleeping_samples, 1u) << "no waiter was ever seen asleep: " << states;
}

// ---- (b) the completion races the waiter's check-then-block -------------------

// A handoff spins this many pauses (tens of microseconds) before it sleeps:
// long enough to catch a partner running on the other CPU, short enough not
// to burn a time slice when the partner is descheduled on a loaded machine.
constexpr int kHandoffSpins = 2000;
constexpr int kOrderSpins = 3000;  // bound on the waiter's wait for an order (below)
constexpr uint32_t kAhead = 4;     // keys the owner holds ahead of the waiter

struct RaceShared {
  ShmSignal owned;       // iterations whose key the owner holds
  ShmSignal registered;  // iterations whose key the waiter holds as waiter
  std::atomic<uint64_t> ready_before_wait{0};  // the word was Ready just before the waiter called wait_for_change
  std::atomic<uint64_t> waiter_iterations{0};
  std::atomic<uint64_t> mark_ns{0};         // owner: just before this iteration's mark_ready
  std::atomic<uint32_t> marking{0};         // owner: iterations it is about to complete (no futex)
  std::atomic<uint64_t> max_wake_ns{0};     // waiter: longest mark_ready -> wait returned
  ShmError error;
};

TEST(ScenarioB, NoLostWakeupWhenTheCompletionRacesTheWaitersCheckThenBlock) {
  // A few seconds, also under ThreadSanitizer and AddressSanitizer (the
  // handoffs, not the instrumented code, set the pace).
  constexpr uint32_t iterations = 100000;
  const uint64_t seed = test_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (rerun with UCM_TEST_SEED=" << seed << ")");
  TestCache tc;
  make_cache(params(64, 0, 64), &tc);
  Shared<RaceShared> sh;
  Children ch;
  auto k_of = [](uint32_t i) { return key(0x100000 + i, i % 16); };
  const uint64_t t0 = now_ns();

  const pid_t owner = ch.spawn([&] {
    TestCache mine;
    attach_copy(tc, &mine);
    ASSERT_EQ(mine.ctrl.join(0), Result::kOk) << last_error();
    CacheOptions o;
    o.rank = 0;
    CacheBuffer cb(&mine.ctrl, &mine.data, o);
    std::mt19937_64 rng(seed);
    // The owner runs kAhead keys ahead, so the waiter rarely waits for a key
    // to exist: the only handoffs per iteration are "registered" and the
    // completion under test.
    uint32_t slots[kAhead];
    auto own = [&](uint32_t j) {
      const Key k = k_of(j);
      GetResult g;
      if (cb.get(k, &g) != Result::kOk || g.kind != GetKind::kOwner) {
        sh->error.report("iteration %u: the owner did not get a fresh key as owner: %s", j, last_error().c_str());
        return false;
      }
      fill_pattern(cb.data_at(g.slot), mine.ctrl.slot_bytes(), k);
      slots[j % kAhead] = g.slot;
      sh->owned.set(j + 1);
      return true;
    };
    bool good = true;
    for (uint32_t j = 0; j < kAhead && j < iterations && good; ++j) good = own(j);
    for (uint32_t i = 0; i < iterations && good && !sh->error.any(); ++i) {
      if (!sh->registered.wait_ge(i + 1, deadline_after_ms(kChildDeadlineMs), kHandoffSpins)) {
        sh->error.report("iteration %u: the waiter never registered", i);
        break;
      }
      const uint32_t slot = slots[i % kAhead];
      sh->marking.store(i + 1, std::memory_order_release);
      // Vary where the completion lands relative to the waiter's check.
      const uint64_t r = rng();
      switch (r % 16) {
        case 8: case 9: case 10: case 11: case 12:
          for (uint64_t s = (r >> 8) % 64; s > 0; --s) cpu_relax();
          break;
        case 13: case 14:
          for (uint64_t s = 200 + (r >> 8) % 2000; s > 0; --s) cpu_relax();
          break;
        case 15: sched_yield(); break;
        default: break;  // no delay at all
      }
      sh->mark_ns.store(now_ns());
      if (cb.mark_ready(slot) != Result::kOk) {
        sh->error.report("iteration %u: mark_ready failed: %s", i, last_error().c_str());
        break;
      }
      cb.release(slot);
      if (i + kAhead < iterations) good = own(i + kAhead);
    }
    mine.ctrl.leave(0);
  });

  const pid_t waiter = ch.spawn([&] {
    TestCache mine;
    attach_copy(tc, &mine);
    ASSERT_EQ(mine.ctrl.join(1), Result::kOk) << last_error();
    CacheOptions o;
    o.rank = 1;
    // Longer than the deadline: a lost wake-up must not be rescued by the
    // liveness re-check after one slice; it must sleep to the deadline.
    o.liveness_slice_ms = 600000;
    CacheBuffer cb(&mine.ctrl, &mine.data, o);
    std::mt19937_64 rng(seed ^ 0x5bd1e995);
    for (uint32_t i = 0; i < iterations && !sh->error.any(); ++i) {
      const Key k = k_of(i);
      if (!sh->owned.wait_ge(i + 1, deadline_after_ms(kChildDeadlineMs), kHandoffSpins)) {
        sh->error.report("iteration %u: the owner never got the key", i);
        break;
      }
      GetResult g;
      if (cb.get(k, &g) != Result::kOk || g.kind != GetKind::kWaiter) {
        sh->error.report("iteration %u: the waiter's get was not kWaiter (kind %d): %s", i, static_cast<int>(g.kind),
                         last_error().c_str());
        break;
      }
      sh->registered.set(i + 1);
      // Three orders, whatever the scheduler does: call at once (the
      // completion usually comes while asleep); call just as the owner is
      // about to complete (both running: the completion lands inside the
      // check-then-block); call once the word is Ready (the check must not
      // block). The waits are bounded: a descheduled owner only shifts the mix.
      std::atomic<uint32_t>& word = mine.ctrl.slot(g.slot).word;
      switch (rng() % 3) {
        case 0: break;
        case 1:
          for (int s = 0; s < kOrderSpins && sh->marking.load(std::memory_order_acquire) < i + 1; ++s) cpu_relax();
          break;
        default:
          for (int s = 0; s < kOrderSpins && word_state(word.load()) != State::kReady; ++s) cpu_relax();
          break;
      }
      uint32_t w = g.word;
      if (word_state(word.load()) == State::kReady) sh->ready_before_wait.fetch_add(1);
      const uint64_t deadline = deadline_after_ms(5000);
      bool good = true;
      while (word_state(w) != State::kReady) {
        uint32_t now_word = 0;
        const Result r = cb.wait_for_change(g.slot, w, deadline, &now_word);
        // A lost wake-up sleeps to the deadline: wait_for_change then either
        // times out or, re-reading the word, returns the Ready it slept through.
        if (r != Result::kOk || now_ns() >= deadline) {
          sh->error.report("iteration %u: lost wake-up: wait_for_change %s only at its 5 s deadline on slot %u, "
                           "word 0x%x (observed 0x%x): %s",
                           i, r == Result::kOk ? "returned" : "timed out", g.slot, mine.ctrl.slot(g.slot).word.load(),
                           w, last_error().c_str());
          good = false;
          break;
        }
        w = now_word;
      }
      if (good) {
        const uint64_t woke = now_ns(), mark = sh->mark_ns.load();
        if (woke > mark && woke - mark > sh->max_wake_ns.load()) sh->max_wake_ns.store(woke - mark);
      }
      if (good && check_pattern(cb.data_at(g.slot), mine.ctrl.slot_bytes(), k) != -1) {
        sh->error.report("iteration %u: woken to Ready but slot %u does not hold the key's bytes", i, g.slot);
        good = false;
      }
      cb.release(g.slot);
      if (!good) break;
      sh->waiter_iterations.fetch_add(1);
    }
    mine.ctrl.leave(1);
  });

  // Each iteration is bounded by the 5 s wait; the whole loop is not, so
  // allow generously for a slow (sanitized, shared) machine.
  const int rc_w = ch.wait(waiter, 300000);
  const int rc_o = ch.wait(owner, 10000);
  const double secs = static_cast<double>(now_ns() - t0) / 1e9;
  // Every iteration calls wait_for_change with the Idle word from get(): in
  // the first group the completion came before that call, in the second it
  // landed inside the call's check-then-block or after it slept.
  const uint64_t done = sh->waiter_iterations.load();
  const uint64_t before = std::min(done, sh->ready_before_wait.load());
  std::printf("[ScenarioB race] %" PRIu64 "/%u iterations in %.2f s; completion before the wait call: %" PRIu64
              ", during or after it: %" PRIu64 "; longest mark_ready -> waiter running: %.3f ms (seed %" PRIu64 ")\n",
              done, iterations, secs, before, done - before, static_cast<double>(sh->max_wake_ns.load()) / 1e6, seed);
  EXPECT_FALSE(sh->error.any()) << sh->error.first();
  EXPECT_EQ(rc_w, 0) << "waiter";
  EXPECT_EQ(rc_o, 0) << "owner";
  EXPECT_EQ(sh->waiter_iterations.load(), iterations);
}

}  // namespace
}  // namespace ucm::test
