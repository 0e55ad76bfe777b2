// A live rank that stops while it holds a bucket lock (a debugger, SIGSTOP)
// cannot be reaped: a get() behind it waits. That wait ends with the task
// that asked, not after a lock timeout per key: rank 1 holds the lock of one
// bucket and never lets go while rank 0's queue runs a task of 3 keys in that
// bucket (deadline 300 ms) and then a task of keys elsewhere. With a lock
// timeout of 30 s per get(), the first task took 3 x 30 s before its entries
// failed and the second waited behind it; now the first fails at its deadline
// with UCM_ERR_TIMEOUT and the second loads. Found by a session-20 audit of
// every wait (a stopped holder caught in gdb: 16 keys in the bucket, a 1 s
// timeout, 16 s). No time is asserted: the bound is the hang guard's.
#include <gtest/gtest.h>

#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/sim_content.h"
#include "common/hang_guard.h"
#include "common/mp_util.h"
#include "common/test_util.h"
#include "ctrl/recovery.h"
#include "mp/queue_rank.h"
#include "queue/load_queue.h"
#include "sync/shared_lock.h"

namespace ucm::test {
namespace {

constexpr uint64_t kShardBytes = 4096;
constexpr uint32_t kSlots = 64;
constexpr uint64_t kLockTimeoutMs = 30000;  // each get()'s own bound on a live holder
constexpr uint64_t kTaskMs = 300;           // the first task's deadline
constexpr uint32_t kStuckKeys = 3;          // 3 x kLockTimeoutMs is past the hang guard's 60 s

struct LockShared {
  ShmSignal locked;    // rank 1 holds the bucket's lock
  ShmSignal finished;  // rank 0 is done
  std::atomic<uint32_t> bucket{0};
};

// Keys of bucket b, and keys of other buckets, from a numbered run.
std::vector<Key> keys_where(uint32_t mask, uint32_t b, bool in_b, uint32_t n, uint64_t first) {
  std::vector<Key> out;
  for (uint64_t i = first; out.size() < n; ++i) {
    const Key k = key(i, 1);
    if ((bucket_of(k, mask) == b) == in_b) out.push_back(k);
  }
  return out;
}

void hold_lock(const TestCache& parent, LockShared* sh) {
  TestCache mine;
  attach_copy(parent, &mine);
  ASSERT_EQ(join_rank_retrying(mine.ctrl, 1, deadline_after_ms(hang_ms())), Result::kOk) << last_error();
  const uint32_t b = sh->bucket.load();
  ASSERT_EQ(lock_bucket(mine.ctrl, 1, b, 1'000'000, deadline_after_ms(hang_ms())), Result::kOk) << last_error();
  sh->locked.set(1);
  // Alive, holding the lock, doing nothing: as a stopped process would.
  ASSERT_TRUE(sh->finished.wait_ge(1, deadline_after_ms(3 * hang_ms())));
  shared_unlock(&mine.ctrl.bucket(b).lock);
  mine.ctrl.leave(1);
}

void run_tasks(const TestCache& parent, LockShared* sh) {
  ASSERT_TRUE(sh->locked.wait_ge(1, deadline_after_ms(hang_ms())));
  QueueRank me;
  QueueOptions qo = solo_queue();
  CacheOptions co;
  co.lock_timeout_ms = kLockTimeoutMs;
  ASSERT_NO_FATAL_FAILURE(me.open(parent, 0, co, qo, kShardBytes, hang_ms()));
  const uint32_t mask = me.cache->ctrl().bucket_mask();
  const std::vector<Key> stuck = keys_where(mask, sh->bucket.load(), true, kStuckKeys, 93000);
  const std::vector<Key> free_keys = keys_where(mask, sh->bucket.load(), false, 4, 94000);
  auto make = [](const std::vector<Key>& ks, std::vector<std::vector<uint8_t>>* dst, uint64_t ms) {
    dst->assign(ks.size(), std::vector<uint8_t>(kShardBytes, 0xee));
    std::vector<TaskEntry> es(ks.size());
    for (size_t i = 0; i < ks.size(); ++i) {
      es[i].key = ks[i];
      es[i].dst = (*dst)[i].data();
    }
    static uint64_t id = 1;
    return std::make_shared<Task>(id++, TaskKind::kLoad, es, deadline_after_ms(ms));
  };
  std::vector<std::vector<uint8_t>> d1, d2;
  auto t1 = make(stuck, &d1, kTaskMs);
  auto t2 = make(free_keys, &d2, hang_ms());
  ASSERT_EQ(me.queue->submit(t1), Result::kOk) << last_error();
  ASSERT_EQ(me.queue->submit(t2), Result::kOk) << last_error();
  ASSERT_TRUE(t1->wait_until(deadline_after_ms(hang_ms())))
      << "the task behind a stopped lock holder was still running after " << hang_seconds() << " s";
  EXPECT_EQ(t1->result(), Result::kTimeout) << t1->error();
  EXPECT_NE(t1->error().find("past the deadline"), std::string::npos) << t1->error();
  ASSERT_TRUE(t2->wait_until(deadline_after_ms(hang_ms())));
  EXPECT_EQ(t2->result(), Result::kOk) << t2->error();
  for (size_t i = 0; i < free_keys.size(); ++i)
    EXPECT_EQ(sim_verify(free_keys[i], d2[i].data(), kShardBytes), kShardBytes) << "key " << i;
  for (size_t i = 0; i < stuck.size(); ++i)
    EXPECT_TRUE(d1[i] == std::vector<uint8_t>(kShardBytes, 0xee)) << "a failed entry's destination is untouched";
  sh->finished.set(1);
  me.close(0);
}

TEST(LockDeadline, AGetBehindAStoppedLockHolderEndsWithItsTaskNotALockTimeoutPerKey) {
  TestCache tc;
  make_cache(params(kSlots, 0, kShardBytes, 8, 2), &tc);
  Shared<LockShared> sh;
  sh->bucket.store(5 & tc.ctrl.bucket_mask());
  Children ch;
  const pid_t r1 = ch.spawn([&] { hold_lock(tc, sh.get()); });
  const pid_t r0 = ch.spawn([&] { run_tasks(tc, sh.get()); });
  EXPECT_EQ(ch.wait(r0, 3 * hang_ms()), 0);
  EXPECT_EQ(ch.wait(r1, 3 * hang_ms()), 0);
}

}  // namespace
}  // namespace ucm::test
