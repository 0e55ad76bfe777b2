// A stray write into the shared control region (another process's bug) must
// not become a spin or a segfault here: every chain walk is bounded, every
// slot index read from shared memory is range-checked, and an owner or lock
// holder no rank can be never indexes a pin row or rank record. A violation is
// UCM_ERR_CORRUPT naming the place. The garbage is written by a forked
// process into the real region; each public path that walks it runs in a
// child bounded by a deadline, so a hang or a crash fails the test instead of
// hanging it.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "common/mp_util.h"
#include "common/test_util.h"
#include "ctrl/pins.h"
#include "ctrl/recovery.h"

namespace ucm::test {
namespace {

constexpr uint64_t kChildMs = 10000;  // a hang, not slowness: each call takes microseconds
constexpr uint32_t kBadIndex = 4294967;

struct Outcome {
  std::atomic<int32_t> result{-1};
  std::atomic<uint32_t> extra{0};
  char error[512] = {};
};

class CorruptRegion : public ::testing::Test {
 protected:
  void SetUp() override {
    CtrlParams p = params(8, 2, 64, 4);
    p.bucket_count = 64;  // room for keys whose bucket is empty
    make_cache(p, &tc_);
    ASSERT_EQ(tc_.ctrl.join(0), Result::kOk) << last_error();
    cb_ = std::make_unique<CacheBuffer>(&tc_.ctrl, &tc_.data, CacheOptions{});
  }
  void TearDown() override { cb_.reset(); }

  // Loads k (Ready) as rank 0; returns its slot.
  uint32_t load(const Key& k) {
    GetResult g;
    EXPECT_EQ(cb_->get(k, &g), Result::kOk) << last_error();
    EXPECT_EQ(g.kind, GetKind::kOwner);
    EXPECT_EQ(cb_->mark_ready(g.slot), Result::kOk) << last_error();
    cb_->release(g.slot);
    return g.slot;
  }

  // Another key of bucket b, not resident.
  Key other_key_of(uint32_t b, uint64_t from = 1000) const {
    for (uint64_t blk = from;; ++blk)
      for (uint32_t s = 0; s < 4; ++s)
        if (bucket_of(key(blk, s), tc_.ctrl.bucket_mask()) == b) return key(blk, s);
  }
  // A key whose bucket is empty.
  Key key_of_empty_bucket() const {
    for (uint64_t blk = 5000;; ++blk) {
      const Key k = key(blk, 0);
      if (tc_.ctrl.bucket(bucket_of(k, tc_.ctrl.bucket_mask())).head.load() == kNoSlot) return k;
    }
  }

  // The stray write, from another process.
  void scribble(const std::function<void()>& write) {
    const pid_t p = fork_child([&] {
      write();
      return 0;
    });
    ASSERT_EQ(wait_child(p, kChildMs), 0);
  }

  // Runs op in a child joined as rank 1; returns its Result (and its error
  // text), or fails the test if the child hangs or crashes.
  Result in_child(const char* what, const std::function<Result(CacheBuffer&, Outcome*)>& op, std::string* error) {
    ch_.kill_all();
    std::memset(static_cast<void*>(out_->error), 0, sizeof(out_->error));
    out_->result.store(-1);
    out_->extra.store(0);
    const pid_t p = ch_.spawn([&] {
      if (join_rank(tc_.ctrl, 1, deadline_after_ms(kChildMs)) != Result::kOk) {
        ADD_FAILURE() << "join rank 1: " << last_error();
        return;
      }
      CacheOptions o;
      o.rank = 1;
      o.lock_timeout_ms = 2000;
      CacheBuffer cb(&tc_.ctrl, &tc_.data, o);
      const Result r = op(cb, out_.get());
      std::snprintf(out_->error, sizeof(out_->error), "%s", r == Result::kOk ? "" : last_error().c_str());
      out_->result.store(static_cast<int32_t>(r));
      tc_.ctrl.leave(1);
    });
    const int rc = ch_.wait(p, kChildMs);
    EXPECT_EQ(rc, 0) << what << ": the child " << (rc == -1 ? "hung (killed at the deadline)" : "crashed or failed")
                     << " (exit " << rc << ")";
    if (error) *error = out_->error;
    std::printf("%-12s -> %s%s%s\n", what, result_name(static_cast<Result>(out_->result.load())),
                out_->error[0] ? ": " : "", out_->error);
    return static_cast<Result>(out_->result.load());
  }

  TestCache tc_;
  std::unique_ptr<CacheBuffer> cb_;
  Shared<Outcome> out_;
  Children ch_;
};

Result get_op(CacheBuffer& cb, const Key& k) {
  GetResult g;
  const Result r = cb.get(k, &g);
  if (r == Result::kOk) cb.release(g.slot);
  return r;
}

TEST_F(CorruptRegion, AnIndexPastTheEndIsCorruptOnEveryPathThatWalksTheChain) {
  const Key k = key(1, 0);
  const uint32_t b = bucket_of(k, tc_.ctrl.bucket_mask());
  const uint32_t s = load(k);
  scribble([&] { tc_.ctrl.slot(s).next.store(kBadIndex); });
  const Key k2 = other_key_of(b);
  char where[128];
  std::snprintf(where, sizeof(where), "bucket %u's chain: slot index %u at position 1 >= 10 slots", b, kBadIndex);
  std::string e;

  EXPECT_EQ(in_child("get", [&](CacheBuffer& cb, Outcome*) { return get_op(cb, k2); }, &e), Result::kCorrupt);
  EXPECT_NE(e.find(where), std::string::npos) << e;
  EXPECT_EQ(in_child("exists", [&](CacheBuffer& cb, Outcome*) {
              bool present = true;
              return cb.exists(k2, &present);
            }, &e), Result::kCorrupt);
  EXPECT_NE(e.find(where), std::string::npos) << e;
  EXPECT_EQ(in_child("touch", [&](CacheBuffer& cb, Outcome*) { return cb.touch(&k2.block, 1); }, &e),
            Result::kCorrupt);
  EXPECT_NE(e.find(where), std::string::npos) << e;
  EXPECT_EQ(in_child("prealloc", [&](CacheBuffer& cb, Outcome*) {
              PreallocOutcome po;
              return cb.prealloc(k2, &po);
            }, &e), Result::kCorrupt);
  EXPECT_NE(e.find(where), std::string::npos) << e;
  // The resident key before the bad link is still served.
  EXPECT_EQ(in_child("hit", [&](CacheBuffer& cb, Outcome*) { return get_op(cb, k); }, &e), Result::kOk);
}

TEST_F(CorruptRegion, ACycleIsCorruptUnderTheLockAndNeverASpin) {
  const Key k = key(2, 0);
  const uint32_t b = bucket_of(k, tc_.ctrl.bucket_mask());
  const uint32_t s = load(k);
  scribble([&] { tc_.ctrl.slot(s).next.store(s); });
  const Key k2 = other_key_of(b);
  char where[128];
  std::snprintf(where, sizeof(where), "bucket %u's chain: more than 10 links", b);
  std::string e;
  EXPECT_EQ(in_child("get", [&](CacheBuffer& cb, Outcome*) { return get_op(cb, k2); }, &e), Result::kCorrupt);
  EXPECT_NE(e.find(where), std::string::npos) << e;
  EXPECT_EQ(in_child("prealloc", [&](CacheBuffer& cb, Outcome*) {
              PreallocOutcome po;
              return cb.prealloc(k2, &po);
            }, &e), Result::kCorrupt);
  EXPECT_NE(e.find(where), std::string::npos) << e;
  // Lock-free hints cannot tell a cycle from a walk that wandered: they end,
  // and answer "absent".
  EXPECT_EQ(in_child("exists", [&](CacheBuffer& cb, Outcome* o) {
              bool present = true;
              const Result r = cb.exists(k2, &present);
              o->extra.store(present ? 1 : 0);
              return r;
            }, &e), Result::kOk);
  EXPECT_EQ(out_->extra.load(), 0u);
  EXPECT_EQ(in_child("touch", [&](CacheBuffer& cb, Outcome*) { return cb.touch(&k2.block, 1); }, &e), Result::kOk);
}

TEST_F(CorruptRegion, AnEvictionWhoseVictimLinksPastTheEndIsCorruptAndSplicesNothing) {
  // Fill the regular pool; every slot's link is garbage.
  for (uint64_t blk = 10; blk < 18; ++blk) load(key(blk, 0));
  const Key fresh = key_of_empty_bucket();
  scribble([&] {
    for (uint32_t i = 0; i < tc_.ctrl.regular_slots(); ++i) tc_.ctrl.slot(i).next.store(kBadIndex);
  });
  std::string e;
  EXPECT_EQ(in_child("evict", [&](CacheBuffer& cb, Outcome*) { return get_op(cb, fresh); }, &e), Result::kCorrupt);
  EXPECT_NE(e.find("links to slot index 4294967 >= 10 slots"), std::string::npos) << e;
  for (uint32_t b = 0; b < tc_.ctrl.bucket_count(); ++b)
    EXPECT_NE(tc_.ctrl.bucket(b).head.load(), kBadIndex) << "bucket " << b << ": the bad link was spliced in";
}

TEST_F(CorruptRegion, AReapWalkingACorruptChainEndsCorruptAndStillReleasesTheDead) {
  const Key k = key(3, 0);
  const uint32_t b = bucket_of(k, tc_.ctrl.bucket_mask());
  const uint32_t s = load(k);
  // Rank 2 dies holding a claim on k's slot and a pin on it.
  const pid_t doomed = fork_child([&] {
    if (join_rank(tc_.ctrl, 2, deadline_after_ms(kChildMs)) != Result::kOk) return 1;
    tc_.ctrl.pin(2, s).fetch_add(1);
    tc_.ctrl.slot(s).claim.store(holder_id(2));
    for (;;) pause();
  });
  {
    const uint64_t deadline = deadline_after_ms(kChildMs);
    while (tc_.ctrl.slot(s).claim.load() == 0 && now_ns() < deadline) usleep(1000);
  }
  ::kill(doomed, SIGKILL);
  ASSERT_EQ(wait_child(doomed, kChildMs), 128 + SIGKILL);
  scribble([&] { tc_.ctrl.bucket(b).head.store(kBadIndex); });
  std::string e;
  EXPECT_EQ(in_child("reap", [&](CacheBuffer& cb, Outcome*) { return cb.reap(); }, &e), Result::kCorrupt);
  char where[128];
  std::snprintf(where, sizeof(where), "bucket %u's chain: slot index %u at position 0 >= 10 slots", b, kBadIndex);
  EXPECT_NE(e.find(where), std::string::npos) << e;
  EXPECT_EQ(tc_.ctrl.pin(2, s).load(), 0u) << "the dead rank's pin is dropped all the same";
  EXPECT_EQ(tc_.ctrl.rank(2).state.load(), static_cast<uint32_t>(RankState::kFree));
}

TEST_F(CorruptRegion, AnOwnerNoRankCanBeIsCorruptNotAWaitForNobody) {
  const Key k = key(4, 0);
  const uint32_t s = load(k);
  // Idle, owned by "rank 40" (max_ranks is 4; kNoOwner is 63).
  scribble([&] {
    const uint32_t w = tc_.ctrl.slot(s).word.load();
    tc_.ctrl.slot(s).word.store(word_next(w, State::kIdle, 40));
  });
  std::string e;
  EXPECT_EQ(in_child("get", [&](CacheBuffer& cb, Outcome*) { return get_op(cb, k); }, &e), Result::kCorrupt);
  char where[128];
  std::snprintf(where, sizeof(where), "slot %u's word", s);
  EXPECT_NE(e.find(where), std::string::npos) << e;
  EXPECT_NE(e.find("owner rank 40 >= 4 ranks"), std::string::npos) << e;
  // A reap for a dead rank looks at every slot's owner: rank 40 is nobody's
  // to drop, and indexes nothing.
  const pid_t doomed = fork_child([&] { return join_rank(tc_.ctrl, 3, deadline_after_ms(kChildMs)) == Result::kOk ? 0 : 1; });
  ASSERT_EQ(wait_child(doomed, kChildMs), 0);
  EXPECT_EQ(in_child("reap", [&](CacheBuffer& cb, Outcome*) { return cb.reap(); }, &e), Result::kOk);
  EXPECT_EQ(word_owner(tc_.ctrl.slot(s).word.load()), 40u);
}

TEST_F(CorruptRegion, ALockWordNamingNoRankIsCorruptNotATimeout) {
  const Key k = key(5, 0);
  const uint32_t b = bucket_of(k, tc_.ctrl.bucket_mask());
  scribble([&] { tc_.ctrl.bucket(b).lock.store(0x1234); });
  std::string e;
  EXPECT_EQ(in_child("get", [&](CacheBuffer& cb, Outcome*) { return get_op(cb, k); }, &e), Result::kCorrupt);
  char where[128];
  std::snprintf(where, sizeof(where), "bucket %u's lock word names holder id %u > 4 ranks", b, 0x1234);
  EXPECT_NE(e.find(where), std::string::npos) << e;
  tc_.ctrl.bucket(b).lock.store(0);
}

}  // namespace
}  // namespace ucm::test
