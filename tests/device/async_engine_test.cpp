// The async-test copy engine: copies land later, on another thread, maybe out
// of order, and a failed flush keeps what it put in flight unsettled until it
// lands. A gate decides when copies land, so nothing here depends on timing.
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "device/copy_engine.h"

namespace ucm {
namespace {

// Opens the gate however the test ends, so the stream's worker can drain.
struct GateOpener {
  std::shared_ptr<AsyncTestGate> gate;
  ~GateOpener() { gate->open(); }
};

struct Bufs {
  explicit Bufs(size_t n, size_t bytes = 256) : src(n, std::vector<uint8_t>(bytes)), dst(n, std::vector<uint8_t>(bytes)) {
    for (size_t i = 0; i < n; ++i) std::memset(src[i].data(), static_cast<int>(i + 1), bytes);
  }
  bool landed(size_t i) const { return dst[i] == src[i]; }
  bool untouched(size_t i) const { return dst[i] == std::vector<uint8_t>(dst[i].size(), 0); }
  std::vector<std::vector<uint8_t>> src, dst;
};

std::unique_ptr<CopyStream> open_stream(const AsyncTestOptions& o) {
  std::unique_ptr<CopyEngine> e = make_async_test_engine(0, o);
  EXPECT_STREQ(e->name(), "async-test");
  std::unique_ptr<CopyStream> s;
  EXPECT_EQ(e->open_stream(&s), Result::kOk);
  return s;
}

TEST(AsyncTestEngine, CopiesLandOnlyWhenTheEngineSaysSo) {
  AsyncTestOptions o;
  o.delay_us = 0;
  o.gate = std::make_shared<AsyncTestGate>();
  GateOpener opener{o.gate};
  auto s = open_stream(o);
  Bufs b(3);
  uint64_t t[3];
  for (int i = 0; i < 3; ++i) ASSERT_EQ(s->copy(b.dst[i].data(), b.src[i].data(), 256, &t[i]), Result::kOk);
  EXPECT_EQ(t[0], 1u);
  EXPECT_EQ(t[2], 3u);
  EXPECT_FALSE(s->done(t[0])) << "queued, not even flushed";
  ASSERT_EQ(s->flush(), Result::kOk);
  EXPECT_FALSE(s->done(t[0])) << "flushed, but the gate holds it";
  EXPECT_TRUE(b.untouched(0));
  o.gate->allow(1);
  ASSERT_EQ(s->wait(t[0]), Result::kOk) << last_error();
  EXPECT_TRUE(s->done(t[0]));
  EXPECT_TRUE(b.landed(0));
  EXPECT_FALSE(s->done(t[2]));
  EXPECT_TRUE(b.untouched(2));
  o.gate->allow(2);
  ASSERT_EQ(s->wait(t[2]), Result::kOk) << last_error();
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(s->done(t[i]));
    EXPECT_TRUE(b.landed(i)) << i;
  }
}

TEST(AsyncTestEngine, ReorderedLandingsSettleTicketsInOrder) {
  AsyncTestOptions o;
  o.delay_us = 2000;
  o.reorder = true;
  o.seed = 7;
  auto s = open_stream(o);
  constexpr size_t kN = 64;
  Bufs b(kN, 4096);
  uint64_t last = 0;
  for (size_t i = 0; i < kN; ++i) {
    ASSERT_EQ(s->copy(b.dst[i].data(), b.src[i].data(), 4096, &last), Result::kOk);
    if (i % 8 == 7) {
      ASSERT_EQ(s->flush(), Result::kOk);
    }
  }
  // Whenever a ticket counts as done, it and every ticket before it landed.
  for (uint64_t seen = 0; seen < kN;) {
    for (uint64_t t = kN; t > seen; --t)
      if (s->done(t)) {
        for (uint64_t u = 1; u <= t; ++u) ASSERT_TRUE(b.landed(u - 1)) << "ticket " << t << " done before " << u;
        seen = t;
        break;
      }
    std::this_thread::yield();
  }
  ASSERT_EQ(s->wait(last), Result::kOk) << last_error();
  for (size_t i = 0; i < kN; ++i) EXPECT_TRUE(b.landed(i)) << i;
}

TEST(AsyncTestEngine, AFailedFlushKeepsItsInFlightCopiesUnsettledUntilTheyLand) {
  AsyncTestOptions o;
  o.delay_us = 0;
  o.fail_flush = 1;
  o.fail_after = 1;  // the first copy goes out, the second does not
  o.gate = std::make_shared<AsyncTestGate>();
  GateOpener opener{o.gate};
  auto s = open_stream(o);
  Bufs b(3);
  uint64_t t1, t2, t3;
  ASSERT_EQ(s->copy(b.dst[0].data(), b.src[0].data(), 256, &t1), Result::kOk);
  ASSERT_EQ(s->copy(b.dst[1].data(), b.src[1].data(), 256, &t2), Result::kOk);
  EXPECT_EQ(s->flush(), Result::kDevice);
  EXPECT_NE(last_error().find("injected"), std::string::npos) << last_error();
  EXPECT_FALSE(s->done(t1));
  EXPECT_FALSE(s->done(t2));

  // A wait on the failed ticket returns only once the copy in flight landed.
  std::atomic<bool> returned{false};
  Result waited = Result::kOk;
  std::string why;
  std::thread waiter([&] {
    waited = s->wait(t1);
    why = last_error();
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load()) << "wait() on a failed ticket returned while its copy was still in flight";
  o.gate->allow(2);
  waiter.join();
  EXPECT_EQ(waited, Result::kDevice);
  EXPECT_NE(why.find("failed after 1 of its 2 copies"), std::string::npos) << why;
  EXPECT_TRUE(b.landed(0)) << "the copy that went out landed before its ticket settled";
  EXPECT_TRUE(b.untouched(1)) << "the copy that never went out wrote nothing";
  EXPECT_FALSE(s->done(t2)) << "a failed ticket never counts as done";
  EXPECT_EQ(s->wait(t2), Result::kDevice);

  // The stream goes on: the next flush is good.
  ASSERT_EQ(s->copy(b.dst[2].data(), b.src[2].data(), 256, &t3), Result::kOk);
  ASSERT_EQ(s->flush(), Result::kOk);
  o.gate->allow(1);
  ASSERT_EQ(s->wait(t3), Result::kOk) << last_error();
  EXPECT_TRUE(s->done(t3));
  EXPECT_TRUE(b.landed(2));
}

TEST(AsyncTestEngine, ALaterGoodTicketIsNotDoneBeforeAnEarlierFailedOneSettled) {
  AsyncTestOptions o;
  o.delay_us = 0;
  o.fail_flush = 1;
  o.fail_after = 1;
  o.gate = std::make_shared<AsyncTestGate>();
  GateOpener opener{o.gate};
  auto s = open_stream(o);
  Bufs b(2);
  uint64_t t1, t2;
  ASSERT_EQ(s->copy(b.dst[0].data(), b.src[0].data(), 256, &t1), Result::kOk);
  EXPECT_EQ(s->flush(), Result::kDevice);
  ASSERT_EQ(s->copy(b.dst[1].data(), b.src[1].data(), 256, &t2), Result::kOk);
  ASSERT_EQ(s->flush(), Result::kOk);
  EXPECT_FALSE(s->done(t2));
  EXPECT_FALSE(s->done(t1));
  o.gate->open();
  ASSERT_EQ(s->wait(t2), Result::kOk) << last_error();
  EXPECT_TRUE(b.landed(0));
  EXPECT_TRUE(b.landed(1));
}

TEST(AsyncTestEngine, DestroyingAStreamLetsItsCopiesLandFirst) {
  AsyncTestOptions o;
  o.delay_us = 20000;
  Bufs b(4);
  {
    auto s = open_stream(o);
    uint64_t t;
    for (int i = 0; i < 4; ++i) ASSERT_EQ(s->copy(b.dst[i].data(), b.src[i].data(), 256, &t), Result::kOk);
    ASSERT_EQ(s->flush(), Result::kOk);
  }
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(b.landed(i)) << i;
}

}  // namespace
}  // namespace ucm
