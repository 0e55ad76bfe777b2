// ucm_cachebench: micro-benchmark of the shared cache core (ctrl + data + cache),
// every mode side by side in one run, against the v1 index it replaces.
//
// What it measures:
//  1. Get+Release, ns per op, on a cache of 4096 regular slots of 4 KiB:
//     - hit: get() answers kHit, then release(). The cache is first loaded with
//       keys in order, so key j sits in slot j (checked through GetResult.slot
//       before timing). A process loops over its key set: 1 key (the same key
//       repeated), 64 keys, or 2048 keys (a sweep over half the cache).
//       Layouts: one process; two processes on adjacent slots (rank r takes
//       slots 2j + r, so its neighbour's slot shares the cache lines of the
//       slot meta and accessed bytes); two processes on far slots (rank r takes
//       slots j + 2048 r: the control for the adjacent case, it separates false
//       sharing from what two busy CPUs cost each other anyway); two processes
//       on the same keys.
//     - miss with eviction: get() of a key never seen (kOwner, a resident key
//       evicted by CLOCK, or by the legacy ring), 8 bytes written into the
//       slot (one case writes none, to separate the cost of touching the data
//       page), mark_ready(), release(). The cache is full before timing, so
//       every op evicts (checked through GetResult.evicted). One process, and
//       two processes with distinct keys (their victims come from the shared
//       hand, so they are neighbouring slots).
//  2. Wake latency and waiter CPU, futex vs poll: the owner process get()s a
//     new key (kOwner), the waiter process get()s it (kWaiter) and calls
//     wait_for_change() until Ready; the owner sleeps a random 1-5 ms, takes a
//     CLOCK_MONOTONIC timestamp and calls mark_ready(); the waiter takes one
//     when it wakes. Latency = wake - mark. Waiter CPU = its
//     CLOCK_THREAD_CPUTIME_ID across the wait. Poll mode is CacheOptions.wait
//     = kPoll with poll_interval_ms = 10 (lock, read, unlock, sleep 10 ms).
//
// How: rank 0 is this process, rank 1 a forked child that maps the planes
// again through their fds (BufferCtrl::attach, BufferData::attach) and joins
// as rank 1, as another local rank would. Each process is pinned to its own
// CPU (sched_setaffinity) and both start from a barrier in a MAP_SHARED page
// made before the fork. A timed run loops in batches of 256 ops until its
// duration has passed, so two processes overlap for the whole run; ns/op is
// elapsed / ops per process, averaged over the processes, and the same by the
// process's CPU time (which a preemption by unrelated work does not stretch).
// Every case runs --reps times on a fresh cache (reps outermost, so drifting
// machine load hits every case alike) and the median is reported. A start-up
// calibration (one locked RMW, one clock read) puts the numbers in the units
// the core is made of. Output: a table on stdout and JSON (--json PATH,
// default ucm_cachebench.json); reporting is in cachebench_report.cpp.
#include <getopt.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "cache/cache_buffer.h"
#include "cachebench_report.h"
#include "common/key.h"
#include "common/result.h"
#include "common/time.h"
#include "ctrl/buffer_ctrl.h"
#include "data/buffer_data.h"
#include "sync/spin.h"
#include "v1_index.h"

namespace ucm::bench {
namespace {

// ---- parameters ----------------------------------------------------------------

constexpr uint32_t kSlots = 4096;
constexpr uint64_t kSlotBytes = 4096;
constexpr uint32_t kWakeSlots = 256;
constexpr int kBatch = 256;
constexpr int kMaxWakeIters = 4096;
constexpr uint64_t kMissKeyBase = 1ull << 40;  // rank r's new keys: (r + 1) * base + n
constexpr uint64_t kWakeKeyBase = 1ull << 44;
constexpr uint64_t kHandshakeTimeoutNs = 20'000'000'000ull;

struct Options {
  bool quick = false;
  std::string json_path = "ucm_cachebench.json";
  int reps = 5;
  uint64_t run_ms = 200;
  uint32_t max_ranks = 8;
  int futex_iters = 200;
  int poll_iters = 50;
  bool wake = true;
  bool ops = true;
  std::string filter;  // run only the Get+Release cases whose name contains this
};

// ---- process plumbing ---------------------------------------------------------

struct ProcResult {
  uint64_t ops;
  uint64_t elapsed_ns;
  uint64_t cpu_ns;  // this process's CPU time over the same run (excludes preemption)
  uint64_t bad;     // ops whose outcome was not the one the case expects
};

// Made before each fork, MAP_SHARED: the barrier, results, the wake handshake.
struct SharedPage {
  alignas(64) std::atomic<uint32_t> arrived{0};
  alignas(64) std::atomic<uint32_t> aborted{0};
  alignas(64) std::atomic<int32_t> owned{-1};    // wake: iteration the owner holds as kOwner
  alignas(64) std::atomic<int32_t> waiting{-1};  // wake: iteration the waiter is about to wait on
  alignas(64) std::atomic<int32_t> done{-1};     // wake: iteration the waiter finished
  alignas(64) ProcResult result[2]{};
  uint64_t mark_ns[kMaxWakeIters]{};
  uint64_t wake_ns[kMaxWakeIters]{};
  uint64_t cpu_ns[kMaxWakeIters]{};
};

SharedPage* g_page = nullptr;
bool g_child = false;

[[noreturn]] void die(const char* what) {
  fprintf(stderr, "ucm_cachebench%s: %s: %s\n", g_child ? " (rank 1)" : "", what, last_error().c_str());
  if (g_page) g_page->aborted.store(1);  // the peer stops waiting for us
  if (g_child) _exit(1);
  exit(1);
}

void check(Result r, const char* what) {
  if (r != Result::kOk) die(what);
}

SharedPage* fresh_page() {
  if (!g_page) {
    void* p = mmap(nullptr, sizeof(SharedPage), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      perror("mmap shared page");
      exit(1);
    }
    g_page = static_cast<SharedPage*>(p);
  }
  return new (g_page) SharedPage();
}

// Spins (politely) until pred() holds; false if the peer aborted or it took too long.
template <class Pred>
bool spin_until(Pred pred) {
  const uint64_t deadline = now_ns() + kHandshakeTimeoutNs;
  for (uint32_t n = 0; !pred(); ++n) {
    if (g_page->aborted.load(std::memory_order_relaxed)) return false;
    if ((n & 1023) == 1023) {
      if (now_ns() > deadline) return false;
      sched_yield();
    }
    cpu_relax();
  }
  return true;
}

bool barrier(int procs) {
  g_page->arrived.fetch_add(1, std::memory_order_acq_rel);
  return spin_until([&] { return g_page->arrived.load(std::memory_order_acquire) >= static_cast<uint32_t>(procs); });
}

int g_cpu[2] = {-1, -1};  // the two CPUs rank 0 and rank 1 run on

void choose_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
  int n = 0;
  for (int c = 0; c < CPU_SETSIZE && n < 2; ++c)
    if (CPU_ISSET(c, &set)) g_cpu[n++] = c;
  if (n < 2) fprintf(stderr, "warning: fewer than 2 CPUs allowed: two-process cases share one CPU\n");
}

void pin_to(int rank) {
  const int c = g_cpu[rank] >= 0 ? g_cpu[rank] : g_cpu[0];
  if (c < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(c, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) perror("sched_setaffinity");
}

Key make_key(uint64_t n) {
  Key k;
  k.block.lo = n + 1;
  k.block.hi = n ^ 0x5a5a5a5a5a5a5a5aull;
  k.shard = 0;
  return k;
}

struct NodeCache {
  BufferCtrl ctrl;
  BufferData data;
};

void create_cache(uint32_t slots, EvictMode evict, uint32_t max_ranks, NodeCache* nc) {
  CtrlParams cp;
  cp.slot_bytes = kSlotBytes;
  cp.regular_slots = slots;
  cp.shards_per_block = 1;
  cp.max_ranks = max_ranks;
  cp.evict = evict;
  check(BufferCtrl::create(cp, &nc->ctrl), "BufferCtrl::create");
  DataParams dp;
  dp.slot_bytes = kSlotBytes;
  dp.total_slots = slots;
  dp.hugepages = HugePolicy::kAuto;
  check(BufferData::create(dp, &nc->data), "BufferData::create");
  check(nc->ctrl.join(0), "join rank 0");
}

// Maps the parent's planes again through their fds, as another rank would.
void attach_cache(const NodeCache& parent, NodeCache* out) {
  check(BufferCtrl::attach(parent.ctrl.fd(), nullptr, &out->ctrl), "BufferCtrl::attach");
  DataParams dp;
  dp.slot_bytes = parent.data.slot_bytes();
  dp.total_slots = parent.data.total_slots();
  std::vector<int> fds;
  for (size_t i = 0; i < parent.data.segment_count(); ++i) fds.push_back(parent.data.segment_fd(i));
  check(BufferData::attach(dp, parent.data.hugetlb(), fds.data(), fds.size(), &out->data), "BufferData::attach");
  check(out->ctrl.join(1), "join rank 1");
}

// The two indexes behind one face, so that every case is written once and
// both run exactly the same loop. get() answers the kind, the slot and
// whether a resident key was evicted; a call that fails counts as kOther.
enum class Got { kHit, kOwner, kOther };

struct UcmIndex {
  CacheBuffer& cb;
  Got get(const Key& k, uint32_t* slot, bool* evicted) {
    GetResult g;
    const Result r = cb.get(k, &g);
    *slot = g.slot;
    *evicted = g.evicted;
    if (r != Result::kOk) return Got::kOther;
    return g.kind == GetKind::kHit ? Got::kHit : g.kind == GetKind::kOwner ? Got::kOwner : Got::kOther;
  }
  bool mark_ready(uint32_t slot) { return cb.mark_ready(slot) == Result::kOk; }
  void release(uint32_t slot) { cb.release(slot); }
  void* data_at(uint32_t slot) const { return cb.data_at(slot); }
};

struct V1ModelIndex {
  V1Index& ix;
  const BufferData& data;  // the same data plane as ucmcache's, for the fill
  Got get(const Key& k, uint32_t* slot, bool* evicted) {
    const V1Index::Outcome o = ix.get(k, slot, evicted);
    return o == V1Index::Outcome::kHit ? Got::kHit : o == V1Index::Outcome::kOwner ? Got::kOwner : Got::kOther;
  }
  bool mark_ready(uint32_t slot) {
    ix.mark_ready(slot);
    return true;
  }
  void release(uint32_t slot) { ix.release(slot); }
  void* data_at(uint32_t slot) const { return data.at(slot); }
};

// Loads key j into slot j for every regular slot (8 bytes written per slot,
// which also faults the data pages in before anything is timed).
template <class Index>
void fill_in_order(Index& ix) {
  for (uint32_t j = 0; j < kSlots; ++j) {
    uint32_t slot;
    bool evicted;
    const Got got = ix.get(make_key(j), &slot, &evicted);
    if (got != Got::kOwner || slot != j) {
      fprintf(stderr, "fill: key %u went to slot %u (kind %d: %s), expected slot %u as owner\n", j, slot,
              static_cast<int>(got), last_error().c_str(), j);
      exit(1);
    }
    *static_cast<volatile uint64_t*>(ix.data_at(slot)) = j;
    if (!ix.mark_ready(slot)) die("fill mark_ready");
    ix.release(slot);
  }
}

// Runs body(cache buffer, rank) as rank 0 here and, when procs == 2, as rank 1
// in a forked child with its own mapping. Returns false if either side failed.
bool run_ranks(const NodeCache& nc, int procs, const CacheOptions& opts0, const CacheOptions& opts1,
               const std::function<bool(CacheBuffer&, int)>& body) {
  pid_t child = -1;
  if (procs == 2) {
    fflush(nullptr);
    child = fork();
    if (child < 0) {
      perror("fork");
      exit(1);
    }
    if (child == 0) {
      g_child = true;
      pin_to(1);
      NodeCache mine;
      attach_cache(nc, &mine);
      CacheBuffer cb(&mine.ctrl, &mine.data, opts1);
      const bool ok = body(cb, 1);
      if (!ok) g_page->aborted.store(1);
      mine.ctrl.leave(1);
      _exit(ok ? 0 : 1);
    }
  }
  pin_to(0);
  CacheBuffer cb(&nc.ctrl, &nc.data, opts0);
  bool ok = body(cb, 0);
  if (!ok) g_page->aborted.store(1);
  if (child > 0) {
    int status = 0;
    const uint64_t deadline = now_ns() + kHandshakeTimeoutNs;
    while (waitpid(child, &status, WNOHANG) == 0) {
      if (now_ns() > deadline) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        break;
      }
      usleep(1000);
    }
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return ok;
}

// Runs op() in batches until run_ns has passed; records ops, elapsed and CPU time.
template <class Op>
void timed_loop(uint64_t run_ns, ProcResult* out, Op op) {
  uint64_t ops = 0;
  const uint64_t cpu0 = thread_cpu_ns();
  const uint64_t t0 = now_ns();
  const uint64_t end = t0 + run_ns;
  uint64_t t;
  do {
    for (int i = 0; i < kBatch; ++i) op();
    ops += kBatch;
    t = now_ns();
  } while (t < end);
  out->cpu_ns = thread_cpu_ns() - cpu0;
  out->ops = ops;
  out->elapsed_ns = t - t0;
}

// ---- 1. Get+Release -----------------------------------------------------------

uint32_t hit_slot(Layout l, uint32_t j, int rank) {
  switch (l) {
    case Layout::kOne:
    case Layout::kSame: return 2 * j;
    case Layout::kAdjacent: return 2 * j + static_cast<uint32_t>(rank);
    case Layout::kFar: return j + static_cast<uint32_t>(rank) * (kSlots / 2);
  }
  return 0;
}

template <class Index>
bool hit_body(const Case& c, uint64_t run_ns, Index& ix, int rank) {
  std::vector<Key> keys;
  for (uint32_t j = 0; j < c.keys; ++j) {
    const uint32_t s = hit_slot(c.layout, j, rank);
    keys.push_back(make_key(s));
    uint32_t slot;
    bool evicted;
    const Got got = ix.get(keys.back(), &slot, &evicted);
    if (got != Got::kHit || slot != s) {
      fprintf(stderr, "%s: key of slot %u answered kind %d slot %u: %s\n", c.name.c_str(), s, static_cast<int>(got),
              slot, last_error().c_str());
      return false;
    }
    ix.release(slot);
  }
  if (!barrier(c.procs)) return false;
  ProcResult& r = g_page->result[rank];
  size_t j = 0;
  uint64_t bad = 0;
  timed_loop(run_ns, &r, [&] {
    uint32_t slot;
    bool evicted;
    if (ix.get(keys[j], &slot, &evicted) != Got::kHit) {
      ++bad;
      return;
    }
    ix.release(slot);
    if (++j == keys.size()) j = 0;
  });
  r.bad = bad;
  return bad == 0;
}

template <class Index>
bool miss_body(const Case& c, uint64_t run_ns, Index& ix, int rank) {
  uint64_t n = (static_cast<uint64_t>(rank) + 1) * kMissKeyBase;
  if (!barrier(c.procs)) return false;
  ProcResult& r = g_page->result[rank];
  uint64_t bad = 0;
  timed_loop(run_ns, &r, [&] {
    uint32_t slot;
    bool evicted;
    const Got got = ix.get(make_key(n), &slot, &evicted);
    if (got != Got::kOwner || !evicted) {
      ++bad;
      if (got != Got::kOwner) return;
    }
    if (c.fill) *static_cast<volatile uint64_t*>(ix.data_at(slot)) = n;
    ++n;
    if (!ix.mark_ready(slot)) ++bad;
    ix.release(slot);
  });
  r.bad = bad;
  return bad == 0;
}

template <class Index>
bool case_body(const Case& c, uint64_t run_ns, Index& ix, int rank) {
  return c.kind == OpKind::kHit ? hit_body(c, run_ns, ix, rank) : miss_body(c, run_ns, ix, rank);
}

void run_case(Case* c, const Options& o) {
  NodeCache nc;
  create_cache(kSlots, c->evict, o.max_ranks, &nc);
  V1Index* v1 = nullptr;
  if (c->v1) {
    v1 = V1Index::create(kSlots);
    if (!v1) {
      perror("v1 model: create");
      exit(1);
    }
    V1ModelIndex ix{*v1, nc.data};
    fill_in_order(ix);
  } else {
    CacheBuffer loader(&nc.ctrl, &nc.data, CacheOptions{});
    UcmIndex ix{loader};
    fill_in_order(ix);
  }
  fresh_page();
  const uint64_t run_ns = o.run_ms * 1000000ull;
  CacheOptions o0, o1;
  o1.rank = 1;
  const bool ok = run_ranks(nc, c->procs, o0, o1, [&](CacheBuffer& cb, int rank) {
    if (v1) {
      V1ModelIndex ix{*v1, nc.data};
      return case_body(*c, run_ns, ix, rank);
    }
    UcmIndex ix{cb};
    return case_body(*c, run_ns, ix, rank);
  });
  V1Index::destroy(v1);
  if (!ok) {
    fprintf(stderr, "case '%s' failed (rank 0 bad %" PRIu64 ", rank 1 bad %" PRIu64 ")\n", c->name.c_str(),
            g_page->result[0].bad, g_page->result[1].bad);
    exit(1);
  }
  double sum = 0, worst = 0, cpu = 0;
  for (int r = 0; r < c->procs; ++r) {
    const ProcResult& pr = g_page->result[r];
    const double ns = static_cast<double>(pr.elapsed_ns) / static_cast<double>(pr.ops);
    sum += ns;
    worst = std::max(worst, ns);
    cpu += static_cast<double>(pr.cpu_ns) / static_cast<double>(pr.ops);
  }
  c->runs.push_back(sum / c->procs);
  c->runs_max.push_back(worst);
  c->runs_cpu.push_back(cpu / c->procs);
}

std::vector<Case> make_cases() {
  std::vector<Case> cs;
  auto hit = [&](const char* name, Layout l, uint32_t keys, int procs) {
    const bool two = procs == 2;
    cs.push_back(Case{name, OpKind::kHit, l, keys, EvictMode::kClock, false, procs, two ? kAnchorHit2Lo : kAnchorHit,
                      two ? kAnchorHit2Hi : kAnchorHit, two ? 0 : kTargetHit, {}, {}, {}});
  };
  hit("hit  1 proc,  1 key", Layout::kOne, 1, 1);
  hit("hit  1 proc,  64 keys", Layout::kOne, 64, 1);
  hit("hit  1 proc,  2048 keys", Layout::kOne, 2048, 1);
  hit("hit  2 procs, adjacent slots, 1 key each", Layout::kAdjacent, 1, 2);
  hit("hit  2 procs, adjacent slots, 64 keys each", Layout::kAdjacent, 64, 2);
  hit("hit  2 procs, adjacent slots, 2048 keys each", Layout::kAdjacent, 2048, 2);
  hit("hit  2 procs, far slots, 1 key each", Layout::kFar, 1, 2);
  hit("hit  2 procs, far slots, 64 keys each", Layout::kFar, 64, 2);
  hit("hit  2 procs, far slots, 2048 keys each", Layout::kFar, 2048, 2);
  hit("hit  2 procs, same key", Layout::kSame, 1, 2);
  hit("hit  2 procs, same 64 keys", Layout::kSame, 64, 2);
  hit("hit  2 procs, same 2048 keys", Layout::kSame, 2048, 2);
  auto miss = [&](const char* name, EvictMode e, bool fill, int procs) {
    cs.push_back(Case{name, OpKind::kMiss, Layout::kOne, 0, e, fill, procs, kAnchorMiss, kAnchorMiss,
                      procs == 1 ? kTargetMiss : 0, {}, {}, {}});
  };
  miss("miss 1 proc,  CLOCK eviction", EvictMode::kClock, true, 1);
  miss("miss 1 proc,  CLOCK eviction, no fill", EvictMode::kClock, false, 1);
  miss("miss 2 procs, CLOCK eviction", EvictMode::kClock, true, 2);
  miss("miss 1 proc,  ring eviction (legacy)", EvictMode::kRing, true, 1);
  miss("miss 2 procs, ring eviction (legacy)", EvictMode::kRing, true, 2);
  // The control group: the same ops on the v1 model, in the same run.
  auto v1 = [&](Case c, const char* name) {
    c.name = name;
    c.v1 = true;
    c.target = 0;
    cs.push_back(std::move(c));
  };
  const size_t ours = cs.size();
  for (size_t i = 0; i < ours; ++i) {
    const Case& c = cs[i];
    const bool wanted = c.kind == OpKind::kHit ? (c.layout == Layout::kOne || c.layout == Layout::kAdjacent ||
                                                  (c.layout == Layout::kSame && c.keys == 1))
                                               : c.evict == EvictMode::kRing || (c.procs == 1 && !c.fill);
    if (!wanted) continue;
    std::string name = "v1m " + c.name;
    if (c.kind == OpKind::kMiss) name = std::string("v1m miss ") + (c.procs == 1 ? "1 proc,  " : "2 procs, ") +
                                        "ring eviction" + (c.fill ? "" : ", no fill");
    v1(c, name.c_str());
  }
  return cs;
}

// ---- 2. wake latency ------------------------------------------------------------

bool wake_owner(CacheBuffer& cb, int iters) {
  std::mt19937_64 rng(12345);
  std::uniform_int_distribution<long> sleep_us(1000, 5000);
  for (int i = 0; i < iters; ++i) {
    GetResult g;
    if (cb.get(make_key(kWakeKeyBase + static_cast<uint64_t>(i)), &g) != Result::kOk || g.kind != GetKind::kOwner) {
      fprintf(stderr, "wake: owner get of iteration %d: %s\n", i, last_error().c_str());
      return false;
    }
    g_page->owned.store(i, std::memory_order_release);
    if (!spin_until([&] { return g_page->waiting.load(std::memory_order_acquire) >= i; })) return false;
    const long us = sleep_us(rng);
    timespec ts{0, us * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
    *static_cast<volatile uint64_t*>(cb.data_at(g.slot)) = static_cast<uint64_t>(i);
    g_page->mark_ns[i] = now_ns();
    if (cb.mark_ready(g.slot) != Result::kOk) return false;
    cb.release(g.slot);
    if (!spin_until([&] { return g_page->done.load(std::memory_order_acquire) >= i; })) return false;
  }
  return true;
}

bool wake_waiter(CacheBuffer& cb, int iters) {
  for (int i = 0; i < iters; ++i) {
    if (!spin_until([&] { return g_page->owned.load(std::memory_order_acquire) >= i; })) return false;
    GetResult g;
    if (cb.get(make_key(kWakeKeyBase + static_cast<uint64_t>(i)), &g) != Result::kOk || g.kind != GetKind::kWaiter) {
      fprintf(stderr, "wake: waiter get of iteration %d: kind %d %s\n", i, static_cast<int>(g.kind),
              last_error().c_str());
      return false;
    }
    const uint64_t cpu0 = thread_cpu_ns();
    g_page->waiting.store(i, std::memory_order_release);
    uint32_t w = g.word;
    while (word_state(w) != State::kReady) {
      if (cb.wait_for_change(g.slot, w, deadline_after_ms(5000), &w) != Result::kOk || word_state(w) == State::kFailed) {
        fprintf(stderr, "wake: wait of iteration %d: %s\n", i, last_error().c_str());
        return false;
      }
    }
    g_page->wake_ns[i] = now_ns();
    g_page->cpu_ns[i] = thread_cpu_ns() - cpu0;
    cb.release(g.slot);
    g_page->done.store(i, std::memory_order_release);
  }
  return true;
}

WakeResult run_wake(WaitMode mode, int iters, const Options& o) {
  iters = std::min(iters, kMaxWakeIters);
  NodeCache nc;
  create_cache(kWakeSlots, EvictMode::kClock, o.max_ranks, &nc);
  fresh_page();
  CacheOptions owner, waiter;
  waiter.rank = 1;
  waiter.wait = mode;
  waiter.poll_interval_ms = 10;
  const bool ok = run_ranks(nc, 2, owner, waiter, [&](CacheBuffer& cb, int rank) {
    return rank == 0 ? wake_owner(cb, iters) : wake_waiter(cb, iters);
  });
  if (!ok) {
    fprintf(stderr, "wake benchmark (%s) failed\n", mode == WaitMode::kFutex ? "futex" : "poll");
    exit(1);
  }
  WakeResult wr{mode == WaitMode::kFutex ? "futex" : "poll", iters, {}, {}};
  for (int i = 0; i < iters; ++i) {
    wr.latency_us.push_back(static_cast<double>(g_page->wake_ns[i] - g_page->mark_ns[i]) / 1e3);
    wr.cpu_us.push_back(static_cast<double>(g_page->cpu_ns[i]) / 1e3);
  }
  return wr;
}

void usage() {
  printf(
      "usage: ucm_cachebench [--quick] [--json PATH] [--reps N] [--ms N] [--max-ranks N]\n"
      "                      [--futex-iters N] [--poll-iters N] [--filter TEXT] [--no-wake] [--no-ops]\n"
      "  --quick        a short run (a few seconds): 3 reps of 30 ms, 60 futex / 15 poll waits\n"
      "  --json PATH    where to write the results (default ucm_cachebench.json)\n"
      "  --reps N       runs per Get+Release case, on a fresh cache each (default 5)\n"
      "  --ms N         duration of one timed run (default 200)\n"
      "  --max-ranks N  local ranks the control plane is sized for (default 8)\n"
      "  --filter TEXT  run only the Get+Release cases whose name contains TEXT\n"
      "  --no-wake, --no-ops  skip the wake or the Get+Release part\n");
}

Options parse(int argc, char** argv) {
  Options o;
  static const option longopts[] = {
      {"quick", no_argument, nullptr, 'q'},         {"json", required_argument, nullptr, 'j'},
      {"reps", required_argument, nullptr, 'r'},    {"ms", required_argument, nullptr, 'm'},
      {"max-ranks", required_argument, nullptr, 'k'}, {"futex-iters", required_argument, nullptr, 'f'},
      {"poll-iters", required_argument, nullptr, 'p'}, {"no-wake", no_argument, nullptr, 'W'},
      {"no-ops", no_argument, nullptr, 'O'},        {"filter", required_argument, nullptr, 'F'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0}};
  // Two passes so that --quick sets defaults and explicit flags override them.
  for (int i = 1; i < argc; ++i)
    if (strcmp(argv[i], "--quick") == 0) {
      o.quick = true;
      o.reps = 3;
      o.run_ms = 30;
      o.futex_iters = 60;
      o.poll_iters = 15;
    }
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, nullptr)) != -1) {
    switch (c) {
      case 'q': break;
      case 'j': o.json_path = optarg; break;
      case 'r': o.reps = std::max(1, atoi(optarg)); break;
      case 'm': o.run_ms = std::max(1, atoi(optarg)); break;
      case 'k': o.max_ranks = static_cast<uint32_t>(std::clamp(atoi(optarg), 2, static_cast<int>(kMaxRanks))); break;
      case 'f': o.futex_iters = std::clamp(atoi(optarg), 1, kMaxWakeIters); break;
      case 'p': o.poll_iters = std::clamp(atoi(optarg), 1, kMaxWakeIters); break;
      case 'W': o.wake = false; break;
      case 'O': o.ops = false; break;
      case 'F': o.filter = optarg; break;
      case 'h': usage(); exit(0);
      default: usage(); exit(2);
    }
  }
  return o;
}

// Median of 5 short loops each: a locked RMW, a clock read.
void calibrate(RunInfo* info) {
  constexpr int kLoops = 2'000'000;
  std::atomic<uint64_t> counter{0};
  std::vector<double> rmw, clock;
  for (int rep = 0; rep < 5; ++rep) {
    uint64_t t0 = now_ns();
    for (int i = 0; i < kLoops; ++i) counter.fetch_add(1, std::memory_order_relaxed);
    rmw.push_back(static_cast<double>(now_ns() - t0) / kLoops);
    uint64_t sink = 0;
    t0 = now_ns();
    for (int i = 0; i < kLoops / 10; ++i) sink += now_ns();
    clock.push_back(static_cast<double>(now_ns() - t0) / (kLoops / 10));
    if (sink == 1) puts("");  // keeps the loop
  }
  info->locked_rmw_ns = median(rmw);
  info->clock_read_ns = median(clock);
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  choose_cpus();
  double load[1] = {0};
  getloadavg(load, 1);
  bool hugetlb = false;
  {
    NodeCache probe;
    create_cache(kSlots, EvictMode::kClock, o.max_ranks, &probe);
    hugetlb = probe.data.hugetlb();
  }
  pin_to(0);
  RunInfo info{o.quick, o.reps, o.run_ms, kSlots, kSlotBytes, o.max_ranks, hugetlb, load[0], {g_cpu[0], g_cpu[1]}, 0, 0};
  calibrate(&info);
  print_header(info);

  std::vector<Case> cases;
  if (o.ops) {
    for (Case& c : make_cases())
      if (o.filter.empty() || c.name.find(o.filter) != std::string::npos) cases.push_back(std::move(c));
    // Each ucmcache line runs right before its v1 twin (once per rep), so a
    // pair sees the machine in the same state and their per-rep ratio holds
    // even while the host's speed drifts.
    for (int rep = 0; rep < o.reps; ++rep) {
      std::vector<bool> done(cases.size(), false);
      for (size_t i = 0; i < cases.size(); ++i) {
        if (cases[i].v1) continue;
        run_case(&cases[i], o);
        if (const Case* t = v1_twin(cases, cases[i])) {
          const size_t ti = static_cast<size_t>(t - cases.data());
          if (!done[ti]) run_case(&cases[ti], o);
          done[ti] = true;
        }
      }
      for (size_t i = 0; i < cases.size(); ++i)
        if (cases[i].v1 && !done[i]) run_case(&cases[i], o);  // a v1 line without a twin (--filter)
    }
    print_ops(cases);
  }
  WakeResult fw{}, pw{};
  if (o.wake) {
    fw = run_wake(WaitMode::kFutex, o.futex_iters, o);
    pw = run_wake(WaitMode::kPoll, o.poll_iters, o);
    print_wake(fw, pw);
  }
  if (!write_json(o.json_path, info, cases, o.wake ? &fw : nullptr, o.wake ? &pw : nullptr)) return 1;
  printf("\nwrote %s\n", o.json_path.c_str());
  return 0;
}

}  // namespace
}  // namespace ucm::bench

int main(int argc, char** argv) { return ucm::bench::run(argc, argv); }
