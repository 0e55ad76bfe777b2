// A random multi-rank workload over one node cache, with its own bookkeeping
// in shared memory, for the mp suite's stress and chaos tests.
//
// Each worker is a forked process joined as one local rank. It runs random
// operations: batches of get() (a hit is read and verified; an owner poisons
// the slot, fills it with its key's bytes in chunks, then marks it Ready, or
// Failed, or releases it unmarked; a waiter blocks until Ready, or takes a
// Failed load over and loads it), touch() and prealloc(). Keys are drawn
// mostly from a window that slides over a key space larger than the cache, so
// ranks miss on the same keys at the same time and evict each other's keys.
//
// What a worker checks as it goes, reporting the first violation to the
// shared error (and exiting non-zero):
//   - every Ready slot it reads, hit or woken, holds exactly its key's bytes;
//   - exactly one owner per load: when chosen as owner of key k it swaps its
//     incarnation into k's owner tag and finds there nothing or a dead
//     process; when it finishes, the tag still names it;
//   - an owner is only ever chosen for a key that has no Ready copy anywhere
//     (ready_copy_elsewhere);
//   - no wait outlives its deadline; every library call that must succeed does.
// With check_every, all workers meet at a barrier every so many operations and
// worker 0 walks the whole control plane (check_quiescent) while nobody moves.
// The test that forks the workers checks the per-key and per-rank tallies.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/ctrl_check.h"
#include "common/mp_util.h"

namespace ucm::test {

constexpr uint32_t kWlMaxKeys = 1024;
constexpr uint32_t kWlMaxIncarnations = 128;

struct WorkloadConfig {
  uint32_t workers = 4;           // processes (ranks 0..workers-1) in the barrier
  uint32_t blocks = 60;           // key space: blocks x shards keys
  uint32_t shards = 5;            // shard indexes used by get (prealloc goes one further)
  uint32_t ops = 0;               // per worker; 0 = until stop
  uint32_t check_every = 0;       // operations between quiescent checks; 0 = never
  uint32_t window = 8;            // hot keys shared by all ranks at a time
  uint32_t fail_permille = 100;   // a first load attempt marks Failed
  uint32_t abandon_permille = 2;  // a first load attempt is released unmarked
  uint32_t yield_permille = 60;   // an owner yields between fill chunks (widens kill windows)
  uint32_t slow_permille = 300;   // a load spins up to ~10 us (a backend's latency)
  uint32_t sleep_permille = 50;   // a load sleeps 200 us: others pile up as waiters
  uint64_t wait_deadline_ms = 10000;
  WaitMode wait = WaitMode::kFutex;
  uint64_t poll_interval_ms = 1;
};

struct KeyStats {
  std::atomic<uint32_t> owner_tag;     // incarnation + 1 of the process loading the key now; 0 = none
  std::atomic<uint64_t> owner_events;  // chosen as owner: by get(), or by try_take_over()
  std::atomic<uint64_t> ready;         // loads completed: mark_ready()
  std::atomic<uint64_t> failed;        // loads that marked Failed
  std::atomic<uint64_t> abandoned;     // loads released unmarked
  std::atomic<uint64_t> reads;         // Ready shards verified byte for byte
};

struct RankStats {
  std::atomic<uint64_t> ops;  // progress: operations finished
  std::atomic<uint64_t> gets;
  std::atomic<uint64_t> hits;
  std::atomic<uint64_t> owners;      // get() answered owner
  std::atomic<uint64_t> waiters;     // get() answered waiter
  std::atomic<uint64_t> takeovers;   // try_take_over() won (a retry of its own failed load, or another's)
  std::atomic<uint64_t> waiter_takeovers;  // ... by a process that get() had made a waiter
  std::atomic<uint64_t> woken_ready; // a wait ended in Ready loaded by another process
  std::atomic<uint64_t> no_space;
  std::atomic<uint64_t> touches;
  std::atomic<uint64_t> preallocs_placed;
  std::atomic<uint64_t> checks;      // quiescent walks done (worker 0)
};

struct Incarnation {
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> rank;
  std::atomic<uint64_t> start_ticks;
};

struct WorkloadShared {
  WorkloadConfig cfg;  // written by the parent before fork
  std::atomic<uint32_t> stop{0};
  std::atomic<uint64_t> global_ops{0};
  std::atomic<uint32_t> next_incarnation{0};
  ShmBarrier barrier;
  ShmError error;
  Incarnation inc[kWlMaxIncarnations];
  KeyStats keys[kWlMaxKeys];
  RankStats ranks[kMaxRanks];
};

inline uint32_t workload_keys(const WorkloadConfig& cfg) { return cfg.blocks * cfg.shards; }

inline Key workload_key(const WorkloadConfig& cfg, uint32_t idx) {
  return key(0x1000 + idx / cfg.shards, idx % cfg.shards);
}

// A process-unique id for the owner tags; call once per process before run_worker.
uint32_t register_incarnation(WorkloadShared* sh, uint32_t rank);

// Runs the workload in this process as `rank` (already joined on tc.ctrl)
// until cfg.ops operations or stop. Returns false after a violation, which
// is in sh->error. Releases every pin it took; does not leave().
bool run_worker(WorkloadShared* sh, const TestCache& tc, uint32_t rank, uint32_t incarnation, uint64_t seed);

}  // namespace ucm::test
