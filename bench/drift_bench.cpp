// ucm_drift_bench: loads per unique shard when the ranks of a node drift
// apart, with the eviction protection (UCM_PROTECT=1) and without it, side by
// side in one run, plus rank 0 alone on the same cache as the reference.
//
//   mpirun -np 4 ucm_drift_bench [--tasks 48] [--task-shards 8] [--lag-tasks 3]
//       [--slow-ranks 1] [--linear] [--cache-tasks 0] [--period-us 2000] [--jitter-us 0] [--latency-us 500]
//       [--shard-bytes 16384] [--repeat-after 0] [--reps 1] [--check]
//
// Every rank runs the same node-collective tasks (task t asks for
// task-shards new shards; with --repeat-after R, the tasks come in runs of
// R, and every second run asks again for the shards of the run before it, R
// tasks later: shards the cache still holds, asked for by a later task). Rank r starts task t at t x period plus its lag
// and a random jitter in [0, jitter-us). The lag: the last slow-ranks ranks
// lag lag-tasks tasks of period behind the others (two groups drifting
// apart); with --linear, rank r lags r x lag-tasks / (ranks - 1). The cache holds
// cache-tasks tasks' worth of slots (0: lag-tasks + 1, just what the lag
// needs). Printed per mode: backend loads on the node, loads per unique
// shard, owner loads per rank and their max/min, NoSpace answers, and the
// ratio of each mode's loads to the solo reference (the goal: at most
// 1.05x with protection; owner loads within 1.5x max/min). --check (the bench
// suite) exits non-zero unless every task succeeded and every destination
// was written; it never looks at time.
#include <mpi.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ucmcache/ucm.h"

namespace {

struct Args {
  uint32_t tasks = 48;
  uint32_t task_shards = 8;
  uint32_t lag_tasks = 3;
  uint32_t slow_ranks = 1;
  bool linear = false;
  uint32_t cache_tasks = 0;
  uint32_t period_us = 2000;
  uint32_t jitter_us = 0;
  uint32_t latency_us = 500;
  uint64_t shard_bytes = 16384;
  uint32_t repeat_after = 0;
  uint32_t reps = 1;
  bool check = false;
};

int g_rank = 0, g_size = 1;
int g_failures = 0;

[[noreturn]] void usage(const char* bad) {
  if (g_rank == 0) std::fprintf(stderr, "ucm_drift_bench: bad argument %s (see the file's header for the options)\n", bad);
  MPI_Finalize();
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto num = [&](uint64_t lo, uint64_t hi) -> uint64_t {
      if (i + 1 >= argc) usage(argv[i]);
      char* end = nullptr;
      const unsigned long long v = std::strtoull(argv[++i], &end, 10);
      if (!end || *end || v < lo || v > hi) usage(argv[i]);
      return v;
    };
    if (s == "--tasks") a.tasks = static_cast<uint32_t>(num(1, 1 << 20));
    else if (s == "--task-shards") a.task_shards = static_cast<uint32_t>(num(1, 4096));
    else if (s == "--lag-tasks") a.lag_tasks = static_cast<uint32_t>(num(0, 1 << 16));
    else if (s == "--slow-ranks") a.slow_ranks = static_cast<uint32_t>(num(0, 1 << 16));
    else if (s == "--linear") a.linear = true;
    else if (s == "--cache-tasks") a.cache_tasks = static_cast<uint32_t>(num(0, 1 << 16));
    else if (s == "--period-us") a.period_us = static_cast<uint32_t>(num(0, 10'000'000));
    else if (s == "--jitter-us") a.jitter_us = static_cast<uint32_t>(num(0, 10'000'000));
    else if (s == "--latency-us") a.latency_us = static_cast<uint32_t>(num(0, 10'000'000));
    else if (s == "--shard-bytes") a.shard_bytes = num(64, 64ull << 20);
    else if (s == "--repeat-after") a.repeat_after = static_cast<uint32_t>(num(0, 1 << 16));
    else if (s == "--reps") a.reps = static_cast<uint32_t>(num(1, 1000));
    else if (s == "--check") a.check = true;
    else usage(argv[i]);
  }
  if (a.cache_tasks == 0) a.cache_tasks = a.lag_tasks + 1;
  return a;
}

int64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

void sleep_until(int64_t at_ns) {
  timespec at{static_cast<time_t>(at_ns / 1000000000), static_cast<long>(at_ns % 1000000000)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, nullptr) != 0) {
  }
}

ucm_key_t task_key(uint32_t task, uint32_t i, uint32_t task_shards) {
  ucm_key_t k{};
  const uint64_t lo = 1'000'000 + uint64_t{task} * task_shards + i, hi = ~lo;
  std::memcpy(k.block.bytes, &lo, 8);
  std::memcpy(k.block.bytes + 8, &hi, 8);
  k.shard = 0;
  return k;
}

// The task whose shards task t asks for: itself, or with --repeat-after R,
// in every second run of R tasks, the task R before it.
uint32_t keys_of(const Args& a, uint32_t t) {
  return a.repeat_after && (t / a.repeat_after) % 2 == 1 ? t - a.repeat_after : t;
}

enum class Mode { kProtect, kNoProtect, kSolo };
const char* mode_name(Mode m) { return m == Mode::kProtect ? "protect" : m == Mode::kNoProtect ? "no-protect" : "solo"; }

struct Outcome {
  uint64_t node_loads = 0;
  uint64_t no_space = 0;
  uint64_t owner_max = 0, owner_min = 0;
  std::vector<uint64_t> owners;
  double seconds = 0;
};

#define FAIL(...)                                  \
  do {                                             \
    std::fprintf(stderr, "rank %d: ", g_rank);     \
    std::fprintf(stderr, __VA_ARGS__);             \
    std::fprintf(stderr, "\n");                    \
    ++g_failures;                                  \
  } while (0)

Outcome run(const Args& a, Mode m, uint32_t rep) {
  ucm_config_t cfg;
  if (ucm_config_init(&cfg) != UCM_OK) FAIL("ucm_config_init: %s", ucm_last_error(nullptr));
  cfg.shard_bytes = a.shard_bytes;
  cfg.cache_bytes = uint64_t{a.cache_tasks} * a.task_shards * a.shard_bytes;
  cfg.reserved_slots = 0;
  cfg.prealloc = 0;
  cfg.shards_per_block = 1;
  cfg.max_task_entries = a.task_shards;
  cfg.hugepages = UCM_HUGEPAGES_OFF;
  cfg.bind_threads = 0;
  cfg.copy_engine = UCM_COPY_ENGINE_HOST;
  cfg.protect = m == Mode::kProtect ? 1 : 0;
  std::snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=%u", a.latency_us);
  ucm_cache_t cache = nullptr;
  if (ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache) != UCM_OK) {
    FAIL("ucm_cache_init: %s", ucm_last_error(nullptr));
    return {};
  }
  std::vector<ucm_load_entry_t> entries(a.task_shards);
  std::vector<std::vector<uint8_t>> dst(a.task_shards, std::vector<uint8_t>(a.shard_bytes));
  std::mt19937_64 rng(0x5eed ^ (uint64_t{rep} << 32) ^ static_cast<uint64_t>(g_rank));
  const bool active = m != Mode::kSolo || g_rank == 0;
  const double lag = m == Mode::kSolo ? 0.0
                     : a.linear      ? (g_size > 1 ? double(a.lag_tasks) * g_rank / (g_size - 1) : 0.0)
                     : g_rank >= g_size - static_cast<int>(a.slow_ranks) ? double(a.lag_tasks)
                                                                          : 0.0;
  int64_t t0 = mono_ns() + 20'000'000;
  MPI_Bcast(&t0, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  sleep_until(t0);
  const int64_t start = mono_ns();
  if (active) {
    for (uint32_t t = 0; t < a.tasks; ++t) {
      const double at_us = (t + lag) * a.period_us +
                           (a.jitter_us ? double(rng() % a.jitter_us) : 0.0);
      sleep_until(t0 + static_cast<int64_t>(at_us * 1000));
      for (uint32_t i = 0; i < a.task_shards; ++i) {
        std::memset(dst[i].data(), 0xee, 64);
        entries[i].key = task_key(keys_of(a, t), i, a.task_shards);
        entries[i].dst = dst[i].data();
      }
      ucm_task_t task = 0;
      ucm_result_t r = ucm_load_task(cache, entries.data(), entries.size(), &task);
      if (r == UCM_OK) r = ucm_task_wait(cache, task, 60000);
      if (r != UCM_OK) FAIL("%s task %u: %s", mode_name(m), t, ucm_last_error(cache));
      for (uint32_t i = 0; i < a.task_shards && r == UCM_OK; ++i) {
        bool written = false;
        for (int b = 0; b < 64 && !written; ++b) written = dst[i][b] != 0xee;
        if (!written) FAIL("%s task %u entry %u: the destination was not written", mode_name(m), t, i);
      }
    }
  }
  const int64_t end = mono_ns();
  MPI_Barrier(MPI_COMM_WORLD);
  Outcome o;
  ucm_stats_t rs{}, ns{};
  rs.struct_bytes = sizeof(rs);
  ns.struct_bytes = sizeof(ns);
  if (ucm_cache_stats(cache, &rs, &ns) != UCM_OK) FAIL("ucm_cache_stats: %s", ucm_last_error(cache));
  o.node_loads = ns.owner_loads;
  o.no_space = ns.no_space;
  o.owners.resize(g_size);
  uint64_t mine = rs.owner_loads;
  MPI_Allgather(&mine, 1, MPI_UINT64_T, o.owners.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  o.owner_max = *std::max_element(o.owners.begin(), o.owners.end());
  o.owner_min = *std::min_element(o.owners.begin(), o.owners.end());
  double secs = double(end - start) / 1e9, worst = 0;
  MPI_Allreduce(&secs, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  o.seconds = worst;
  MPI_Barrier(MPI_COMM_WORLD);
  if (ucm_cache_finalize(&cache) != UCM_OK) FAIL("ucm_cache_finalize: %s", ucm_last_error(nullptr));
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  const Args a = parse(argc, argv);
  uint64_t unique = 0;
  for (uint32_t t = 0; t < a.tasks; ++t) unique += keys_of(a, t) == t ? a.task_shards : 0;
  if (g_rank == 0)
    std::printf("ucm_drift_bench: %d ranks, %u tasks of %u shards (%" PRIu64 " unique), %s lag %u tasks of "
                "%u us, jitter %u us, cache %u tasks (%u slots), sim latency %u us, repeat after %u tasks\n",
                g_size, a.tasks, a.task_shards, unique,
                a.linear ? "the last rank (linear)" : (std::to_string(a.slow_ranks) + " slow rank(s)").c_str(),
                a.lag_tasks, a.period_us, a.jitter_us, a.cache_tasks,
                a.cache_tasks * a.task_shards, a.latency_us, a.repeat_after);
  const Mode modes[] = {Mode::kSolo, Mode::kProtect, Mode::kNoProtect};
  for (uint32_t rep = 0; rep < a.reps; ++rep) {
    uint64_t solo = 0;
    for (Mode m : modes) {
      const Outcome o = run(a, m, rep);
      if (m == Mode::kSolo) solo = o.node_loads;
      if (g_rank != 0) continue;
      std::string owners;
      for (uint64_t v : o.owners) owners.append(owners.empty() ? "" : ",").append(std::to_string(v));
      const double balance = o.owner_min ? double(o.owner_max) / double(o.owner_min) : -1.0;
      std::printf("rep %u %-10s loads %6" PRIu64 "  per-unique %.3f  vs-solo %.3f  owners [%s] max/min %s  "
                  "no_space %" PRIu64 "  %.3f s\n",
                  rep, mode_name(m), o.node_loads, double(o.node_loads) / double(unique),
                  solo ? double(o.node_loads) / double(solo) : 0.0, owners.c_str(),
                  m == Mode::kSolo ? "-" : balance < 0 ? "inf" : std::to_string(balance).substr(0, 5).c_str(),
                  o.no_space, o.seconds);
      if (a.check && o.node_loads < unique) FAIL("%s: %" PRIu64 " loads for %" PRIu64 " unique shards", mode_name(m),
                                                 o.node_loads, unique);
    }
  }
  int worst = 0;
  MPI_Allreduce(&g_failures, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return worst ? 1 : 0;
}
