// Random multi-process stress: four ranks hammer one cache that is smaller
// than their key space, and every invariant of the owner/waiter protocol is
// checked as they go (random_workload.h), at barriers while nobody moves, and
// in the tallies at the end.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstdio>
#include <ostream>
#include <string>

#include "common/ctrl_check.h"
#include "common/mp_util.h"
#include "mp/random_workload.h"

namespace ucm::test {
namespace {

struct RandomParam {
  const char* name;
  EvictMode evict;
  WaitMode wait;
  uint32_t ops;          // per rank, normal build
  uint32_t check_every;  // operations between quiescent walks
};

void PrintTo(const RandomParam& p, std::ostream* os) { *os << p.name; }

class RandomWorkload : public ::testing::TestWithParam<RandomParam> {};

constexpr uint32_t kRanks = 4;

TEST_P(RandomWorkload, FourRanksKeepEveryInvariant) {
  const RandomParam& p = GetParam();
  const uint64_t seed = test_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " (rerun with UCM_TEST_SEED=" << seed << ")");
  // 64 regular + 8 reserved slots, 32 buckets (chains of a few slots), 300
  // keys over 60 blocks: most gets miss, evict, or meet another rank's load.
  CtrlParams cp = params(64, 8, 4096, 8, kRanks, p.evict);
  cp.bucket_count = 32;
  TestCache tc;
  make_cache(cp, &tc);
  Shared<WorkloadShared> sh;
  WorkloadConfig& cfg = sh->cfg;
  cfg.workers = kRanks;
  cfg.ops = p.ops;
  cfg.check_every = p.check_every;
  cfg.wait = p.wait;
  sh->barrier.parties = kRanks;
  ASSERT_LE(workload_keys(cfg), kWlMaxKeys);

  const uint64_t t0 = now_ns();
  Children ch;
  pid_t pids[kRanks];
  for (uint32_t r = 0; r < kRanks; ++r) {
    pids[r] = ch.spawn([&, r] {
      TestCache mine;
      attach_copy(tc, &mine);
      ASSERT_EQ(mine.ctrl.join(r), Result::kOk) << last_error();
      const uint32_t inc = register_incarnation(sh.get(), r);
      const bool good = run_worker(sh.get(), mine, r, inc, mix64(seed + r));
      if (!good) sh->stop.store(1);
      mine.ctrl.leave(r);
      EXPECT_TRUE(good) << sh->error.first();
    });
  }
  for (uint32_t r = 0; r < kRanks; ++r) EXPECT_EQ(ch.wait(pids[r], 240000), 0) << "rank " << r;
  const double secs = static_cast<double>(now_ns() - t0) / 1e9;
  ASSERT_FALSE(sh->error.any()) << sh->error.first();

  // Nobody moves now: the whole plane must be clean, every Ready slot right.
  QuiescentOptions qo;
  qo.check_bytes = &check_pattern;
  QuiescentStats qs;
  EXPECT_EQ(check_quiescent(tc.ctrl, &tc.data, qo, &qs), "");

  // Tallies. Per key: every load that began ended in exactly one of Ready,
  // Failed or abandoned, and nobody still holds the owner tag.
  uint64_t owner_events = 0, ready = 0, failed = 0, abandoned = 0, reads = 0;
  for (uint32_t i = 0; i < workload_keys(cfg); ++i) {
    const KeyStats& k = sh->keys[i];
    EXPECT_EQ(k.owner_events.load(), k.ready.load() + k.failed.load() + k.abandoned.load()) << "key index " << i;
    EXPECT_EQ(k.owner_tag.load(), 0u) << "key index " << i;
    owner_events += k.owner_events.load();
    ready += k.ready.load();
    failed += k.failed.load();
    abandoned += k.abandoned.load();
    reads += k.reads.load();
  }
  uint64_t t_owners = 0, t_takeovers = 0, t_wtakeovers = 0, t_hits = 0, t_waiters = 0, t_woken = 0, t_gets = 0, t_nospace = 0,
           t_ops = 0, t_checks = 0, t_pre = 0;
  uint64_t l_misses = 0, l_takeovers = 0, l_pre_used = 0, l_hits = 0, l_waits = 0, l_evictions = 0;
  for (uint32_t r = 0; r < kRanks; ++r) {
    const RankStats& s = sh->ranks[r];
    t_owners += s.owners.load();
    t_takeovers += s.takeovers.load();
    t_wtakeovers += s.waiter_takeovers.load();
    t_hits += s.hits.load();
    t_waiters += s.waiters.load();
    t_woken += s.woken_ready.load();
    t_gets += s.gets.load();
    t_nospace += s.no_space.load();
    t_ops += s.ops.load();
    t_checks += s.checks.load();
    t_pre += s.preallocs_placed.load();
    const RankCounters& c = tc.ctrl.rank(r).counters;
    l_misses += c.owner_misses.load();
    l_takeovers += c.takeovers.load();
    l_pre_used += c.prealloc_used.load();
    l_hits += c.hits.load();
    l_waits += c.waits.load();
    l_evictions += c.evictions.load();
  }
  // Every owner the library chose was counted by the test, and vice versa.
  EXPECT_EQ(t_owners + t_takeovers, owner_events);
  EXPECT_EQ(l_misses + l_takeovers, owner_events) << "library owner_misses + takeovers vs loads begun";
  EXPECT_EQ(l_hits, t_hits);
  EXPECT_EQ(l_waits, t_waiters);
  // A waiter loads only what failed: takeovers of anything but a
  // preallocated slot are bounded by the loads that failed or were abandoned.
  EXPECT_LE(l_takeovers - l_pre_used, failed + abandoned);
  EXPECT_EQ(t_ops, uint64_t{cfg.ops} * kRanks);
  if (cfg.check_every) {
    EXPECT_EQ(t_checks, cfg.ops / cfg.check_every);
  }
  EXPECT_GT(t_waiters, 0u) << "the workload never made a rank wait: it does not test the waiter path";
  EXPECT_GT(l_evictions, 0u);

  std::printf("[random %s] %.2f s, seed %" PRIu64 ": %" PRIu64 " ops, %" PRIu64 " gets: %" PRIu64 " hits, %" PRIu64
              " owners (+%" PRIu64 " takeovers, %" PRIu64 " of them by waiters), %" PRIu64
              " waiters (%" PRIu64 " woken Ready by another), %" PRIu64 " no-space; loads: %" PRIu64 " ready, %" PRIu64 " failed, %" PRIu64
              " abandoned; %" PRIu64 " evictions, %" PRIu64 " prealloc placed (%" PRIu64 " used); %" PRIu64
              " verified reads; %" PRIu64 " quiescent walks; final: %u resident (%u Ready, %u Failed, %u Idle), "
              "longest chain %u\n",
              p.name, secs, seed, t_ops, t_gets, t_hits, t_owners, t_takeovers, t_wtakeovers, t_waiters, t_woken, t_nospace, ready,
              failed, abandoned, l_evictions, t_pre, l_pre_used, reads, t_checks, qs.resident, qs.ready, qs.failed,
              qs.idle, qs.max_chain);
}

INSTANTIATE_TEST_SUITE_P(Modes, RandomWorkload,
                         ::testing::Values(RandomParam{"ClockFutex", EvictMode::kClock, WaitMode::kFutex, 24000, 2000},
                                           RandomParam{"RingFutex", EvictMode::kRing, WaitMode::kFutex, 10000, 1000},
                                           RandomParam{"ClockPoll", EvictMode::kClock, WaitMode::kPoll, 3000, 500}),
                         [](const ::testing::TestParamInfo<RandomParam>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace ucm::test
