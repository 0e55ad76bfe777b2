// ucm_scalebench: what the cache costs as it grows (issue 15, goals 4-6), each
// as a ratio measured side by side in one run, through the real planes in
// one process (no MPI):
//
//   ucm_scalebench [--quick] [--mode miss|hit|fill|leave|all] [--slots N] [--reps N]
//                  [--shard-bytes B (4096; hit and fill)] [--hits N (200000)]
//                  [--misses N (20000; miss)] [--fill-bytes B (1 GiB; fill)]
//
//   miss   the --misses misses after the cache fills, at --slots slots
//          (512k): median, p99 and slowest miss, and slowest/median (goal 4:
//          within 10x), each miss beside a fixed-cost control with no cache
//          (a hash and a 64-byte record copy, calibrated to the median miss),
//          whose own slowest/median is the machine's noise floor; then the
//          same on a cache filled afresh, instrumented: per miss the CLOCK
//          positions, sweeping lock holds, locked chain walks and links
//          (the library's per-thread counters), page faults and context
//          switches (getrusage RUSAGE_THREAD) and the thread's CPU time,
//          read outside the timed window (their own CPU cost, measured on
//          empty windows, is subtracted); and why each miss over 10x the
//          median was slow (see Blame below).
//   hit    the per-shard hit overhead (get + copy of the slot + release,
//          minus a plain memcpy of the same slot, same random order) at 4k
//          and at --slots slots, with the control region on 4 KiB pages and
//          on 2 MiB hugetlb pages (when the kernel has free ones: reserve
//          them with /proc/sys/vm/nr_hugepages), and the ratio large/small
//          for each (goal 5: within 1.2x with hugepages).
//   fill   the first fill of a fresh data plane (populated at init, in
//          parallel) against a warm refill of the same plane, and the same
//          for a plane that is not populated (allow_overcommit), which is what
//          a fresh cache cost before (goal 6: populated fresh/warm <= 1.1).
//   leave  leaving the control region at --slots slots: a rank that holds
//          nothing (no walk) against one that holds a pin (the walk).
//   finalize (MPI build; not in "all"; under mpirun -np N)
//          ucm_cache_finalize of a --cache-bytes cache (64 GiB, sparse) at
//          1 rank and at N ranks side by side in one job, by wall and by
//          CPU time per rank (goal 6: N = 8 within 2x of 1).
//
// Each number is the median of --reps repetitions; ratios are taken within a
// repetition. Timing only: it checks outcomes (every miss evicts, every hit
// hits) and exits non-zero when one is wrong, never on a time.
#include <getopt.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/cache_buffer.h"
#include "common/log.h"
#include "ctrl/buffer_ctrl.h"
#include "ctrl/chain.h"
#include "ctrl/clock.h"
#include "data/buffer_data.h"

#ifdef UCM_SCALEBENCH_MPI
#include <mpi.h>

#include "common/numbered_key.h"
#include "ucmcache/ucm.h"
#endif

namespace ucm::bench {
namespace {

struct Options {
  std::string mode = "all";
  uint32_t slots = 512 * 1024;
  uint32_t small_slots = 4096;
  uint32_t reps = 5;
  uint64_t slot_bytes = 4096;
  uint32_t hits = 200000;
  uint32_t misses = 20000;
  uint64_t fill_bytes = 1ull << 30;
  // finalize
  bool slot_bytes_set = false;          // --shard-bytes given (finalize's default is 256 KiB)
  uint64_t cache_bytes = 64ull << 30;   // --cache-bytes: the node's regular pool
  uint32_t fill_shards = 64;            // --fill-shards: each rank loads these, then releases them
};

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
}

Key key_of(uint64_t b) {
  Key k;
  k.block.lo = b;
  k.block.hi = b * 0x9e3779b97f4a7c15ull;
  k.shard = 0;
  return k;
}

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "ucm_scalebench: %s: %s\n", what, last_error().c_str());
  std::exit(1);
}

struct Planes {
  BufferCtrl ctrl;
  BufferData data;
};

void make(uint32_t slots, uint64_t slot_bytes, CtrlPages pages, Planes* p, bool populate = true) {
  CtrlParams cp;
  cp.slot_bytes = slot_bytes;
  cp.regular_slots = slots;
  cp.shards_per_block = 1;
  cp.max_ranks = 1;
  if (BufferCtrl::create(cp, &p->ctrl, pages) != Result::kOk) die("control region");
  DataParams dp;
  dp.slot_bytes = slot_bytes;
  dp.total_slots = slots;
  dp.hugepages = HugePolicy::kOff;
  dp.allow_overcommit = !populate;
  if (BufferData::create(dp, &p->data) != Result::kOk) die("data plane");
  if (p->ctrl.join(0) != Result::kOk) die("join");
}

void fill_all(CacheBuffer& cb, uint32_t slots, uint64_t first_block) {
  for (uint32_t i = 0; i < slots; ++i) {
    GetResult g;
    if (cb.get(key_of(first_block + i), &g) != Result::kOk || g.kind != GetKind::kOwner) die("fill");
    if (cb.mark_ready(g.slot) != Result::kOk) die("mark_ready");
    cb.release(g.slot);
  }
}

// ---- miss ------------------------------------------------------------------
// What one timed operation cost, and what it did (the instrumented pass).
struct Sample {
  double wall = 0;      // ns, steady clock
  double cpu = 0;       // ns of this thread's CPU time (CLOCK_THREAD_CPUTIME_ID)
  uint32_t positions = 0;  // CLOCK positions examined (sweep_stats)
  uint32_t sweeps = 0;     // sweep calls: holds of the key's bucket lock that swept
  uint32_t walks = 0;      // chain walks under a bucket lock (own bucket, the victim's)
  uint32_t links = 0;      // links those walks visited
  uint32_t chain = 0;      // links on the key's chain before the miss (walked by the bench)
  uint32_t minflt = 0, majflt = 0, nvcsw = 0, nivcsw = 0;  // getrusage(RUSAGE_THREAD) deltas
  bool moved = false;      // ran on another CPU after than before
};

uint64_t thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint32_t chain_length(const BufferCtrl& c, uint32_t b) {
  uint32_t n = 0;
  for (uint32_t i = c.bucket(b).head.load(std::memory_order_acquire); i < c.total_slots() && n < c.total_slots();
       i = c.slot(i).next.load(std::memory_order_acquire))
    ++n;
  return n;
}

// The control: a fixed-cost operation with no cache, of about a median
// miss's cost: `rounds` rounds of a 64-bit mix (the hash), then a copy of
// one 64-byte record (a control record's size) from a table with as many
// records as the cache has slots, at a place the hash picks (the same spread
// over memory as the slot records a miss reads).
struct Control {
  struct alignas(64) Record {
    uint64_t w[8];
  };
  std::vector<Record> table;
  uint32_t rounds = 64;
  Record out{};
  explicit Control(uint32_t n) : table(n) {
    for (uint32_t i = 0; i < n; ++i) table[i].w[0] = i;
  }
  void run(uint64_t i) {
    uint64_t h = i;
    for (uint32_t r = 0; r < rounds; ++r) {
      h += 0x9e3779b97f4a7c15ull;
      h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
      h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
      h ^= h >> 31;
    }
    std::memcpy(&out, &table[h % table.size()], sizeof(Record));
    asm volatile("" : : "r"(&out) : "memory");
  }
  double median_ns(uint32_t n, uint64_t first) {
    std::vector<double> t(n);
    for (uint32_t i = 0; i < n; ++i) {
      const uint64_t t0 = now_ns();
      run(first + i);
      t[i] = static_cast<double>(now_ns() - t0);
    }
    return median(t);
  }
  // Rounds such that the median is about target_ns.
  void calibrate(double target_ns) {
    for (int step = 0; step < 4; ++step) {
      const double m = median_ns(2000, 1ull << 40);
      if (m <= 0) break;
      const double r = static_cast<double>(rounds) * target_ns / m;
      rounds = static_cast<uint32_t>(std::clamp(r, 1.0, 1e6));
    }
  }
};

// Counters of the whole machine (/proc): interrupts, context switches, and
// the local timer's interrupts summed over the CPUs.
struct MachineCounts {
  uint64_t intr = 0, ctxt = 0, timer = 0, steal_ticks = 0;
};

MachineCounts machine_counts() {
  MachineCounts m;
  if (FILE* f = std::fopen("/proc/stat", "r")) {
    char line[4096];
    while (std::fgets(line, sizeof line, f)) {
      unsigned long long v = 0;
      if (std::sscanf(line, "intr %llu", &v) == 1) m.intr = v;
      if (std::sscanf(line, "ctxt %llu", &v) == 1) m.ctxt = v;
      unsigned long long u, n, sy, id, io, irq, sirq, st;
      if (std::sscanf(line, "cpu  %llu %llu %llu %llu %llu %llu %llu %llu", &u, &n, &sy, &id, &io, &irq, &sirq, &st) == 8)
        m.steal_ticks = st;
    }
    std::fclose(f);
  }
  if (FILE* f = std::fopen("/proc/interrupts", "r")) {
    char line[8192];
    while (std::fgets(line, sizeof line, f)) {
      const char* p = line;
      while (*p == ' ') ++p;
      if (std::strncmp(p, "LOC:", 4) != 0) continue;
      p += 4;
      char* end = nullptr;
      for (;;) {
        const unsigned long long v = std::strtoull(p, &end, 10);
        if (end == p) break;
        m.timer += v;
        p = end;
      }
    }
    std::fclose(f);
  }
  return m;
}

// One pass: n misses (new keys, each must evict) interleaved with n control
// operations, so that both meet the same machine. instrumented: each also
// reads its CPU time, getrusage and the library's per-thread counters
// around the timed window (outside it).
struct Pass {
  std::vector<Sample> miss, ctl;
  double wall_s = 0;            // the pass, start to end
  double timed_s = 0;           // inside the timed windows, both kinds
  MachineCounts before, after;
};

template <class Op>
void one_op(bool instrumented, Sample* s, Op&& op) {
  if (!instrumented) {
    const uint64_t t0 = now_ns();
    op();
    s->wall = static_cast<double>(now_ns() - t0);
    return;
  }
  rusage r0, r1;
  const SweepStats s0 = sweep_stats();
  const ChainStats c0 = chain_stats();
  const int cpu0 = sched_getcpu();
  getrusage(RUSAGE_THREAD, &r0);
  const uint64_t u0 = thread_cpu_ns();
  const uint64_t t0 = now_ns();
  op();
  const uint64_t t1 = now_ns();
  const uint64_t u1 = thread_cpu_ns();
  getrusage(RUSAGE_THREAD, &r1);
  const int cpu1 = sched_getcpu();
  const SweepStats s1 = sweep_stats();
  const ChainStats c1 = chain_stats();
  s->wall = static_cast<double>(t1 - t0);
  s->cpu = static_cast<double>(u1 - u0);
  s->positions = static_cast<uint32_t>(s1.positions - s0.positions);
  s->sweeps = static_cast<uint32_t>(s1.calls - s0.calls);
  s->walks = static_cast<uint32_t>(c1.locked_walks - c0.locked_walks);
  s->links = static_cast<uint32_t>(c1.links - c0.links);
  s->minflt = static_cast<uint32_t>(r1.ru_minflt - r0.ru_minflt);
  s->majflt = static_cast<uint32_t>(r1.ru_majflt - r0.ru_majflt);
  s->nvcsw = static_cast<uint32_t>(r1.ru_nvcsw - r0.ru_nvcsw);
  s->nivcsw = static_cast<uint32_t>(r1.ru_nivcsw - r0.ru_nivcsw);
  s->moved = cpu0 != cpu1;
}

// What the instrumentation's own reads add to a window's CPU time (two
// clock_gettime and half of two getrusage): the median over empty windows,
// subtracted from every instrumented sample so that CPU ratios compare work.
double cpu_bracket_ns() {
  std::vector<double> v(2000);
  for (double& x : v) {
    Sample s;
    one_op(true, &s, [] {});
    x = s.cpu;
  }
  return median(v);
}

Pass miss_pass(CacheBuffer& cb, const BufferCtrl& c, Control& ctl, uint32_t n, uint64_t* next_key, bool instrumented) {
  Pass p;
  p.miss.resize(n);
  p.ctl.resize(n);
  const double bracket = instrumented ? cpu_bracket_ns() : 0;
  p.before = machine_counts();
  const uint64_t start = now_ns();
  for (uint32_t i = 0; i < n; ++i) {
    const Key k = key_of((*next_key)++);
    if (instrumented) p.miss[i].chain = chain_length(c, bucket_of(k, c.bucket_mask()));
    GetResult g;
    Result res = Result::kOk;
    one_op(instrumented, &p.miss[i], [&] { res = cb.get(k, &g); });
    if (res != Result::kOk || g.kind != GetKind::kOwner || !g.evicted) die("a miss after the fill did not evict");
    if (cb.mark_ready(g.slot) != Result::kOk) die("mark_ready");
    cb.release(g.slot);
    one_op(instrumented, &p.ctl[i], [&] { ctl.run(*next_key + i); });
    p.timed_s += (p.miss[i].wall + p.ctl[i].wall) / 1e9;
    if (instrumented)
      for (Sample* x : {&p.miss[i], &p.ctl[i]}) x->cpu = std::max(1.0, x->cpu - bracket);
  }
  p.wall_s = static_cast<double>(now_ns() - start) / 1e9;
  p.after = machine_counts();
  return p;
}

std::vector<double> walls(const std::vector<Sample>& v) {
  std::vector<double> w;
  for (const Sample& s : v) w.push_back(s.wall);
  return w;
}
std::vector<double> cpus(const std::vector<Sample>& v) {
  std::vector<double> w;
  for (const Sample& s : v) w.push_back(s.cpu);
  return w;
}
double worst_over_median(const std::vector<double>& v) {
  const double m = median(v);
  return m > 0 ? *std::max_element(v.begin(), v.end()) / m : 0;
}

// Why the slow ones (wall above 10x the median) were slow, in the
// instrumented pass, each counted once, in this order: a context switch (or
// a move to another CPU) during it; a page fault; wall time that was not
// this thread's CPU time (CPU time within 10x of the median of its kind:
// the vCPU was away, the hypervisor's steal); more work of ours than any
// bounded miss does (more than kSweepSecondChance + 1 positions, a second
// sweeping lock hold, a chain walk 4 links longer than the median); CPU time
// above 10x with no more work: an interrupt, whose time this kernel counts
// to the thread it hit (no IRQ_TIME_ACCOUNTING). "Its kind": a miss of the
// first lap after the fill (65 positions) is compared with those, a later
// one (a position or two) with the later ones.
struct Blame {
  uint32_t slow = 0, cswitch = 0, fault = 0, away = 0, work = 0, interrupt = 0;
  void add(const Blame& o) {
    slow += o.slow;
    cswitch += o.cswitch;
    fault += o.fault;
    away += o.away;
    work += o.work;
    interrupt += o.interrupt;
  }
};

Blame blame(const std::vector<Sample>& v) {
  Blame b;
  const double mw = median(walls(v));
  std::vector<double> lap_cpu, rest_cpu, lnk;
  for (const Sample& s : v) {
    (s.positions > kSweepSecondChance ? lap_cpu : rest_cpu).push_back(s.cpu);
    lnk.push_back(s.links);
  }
  const double ml = median(lnk), mc_lap = median(lap_cpu), mc_rest = median(rest_cpu);
  for (const Sample& s : v) {
    if (s.wall <= 10 * mw) continue;
    ++b.slow;
    const double mc = s.positions > kSweepSecondChance ? mc_lap : mc_rest;
    if (s.nvcsw + s.nivcsw != 0 || s.moved) ++b.cswitch;
    else if (s.minflt + s.majflt != 0) ++b.fault;
    else if (s.cpu <= 10 * mc) ++b.away;
    else if (s.positions > kSweepSecondChance + 1 || s.sweeps > 1 || s.links > ml + 4) ++b.work;
    else ++b.interrupt;
  }
  return b;
}

void run_miss(const Options& o) {
  // Per repetition: ratios in one pass (plain), then in the instrumented pass.
  std::vector<double> med, p99, worst, ratio, ctl_ratio, over, holds, rounds;
  std::vector<double> i_ratio, i_ctl_ratio, c_ratio, c_ctl_ratio, cpu_med, ctl_cpu_med;
  std::vector<double> tick_rate, ticks_expected, first_lap, pos_med, lap_over_rest;
  Blame bm_all, bc_all;
  uint64_t faults = 0, majfaults = 0, vcs = 0, ivcs = 0, max_pos = 0, max_sweeps = 0, max_walks = 0, max_links = 0,
           max_chain = 0, longest_chain = 0;
  std::vector<Sample> top;  // the slowest misses of the instrumented passes
  // A fresh cache, filled: every accessed bit set, the state of the first
  // miss after a fill. The first lap of misses after it examines 65
  // positions each (64 second chances, then the raw cursor); once the hand
  // has passed every slot, a miss finds a clear bit in a position or two.
  struct Filled {
    Planes p;
    std::unique_ptr<CacheBuffer> cb;
  };
  auto filled = [&](Filled* f) {
    make(o.slots, 64, CtrlPages::kOff, &f->p, false);
    f->cb = std::make_unique<CacheBuffer>(&f->p.ctrl, &f->p.data, CacheOptions{});
    fill_all(*f->cb, o.slots, 1);
  };
  auto done = [](Filled* f) {
    f->cb.reset();
    f->p.ctrl.leave(0);
  };
  // The control's cost: calibrated once to this machine's median miss after
  // a fill (a pass of its own, not reported).
  Control ctl(o.slots);
  {
    Filled f;
    filled(&f);
    uint64_t next_key = 50000000ull;
    Pass cal = miss_pass(*f.cb, f.p.ctrl, ctl, o.misses, &next_key, false);
    ctl.calibrate(median(walls(cal.miss)));
    done(&f);
  }
  for (uint32_t r = 0; r < o.reps; ++r) {
    uint64_t next_key = 100000000ull;
    Filled f;
    filled(&f);
    for (uint32_t b = 0; b < f.p.ctrl.bucket_count(); ++b)
      longest_chain = std::max<uint64_t>(longest_chain, chain_length(f.p.ctrl, b));
    // Plain (each window reads the steady clock only): the figure the goal names.
    reset_sweep_stats();
    Pass plain = miss_pass(*f.cb, f.p.ctrl, ctl, o.misses, &next_key, false);
    holds.push_back(static_cast<double>(sweep_stats().max_per_call));
    const std::vector<double> t = walls(plain.miss);
    med.push_back(median(t));
    p99.push_back(pct(t, 0.99));
    worst.push_back(*std::max_element(t.begin(), t.end()));
    ratio.push_back(worst.back() / med.back());
    ctl_ratio.push_back(worst_over_median(walls(plain.ctl)));
    over.push_back(ratio.back() / std::max(1e-9, ctl_ratio.back()));
    rounds.push_back(ctl.rounds);
    done(&f);
    // Instrumented, on a cache filled afresh: the same misses, with what each did.
    filled(&f);
    Pass ins = miss_pass(*f.cb, f.p.ctrl, ctl, o.misses, &next_key, true);
    done(&f);
    i_ratio.push_back(worst_over_median(walls(ins.miss)));
    i_ctl_ratio.push_back(worst_over_median(walls(ins.ctl)));
    c_ratio.push_back(worst_over_median(cpus(ins.miss)));
    c_ctl_ratio.push_back(worst_over_median(cpus(ins.ctl)));
    cpu_med.push_back(median(cpus(ins.miss)));
    ctl_cpu_med.push_back(median(cpus(ins.ctl)));
    std::vector<double> pos;
    for (const Sample& s : ins.miss) pos.push_back(s.positions);
    first_lap.push_back(static_cast<double>(std::count_if(ins.miss.begin(), ins.miss.end(), [](const Sample& s) {
      return s.positions > kSweepSecondChance;
    })));
    pos_med.push_back(median(pos));
    const double ticks = static_cast<double>(ins.after.timer - ins.before.timer);
    const long ncpu = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    tick_rate.push_back(ticks / static_cast<double>(ncpu) / std::max(1e-9, ins.wall_s));
    ticks_expected.push_back(tick_rate.back() * ins.timed_s);
    bm_all.add(blame(ins.miss));
    bc_all.add(blame(ins.ctl));
    // Our work's own spread: the first lap's misses (65 positions) against
    // the misses after it (a position or two), medians by CPU time.
    std::vector<double> lap_cpu, rest_cpu;
    for (const Sample& s : ins.miss) (s.positions > kSweepSecondChance ? lap_cpu : rest_cpu).push_back(s.cpu);
    if (!lap_cpu.empty() && !rest_cpu.empty()) lap_over_rest.push_back(median(lap_cpu) / median(rest_cpu));
    for (const Sample& s : ins.miss) {
      faults += s.minflt;
      majfaults += s.majflt;
      vcs += s.nvcsw;
      ivcs += s.nivcsw;
      max_pos = std::max<uint64_t>(max_pos, s.positions);
      max_sweeps = std::max<uint64_t>(max_sweeps, s.sweeps);
      max_walks = std::max<uint64_t>(max_walks, s.walks);
      max_links = std::max<uint64_t>(max_links, s.links);
      max_chain = std::max<uint64_t>(max_chain, s.chain);
    }
    std::vector<Sample> sorted = ins.miss;
    std::sort(sorted.begin(), sorted.end(), [](const Sample& a, const Sample& b) { return a.wall > b.wall; });
    top.insert(top.end(), sorted.begin(), sorted.begin() + std::min<size_t>(3, sorted.size()));
  }
  auto range = [](const std::vector<double>& v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f (range %.2f-%.2f)", median(v), *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    return std::string(buf);
  };
  std::printf("miss after fill, %u slots, %u misses x %u reps, each beside a fixed-cost control (no cache):\n",
              o.slots, o.misses, o.reps);
  std::printf("  first misses after the fill: median %.0f ns  p99 %.0f ns  slowest %.0f ns  slowest/median %s"
              " (goal <= 10)\n",
              median(med), median(p99), median(worst), range(ratio).c_str());
  std::printf("  control (%.0f rounds of a 64-bit mix + a 64-byte record copy, calibrated to the median miss):"
              " slowest/median %s\n",
              median(rounds), range(ctl_ratio).c_str());
  std::printf("  miss's slowest/median over the control's, same pass: %s\n", range(over).c_str());
  std::printf("  instrumented pass, by wall time: miss %s, control %s\n", range(i_ratio).c_str(),
              range(i_ctl_ratio).c_str());
  std::printf("  instrumented pass, by the thread's CPU time: miss %s, control %s (median CPU %.0f ns, control %.0f ns)\n",
              range(c_ratio).c_str(), range(c_ctl_ratio).c_str(), median(cpu_med), median(ctl_cpu_med));
  std::printf("  positions per miss: median %.0f; %.0f of the %u misses examined more than %u (the first lap after the"
              " fill), their median CPU time %s x that of the misses after them\n",
              median(pos_med), median(first_lap), o.misses, kSweepSecondChance,
              lap_over_rest.empty() ? "-" : range(lap_over_rest).c_str());
  std::printf("  per miss (instrumented, all reps): at most %" PRIu64 " positions, %" PRIu64 " sweeping lock hold(s), %" PRIu64
              " locked chain walk(s) of %" PRIu64 " link(s); key's chain at most %" PRIu64 " (longest in the table %" PRIu64
              "); page faults %" PRIu64 " minor %" PRIu64 " major; context switches %" PRIu64 " voluntary %" PRIu64
              " involuntary\n",
              max_pos, max_sweeps, max_walks, max_links, max_chain, longest_chain, faults, majfaults, vcs, ivcs);
  for (auto [what, b] : {std::pair{"misses", &bm_all}, std::pair{"controls", &bc_all}})
    std::printf("  %s above 10x their median wall (all reps): %u: context switch %u, page fault %u, wall not on"
                " this CPU (steal) %u, more work of ours %u, an interrupt (CPU time counted to the thread) %u\n",
                what, b->slow, b->cswitch, b->fault, b->away, b->work, b->interrupt);
  std::printf("  local timer interrupts: %.0f per CPU per second; expected inside the timed windows of a pass: %.1f\n",
              median(tick_rate), median(ticks_expected));
  std::sort(top.begin(), top.end(), [](const Sample& a, const Sample& b) { return a.wall > b.wall; });
  for (size_t i = 0; i < std::min<size_t>(5, top.size()); ++i) {
    const Sample& s = top[i];
    std::printf("    slowest #%zu: wall %.0f ns cpu %.0f ns, %u positions, %u sweep(s), %u walk(s) of %u link(s),"
                " chain %u, faults %u+%u, cs %u+%u%s\n",
                i + 1, s.wall, s.cpu, s.positions, s.sweeps, s.walks, s.links, s.chain, s.minflt, s.majflt, s.nvcsw,
                s.nivcsw, s.moved ? ", moved CPU" : "");
  }
  std::printf("  most positions one lock hold examined: %.0f (bound %u)\n", median(holds), kSweepPerCall);
}

// ---- hit -------------------------------------------------------------------
// ns per shard: hit (get + memcpy + release) and memcpy alone, same order.
void hit_costs(uint32_t slots, uint64_t slot_bytes, CtrlPages pages, uint32_t n, double* hit, double* copy,
               bool* huge) {
  Planes p;
  make(slots, slot_bytes, pages, &p);
  *huge = p.ctrl.hugetlb();
  CacheBuffer cb(&p.ctrl, &p.data, CacheOptions{});
  fill_all(cb, slots, 1);
  std::vector<uint32_t> order(n);
  std::mt19937_64 rng(42);
  for (uint32_t& x : order) x = static_cast<uint32_t>(rng() % slots);
  std::vector<uint8_t> dst(slot_bytes);
  // memcpy alone, from the slot the key lives in (a random spread over the plane).
  std::vector<uint32_t> slot_of(slots);
  for (uint32_t i = 0; i < slots; ++i) {
    GetResult g;
    if (cb.get(key_of(1 + i), &g) != Result::kOk || g.kind != GetKind::kHit) die("hit");
    slot_of[i] = g.slot;
    cb.release(g.slot);
  }
  // Alternating rounds, the fastest of each: neither loop runs on caches the
  // other warmed for it alone.
  *copy = *hit = 1e300;
  for (int round = 0; round < 3; ++round) {
    uint64_t t0 = now_ns();
    for (uint32_t x : order) {
      std::memcpy(dst.data(), p.data.at(slot_of[x]), slot_bytes);
      asm volatile("" : : "r"(dst.data()) : "memory");
    }
    *copy = std::min(*copy, static_cast<double>(now_ns() - t0) / n);
    t0 = now_ns();
    for (uint32_t x : order) {
      GetResult g;
      if (cb.get(key_of(1 + x), &g) != Result::kOk || g.kind != GetKind::kHit) die("hit");
      std::memcpy(dst.data(), p.data.at(g.slot), slot_bytes);
      asm volatile("" : : "r"(dst.data()) : "memory");
      cb.release(g.slot);
    }
    *hit = std::min(*hit, static_cast<double>(now_ns() - t0) / n);
  }
  p.ctrl.leave(0);
}

void run_hit(const Options& o) {
  std::printf("hit overhead above memcpy, %llu-byte shards, %u hits x %u reps:\n",
              static_cast<unsigned long long>(o.slot_bytes), o.hits, o.reps);
  for (CtrlPages pages : {CtrlPages::kOff, CtrlPages::kAuto}) {
    std::vector<double> r_over, r_copy, small_over, large_over;
    bool huge_small = false, huge_large = false;
    for (uint32_t r = 0; r < o.reps; ++r) {
      double hs, cs, hl, cl;
      hit_costs(o.small_slots, o.slot_bytes, pages, o.hits, &hs, &cs, &huge_small);
      hit_costs(o.slots, o.slot_bytes, pages, o.hits, &hl, &cl, &huge_large);
      small_over.push_back(hs - cs);
      large_over.push_back(hl - cl);
      r_over.push_back((hl - cl) / std::max(1.0, hs - cs));
      r_copy.push_back(cl / cs);
    }
    const char* what = pages == CtrlPages::kOff ? "4 KiB pages" : huge_large ? "2 MiB hugetlb" : "THP hint only (no free hugepages)";
    std::printf("  control on %-34s overhead %u slots %.1f ns, %u slots %.1f ns: large/small %.2f (range %.2f-%.2f)"
                "; memcpy alone grows %.2f%s\n",
                what, o.small_slots, median(small_over), o.slots, median(large_over), median(r_over),
                *std::min_element(r_over.begin(), r_over.end()), *std::max_element(r_over.begin(), r_over.end()),
                median(r_copy), pages == CtrlPages::kAuto && huge_small != huge_large ? " (pages differ by size)" : "");
  }
  std::printf("  goal: large/small <= 1.2 with hugepages\n");
}

// ---- fill ------------------------------------------------------------------
double write_every_slot(const BufferData& d, uint8_t v) {
  const uint64_t t0 = now_ns();
  for (uint32_t i = 0; i < d.total_slots(); ++i) std::memset(d.at(i), v, d.slot_bytes());
  return static_cast<double>(now_ns() - t0) / 1e9;
}

void run_fill(const Options& o) {
  const uint32_t slots = std::max<uint32_t>(8, static_cast<uint32_t>(o.fill_bytes / o.slot_bytes));
  std::vector<double> pop_ratio, lazy_ratio, pop_s, init_s;
  uint32_t threads = 0;
  for (uint32_t r = 0; r < o.reps; ++r) {
    for (bool populate : {true, false}) {
      DataParams dp;
      dp.slot_bytes = o.slot_bytes;
      dp.total_slots = slots;
      dp.segment_bytes = std::max<uint64_t>(o.slot_bytes, uint64_t{slots} * o.slot_bytes / 8);  // 8 segments
      dp.hugepages = HugePolicy::kOff;
      dp.allow_overcommit = !populate;
      BufferData d;
      const uint64_t t0 = now_ns();
      if (BufferData::create(dp, &d) != Result::kOk) die("data plane");
      const double init = static_cast<double>(now_ns() - t0) / 1e9;
      const double fresh = write_every_slot(d, 1);
      const double warm = write_every_slot(d, 2);
      (populate ? pop_ratio : lazy_ratio).push_back(fresh / warm);
      if (populate) {
        pop_s.push_back(d.populate_seconds());
        init_s.push_back(init);
        threads = d.populate_threads();
      }
    }
  }
  std::printf("first fill of %u x %llu bytes (8 segments), %u reps:\n", slots,
              static_cast<unsigned long long>(o.slot_bytes), o.reps);
  std::printf("  populated at init (%u threads, %.3f s of %.3f s create): fresh/warm %.2f (range %.2f-%.2f; goal <= 1.1)\n",
              threads, median(pop_s), median(init_s), median(pop_ratio),
              *std::min_element(pop_ratio.begin(), pop_ratio.end()), *std::max_element(pop_ratio.begin(), pop_ratio.end()));
  std::printf("  not populated (overcommit, faulted on first use): fresh/warm %.2f\n", median(lazy_ratio));
}

// ---- leave -----------------------------------------------------------------
void run_leave(const Options& o) {
  std::vector<double> walk, none;
  for (uint32_t r = 0; r < o.reps; ++r) {
    for (bool holds : {false, true}) {
      Planes p;
      make(o.slots, 64, CtrlPages::kOff, &p, false);
      CacheBuffer cb(&p.ctrl, &p.data, CacheOptions{});
      GetResult g;
      if (cb.get(key_of(1), &g) != Result::kOk) die("get");
      if (cb.mark_ready(g.slot) != Result::kOk) die("mark_ready");
      if (!holds) cb.release(g.slot);
      const uint64_t t0 = now_ns();
      const uint32_t walked = p.ctrl.leave(0, cb.references_held() != 0);
      const double s = static_cast<double>(now_ns() - t0) / 1e9;
      if ((walked != 0) != holds) die("leave walked when it should not, or not when it should");
      (holds ? walk : none).push_back(s);
    }
  }
  std::printf("leave at %u slots, %u reps: holds nothing %.1f us, holds one pin (walk) %.1f us: walk/none %.0fx\n",
              o.slots, o.reps, median(none) * 1e6, median(walk) * 1e6, median(walk) / std::max(1e-9, median(none)));
}

// ---- finalize (MPI) --------------------------------------------------------
// ucm_cache_finalize through the public API, at one rank and at every rank
// mpirun started, side by side in one job: each repetition runs a cache life
// on a communicator of world rank 0 alone (the others wait asleep: an
// MPI_Ibarrier polled every 200 us, so on a small machine they take no CPU
// from it), then one on the whole world. In each life every rank loads the
// same --fill-shards shards (one task, waited for), so it took references
// and released them; the ranks meet (MPI_Barrier), then each times its own
// ucm_cache_finalize: wall time, and the process's CPU time (getrusage
// RUSAGE_SELF: the calling thread and the queue's threads as they stop).
//
// The data plane is sparse (allow_overcommit: mapped, not populated), so a
// 64 GiB cache runs on a machine with less memory. That is the measurement
// the goal names: what finalize walks is the control plane, one record per
// slot, which is full size; the data plane's bytes are never read by
// finalize, and unmapping pages nobody touched costs nothing. A populated
// plane adds the unmap of the pages this rank mapped (per byte, per rank:
// each rank tears down its own mapping, in parallel on a machine with a
// core per rank). --cache-bytes and --shard-bytes choose the slot count;
// the same count at smaller shards (e.g. 1 GiB of 4 KiB shards = 262144
// slots, populated) is the same per-slot measurement at a size that fits.
#ifdef UCM_SCALEBENCH_MPI
void sleepy_barrier(MPI_Comm comm) {
  MPI_Request req = MPI_REQUEST_NULL;
  MPI_Ibarrier(comm, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    timespec ts{0, 200000};
    nanosleep(&ts, nullptr);
  }
}

double process_cpu_s() {
  rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

struct Life {
  double wall_max = 0, wall_med = 0, cpu_max = 0, cpu_med = 0;  // seconds, over the life's ranks
  bool ok = false;
};

// One cache life on comm; the figures are valid on comm's rank 0.
Life cache_life(MPI_Comm comm, const Options& o, uint64_t shard_bytes, uint32_t rep) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  Life life;
  ucm_config_t cfg;
  if (ucm_config_init(&cfg) != UCM_OK) return life;
  cfg.shard_bytes = shard_bytes;
  cfg.cache_bytes = o.cache_bytes;
  cfg.shards_per_block = 1;
  cfg.max_task_entries = std::max<uint32_t>(1, o.fill_shards);
  cfg.hugepages = UCM_HUGEPAGES_OFF;
  cfg.bind_threads = 0;
  cfg.copy_engine = UCM_COPY_ENGINE_HOST;
  cfg.allow_overcommit = 1;
  std::snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=0");
  ucm_cache_t cache = nullptr;
  if (ucm_cache_init(comm, &cfg, &cache) != UCM_OK) {
    std::fprintf(stderr, "ucm_scalebench: ucm_cache_init: %s\n", ucm_last_error(nullptr));
    return life;
  }
  bool ok = true;
  if (o.fill_shards > 0) {
    std::vector<ucm_load_entry_t> e(o.fill_shards);
    std::vector<uint8_t> dst(o.fill_shards * shard_bytes);
    for (uint32_t i = 0; i < o.fill_shards; ++i) {
      e[i] = ucm_load_entry_t{};
      e[i].key = to_ucm_key(numbered_key(1 + uint64_t{rep} * o.fill_shards + i, 0));
      e[i].dst = dst.data() + i * shard_bytes;
    }
    ucm_task_t t = 0;
    ucm_result_t r = ucm_load_task(cache, e.data(), e.size(), &t);
    if (r == UCM_OK) r = ucm_task_wait(cache, t, 60000);
    if (r != UCM_OK) {
      std::fprintf(stderr, "ucm_scalebench: the fill task: %s\n", ucm_last_error(cache));
      ok = false;
    }
  }
  MPI_Barrier(comm);
  const double c0 = process_cpu_s();
  const uint64_t t0 = now_ns();
  if (ucm_cache_finalize(&cache) != UCM_OK) {
    std::fprintf(stderr, "ucm_scalebench: ucm_cache_finalize: %s\n", ucm_last_error(nullptr));
    ok = false;
  }
  double mine[3] = {static_cast<double>(now_ns() - t0) / 1e9, process_cpu_s() - c0, ok ? 1.0 : 0.0};
  std::vector<double> all(3 * static_cast<size_t>(size));
  MPI_Gather(mine, 3, MPI_DOUBLE, all.data(), 3, MPI_DOUBLE, 0, comm);
  if (rank == 0) {
    std::vector<double> w, c;
    life.ok = true;
    for (int r = 0; r < size; ++r) {
      w.push_back(all[3 * r]);
      c.push_back(all[3 * r + 1]);
      life.ok = life.ok && all[3 * r + 2] != 0;
    }
    life.wall_max = *std::max_element(w.begin(), w.end());
    life.cpu_max = *std::max_element(c.begin(), c.end());
    life.wall_med = median(w);
    life.cpu_med = median(c);
  }
  return life;
}

int run_finalize(const Options& o) {
  int world = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const uint64_t shard_bytes = o.slot_bytes_set ? o.slot_bytes : 256 * 1024;
  MPI_Comm solo = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world == 0 ? 0 : MPI_UNDEFINED, 0, &solo);
  std::vector<double> one_wall, one_cpu, all_wall, all_wall_med, all_cpu, all_cpu_med, r_wall, r_cpu;
  bool ok = true;
  for (uint32_t rep = 0; rep < o.reps; ++rep) {
    if (world == 0) {
      const Life one = cache_life(solo, o, shard_bytes, 2 * rep);
      ok = ok && one.ok;
      one_wall.push_back(one.wall_max);
      one_cpu.push_back(one.cpu_max);
    }
    sleepy_barrier(MPI_COMM_WORLD);
    if (size > 1) {
      const Life all = cache_life(MPI_COMM_WORLD, o, shard_bytes, 2 * rep + 1);
      if (world == 0) {
        ok = ok && all.ok;
        all_wall.push_back(all.wall_max);
        all_wall_med.push_back(all.wall_med);
        all_cpu.push_back(all.cpu_max);
        all_cpu_med.push_back(all.cpu_med);
        r_wall.push_back(all.wall_max / std::max(1e-9, one_wall.back()));
        r_cpu.push_back(all.cpu_max / std::max(1e-9, one_cpu.back()));
      }
      sleepy_barrier(MPI_COMM_WORLD);
    }
  }
  if (solo != MPI_COMM_NULL) MPI_Comm_free(&solo);
  int good = ok ? 1 : 0, all_good = 0;
  MPI_Allreduce(&good, &all_good, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (world != 0) return all_good ? 0 : 1;
  auto rng = [](const std::vector<double>& v, double scale) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "%.3f (range %.3f-%.3f)", median(v) * scale,
                  *std::min_element(v.begin(), v.end()) * scale, *std::max_element(v.begin(), v.end()) * scale);
    return std::string(buf);
  };
  const uint64_t slots = o.cache_bytes / shard_bytes;
  std::printf("finalize, %.1f GiB of %llu-byte shards = %llu slots (data plane sparse: allow_overcommit, not"
              " populated), each rank loaded %u shards and released them, %u reps, %ld cores:\n",
              static_cast<double>(o.cache_bytes) / (1ull << 30), static_cast<unsigned long long>(shard_bytes),
              static_cast<unsigned long long>(slots), o.fill_shards, o.reps, sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("  1 rank:   wall %s ms, CPU %s ms\n", rng(one_wall, 1e3).c_str(), rng(one_cpu, 1e3).c_str());
  if (size > 1) {
    std::printf("  %d ranks: slowest rank's wall %s ms (median rank %s ms); CPU per rank, most %s ms (median %s ms)\n",
                size, rng(all_wall, 1e3).c_str(), rng(all_wall_med, 1e3).c_str(), rng(all_cpu, 1e3).c_str(),
                rng(all_cpu_med, 1e3).c_str());
    std::printf("  %d ranks / 1 rank: by the slowest rank's wall %s, by the most CPU of a rank %s (goal <= 2)\n", size,
                rng(r_wall, 1).c_str(), rng(r_cpu, 1).c_str());
    if (sysconf(_SC_NPROCESSORS_ONLN) < size)
      std::printf("  (more ranks than cores: their wall includes waiting for a core; the CPU ratio does not)\n");
  } else {
    std::printf("  (one rank: run it again under mpirun -np 8 for the ratio; each run measures 1 rank beside it)\n");
  }
  return all_good ? 0 : 1;
}
#endif

// A byte count, with an optional K, M or G (binary) suffix.
uint64_t parse_bytes(const char* s) {
  char* end = nullptr;
  uint64_t v = std::strtoull(s, &end, 10);
  if (end && (*end == 'K' || *end == 'k')) v <<= 10;
  else if (end && (*end == 'M' || *end == 'm')) v <<= 20;
  else if (end && (*end == 'G' || *end == 'g')) v <<= 30;
  return v;
}

void usage() {
  std::printf(
      "usage: ucm_scalebench [--quick] [--mode miss|hit|fill|leave|all] [--slots N] [--reps N]\n"
      "                      [--shard-bytes B] [--hits N] [--misses N] [--fill-bytes B]\n"
      "       mpirun -np N ucm_scalebench --mode finalize [--cache-bytes B (64G)] [--shard-bytes B (256K)]\n"
      "                      [--fill-shards N (64)] [--reps N]\n"
      "  --quick   tiny sizes (checks outcomes; the numbers mean nothing)\n");
}

}  // namespace

int run(int argc, char** argv) {
  Options o;
  static option longopts[] = {{"quick", no_argument, nullptr, 'q'},     {"mode", required_argument, nullptr, 'm'},
                              {"slots", required_argument, nullptr, 's'}, {"reps", required_argument, nullptr, 'r'},
                              {"shard-bytes", required_argument, nullptr, 'b'},
                              {"hits", required_argument, nullptr, 'n'},
                              {"fill-bytes", required_argument, nullptr, 'f'},
                              {"misses", required_argument, nullptr, 'x'},
                              {"cache-bytes", required_argument, nullptr, 'c'},
                              {"fill-shards", required_argument, nullptr, 'k'},
                              {"help", no_argument, nullptr, 'h'},       {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, nullptr)) != -1) {
    switch (c) {
      case 'q':
        o.cache_bytes = 64ull << 20;  // finalize: 256 slots of 256 KiB
        o.fill_shards = 8;
        o.slots = 8192;
        o.small_slots = 1024;
        o.reps = 1;
        o.hits = 2000;
        o.misses = 500;
        o.fill_bytes = 1 << 20;
        break;
      case 'm': o.mode = optarg; break;
      case 's': o.slots = static_cast<uint32_t>(std::strtoul(optarg, nullptr, 10)); break;
      case 'r': o.reps = std::max<uint32_t>(1, static_cast<uint32_t>(std::strtoul(optarg, nullptr, 10))); break;
      case 'b':
        o.slot_bytes = std::max<uint64_t>(64, parse_bytes(optarg));
        o.slot_bytes_set = true;
        break;
      case 'f': o.fill_bytes = std::max<uint64_t>(1 << 20, parse_bytes(optarg)); break;
      case 'c': o.cache_bytes = parse_bytes(optarg); break;
      case 'k': o.fill_shards = static_cast<uint32_t>(std::strtoul(optarg, nullptr, 10)); break;
      case 'n': o.hits = std::max<uint32_t>(1, static_cast<uint32_t>(std::strtoul(optarg, nullptr, 10))); break;
      case 'x': o.misses = std::max<uint32_t>(1, static_cast<uint32_t>(std::strtoul(optarg, nullptr, 10))); break;
      case 'h': usage(); return 0;
      default: usage(); return 2;
    }
  }
  if (o.slots < 2) {
    std::fprintf(stderr, "ucm_scalebench: --slots %u: at least 2\n", o.slots);
    return 2;
  }
  if (o.mode == "finalize") {
#ifdef UCM_SCALEBENCH_MPI
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    const int rc = run_finalize(o);
    MPI_Finalize();
    return rc;
#else
    std::fprintf(stderr, "ucm_scalebench: --mode finalize needs a build with MPI\n");
    return 2;
#endif
  }
  const bool all = o.mode == "all";
  if (!all && o.mode != "miss" && o.mode != "hit" && o.mode != "fill" && o.mode != "leave") {
    std::fprintf(stderr, "ucm_scalebench: unknown --mode '%s'\n", o.mode.c_str());
    return 2;
  }
  if (all || o.mode == "miss") run_miss(o);
  if (all || o.mode == "hit") run_hit(o);
  if (all || o.mode == "fill") run_fill(o);
  if (all || o.mode == "leave") run_leave(o);
  return 0;
}

}  // namespace ucm::bench

int main(int argc, char** argv) { return ucm::bench::run(argc, argv); }
