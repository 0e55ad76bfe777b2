// Seed scenario A across four real processes on one node cache, step by step:
// lockstep contention under the natural order against rotation.
//
// Four forked processes (local ranks 0-3) share a real control and data plane
// and one 12-shard task (12 blocks, the same shard index). The harness runs
// the seed's story in synchronized steps:
//   1. at step k, every process calls get() on the k-th entry of its
//      rearrange_order() and records the outcome (owner / waiter / hit, the
//      key's bucket and slot) in shared memory;
//   2. all barrier: every get() of the step has happened;
//   3. owners "load from the backend" (fill the slot, mark_ready); waiters
//      wait on the futex word until Ready; everyone checks the bytes and
//      releases its pin;
//   4. all barrier, and the next step begins.
// The parent then checks the seed's sentences literally:
//   natural: at every step 1 owner and 3 waiters, all on the same bucket; 12
//            steps, each with exactly one backend load;
//   rotate:  steps 0-2 have 4 owners on 4 distinct buckets; each rank owns
//            exactly 3 shards (its own stride); no owner (no backend load)
//            after step 2: steps 3-11 are all hits, still 4 distinct buckets.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "common/mp_util.h"
#include "common/test_util.h"
#include "queue/rearrange.h"

namespace ucm::test {
namespace {

constexpr uint32_t kRanks = 4;
constexpr uint32_t kShards = 12;
constexpr uint32_t kShardIndex = 3;
constexpr uint64_t kDeadlineMs = 10000;  // a hang, not slowness

enum Outcome : int32_t { kNone = 0, kOwner = 1, kWaiter = 2, kHit = 3 };

const char* outcome_name(int32_t o) {
  switch (o) {
    case kOwner: return "owner";
    case kWaiter: return "waiter";
    case kHit: return "hit";
  }
  return "none";
}

struct StepRecord {
  std::atomic<int32_t> outcome{kNone};
  std::atomic<int32_t> entry{-1};   // which of the task's 12 entries
  std::atomic<int32_t> bucket{-1};  // bucket_of(key, bucket_mask)
  std::atomic<int32_t> slot{-1};
};

struct ScenarioShared {
  ShmBarrier barrier;
  ShmError error;
  StepRecord rec[kRanks][kShards];
};

// The task's 12 blocks: the first candidates whose keys (shard kShardIndex)
// fall in 12 different buckets. The seed's example has every shard of the task
// on its own bucket lock ("shard0 bucket 37, shard1 bucket 12, ..."); with a
// real hash that is a property of the chosen blocks, so the test picks them.
std::vector<Key> task_keys(const BufferCtrl& c) {
  std::vector<Key> keys;
  std::set<uint32_t> used;
  for (uint64_t b = 1; keys.size() < kShards && b < 100000; ++b) {
    const Key k = key(1000 + b, kShardIndex);
    if (used.insert(bucket_of(k, c.bucket_mask())).second) keys.push_back(k);
  }
  return keys;
}

// One process of the scenario: local rank `rank`, visiting the task in the
// order the queue would.
void run_rank(const TestCache& parent, uint32_t rank, bool rotate, const std::vector<Key>& keys, ScenarioShared* sh) {
  TestCache mine;
  attach_copy(parent, &mine);
  ASSERT_EQ(join_rank_retrying(mine.ctrl, rank, deadline_after_ms(kDeadlineMs)), Result::kOk) << last_error();
  CacheOptions o;
  o.rank = rank;
  CacheBuffer cb(&mine.ctrl, &mine.data, o);
  std::vector<uint32_t> order;
  rearrange_order(kShards, rank, kRanks, rotate, &order);
  const uint64_t bytes = mine.ctrl.slot_bytes();
  const std::atomic<uint32_t>* abort = &sh->error.count;

  for (uint32_t step = 0; step < kShards; ++step) {
    const uint32_t entry = order[step];
    const Key& k = keys[entry];
    GetResult g;
    const Result r = cb.get(k, &g);
    if (r != Result::kOk) {
      sh->error.report("rank %u step %u: get(entry %u): %s", rank, step, entry, last_error().c_str());
      return;
    }
    StepRecord& rec = sh->rec[rank][step];
    rec.entry.store(static_cast<int32_t>(entry));
    rec.bucket.store(static_cast<int32_t>(bucket_of(k, mine.ctrl.bucket_mask())));
    rec.slot.store(static_cast<int32_t>(g.slot));
    rec.outcome.store(g.kind == GetKind::kOwner ? kOwner : g.kind == GetKind::kWaiter ? kWaiter : kHit);

    // Every get() of this step has happened before anyone completes a load.
    if (!sh->barrier.wait(deadline_after_ms(kDeadlineMs), abort)) {
      sh->error.report("rank %u step %u: barrier after get() timed out or aborted", rank, step);
      return;
    }

    if (g.kind == GetKind::kOwner) {  // the backend load, simulated
      fill_pattern(cb.data_at(g.slot), bytes, k);
      if (cb.mark_ready(g.slot) != Result::kOk) {
        sh->error.report("rank %u step %u: mark_ready: %s", rank, step, last_error().c_str());
        return;
      }
    } else if (g.kind == GetKind::kWaiter) {
      uint32_t w = g.word;
      const uint64_t deadline = deadline_after_ms(kDeadlineMs);
      while (word_state(w) != State::kReady) {
        if (word_state(w) == State::kFailed) {
          sh->error.report("rank %u step %u: entry %u failed", rank, step, entry);
          return;
        }
        uint32_t now_word = 0;
        if (cb.wait_for_change(g.slot, w, deadline, &now_word) != Result::kOk) {
          sh->error.report("rank %u step %u: waiting for entry %u: %s", rank, step, entry, last_error().c_str());
          return;
        }
        w = now_word;
      }
    }
    if (const int64_t bad = check_pattern(cb.data_at(g.slot), bytes, k); bad >= 0)
      sh->error.report("rank %u step %u: entry %u: word %lld is not the key's", rank, step, entry,
                       static_cast<long long>(bad));
    cb.release(g.slot);

    if (!sh->barrier.wait(deadline_after_ms(kDeadlineMs), abort)) {
      sh->error.report("rank %u step %u: barrier after the loads timed out or aborted", rank, step);
      return;
    }
  }
  mine.ctrl.leave(rank);
}

// Runs the four processes; the records are in *sh afterwards.
void run_scenario(bool rotate, ScenarioShared* sh, std::vector<Key>* keys_out, uint32_t* mask_out) {
  TestCache tc;
  make_cache(params(64, 0, 256, 16, kRanks), &tc);
  const std::vector<Key> keys = task_keys(tc.ctrl);
  ASSERT_EQ(keys.size(), kShards);
  *keys_out = keys;
  *mask_out = tc.ctrl.bucket_mask();
  sh->barrier.parties = kRanks;
  Children ch;
  pid_t pids[kRanks];
  for (uint32_t r = 0; r < kRanks; ++r) pids[r] = ch.spawn([&, r] { run_rank(tc, r, rotate, keys, sh); });
  for (uint32_t r = 0; r < kRanks; ++r) EXPECT_EQ(ch.wait(pids[r], 3 * kDeadlineMs), 0) << "rank " << r;
  ASSERT_FALSE(sh->error.any()) << sh->error.first();

  // Print the table: one line per step, rank: entry/outcome/bucket.
  for (uint32_t step = 0; step < kShards; ++step) {
    std::string line;
    for (uint32_t r = 0; r < kRanks; ++r) {
      const StepRecord& rec = sh->rec[r][step];
      char buf[80];
      std::snprintf(buf, sizeof(buf), "  r%u: shard%-2d %-6s bucket %-4d", r, rec.entry.load(),
                    outcome_name(rec.outcome.load()), rec.bucket.load());
      line += buf;
    }
    std::printf("[ScenarioA %s] step %2u:%s\n", rotate ? "rotate " : "natural", step, line.c_str());
  }
}

uint32_t count_at(const ScenarioShared& sh, uint32_t step, int32_t outcome) {
  uint32_t n = 0;
  for (uint32_t r = 0; r < kRanks; ++r) n += sh.rec[r][step].outcome.load() == outcome;
  return n;
}

std::set<int32_t> buckets_at(const ScenarioShared& sh, uint32_t step) {
  std::set<int32_t> b;
  for (uint32_t r = 0; r < kRanks; ++r) b.insert(sh.rec[r][step].bucket.load());
  return b;
}

TEST(ScenarioA, NaturalOrderSerializesOnOneBucketWithOneBackendLoadPerStep) {
  Shared<ScenarioShared> sh;
  std::vector<Key> keys;
  uint32_t mask = 0;
  ASSERT_NO_FATAL_FAILURE(run_scenario(false, sh.get(), &keys, &mask));
  uint32_t backend_loads = 0;
  for (uint32_t step = 0; step < kShards; ++step) {
    // "At step k all ranks request shard k ... all pile onto the same bucket."
    for (uint32_t r = 0; r < kRanks; ++r) EXPECT_EQ(sh->rec[r][step].entry.load(), static_cast<int32_t>(step));
    const std::set<int32_t> b = buckets_at(*sh, step);
    EXPECT_EQ(b.size(), 1u) << "step " << step << ": every rank on the same bucket lock";
    EXPECT_EQ(*b.begin(), static_cast<int32_t>(bucket_of(keys[step], mask))) << "step " << step;
    // "Only the one rank that wins owner each step goes back to the backend;
    // the other N-1 ranks" wait.
    EXPECT_EQ(count_at(*sh, step, kOwner), 1u) << "step " << step;
    EXPECT_EQ(count_at(*sh, step, kWaiter), kRanks - 1) << "step " << step;
    EXPECT_EQ(count_at(*sh, step, kHit), 0u) << "step " << step;
    backend_loads += count_at(*sh, step, kOwner);
    std::set<int32_t> slots;
    for (uint32_t r = 0; r < kRanks; ++r) slots.insert(sh->rec[r][step].slot.load());
    EXPECT_EQ(slots.size(), 1u) << "step " << step << ": one slot, filled once";
  }
  // "12 steps with only 1 concurrent backend load throughout."
  EXPECT_EQ(backend_loads, kShards);
}

TEST(ScenarioA, RotationMakesFourConcurrentOwnersForThreeStepsThenOnlyHits) {
  Shared<ScenarioShared> sh;
  std::vector<Key> keys;
  uint32_t mask = 0;
  ASSERT_NO_FATAL_FAILURE(run_scenario(true, sh.get(), &keys, &mask));
  uint32_t owned[kRanks] = {};
  for (uint32_t step = 0; step < kShards; ++step) {
    // "Four different locks, no blocking" at every step, the rotated ones too.
    EXPECT_EQ(buckets_at(*sh, step).size(), kRanks) << "step " << step << ": four distinct buckets";
    if (step < 3) {
      // "Step 0 rank0->shard0, rank1->shard1, rank2->shard2, rank3->shard3 ...
      // all four ranks become owners simultaneously: 4 concurrent backend loads."
      for (uint32_t r = 0; r < kRanks; ++r)
        EXPECT_EQ(sh->rec[r][step].entry.load(), static_cast<int32_t>(r + kRanks * step)) << "rank " << r;
      EXPECT_EQ(count_at(*sh, step, kOwner), kRanks) << "step " << step;
    } else {
      // "A 12-shard task goes from 12 serial steps to 3 steps": nothing is
      // left to load once every rank has swept its own stride.
      EXPECT_EQ(count_at(*sh, step, kOwner), 0u) << "step " << step << ": no backend load after step 2";
      EXPECT_EQ(count_at(*sh, step, kHit), kRanks) << "step " << step;
    }
    EXPECT_EQ(count_at(*sh, step, kWaiter), 0u) << "step " << step << ": nobody waits";
    for (uint32_t r = 0; r < kRanks; ++r) {
      owned[r] += sh->rec[r][step].outcome.load() == kOwner;
      const int32_t entry = sh->rec[r][step].entry.load();
      ASSERT_GE(entry, 0);
      EXPECT_EQ(sh->rec[r][step].bucket.load(), static_cast<int32_t>(bucket_of(keys[entry], mask)));
    }
  }
  // "Ownership is balanced across ranks (1/N each)": 3 shards each, its own stride.
  for (uint32_t r = 0; r < kRanks; ++r) {
    EXPECT_EQ(owned[r], kShards / kRanks) << "rank " << r;
    for (uint32_t step = 0; step < kShards; ++step) {
      if (sh->rec[r][step].outcome.load() == kOwner) {
        EXPECT_EQ(static_cast<uint32_t>(sh->rec[r][step].entry.load()) % kRanks, r) << "rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace ucm::test
