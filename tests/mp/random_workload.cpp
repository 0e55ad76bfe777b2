#include "mp/random_workload.h"

#include <sched.h>
#include <unistd.h>

#include <cinttypes>
#include <cstring>
#include <random>
#include <vector>

namespace ucm::test {
namespace {

struct Pending {
  Key k;
  uint32_t idx;
  uint32_t slot;
  uint32_t word;
};

enum class LoadOutcome { kLoaded, kMarkedFailed, kAbandoned, kError };

class Worker {
 public:
  Worker(WorkloadShared* sh, const TestCache& tc, uint32_t rank, uint32_t inc, uint64_t seed)
      : sh_(*sh),
        cfg_(sh->cfg),
        c_(tc.ctrl),
        data_(tc.data),
        cb_(&tc.ctrl, &tc.data, options(sh->cfg, rank)),
        rank_(rank),
        inc_(inc),
        rng_(seed),
        rs_(sh->ranks[rank]),
        nkeys_(workload_keys(sh->cfg)) {}

  bool run() {
    for (uint64_t n = 0; cfg_.ops == 0 || n < cfg_.ops; ++n) {
      if (sh_.stop.load(std::memory_order_acquire) || sh_.error.any()) break;
      if (!step()) return false;
      rs_.ops.fetch_add(1, std::memory_order_relaxed);
      sh_.global_ops.fetch_add(1, std::memory_order_relaxed);
      if (cfg_.check_every && (n + 1) % cfg_.check_every == 0 && !quiescent_check()) return false;
    }
    return !sh_.error.any();
  }

 private:
  static CacheOptions options(const WorkloadConfig& cfg, uint32_t rank) {
    CacheOptions o;
    o.rank = rank;
    o.wait = cfg.wait;
    o.poll_interval_ms = cfg.poll_interval_ms;
    return o;
  }

  uint32_t below(uint32_t n) { return static_cast<uint32_t>(rng_() % n); }
  bool chance(uint32_t permille) { return below(1000) < permille; }

  uint32_t pick_key() {
    if (chance(700)) {
      // The window slides with everyone's progress: ranks meet on the same keys.
      const uint64_t base = (sh_.global_ops.load(std::memory_order_relaxed) / 64) * 3;
      return static_cast<uint32_t>((base + below(cfg_.window)) % nkeys_);
    }
    return below(nkeys_);
  }

  bool fail(const char* what, const Key& k, uint32_t slot) {
    const uint32_t w = slot < c_.total_slots() ? c_.slot(slot).word.load() : 0;
    sh_.error.report("rank %u (incarnation %u): %s: key %s slot %u word 0x%x (state %u owner %u): %s", rank_, inc_,
                     what, key_str(k).c_str(), slot, w, static_cast<uint32_t>(word_state(w)), word_owner(w),
                     last_error().c_str());
    return false;
  }

  bool step() {
    const uint32_t p = below(1000);
    if (p < 450) return task();
    if (p < 700) return random_batch(1 + below(4));
    if (p < 750) return random_batch(5 + below(4));
    if (p < 850) return touch();
    return prealloc();
  }

  // The seed's task: every rank asks for the same shards at about the same
  // time, each starting at its own offset (RearrangeIndex), so each owns one
  // and waits on the others' loads.
  bool task() {
    constexpr uint32_t kTaskKeys = 6;
    const uint64_t t = sh_.global_ops.load(std::memory_order_relaxed) / 24;
    const uint32_t base = static_cast<uint32_t>((t * kTaskKeys) % nkeys_);
    uint32_t idxs[kTaskKeys];
    for (uint32_t j = 0; j < kTaskKeys; ++j) idxs[j] = (base + (rank_ + j) % kTaskKeys) % nkeys_;
    return get_batch(idxs, kTaskKeys);
  }

  bool random_batch(uint32_t n) {
    uint32_t idxs[8];
    uint32_t m = 0;
    while (m < n) {
      const uint32_t idx = pick_key();
      bool dup = false;
      for (uint32_t j = 0; j < m; ++j) dup |= idxs[j] == idx;
      if (!dup) idxs[m++] = idx;
    }
    return get_batch(idxs, m);
  }

  bool verify(const Key& k, uint32_t idx, uint32_t slot) {
    const int64_t bad = check_pattern(cb_.data_at(slot), c_.slot_bytes(), k);
    if (bad >= 0) {
      char what[128];
      std::snprintf(what, sizeof(what), "a Ready slot does not hold its key's bytes (8-byte word %" PRId64 " differs)",
                    bad);
      return fail(what, k, slot);
    }
    sh_.keys[idx].reads.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  bool incarnation_alive(uint32_t i) const {
    ProcessIdentity id;
    id.pid = sh_.inc[i].pid.load();
    id.start_ticks = sh_.inc[i].start_ticks.load();
    return is_alive(id);
  }

  // Chosen as owner of k in `slot` (pinned): check that nobody else loads it
  // and that it has no Ready copy, fill it, and finish the load.
  LoadOutcome load(const Key& k, uint32_t idx, uint32_t slot, uint32_t attempt, bool may_abandon) {
    KeyStats& ks = sh_.keys[idx];
    const uint32_t me = inc_ + 1;
    const uint32_t prev = ks.owner_tag.exchange(me, std::memory_order_acq_rel);
    if (prev != 0 && incarnation_alive(prev - 1)) {
      char what[160];
      std::snprintf(what, sizeof(what), "two live owners: chosen as owner while incarnation %u (pid %d, rank %u) loads",
                    prev - 1, sh_.inc[prev - 1].pid.load(), sh_.inc[prev - 1].rank.load());
      fail(what, k, slot);
      return LoadOutcome::kError;
    }
    if (const uint32_t other = ready_copy_elsewhere(c_, k, slot); other != kNoSlot) {
      char what[128];
      std::snprintf(what, sizeof(what), "chosen as owner although slot %u holds the key Ready", other);
      fail(what, k, slot);
      return LoadOutcome::kError;
    }
    ks.owner_events.fetch_add(1, std::memory_order_relaxed);

    // Poison first: a half-done load must never pass for the key's bytes.
    void* dst = cb_.data_at(slot);
    const uint64_t bytes = c_.slot_bytes();
    std::memset(dst, 0xEE, bytes);
    const uint64_t words = bytes / 8;
    constexpr uint64_t kChunks = 4;
    for (uint64_t ch = 0; ch < kChunks; ++ch) {
      fill_pattern(dst, bytes, k, ch * words / kChunks, (ch + 1) * words / kChunks);
      if (chance(cfg_.yield_permille)) sched_yield();
    }
    if (chance(cfg_.slow_permille))
      for (uint32_t s = below(20000); s > 0; --s) cpu_relax();
    if (chance(cfg_.sleep_permille)) usleep(200);

    const bool abandon = may_abandon && attempt == 0 && chance(cfg_.abandon_permille);
    const uint32_t fail_pm = attempt == 0 ? cfg_.fail_permille : attempt == 1 ? cfg_.fail_permille / 2 : 0;
    const bool failed = !abandon && chance(fail_pm);
    uint32_t expect = me;
    if (!ks.owner_tag.compare_exchange_strong(expect, 0, std::memory_order_acq_rel)) {
      char what[128];
      std::snprintf(what, sizeof(what), "owner tag changed under a live owner (now %u, expected %u)", expect, me);
      fail(what, k, slot);
      return LoadOutcome::kError;
    }
    if (abandon) {
      ks.abandoned.fetch_add(1, std::memory_order_relaxed);
      cb_.release(slot);  // the library marks it Failed for the waiters
      return LoadOutcome::kAbandoned;
    }
    if (failed) {
      if (cb_.mark_failed(slot) != Result::kOk) {
        fail("mark_failed by the owner failed", k, slot);
        return LoadOutcome::kError;
      }
      ks.failed.fetch_add(1, std::memory_order_relaxed);
      return LoadOutcome::kMarkedFailed;
    }
    if (cb_.mark_ready(slot) != Result::kOk) {
      fail("mark_ready by the owner failed", k, slot);
      return LoadOutcome::kError;
    }
    ks.ready.fetch_add(1, std::memory_order_relaxed);
    return LoadOutcome::kLoaded;
  }

  // Pinned on `slot` (holding k), having seen `w`: until its bytes are Ready
  // and verified. Takes a Failed load over. Does not release.
  bool wait_ready(const Key& k, uint32_t idx, uint32_t slot, uint32_t w, uint32_t attempt, bool as_waiter) {
    const uint64_t deadline = now_ns() + cfg_.wait_deadline_ms * 1000000ull;
    std::atomic<uint32_t>& word = c_.slot(slot).word;
    for (;;) {
      const State s = word_state(w);
      if (s == State::kReady) {
        rs_.woken_ready.fetch_add(1, std::memory_order_relaxed);  // our own loads return below
        return verify(k, idx, slot);
      }
      if (s == State::kFailed || (s == State::kIdle && word_owner(w) == kNoOwner)) {
        if (cb_.try_take_over(slot, w)) {
          rs_.takeovers.fetch_add(1, std::memory_order_relaxed);
          if (as_waiter) rs_.waiter_takeovers.fetch_add(1, std::memory_order_relaxed);
          const LoadOutcome o = load(k, idx, slot, attempt++, false);
          if (o == LoadOutcome::kError) return false;
          if (o == LoadOutcome::kLoaded) return verify(k, idx, slot);
        }
        w = word.load(std::memory_order_acquire);
        if (now_ns() > deadline) return fail("a Failed load was never taken over by the deadline", k, slot);
        continue;
      }
      if (word_owner(w) == rank_) return fail("waiting on a load this rank owns", k, slot);
      uint32_t now_word = 0;
      if (cb_.wait_for_change(slot, w, deadline, &now_word) != Result::kOk)
        return fail("wait_for_change did not see the load finish by the deadline", k, slot);
      w = now_word;
    }
  }

  // Gets distinct keys; owners load at once, waiters wait after the last get.
  bool get_batch(const uint32_t* idxs, uint32_t m) {
    std::vector<Pending> pending;
    pending.reserve(m);
    for (uint32_t j = 0; j < m; ++j) {
      const uint32_t idx = idxs[j];
      const Key k = workload_key(cfg_, idx);
      GetResult g;
      rs_.gets.fetch_add(1, std::memory_order_relaxed);
      const Result r = cb_.get(k, &g);
      if (r == Result::kNoSpace) {
        rs_.no_space.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (r != Result::kOk) {
        for (const Pending& p : pending) cb_.release(p.slot);
        return fail("get failed", k, kNoSlot);
      }
      switch (g.kind) {
        case GetKind::kHit: {
          rs_.hits.fetch_add(1, std::memory_order_relaxed);
          const bool good = verify(k, idx, g.slot);
          cb_.release(g.slot);
          if (!good) return false;
          break;
        }
        case GetKind::kOwner: {
          // Owners load at once, before waiting on anything: no rank ever
          // waits on a load that waits on it.
          rs_.owners.fetch_add(1, std::memory_order_relaxed);
          const LoadOutcome o = load(k, idx, g.slot, 0, true);
          if (o == LoadOutcome::kError) return false;
          if (o == LoadOutcome::kAbandoned) break;  // released already
          bool good = true;
          if (o == LoadOutcome::kMarkedFailed)
            good = wait_ready(k, idx, g.slot, c_.slot(g.slot).word.load(std::memory_order_acquire), 1, false);
          cb_.release(g.slot);
          if (!good) return false;
          break;
        }
        case GetKind::kWaiter:
          rs_.waiters.fetch_add(1, std::memory_order_relaxed);
          pending.push_back(Pending{k, idx, g.slot, g.word});
          break;
      }
    }
    bool good = true;
    for (const Pending& p : pending) {
      if (good) good = wait_ready(p.k, p.idx, p.slot, p.word, 0, true);
      cb_.release(p.slot);
    }
    return good;
  }

  bool touch() {
    BlockId blocks[3];
    const uint32_t n = 1 + below(3);
    for (uint32_t j = 0; j < n; ++j) blocks[j] = workload_key(cfg_, pick_key()).block;
    (void)cb_.touch(blocks, n);  // a corrupt chain shows in get()
    rs_.touches.fetch_add(1, std::memory_order_relaxed);
    return true;
  }

  bool prealloc() {
    const uint32_t n = 1 + below(3);
    for (uint32_t j = 0; j < n; ++j) {
      Key k = workload_key(cfg_, pick_key());
      if (k.shard + 1 >= c_.shards_per_block()) continue;
      k.shard += 1;
      PreallocOutcome o;
      if (cb_.prealloc(k, &o) != Result::kOk) return fail("prealloc failed", k, kNoSlot);
      if (o == PreallocOutcome::kPlacedRegular || o == PreallocOutcome::kPlacedReserved)
        rs_.preallocs_placed.fetch_add(1, std::memory_order_relaxed);
    }
    return true;
  }

  bool quiescent_check() {
    const uint64_t deadline = now_ns() + 60'000'000'000ull;
    if (!sh_.barrier.wait(deadline, &sh_.stop)) {
      if (!sh_.error.any()) sh_.error.report("rank %u: the check barrier timed out (a worker hangs?)", rank_);
      return false;
    }
    bool good = true;
    if (rank_ == 0) {
      QuiescentOptions o;
      o.check_bytes = &check_pattern;
      const std::string why = check_quiescent(c_, &data_, o);
      rs_.checks.fetch_add(1, std::memory_order_relaxed);
      if (!why.empty()) {
        sh_.error.report("quiescent check after %" PRIu64 " operations: %s", sh_.global_ops.load(), why.c_str());
        sh_.stop.store(1);
        good = false;
      }
    }
    if (!sh_.barrier.wait(deadline, &sh_.stop)) {
      if (!sh_.error.any()) sh_.error.report("rank %u: the check barrier timed out (a worker hangs?)", rank_);
      return false;
    }
    return good;
  }

  WorkloadShared& sh_;
  const WorkloadConfig& cfg_;
  const BufferCtrl& c_;
  const BufferData& data_;
  CacheBuffer cb_;
  uint32_t rank_;
  uint32_t inc_;
  std::mt19937_64 rng_;
  RankStats& rs_;
  uint32_t nkeys_;
};

}  // namespace

uint32_t register_incarnation(WorkloadShared* sh, uint32_t rank) {
  const uint32_t i = sh->next_incarnation.fetch_add(1);
  if (i >= kWlMaxIncarnations) {
    std::fprintf(stderr, "too many worker incarnations\n");
    std::abort();
  }
  const ProcessIdentity self = self_identity();
  sh->inc[i].rank.store(rank);
  sh->inc[i].start_ticks.store(self.start_ticks);
  sh->inc[i].pid.store(self.pid);
  return i;
}

bool run_worker(WorkloadShared* sh, const TestCache& tc, uint32_t rank, uint32_t incarnation, uint64_t seed) {
  Worker w(sh, tc, rank, incarnation, seed);
  return w.run();
}

}  // namespace ucm::test
