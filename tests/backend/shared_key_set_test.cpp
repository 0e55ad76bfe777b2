// The table of dumped keys across real processes: one memfd (as the cache
// makes it for a node), mapped before fork, used by forked children at once.
// Concurrent inserts of overlapping keys from four processes, a reader in a
// third role that checks every published key as it appears, a writer
// SIGKILLed mid-run, and a table filled to capacity by racing processes.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "backend/node_state.h"
#include "backend/shared_key_set.h"
#include "common/mp_util.h"
#include "common/test_util.h"

namespace ucm::test {
namespace {

constexpr uint32_t kWriters = 4;
constexpr uint64_t kPerWriter = 3000;  // writer w inserts blocks [w * 2000, w * 2000 + 3000): overlaps its neighbour
constexpr uint64_t kStride = 2000;

Key ins_key(uint64_t b) { return key(b, static_cast<uint32_t>(b % 7)); }

struct Progress {
  ShmBarrier start;
  std::atomic<uint64_t> done[kWriters + 1];  // keys each writer has inserted (and returned from)
  std::atomic<uint32_t> abort{0};
  ShmError error;
};

class SetRegion {
 public:
  explicit SetRegion(uint64_t capacity) : capacity_(capacity) {
    EXPECT_EQ(NodeState::create(SharedKeySet::region_bytes(capacity), &mem_), Result::kOk) << last_error();
  }
  // Every process attaches on its own, as the ranks of a node do.
  bool attach(SharedKeySet* s) const {
    return SharedKeySet::attach(mem_.base(), mem_.bytes(), capacity_, s) == Result::kOk;
  }
  uint64_t count_claimed() const {
    const auto* slots = reinterpret_cast<const KeySetSlot*>(static_cast<const uint8_t*>(mem_.base()) + sizeof(KeySetHeader));
    uint64_t n = 0;
    for (uint64_t i = 0; i < (mem_.bytes() - sizeof(KeySetHeader)) / sizeof(KeySetSlot); ++i)
      n += (slots[i].word.load(std::memory_order_acquire) & 3) == SharedKeySet::kClaimed ? 1 : 0;
    return n;
  }

 private:
  NodeState mem_;
  uint64_t capacity_;
};

TEST(SharedKeySetMp, FourWritersAndAReaderAgreeOnEveryKey) {
  SetRegion region(kWriters * kPerWriter);
  Shared<Progress> p;
  p->start.parties = kWriters + 1;
  Children kids;
  const uint64_t deadline = deadline_after_ms(60000);
  std::vector<pid_t> pids;
  for (uint32_t w = 0; w < kWriters; ++w) {
    pids.push_back(kids.spawn([&, w] {
      SharedKeySet s;
      if (!region.attach(&s)) return p->error.report("writer %u: attach: %s", w, last_error().c_str());
      if (!p->start.wait(deadline, &p->abort)) return p->error.report("writer %u: start barrier", w);
      for (uint64_t i = 0; i < kPerWriter; ++i) {
        const Key k = ins_key(w * kStride + i);
        if (s.insert(k) != Result::kOk)
          return p->error.report("writer %u: insert %" PRIu64 ": %s", w, i, last_error().c_str());
        p->done[w].store(i + 1, std::memory_order_release);
      }
    }));
  }
  // The reader: every key a writer has announced is there, at once and for
  // good; keys nobody inserts never are.
  pids.push_back(kids.spawn([&] {
    SharedKeySet s;
    if (!region.attach(&s)) return p->error.report("reader: attach: %s", last_error().c_str());
    if (!p->start.wait(deadline, &p->abort)) return p->error.report("reader: start barrier");
    uint64_t checked = 0;
    for (;;) {
      bool all_done = true;
      for (uint32_t w = 0; w < kWriters; ++w) {
        const uint64_t n = p->done[w].load(std::memory_order_acquire);
        all_done = all_done && n == kPerWriter;
        for (uint64_t i = n > 64 ? n - 64 : 0; i < n; ++i, ++checked)
          if (!s.contains(ins_key(w * kStride + i)))
            return p->error.report("reader: writer %u's key %" PRIu64 " announced but absent", w, i);
      }
      for (uint64_t j = 0; j < 16; ++j)
        if (s.contains(key(900000 + j, 1))) return p->error.report("reader: key %" PRIu64 " was never inserted", j);
      if (all_done || p->error.any()) break;
      if (now_ns() > deadline) return p->error.report("reader: writers still running at the deadline");
    }
    if (checked == 0) p->error.report("reader checked nothing");
  }));
  for (pid_t pid : pids) EXPECT_EQ(kids.wait(pid, 60000), 0) << p->error.first();
  ASSERT_FALSE(p->error.any()) << p->error.first();

  SharedKeySet s;
  ASSERT_TRUE(region.attach(&s)) << last_error();
  const uint64_t distinct = (kWriters - 1) * kStride + kPerWriter;
  for (uint64_t b = 0; b < distinct; ++b) ASSERT_TRUE(s.contains(ins_key(b))) << "block " << b;
  EXPECT_FALSE(s.contains(ins_key(distinct)));
  EXPECT_GE(s.used(), distinct);
  EXPECT_LE(s.used(), s.capacity());
}

TEST(SharedKeySetMp, AWriterKilledMidRunLeavesTheTableUsable) {
  SetRegion region(uint64_t{1} << 20);
  Shared<Progress> p;
  p->start.parties = 2;
  Children kids;
  const uint64_t deadline = deadline_after_ms(60000);
  // Eight rounds: each time a writer inserts new keys as fast as it can and
  // is SIGKILLed while it runs, most likely inside insert() (which is nearly
  // all its loop does; where exactly it dies is the scheduler's choice, so the
  // abandoned-claim case is also made by hand in the unit suite).
  uint64_t inserted_before = 0;
  constexpr uint32_t kRounds = 8;
  for (uint32_t round = 0; round < kRounds; ++round) {
    p->done[0].store(0);
    const uint64_t base = 1000000 * (round + 1);
    const pid_t writer = kids.spawn([&, base] {
      SharedKeySet s;
      if (!region.attach(&s)) return p->error.report("writer: attach: %s", last_error().c_str());
      for (uint64_t i = 0; i < 100000; ++i) {  // 8 rounds of this and the survivors fit the capacity
        if (s.insert(ins_key(base + i)) != Result::kOk)
          return p->error.report("writer: insert %" PRIu64 ": %s", i, last_error().c_str());
        p->done[0].store(i + 1, std::memory_order_release);
      }
      pause();  // all inserted before the kill: the parent was slow; the checks still hold
    });
    while (p->done[0].load(std::memory_order_acquire) < 500 + 300 * round && now_ns() < deadline) cpu_relax();
    kids.kill_now(writer);
    ASSERT_FALSE(p->error.any()) << p->error.first();
    const uint64_t announced = p->done[0].load(std::memory_order_acquire);
    ASSERT_GE(announced, 500u + 300 * round) << "the writer did not get going by the deadline";

    // Another process: everything announced is there; it inserts and finds
    // its own keys; the earlier rounds' keys are intact.
    const pid_t after = kids.spawn([&, base, announced] {
      SharedKeySet s;
      if (!region.attach(&s)) return p->error.report("survivor: attach: %s", last_error().c_str());
      for (uint64_t i = 0; i < announced; ++i)
        if (!s.contains(ins_key(base + i))) return p->error.report("survivor: announced key %" PRIu64 " absent", i);
      for (uint64_t i = 0; i < 2000; ++i)
        if (s.insert(ins_key(base + 500000 + i)) != Result::kOk)
          return p->error.report("survivor: insert %" PRIu64 ": %s", i, last_error().c_str());
      for (uint64_t i = 0; i < 2000; ++i)
        if (!s.contains(ins_key(base + 500000 + i))) return p->error.report("survivor: own key %" PRIu64 " absent", i);
      // The killed writer's next key may or may not be in: either is fine,
      // as long as asking does not hang and the answer stays.
      const bool maybe = s.contains(ins_key(base + announced));
      if (s.contains(ins_key(base + announced)) != maybe) p->error.report("survivor: an answer changed");
    });
    ASSERT_EQ(kids.wait(after, 60000), 0) << p->error.first();
    ASSERT_FALSE(p->error.any()) << p->error.first();
    inserted_before += announced + 2000;
  }
  SharedKeySet s;
  ASSERT_TRUE(region.attach(&s)) << last_error();
  EXPECT_GE(s.used(), inserted_before);
  EXPECT_LE(s.used(), inserted_before + kRounds) << "each kill costs at most one unit of capacity";
  // How many kills landed between a claim and its publish (not asserted: the
  // scheduler decides), for the record.
  RecordProperty("abandoned_claims", static_cast<int>(region.count_claimed()));
  RecordProperty("lost_capacity", static_cast<int>(s.used() - inserted_before));
}

TEST(SharedKeySetMp, RacingWritersFillItToCapacityExactly) {
  constexpr uint64_t kCapacity = 5000;
  SetRegion region(kCapacity);
  struct Counts {
    ShmBarrier start;
    std::atomic<uint64_t> ok{0}, full{0};
    std::atomic<uint32_t> abort{0};
    ShmError error;
  };
  Shared<Counts> c;
  c->start.parties = kWriters;
  Children kids;
  const uint64_t deadline = deadline_after_ms(60000);
  std::vector<pid_t> pids;
  for (uint32_t w = 0; w < kWriters; ++w) {
    pids.push_back(kids.spawn([&, w] {
      SharedKeySet s;
      if (!region.attach(&s)) return c->error.report("writer %u: attach: %s", w, last_error().c_str());
      if (!c->start.wait(deadline, &c->abort)) return c->error.report("writer %u: start barrier", w);
      for (uint64_t i = 0; i < 2000; ++i) {  // distinct keys: 8000 in all for 5000 places
        const Key k = ins_key(1000000 + w * 2000 + i);
        const Result r = s.insert(k);
        if (r == Result::kOk) {
          c->ok.fetch_add(1);
          if (!s.contains(k)) return c->error.report("writer %u: inserted key %" PRIu64 " absent", w, i);
        } else if (r == Result::kNoSpace) {
          c->full.fetch_add(1);
          if (s.contains(k)) return c->error.report("writer %u: refused key %" PRIu64 " present", w, i);
        } else {
          return c->error.report("writer %u: insert: %s", w, last_error().c_str());
        }
      }
    }));
  }
  for (pid_t pid : pids) EXPECT_EQ(kids.wait(pid, 60000), 0);
  ASSERT_FALSE(c->error.any()) << c->error.first();
  EXPECT_EQ(c->ok.load(), kCapacity) << "every place taken, none twice";
  EXPECT_EQ(c->full.load(), kWriters * 2000 - kCapacity);
  SharedKeySet s;
  ASSERT_TRUE(region.attach(&s));
  uint64_t present = 0;
  for (uint64_t b = 0; b < kWriters * 2000; ++b) present += s.contains(ins_key(1000000 + b)) ? 1 : 0;
  EXPECT_EQ(present, kCapacity);
  EXPECT_EQ(s.used(), kCapacity);
}

}  // namespace
}  // namespace ucm::test
