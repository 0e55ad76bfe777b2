// ucm_scalebench: what the cache costs as it grows (issue 15, goals 4-6), each
// as a ratio measured side by side in one run, through the real planes in
// one process (no MPI):
//
//   ucm_scalebench [--quick] [--mode miss|hit|fill|leave|all] [--slots N] [--reps N]
//                  [--shard-bytes B (4096; hit and fill)] [--hits N (200000)]
//                  [--fill-bytes B (1 GiB; fill)]
//
//   miss   the misses after the cache fills, at --slots slots (512k): median,
//          p99 and slowest miss, and slowest/median (goal 4: within 10x);
//          also the most slot positions one lock hold examined.
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
//
// Each number is the median of --reps repetitions; ratios are taken within a
// repetition. Timing only: it checks outcomes (every miss evicts, every hit
// hits) and exits non-zero when one is wrong, never on a time.
#include <getopt.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cache/cache_buffer.h"
#include "common/log.h"
#include "ctrl/buffer_ctrl.h"
#include "ctrl/clock.h"
#include "data/buffer_data.h"

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
void run_miss(const Options& o) {
  std::vector<double> med, p99, worst, ratio, holds;
  for (uint32_t r = 0; r < o.reps; ++r) {
    Planes p;
    make(o.slots, 64, CtrlPages::kOff, &p, false);
    CacheBuffer cb(&p.ctrl, &p.data, CacheOptions{});
    fill_all(cb, o.slots, 1);  // every accessed bit set: the state of the first miss after a fill
    reset_sweep_stats();
    std::vector<double> t(o.misses);
    for (uint32_t i = 0; i < o.misses; ++i) {
      GetResult g;
      const uint64_t t0 = now_ns();
      const Result res = cb.get(key_of(100000000ull + i), &g);
      t[i] = static_cast<double>(now_ns() - t0);
      if (res != Result::kOk || g.kind != GetKind::kOwner || !g.evicted) die("a miss after the fill did not evict");
      if (cb.mark_ready(g.slot) != Result::kOk) die("mark_ready");
      cb.release(g.slot);
    }
    med.push_back(median(t));
    p99.push_back(pct(t, 0.99));
    worst.push_back(*std::max_element(t.begin(), t.end()));
    ratio.push_back(worst.back() / med.back());
    holds.push_back(static_cast<double>(sweep_stats().max_per_call));
    p.ctrl.leave(0);
  }
  std::printf("miss after fill, %u slots, %u misses x %u reps:\n", o.slots, o.misses, o.reps);
  std::printf("  median %.0f ns  p99 %.0f ns  slowest %.0f ns  slowest/median %.2f (range %.2f-%.2f; goal <= 10)\n",
              median(med), median(p99), median(worst), median(ratio), *std::min_element(ratio.begin(), ratio.end()),
              *std::max_element(ratio.begin(), ratio.end()));
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

void usage() {
  std::printf(
      "usage: ucm_scalebench [--quick] [--mode miss|hit|fill|leave|all] [--slots N] [--reps N]\n"
      "                      [--shard-bytes B] [--hits N] [--fill-bytes B]\n"
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
                              {"help", no_argument, nullptr, 'h'},       {nullptr, 0, nullptr, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "", longopts, nullptr)) != -1) {
    switch (c) {
      case 'q':
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
      case 'b': o.slot_bytes = std::max<uint64_t>(64, std::strtoull(optarg, nullptr, 10)); break;
      case 'f': o.fill_bytes = std::max<uint64_t>(1 << 20, std::strtoull(optarg, nullptr, 10)); break;
      case 'n': o.hits = std::max<uint32_t>(1, static_cast<uint32_t>(std::strtoul(optarg, nullptr, 10))); break;
      case 'h': usage(); return 0;
      default: usage(); return 2;
    }
  }
  if (o.slots < 2) {
    std::fprintf(stderr, "ucm_scalebench: --slots %u: at least 2\n", o.slots);
    return 2;
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
