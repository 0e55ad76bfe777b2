// ucm_task_cost_bench: the fixed cost of a warm task against memcpy of the
// same bytes, measured side by side in one run (issue 15, goal 3).
//
//   mpirun -np 1 ucm_task_cost_bench [--shard-bytes 16384] [--entries 1,64]
//       [--iters 2000] [--reps 5] [--kinds inline,inline-pa,cold,queued]
//       [--cold-mib N] [--clock wall|cpu] [--same-keys] [--check]
//   (-np 2: two ranks at once, each on its own cores and buffers)
//
// Each rank loads its keys once (the cache is warm: every later entry is a
// hit), then, per repetition, kind and task size, times `iters` tasks of
// ucm_load_task + ucm_task_wait and, right after, `iters` rounds of memcpy of
// the same number of shards into the same destinations (a std::vector, whose
// data sits 16 bytes past a page boundary, as malloc gives it). The kinds
// (rows), side by side:
//   inline     every entry a hit: the calling thread copies it (the inline
//              path, queue/load_queue.h), no hand-off to the queue's threads.
//              The same n keys every task: the slots, their control records
//              and the control's source (a std::vector like the destinations,
//              so with the destinations' alignment) stay in the CPU's caches.
//              This row is the one measured since session 6, unchanged.
//   inline-pa  the same tasks; the control copies from a hot page-aligned
//              buffer, as the slots are: a copy between buffers that are
//              misaligned to each other (slot at a page, destination at +16)
//              runs slower than one between equally aligned ones (rep movsb:
//              0.83-0.89x the speed on this machine's AMD EPYC, in L3, and no
//              vector loop did better), so `inline` charges the task for the
//              alignment of the app's buffer.
//   cold       inline tasks over a working set larger than the last-level
//              cache (--cold-mib, default 3x the L3 size), as in a real cache
//              of gigabytes: task k takes the k-th group of n keys of the set,
//              cyclically, so each task finds its slots' bytes and control
//              records out of the CPU's caches; the control memcpy cycles over
//              a page-aligned source of the same size in the same pattern.
//   queued     the `inline` task with entry 0 a key never asked before (a miss,
//              from the sim store at latency 0): the whole task goes through
//              the dispatcher and the copier, so this row is the queue's fixed
//              cost plus one store load (a reference, not a goal).
// Printed per kind and task size: the medians over the repetitions of us per
// task, us of memcpy, the difference (the fixed cost above memcpy), memcpy's
// time / the task's time (the fraction of memcpy reached; goals: a 1-entry
// inline task at most 3 us above memcpy, 64 x 16 KiB at least 0.95 of it with
// one rank, 0.9 with two), and two counts that do not depend on the clock:
// the fraction of tasks that took the inline path (inline_tasks) and the
// process's context switches per task (getrusage: voluntary + involuntary,
// every thread); last, each repetition's own fraction (its memcpy over its
// task), median (lowest-highest), of the rank with the lowest. --same-keys gives every rank the same hot and cold keys
// (each rank still its own destinations and control source): the ranks then
// pin the same slots, as node-collective tasks do. Times are wall time; --clock cpu reads the process's CPU
// time instead (every thread's; what a loaded machine's other processes
// disturb less: time spent waiting for a CPU is not counted, nor are the
// queued kind's waits). --check (the bench suite) only checks that every task
// succeeded and wrote its destinations, and that the inline kinds were inline
// and the queued kind queued; it never looks at time.
#include <mpi.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ucmcache/ucm.h"

namespace {

int g_rank = 0, g_size = 1, g_failures = 0;

clockid_t g_clock = CLOCK_MONOTONIC;

int64_t mono_ns() {
  timespec ts{};
  clock_gettime(g_clock, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void usage(const char* bad) {
  if (g_rank == 0) std::fprintf(stderr, "ucm_task_cost_bench: bad argument %s (see the file's header)\n", bad);
  MPI_Finalize();
  std::exit(2);
}

ucm_key_t make_key(uint64_t b) {
  ucm_key_t k{};
  const uint64_t lo = 7'000'000 + b, hi = ~lo;
  std::memcpy(k.block.bytes, &lo, 8);
  std::memcpy(k.block.bytes + 8, &hi, 8);
  return k;
}

uint64_t context_switches() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_nvcsw) + static_cast<uint64_t>(u.ru_nivcsw);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

enum class Kind { kInline, kInlinePageAligned, kCold, kQueued };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::kInline: return "inline";
    case Kind::kInlinePageAligned: return "inline-pa";
    case Kind::kCold: return "cold";
    case Kind::kQueued: return "queued";
  }
  return "?";
}

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  for (size_t p = 0; p < list.size();) {
    const size_t q = std::min(list.find(',', p), list.size());
    out.push_back(list.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

// The last-level cache of this CPU: sysfs's highest cache level (what lscpu
// prints; sysconf's figure can be the host's under a hypervisor), else 0.
uint64_t llc_bytes() {
  uint64_t best = 0;
  for (int idx = 0, best_level = 0; idx < 8; ++idx) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(idx) + "/";
    FILE* lf = std::fopen((dir + "level").c_str(), "r");
    FILE* sf = std::fopen((dir + "size").c_str(), "r");
    int level = 0;
    unsigned long long kib = 0;
    const bool ok = lf && sf && std::fscanf(lf, "%d", &level) == 1 && std::fscanf(sf, "%lluK", &kib) == 1;
    if (lf) std::fclose(lf);
    if (sf) std::fclose(sf);
    if (ok && level >= best_level) {
      best_level = level;
      best = uint64_t{kib} << 10;
    }
  }
  return best;
}

// A page-aligned buffer (the slots' alignment), every page touched.
struct PageBuffer {
  explicit PageBuffer(uint64_t bytes) : p(static_cast<uint8_t*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096))) {
    if (!p) {
      std::fprintf(stderr, "rank %d: no memory for %" PRIu64 " bytes\n", g_rank, bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    std::memset(p, 0x5a, bytes);
  }
  ~PageBuffer() { std::free(p); }
  PageBuffer(const PageBuffer&) = delete;
  PageBuffer& operator=(const PageBuffer&) = delete;
  uint8_t* p;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  uint64_t shard = 16384, cold_mib = 0;
  std::vector<uint32_t> sizes = {1, 64};
  std::vector<Kind> kinds = {Kind::kInline, Kind::kInlinePageAligned, Kind::kCold, Kind::kQueued};
  uint32_t iters = 2000, reps = 5;
  bool check = false, same_keys = false;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto val = [&]() -> const char* {
      if (i + 1 >= argc) usage(argv[i]);
      return argv[++i];
    };
    if (s == "--shard-bytes") shard = std::strtoull(val(), nullptr, 10);
    else if (s == "--iters") iters = static_cast<uint32_t>(std::strtoul(val(), nullptr, 10));
    else if (s == "--reps") reps = static_cast<uint32_t>(std::strtoul(val(), nullptr, 10));
    else if (s == "--cold-mib") cold_mib = std::strtoull(val(), nullptr, 10);
    else if (s == "--check") check = true;
    else if (s == "--same-keys") same_keys = true;
    else if (s == "--clock") {
      const std::string v = val();
      if (v == "cpu") g_clock = CLOCK_PROCESS_CPUTIME_ID;
      else if (v != "wall") usage(("--clock " + v).c_str());
    } else if (s == "--entries") {
      sizes.clear();
      for (const std::string& v : split(val())) sizes.push_back(static_cast<uint32_t>(std::strtoul(v.c_str(), nullptr, 10)));
    } else if (s == "--kinds") {
      kinds.clear();
      for (const std::string& v : split(val())) {
        Kind k = Kind::kInline;
        if (v == "inline-pa") k = Kind::kInlinePageAligned;
        else if (v == "cold") k = Kind::kCold;
        else if (v == "queued") k = Kind::kQueued;
        else if (v != "inline") usage(("--kinds " + v).c_str());
        kinds.push_back(k);
      }
    } else usage(argv[i]);
  }
  if (shard < 64 || iters == 0 || reps == 0 || sizes.empty() || kinds.empty()) usage("(values)");
  for (uint32_t n : sizes)
    if (n == 0 || n > 4096) usage("--entries");
  const uint32_t most = *std::max_element(sizes.begin(), sizes.end());
  const bool any_cold = std::find(kinds.begin(), kinds.end(), Kind::kCold) != kinds.end();
  // The cold set: 3x the last-level cache unless told, at least one task's
  // worth, a whole number of the largest tasks.
  const uint64_t llc = llc_bytes();
  uint64_t cold_bytes = cold_mib ? cold_mib << 20 : 3 * std::max<uint64_t>(llc, uint64_t{32} << 20);
  uint64_t cold_keys = any_cold ? std::max<uint64_t>(cold_bytes / shard / most, 1) * most : 0;
  cold_bytes = cold_keys * shard;

  ucm_config_t cfg;
  if (ucm_config_init(&cfg) != UCM_OK) usage(ucm_last_error(nullptr));
  cfg.shard_bytes = shard;
  // Room for the hot keys, the cold set and the queued kind's fresh keys.
  cfg.cache_bytes = (uint64_t{most} * 4 + cold_keys) * g_size * shard;
  cfg.shards_per_block = 1;
  cfg.max_task_entries = most;
  cfg.prealloc = 0;
  cfg.hugepages = UCM_HUGEPAGES_OFF;
  cfg.copy_engine = UCM_COPY_ENGINE_HOST;
  cfg.protect = 0;  // each rank its own keys (below): nothing to keep for a peer
  std::snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=0");
  ucm_cache_t cache = nullptr;
  if (ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache) != UCM_OK) {
    std::fprintf(stderr, "rank %d: ucm_cache_init: %s\n", g_rank, ucm_last_error(nullptr));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (g_rank == 0 && any_cold)
    std::printf("# cold set: %" PRIu64 " MiB per rank (%" PRIu64 " shards); last-level cache %" PRIu64 " MiB\n",
                cold_bytes >> 20, cold_keys, llc >> 20);
  // Each rank its own keys (not node-collective on purpose: each rank's
  // fixed cost, not sharing, is measured), buffers and memcpy source.
  // --same-keys: every rank the same hot and cold keys (as a node-collective
  // task asks), so the ranks pin the same slots and read the same records.
  const uint64_t key_rank = same_keys ? 0 : static_cast<uint32_t>(g_rank);
  std::vector<ucm_load_entry_t> entries(most);
  std::vector<uint8_t> dst(uint64_t{most} * shard), src(uint64_t{most} * shard, 0x5a);
  PageBuffer src_pa(uint64_t{most} * shard);
  std::unique_ptr<PageBuffer> src_cold(any_cold ? new PageBuffer(cold_bytes) : nullptr);
  for (uint32_t i = 0; i < most; ++i) {
    entries[i].key = make_key(key_rank * most + i);
    entries[i].dst = dst.data() + uint64_t{i} * shard;
  }
  // The cold set's entries, rebuilt per task size n: task k takes entries
  // [(k % groups) * n, + n), entry j writing destination j % n.
  std::vector<ucm_load_entry_t> cold(cold_keys);
  auto cold_for = [&](uint32_t n) {
    for (uint64_t j = 0; j < cold_keys; ++j) {
      cold[j].key = make_key((uint64_t{1} << 44) + (key_rank << 32) + j);
      cold[j].dst = dst.data() + (j % n) * shard;
    }
  };
  const ucm_key_t warm0 = entries[0].key;
  uint64_t fresh = 0;  // the queued kind's misses: keys no task asked for before
  auto one_task = [&](uint32_t n, Kind kind, uint64_t k) {
    ucm_load_entry_t* es = entries.data();
    if (kind == Kind::kQueued)
      entries[0].key = make_key((uint64_t{1} << 40) + (uint64_t{static_cast<uint32_t>(g_rank)} << 32) + fresh++);
    if (kind == Kind::kCold) es = cold.data() + (k % (cold_keys / n)) * n;
    ucm_task_t t = 0;
    ucm_result_t r = ucm_load_task(cache, es, n, &t);
    if (r == UCM_OK) r = ucm_task_wait(cache, t, 60000);
    if (r != UCM_OK && g_failures++ < 5) std::fprintf(stderr, "rank %d: task: %s\n", g_rank, ucm_last_error(cache));
    entries[0].key = warm0;
  };
  auto one_copy = [&](uint32_t n, Kind kind, uint64_t k) {
    const uint8_t* from = kind == Kind::kInlinePageAligned ? src_pa.p : src.data();
    if (kind == Kind::kCold) from = src_cold->p + (k % (cold_keys / n)) * n * shard;
    for (uint32_t i = 0; i < n; ++i) std::memcpy(dst.data() + uint64_t{i} * shard, from + uint64_t{i} * shard, shard);
  };
  auto inline_tasks = [&] {
    ucm_stats_t s{};
    s.struct_bytes = sizeof(s);
    if (ucm_cache_stats(cache, &s, nullptr) != UCM_OK) ++g_failures;
    return s.inline_tasks;
  };
  for (uint32_t n : sizes) {
    if (any_cold) cold_for(n);
    for (Kind kind : kinds) {
      // The queued kind's misses may have evicted warm keys: warm them again,
      // every rank before any times (a peer's miss evicting now could take a
      // warm key, or claim its slot for a moment, and send a task the queue's way).
      // Until a round in which every rank's warm tasks went inline whole: a
      // load (this rank's or a peer's: the slots are the node's) may evict a
      // key loaded before it. Bounded. The cold kind warms its whole set.
      if (kind != Kind::kQueued) {
        const uint32_t n_warm = kind == Kind::kCold ? n : most;
        const uint64_t tasks = kind == Kind::kCold ? cold_keys / n : 1;
        for (int tries = 0, missed = 1; missed && tries < 20; ++tries) {
          const uint64_t before = inline_tasks();
          for (uint64_t k = 0; k < tasks; ++k) one_task(n_warm, kind, k);
          const int mine = inline_tasks() - before != tasks;
          MPI_Allreduce(&mine, &missed, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
        }
      }
      std::vector<double> task_us, copy_us, csw, inlined, frac;
      uint64_t k0 = 0;  // the cold kind's position in its set: each rep goes on from the last
      for (uint32_t rep = 0; rep < reps; ++rep) {
        MPI_Barrier(MPI_COMM_WORLD);
        if (check) std::memset(dst.data(), 0xee, dst.size());
        const uint64_t in0 = inline_tasks(), cs0 = context_switches();
        int64_t t0 = mono_ns();
        for (uint32_t k = 0; k < iters; ++k) one_task(n, kind, k0 + k);
        int64_t t1 = mono_ns();
        const uint64_t cs1 = context_switches(), in1 = inline_tasks();
        if (check) {
          for (uint32_t i = 0; i < n; ++i)
            if (dst[uint64_t{i} * shard] == 0xee && g_failures++ < 5)
              std::fprintf(stderr, "rank %d: entry %u was not written\n", g_rank, i);
          if (in1 - in0 != (kind == Kind::kQueued ? 0 : iters) && g_failures++ < 5)
            std::fprintf(stderr, "rank %d: %s tasks of %u entries: %llu of %u inline\n", g_rank, kind_name(kind), n,
                         static_cast<unsigned long long>(in1 - in0), iters);
        }
        task_us.push_back(double(t1 - t0) / 1e3 / iters);
        csw.push_back(double(cs1 - cs0) / iters);
        inlined.push_back(double(in1 - in0) / iters);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = mono_ns();
        for (uint32_t k = 0; k < iters; ++k) one_copy(n, kind, k0 + k);
        t1 = mono_ns();
        copy_us.push_back(double(t1 - t0) / 1e3 / iters);
        frac.push_back(copy_us.back() / std::max(task_us.back(), 1e-9));
        k0 += iters;
      }
      double tm = median(task_us), cm = median(copy_us), cs = median(csw), in = median(inlined);
      // The fraction of memcpy per repetition (its memcpy over its task):
      // the median and range of this rank's, the lowest rank's of each.
      double f[3] = {median(frac), *std::min_element(frac.begin(), frac.end()),
                     *std::max_element(frac.begin(), frac.end())};
      double worst_f[3] = {0, 0, 0};
      MPI_Allreduce(f, worst_f, 3, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
      double worst_t = 0, worst_c = 0, worst_cs = 0, least_in = 0;
      MPI_Allreduce(&tm, &worst_t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(&cm, &worst_c, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(&cs, &worst_cs, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      MPI_Allreduce(&in, &least_in, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
      if (g_rank == 0)
        std::printf("ranks %d  %-9s entries %4u x %" PRIu64 " B  task %9.3f us  memcpy %9.3f us  above %8.3f us  "
                    "fraction-of-memcpy %.3f  inline %.2f  ctx-switches/task %.2f  (medians of %u reps x %u tasks; "
                    "slowest rank)  per-rep fraction %.3f (%.3f-%.3f)\n",
                    g_size, kind_name(kind), n, shard, worst_t, worst_c, worst_t - worst_c,
                    worst_t > 0 ? worst_c / worst_t : 0.0, least_in, worst_cs, reps, iters, worst_f[0], worst_f[1],
                    worst_f[2]);
    }
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (ucm_cache_finalize(&cache) != UCM_OK) ++g_failures;
  int worst = 0;
  MPI_Allreduce(&g_failures, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst ? 1 : 0;
}
