// Seed scenarios C, D and E, slot by slot, through the real shared planes.
#include <gtest/gtest.h>

#include "common/test_util.h"
#include "ctrl/pins.h"

namespace ucm::test {
namespace {

// Loads k as owner (fill, mark ready, release); returns its slot.
uint32_t load(CacheBuffer& cb, const Key& k) {
  GetResult g;
  EXPECT_EQ(cb.get(k, &g), Result::kOk) << last_error();
  EXPECT_EQ(g.kind, GetKind::kOwner);
  std::memset(cb.data_at(g.slot), static_cast<int>(k.block.lo & 0xff), cb.ctrl().slot_bytes());
  EXPECT_EQ(cb.mark_ready(g.slot), Result::kOk) << last_error();
  cb.release(g.slot);
  return g.slot;
}

uint32_t slot_of(const CacheBuffer& cb, const Key& k) {
  return resident_slot(cb.ctrl(), k);
}

bool bit(const CacheBuffer& cb, uint32_t slot) { return cb.ctrl().accessed(slot).load() != 0; }

TEST(ScenarioC, ClockPreservesTheBlockThatWasHit) {
  TestCache tc;
  make_cache(params(4), &tc);
  ASSERT_EQ(tc.ctrl.join(0), Result::kOk);
  CacheBuffer cb(&tc.ctrl, &tc.data, CacheOptions{});
  const Key A = key(1, 0), B = key(2, 0), C = key(3, 0), D = key(4, 0), E = key(5, 0), F = key(6, 0);
  // Loaded A/B/C/D in turn: slots 0..3, each accessed bit set on load, cursor at 0.
  EXPECT_EQ(load(cb, A), 0u);
  EXPECT_EQ(load(cb, B), 1u);
  EXPECT_EQ(load(cb, C), 2u);
  EXPECT_EQ(load(cb, D), 3u);
  for (uint32_t s = 0; s < 4; ++s) EXPECT_TRUE(bit(cb, s)) << "slot " << s;
  EXPECT_EQ(tc.ctrl.globals().clock_hand.load() % 4, 0u);

  // Miss E: one lap clears all four bits, the raw cursor then picks slot 0.
  EXPECT_EQ(load(cb, E), 0u);
  EXPECT_TRUE(bit(cb, 0)) << "E was just loaded";
  EXPECT_FALSE(bit(cb, 1));
  EXPECT_FALSE(bit(cb, 2));
  EXPECT_FALSE(bit(cb, 3));
  EXPECT_EQ(tc.ctrl.globals().clock_hand.load() % 4, 1u) << "cursor at slot 1";
  EXPECT_EQ(slot_of(cb, A), kNoSlot) << "A was the victim";

  // Someone gets B (slot 1): the hit sets its bit again.
  GetResult g;
  ASSERT_EQ(cb.get(B, &g), Result::kOk);
  EXPECT_EQ(g.kind, GetKind::kHit);
  EXPECT_EQ(g.slot, 1u);
  cb.release(g.slot);
  EXPECT_TRUE(bit(cb, 1));

  // Miss F: slot 1 (B) gets its second chance, slot 2 (C) is the victim.
  EXPECT_EQ(load(cb, F), 2u);
  EXPECT_EQ(slot_of(cb, B), 1u) << "B survives";
  EXPECT_EQ(slot_of(cb, C), kNoSlot) << "C is evicted";
  EXPECT_EQ(slot_of(cb, D), 3u);
  EXPECT_EQ(slot_of(cb, E), 0u);
  EXPECT_EQ(slot_of(cb, F), 2u);
  EXPECT_EQ(cb.counters().evictions.load(), 2u);
}

TEST(ScenarioC, RingEvictsTheBlockThatWasHit) {
  // The legacy control group: the same sequence under ring eviction loses B.
  TestCache tc;
  make_cache(params(4, 0, 64, 16, 4, EvictMode::kRing), &tc);
  ASSERT_EQ(tc.ctrl.join(0), Result::kOk);
  CacheBuffer cb(&tc.ctrl, &tc.data, CacheOptions{});
  for (uint64_t b = 1; b <= 4; ++b) load(cb, key(b, 0));
  EXPECT_EQ(load(cb, key(5, 0)), 0u);
  GetResult g;
  ASSERT_EQ(cb.get(key(2, 0), &g), Result::kOk);
  cb.release(g.slot);
  EXPECT_EQ(load(cb, key(6, 0)), 1u) << "ring takes cursor + 1, the block just hit";
  EXPECT_EQ(slot_of(cb, key(2, 0)), kNoSlot);
}

TEST(ScenarioD, TouchPreservesAllShardsOfABlock) {
  TestCache tc;
  make_cache(params(6, 0, 64, 3), &tc);
  ASSERT_EQ(tc.ctrl.join(0), Result::kOk);
  CacheBuffer cb(&tc.ctrl, &tc.data, CacheOptions{});
  std::vector<BlockId> forwarded;
  cb.set_touch_hook(
      [](void* ctx, const BlockId* blocks, size_t n) {
        auto* v = static_cast<std::vector<BlockId>*>(ctx);
        v->insert(v->end(), blocks, blocks + n);
      },
      &forwarded);
  const uint64_t T = 100, U = 200, V = 300, W = 400, X = 500;
  EXPECT_EQ(load(cb, key(T, 0)), 0u);
  EXPECT_EQ(load(cb, key(T, 1)), 1u);
  EXPECT_EQ(load(cb, key(T, 2)), 2u);
  EXPECT_EQ(load(cb, key(U, 0)), 3u);
  EXPECT_EQ(load(cb, key(V, 0)), 4u);
  EXPECT_EQ(load(cb, key(W, 0)), 5u);

  // "One miss sweeps all the new-load bits clear" and T stays in 0/1/2: a miss
  // that finds every slot pinned clears every bit in its first lap and evicts
  // nothing in its second.
  std::vector<uint32_t> pinned;
  for (const Key& k : {key(T, 0), key(T, 1), key(T, 2), key(U, 0), key(V, 0), key(W, 0)}) {
    GetResult g;
    ASSERT_EQ(cb.get(k, &g), Result::kOk);
    ASSERT_EQ(g.kind, GetKind::kHit);
    pinned.push_back(g.slot);
  }
  GetResult miss;
  EXPECT_EQ(cb.get(key(X, 0), &miss), Result::kNoSpace);
  for (uint32_t s : pinned) cb.release(s);
  for (uint32_t s = 0; s < 6; ++s) EXPECT_FALSE(bit(cb, s)) << "slot " << s;
  EXPECT_EQ(tc.ctrl.globals().clock_hand.load() % 6, 0u) << "cursor back at slot 0";

  // Touch T: all three resident shards get their bit, and the batch goes down.
  const BlockId t = block(T);
  size_t marked = 0;
  EXPECT_EQ(cb.touch(&t, 1, &marked), Result::kOk);
  EXPECT_EQ(marked, 3u);
  EXPECT_TRUE(bit(cb, 0));
  EXPECT_TRUE(bit(cb, 1));
  EXPECT_TRUE(bit(cb, 2));
  EXPECT_FALSE(bit(cb, 3));
  ASSERT_EQ(forwarded.size(), 1u);
  EXPECT_EQ(forwarded[0], t);

  // Miss X: slots 0, 1, 2 get a second chance; slot 3 (U) is the victim.
  EXPECT_EQ(load(cb, key(X, 0)), 3u);
  EXPECT_EQ(slot_of(cb, key(T, 0)), 0u);
  EXPECT_EQ(slot_of(cb, key(T, 1)), 1u);
  EXPECT_EQ(slot_of(cb, key(T, 2)), 2u);
  EXPECT_EQ(slot_of(cb, key(U, 0)), kNoSlot) << "U is evicted";
  EXPECT_EQ(slot_of(cb, key(V, 0)), 4u);
  EXPECT_EQ(slot_of(cb, key(W, 0)), 5u);
}

TEST(ScenarioE, PreallocHangsIdleSlotsInTheReservedPoolAndGetTakesThemOver) {
  TestCache tc;
  make_cache(params(3, 4, 64, 8), &tc);
  ASSERT_EQ(tc.ctrl.join(0), Result::kOk);
  CacheBuffer cb(&tc.ctrl, &tc.data, CacheOptions{});
  const uint32_t s = 2;
  const uint64_t B0 = 10, B1 = 11, B2 = 12, B3 = 13;
  // The task: B0.s, B1.s, B2.s fill the regular pool.
  load(cb, key(B0, s));
  load(cb, key(B1, s));
  load(cb, key(B2, s));
  const uint64_t evictions_before = cb.counters().evictions.load();

  // Idle window: prealloc (Bi, s+1). The regular pool is full: reserved pool.
  for (uint64_t b : {B0, B1, B2}) {
    PreallocOutcome o;
    ASSERT_EQ(cb.prealloc(key(b, s + 1), &o), Result::kOk);
    EXPECT_EQ(o, PreallocOutcome::kPlacedReserved) << "block " << b;
    const uint32_t slot = slot_of(cb, key(b, s + 1));
    ASSERT_NE(slot, kNoSlot) << "on the bucket chain";
    EXPECT_GE(slot, 3u) << "a reserved slot";
    const uint32_t w = tc.ctrl.slot(slot).word.load();
    EXPECT_EQ(word_state(w), State::kIdle);
    EXPECT_EQ(word_owner(w), kNoOwner);
    EXPECT_EQ(pin_count(tc.ctrl, slot), 0u) << "ref = 0";
  }
  EXPECT_EQ(slot_of(cb, key(B3, s + 1)), kNoSlot) << "B3 is not in the task: nothing happens";
  EXPECT_EQ(slot_of(cb, key(B0, s)), 0u) << "prealloc never evicts the regular pool";
  EXPECT_EQ(slot_of(cb, key(B1, s)), 1u);
  EXPECT_EQ(slot_of(cb, key(B2, s)), 2u);

  // The next task requests (B0, s+1): Get takes the idle slot over as owner,
  // without a victim search.
  const uint32_t pre = slot_of(cb, key(B0, s + 1));
  GetResult g;
  ASSERT_EQ(cb.get(key(B0, s + 1), &g), Result::kOk);
  EXPECT_EQ(g.kind, GetKind::kOwner);
  EXPECT_EQ(g.slot, pre);
  EXPECT_TRUE(g.took_prealloc);
  EXPECT_EQ(cb.counters().evictions.load(), evictions_before);
  EXPECT_EQ(cb.counters().prealloc_used.load(), 1u);

  // Someone else (rank 1) asks for it while rank 0 loads: ref > 0 and not
  // Ready, so it registers as a waiter through the fast path.
  ASSERT_EQ(tc.ctrl.join(1), Result::kOk);
  CacheOptions o1;
  o1.rank = 1;
  CacheBuffer cb1(&tc.ctrl, &tc.data, o1);
  GetResult g1;
  ASSERT_EQ(cb1.get(key(B0, s + 1), &g1), Result::kOk);
  EXPECT_EQ(g1.kind, GetKind::kWaiter);
  EXPECT_EQ(g1.slot, pre);
  ASSERT_EQ(cb.mark_ready(g.slot), Result::kOk);
  uint32_t w = 0;
  ASSERT_EQ(cb1.wait_for_change(g1.slot, g1.word, deadline_after_ms(1000), &w), Result::kOk);
  EXPECT_EQ(word_state(w), State::kReady);
  cb.release(g.slot);
  cb1.release(g1.slot);
}

TEST(ScenarioE, PreallocUsesAFreeRegularSlotFirst) {
  TestCache tc;
  make_cache(params(8, 2, 64, 8), &tc);
  ASSERT_EQ(tc.ctrl.join(0), Result::kOk);
  CacheBuffer cb(&tc.ctrl, &tc.data, CacheOptions{});
  load(cb, key(1, 0));
  PreallocOutcome o;
  ASSERT_EQ(cb.prealloc(key(1, 1), &o), Result::kOk);
  EXPECT_EQ(o, PreallocOutcome::kPlacedRegular);
  ASSERT_EQ(cb.prealloc(key(1, 1), &o), Result::kOk);
  EXPECT_EQ(o, PreallocOutcome::kAlreadyPresent);
  // A shard index past the block's last one is refused, naming it.
  EXPECT_EQ(cb.prealloc(key(1, 8), &o), Result::kInvalidArg);
  EXPECT_NE(last_error().find("shard 8 >= shards_per_block 8"), std::string::npos) << last_error();
}

}  // namespace
}  // namespace ucm::test
