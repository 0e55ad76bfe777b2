// Ranks that drift apart, in real processes over one node cache
// (ctrl/protect.h). The ranks are step-synchronized, never timed: at step s
// rank 0 runs task s, then rank 1 runs task s - kLag, one after the other,
// so every run of the test sees the same interleaving. Each task asks for
// kTaskKeys new shards and the cache holds (kLag + 1) tasks' worth: just what
// the lag needs. Without protection CLOCK evicts shards rank 0 loaded before
// rank 1 copied them, and rank 1 loads them again; with it, the node loads
// each shard exactly once.
//
// Also: a rank that dies holds no protection (the reaper drops it from the
// copier mask, and get() reaps before it answers NoSpace).
#include <signal.h>

#include <gtest/gtest.h>

#include <cstdio>

#include "common/mp_util.h"
#include "common/test_util.h"
#include "ctrl/protect.h"

namespace ucm::test {
namespace {

constexpr uint64_t kDeadlineMs = 20000;  // a hang, not slowness
constexpr uint32_t kTaskKeys = 4;
constexpr uint32_t kLag = 3;
constexpr uint32_t kTasks = 12;
constexpr uint32_t kSlots = (kLag + 1) * kTaskKeys;
constexpr uint64_t kShardBytes = 256;
constexpr uint32_t kNever = 600000;  // a grace no run reaches: only the protocol ends protection

struct DriftShared {
  ShmSignal turn;  // 2 * step + rank: whose turn it is
  std::atomic<uint32_t> loads[2];
  std::atomic<uint32_t> hits[2];
  std::atomic<uint32_t> no_space[2];
  ShmError error;
};

Key task_key(uint32_t task, uint32_t i) { return key(1000 + task * kTaskKeys + i, 1); }

// One rank's part of the drift: its tasks, each at its turn.
void run_rank(const TestCache& parent, DriftShared* sh, uint32_t rank) {
  TestCache mine;
  attach_copy(parent, &mine);
  ASSERT_EQ(mine.ctrl.join(rank), Result::kOk) << last_error();
  mine.ctrl.set_copier(rank, true);
  CacheOptions o;
  o.rank = rank;
  CacheBuffer cb(&mine.ctrl, &mine.data, o);
  const uint32_t steps = kTasks + kLag;
  for (uint32_t s = 0; s < steps; ++s) {
    ASSERT_TRUE(sh->turn.wait_ge(2 * s + rank, deadline_after_ms(kDeadlineMs))) << "step " << s;
    const int64_t task = rank == 0 ? int64_t{s} : int64_t{s} - kLag;
    if (task >= 0 && task < kTasks) {
      for (uint32_t i = 0; i < kTaskKeys; ++i) {
        const Key k = task_key(static_cast<uint32_t>(task), i);
        GetResult g;
        const Result r = cb.get(k, &g);
        if (r == Result::kNoSpace) {
          sh->no_space[rank].fetch_add(1);
          continue;
        }
        ASSERT_EQ(r, Result::kOk) << last_error();
        ASSERT_NE(g.kind, GetKind::kWaiter) << "the ranks take turns: nobody is loading";
        if (g.kind == GetKind::kOwner) {
          fill_pattern(cb.data_at(g.slot), kShardBytes, k);
          ASSERT_EQ(cb.mark_ready(g.slot), Result::kOk) << last_error();
          sh->loads[rank].fetch_add(1);
        } else {
          EXPECT_EQ(check_pattern(cb.data_at(g.slot), kShardBytes, k), -1);
          sh->hits[rank].fetch_add(1);
        }
        cb.release(g.slot);
      }
    }
    sh->turn.set(2 * s + rank + 1);
  }
  mine.ctrl.leave(rank);
}

struct DriftResult {
  uint32_t loads = 0, rank1_loads = 0, no_space = 0;
};

DriftResult run_drift(uint32_t grace_ms) {
  TestCache tc;
  make_cache(params(kSlots, 0, kShardBytes, 4, 2), &tc);
  tc.ctrl.set_protect_grace_ms(grace_ms);
  Shared<DriftShared> sh;
  Children ch;
  const pid_t r0 = ch.spawn([&] { run_rank(tc, sh.get(), 0); });
  const pid_t r1 = ch.spawn([&] { run_rank(tc, sh.get(), 1); });
  EXPECT_EQ(ch.wait(r0, kDeadlineMs), 0);
  EXPECT_EQ(ch.wait(r1, kDeadlineMs), 0);
  DriftResult d;
  d.loads = sh->loads[0].load() + sh->loads[1].load();
  d.rank1_loads = sh->loads[1].load();
  d.no_space = sh->no_space[0].load() + sh->no_space[1].load();
  std::printf("[Drift grace %u ms] lag %u tasks, %u tasks of %u keys, %u slots: %u loads for %u shards (%.3f per "
              "shard; rank 1 loaded %u), %u NoSpace\n",
              grace_ms, kLag, kTasks, kTaskKeys, kSlots, d.loads, kTasks * kTaskKeys,
              double(d.loads) / (kTasks * kTaskKeys), d.rank1_loads, d.no_space);
  return d;
}

TEST(Drift, EachShardLoadsOncePerNodeWithProtection) {
  const DriftResult d = run_drift(kNever);
  EXPECT_EQ(d.loads, kTasks * kTaskKeys) << "each shard once per node";
  EXPECT_EQ(d.rank1_loads, 0u) << "the lagging rank finds every shard rank 0 loaded";
  EXPECT_EQ(d.no_space, 0u) << "the cache holds what the lag needs: nobody waits";
}

TEST(Drift, WithoutProtectionTheLaggingRankLoadsAgain) {
  // The control group: the same steps with protection off.
  const DriftResult d = run_drift(0);
  EXPECT_GT(d.loads, kTasks * kTaskKeys) << "CLOCK evicted shards before the lagging rank copied them";
  EXPECT_GT(d.rank1_loads, 0u);
  EXPECT_EQ(d.no_space, 0u);
}

// ---- a dead rank holds nothing ----------------------------------------------------

struct DeadShared {
  ShmSignal joined;
  ShmError error;
};

TEST(Drift, ADeadRankHoldsNoProtection) {
  TestCache tc;
  make_cache(params(kTaskKeys, 0, kShardBytes, 4, 2), &tc);
  tc.ctrl.set_protect_grace_ms(kNever);
  Shared<DeadShared> sh;
  Children ch;
  // Rank 1 joins as a copier and dies without taking anything.
  const pid_t victim = ch.spawn([&] {
    TestCache mine;
    attach_copy(tc, &mine);
    ASSERT_EQ(mine.ctrl.join(1), Result::kOk) << last_error();
    mine.ctrl.set_copier(1, true);
    sh->joined.set(1);
    for (;;) pause();
  });
  ASSERT_TRUE(sh->joined.wait_ge(1, deadline_after_ms(kDeadlineMs)));
  ASSERT_EQ(tc.ctrl.join(0), Result::kOk) << last_error();
  tc.ctrl.set_copier(0, true);
  CacheBuffer cb(&tc.ctrl, &tc.data, CacheOptions{});
  for (uint32_t i = 0; i < kTaskKeys; ++i) {
    GetResult g;
    ASSERT_EQ(cb.get(task_key(0, i), &g), Result::kOk) << last_error();
    ASSERT_EQ(cb.mark_ready(g.slot), Result::kOk);
    cb.release(g.slot);
  }
  // Alive, rank 1 keeps every slot (the protocol the other tests check).
  GetResult g;
  ASSERT_EQ(cb.get(task_key(1, 0), &g), Result::kNoSpace);
  ch.kill_now(victim);
  // Dead, it holds nothing: get() reaps it before it answers NoSpace.
  ASSERT_EQ(cb.get(task_key(1, 0), &g), Result::kOk) << last_error();
  EXPECT_EQ(g.kind, GetKind::kOwner);
  EXPECT_TRUE(g.evicted);
  EXPECT_EQ(tc.ctrl.globals().copiers.load(), 1u) << "the reaper took rank 1 out of the copier mask";
  ASSERT_EQ(cb.mark_ready(g.slot), Result::kOk);
  cb.release(g.slot);
  tc.ctrl.leave(0);
}

}  // namespace
}  // namespace ucm::test
