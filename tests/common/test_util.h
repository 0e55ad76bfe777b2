// Helpers shared by the unit and mp suites: a real node cache (control memfd +
// data memfds) in this process, keys, and forked children with deadlines.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <functional>

#include <gtest/gtest.h>

#include "cache/cache_buffer.h"
#include "common/key.h"
#include "common/numbered_key.h"
#include "common/time.h"
#include "ctrl/buffer_ctrl.h"
#include "ctrl/chain.h"
#include "data/buffer_data.h"

namespace ucm::test {

// Block b, shard s: the numbering of common/numbered_key.h, shared with the
// mpi suite's ukey() and the benchmarks.
inline Key key(uint64_t block, uint32_t shard) { return numbered_key(block, shard); }

inline BlockId block(uint64_t b) { return numbered_block(b); }

struct TestCache {
  BufferCtrl ctrl;
  BufferData data;
};

// Creates a node cache; aborts the test on failure.
inline void make_cache(const CtrlParams& cp, TestCache* out, HugePolicy huge = HugePolicy::kOff) {
  ASSERT_EQ(BufferCtrl::create(cp, &out->ctrl), Result::kOk) << last_error();
  DataParams dp;
  dp.slot_bytes = cp.slot_bytes;
  dp.total_slots = cp.regular_slots + cp.reserved_slots;
  dp.hugepages = huge;
  ASSERT_EQ(BufferData::create(dp, &out->data), Result::kOk) << last_error();
}

inline CtrlParams params(uint32_t regular, uint32_t reserved = 0, uint64_t slot_bytes = 64,
                         uint32_t shards_per_block = 16, uint32_t max_ranks = 4,
                         EvictMode evict = EvictMode::kClock) {
  CtrlParams p;
  p.slot_bytes = slot_bytes;
  p.regular_slots = regular;
  p.reserved_slots = reserved;
  p.shards_per_block = shards_per_block;
  p.max_ranks = max_ranks;
  p.evict = evict;
  return p;
}

// The slot holding k, kNoSlot if none (a locked walk, for quiet tests:
// a corrupt chain fails the test).
inline uint32_t resident_slot(const BufferCtrl& c, const Key& k) {
  uint32_t slot = kNoSlot;
  EXPECT_EQ(chain_find_locked(c, bucket_of(k, c.bucket_mask()), k, &slot), Result::kOk) << last_error();
  return slot;
}

// Re-attaches, in a child, to the parent's planes through their fds: a real
// second mapping, as another rank would have.
inline void attach_copy(const TestCache& parent, TestCache* out) {
  ASSERT_EQ(BufferCtrl::attach(parent.ctrl.fd(), nullptr, &out->ctrl), Result::kOk) << last_error();
  DataParams dp;
  dp.slot_bytes = parent.data.slot_bytes();
  dp.total_slots = parent.data.total_slots();
  std::vector<int> fds;
  for (size_t i = 0; i < parent.data.segment_count(); ++i) fds.push_back(parent.data.segment_fd(i));
  ASSERT_EQ(BufferData::attach(dp, parent.data.hugetlb(), fds.data(), fds.size(), &out->data), Result::kOk)
      << last_error();
}

// Forks a child that runs fn() and exits with its return value (a gtest
// failure inside the child turns into exit code 100).
inline pid_t fork_child(const std::function<int()>& fn) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int rc = fn();
    if (::testing::Test::HasFailure()) rc = 100;
    _exit(rc);
  }
  return pid;
}

// Waits for a child up to timeout_ms; kills it (SIGKILL) past that. Returns its
// exit code, 128 + signal if it was killed by one, or -1 on timeout.
inline int wait_child(pid_t pid, uint64_t timeout_ms) {
  const uint64_t deadline = now_ns() + timeout_ms * 1000000ull;
  for (;;) {
    int status = 0;
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -2;
    }
    if (now_ns() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    usleep(1000);
  }
}

}  // namespace ucm::test
