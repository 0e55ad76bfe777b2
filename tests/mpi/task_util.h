// Helpers for the mpi suite's task tests (queue, dump, fault): a small
// configuration, keys in the C API's and the library's spelling, stats, the
// internal objects behind a handle, and MPI one-liners.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "api/handles.h"
#include "common/hang_guard.h"
#include "backend/sim_backend.h"
#include "backend/sim_content.h"
#include "common/key.h"
#include "common/numbered_key.h"
#include "common/time.h"
#include "mpi/mpi_test.h"
#include "ucmcache/ucm.h"

namespace ucm::test {

constexpr uint64_t kTaskShard = 16 << 10;  // bytes per shard in these tests
constexpr int64_t kTaskWaitMs = 30000;     // a hang, not slowness

// A small cache of `slots` regular slots over `backend`.
inline ucm_config_t task_config(uint64_t slots, const char* backend) {
  ucm_config_t c;
  EXPECT_EQ(ucm_config_init(&c), UCM_OK) << ucm_config_error();
  c.shard_bytes = kTaskShard;
  c.cache_bytes = slots * kTaskShard;
  c.reserved_slots = 16;
  c.shards_per_block = 8;
  c.max_task_entries = 64;
  c.timeout_ms = 30000;
  c.hugepages = UCM_HUGEPAGES_OFF;
  c.bind_threads = 0;  // 4 ranks x 2 threads on 2 cores: let the kernel place them
  std::snprintf(c.backend, sizeof(c.backend), "%s", backend);
  return c;
}

// ukey(b, s), ublock(b) and ikey(k) come from common/numbered_key.h (the
// numbering the unit tests and the benchmarks use); the sim store's fault
// specs name a block by its low half, b.

// How a failed task names a key in ucm_last_error: 32 hex digits, ':', shard.
inline std::string key_hex(const ucm_key_t& k) {
  const Key i = ikey(k);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx:%u", static_cast<unsigned long long>(i.block.hi),
                static_cast<unsigned long long>(i.block.lo), i.shard);
  return buf;
}

inline ucm_stats_t node_stats(ucm_cache_t c) {
  ucm_stats_t s{};
  s.struct_bytes = sizeof(s);
  EXPECT_EQ(ucm_cache_stats(c, nullptr, &s), UCM_OK) << ucm_last_error(c);
  return s;
}

inline ucm_stats_t rank_stats(ucm_cache_t c) {
  ucm_stats_t s{};
  s.struct_bytes = sizeof(s);
  EXPECT_EQ(ucm_cache_stats(c, &s, nullptr), UCM_OK) << ucm_last_error(c);
  return s;
}

inline Cache* impl_of(ucm_cache_t cache) {
  Cache* c = nullptr;
  EXPECT_EQ(resolve_handle(cache, &c), Result::kOk) << last_error();
  return c;
}

// The rank's own sim store behind a handle (every rank has its own instance).
inline SimBackend* sim_of(ucm_cache_t cache) {
  Cache* c = impl_of(cache);
  if (!c || !c->backend() || std::strcmp(c->backend()->name(), "sim") != 0) return nullptr;
  return static_cast<SimBackend*>(c->backend());
}

// The cache's last error (ucm_last_error), short for the tests' messages.
inline std::string msg(ucm_cache_t c) { return ucm_last_error(c); }

// Milliseconds since `t0` (now_ns, the monotonic clock).
inline uint64_t ms_since(uint64_t t0) { return (now_ns() - t0) / 1000000; }

inline std::vector<uint64_t> allgather_u64(uint64_t v) {
  std::vector<uint64_t> all(world_size());
  MPI_Allgather(&v, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}

inline std::string bcast_string(std::string s, int root = 0) {
  uint64_t n = s.size();
  MPI_Bcast(&n, 1, MPI_UINT64_T, root, MPI_COMM_WORLD);
  s.resize(n);
  MPI_Bcast(s.data(), static_cast<int>(n), MPI_CHAR, root, MPI_COMM_WORLD);
  return s;
}

// Entries over caller-owned destination buffers (one shard each).
struct LoadBatch {
  std::vector<ucm_load_entry_t> entries;
  std::vector<std::vector<uint8_t>> dst;

  void add(const ucm_key_t& k, uint8_t fill = 0xee) {
    dst.emplace_back(kTaskShard, fill);
    entries.push_back({k, nullptr});
    for (size_t i = 0; i < entries.size(); ++i) entries[i].dst = dst[i].data();
  }
  // The first offset of entry i that is not the sim content, or kTaskShard.
  uint64_t verify(size_t i) const { return sim_verify(ikey(entries[i].key), dst[i].data(), kTaskShard); }
  bool untouched(size_t i, uint8_t fill = 0xee) const {
    for (uint8_t b : dst[i])
      if (b != fill) return false;
    return true;
  }
};

// One-entry loads of `k` left unwaited, the i-th into its own `shard` bytes
// of *buf (tasks in flight at once must not share a destination), submitted
// until `max` are taken or a submit is refused other than by the
// dispatcher's full queue (that one drains: it is retried): the tasks
// taken, the refusal's message in *why (empty if none).
inline std::vector<ucm_task_t> submit_unwaited(ucm_cache_t cache, const ucm_key_t& k, uint64_t shard, size_t max,
                                               std::vector<uint8_t>* buf, std::string* why) {
  buf->assign(max * shard, 0xee);
  std::vector<ucm_task_t> tasks;
  why->clear();
  while (tasks.size() < max) {
    const ucm_load_entry_t e{k, buf->data() + tasks.size() * shard};
    ucm_task_t t = 0;
    const ucm_result_t r = ucm_load_task(cache, &e, 1, &t);
    if (r == UCM_OK) {
      tasks.push_back(t);
      continue;
    }
    const std::string refused = std::string(ucm_result_string(r)) + ": " + ucm_last_error(cache);
    if (r != UCM_ERR_BUSY || refused.find("dispatcher") == std::string::npos) {
      *why = refused;
      break;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return tasks;
}

// Submits and waits; the result of the wait.
inline ucm_result_t load_and_wait(ucm_cache_t cache, LoadBatch& b, int64_t timeout_ms = kTaskWaitMs) {
  ucm_task_t t = 0;
  const ucm_result_t r = ucm_load_task(cache, b.entries.data(), b.entries.size(), &t);
  if (r != UCM_OK) return r;
  return ucm_task_wait(cache, t, timeout_ms);
}

// Waits with no bound of its own, under a hang guard: the result is the
// task's (every task ends by its deadline), never a wait's timeout that a
// slow scheduler could reach; a wait that never returns is a hang.
inline ucm_result_t wait_guarded(ucm_cache_t cache, ucm_task_t t, const std::string& what) {
  HangGuard g("ucm_task_wait(-1) on " + what);
  return ucm_task_wait(cache, t, -1);
}

// load_and_wait with no bound of its own, under a hang guard.
inline ucm_result_t load_guarded(ucm_cache_t cache, LoadBatch& b, const std::string& what) {
  HangGuard g("a load and ucm_task_wait(-1) on " + what);
  return load_and_wait(cache, b, -1);
}

// ucm_cache_finalize under a hang guard: its result, how long it took, and
// its message (ucm_last_error(NULL)).
struct Finalized {
  ucm_result_t result = UCM_OK;
  uint64_t ms = 0;
  std::string message;
};
inline Finalized finalize_timed(ucm_cache_t* cache, const std::string& what) {
  Finalized f;
  const uint64_t t0 = now_ns();
  {
    HangGuard g("ucm_cache_finalize " + what);
    f.result = ucm_cache_finalize(cache);
  }
  f.ms = ms_since(t0);
  f.message = ucm_last_error(nullptr);
  return f;
}

// A task failure at the task's own deadline (ucm_task_wait's own bound says
// "still running after N ms" instead).
inline bool at_task_deadline(const std::string& m) {
  return m.find("deadline") != std::string::npos && m.find("still running after") == std::string::npos;
}

}  // namespace ucm::test
