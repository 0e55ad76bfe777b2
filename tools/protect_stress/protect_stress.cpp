// Stress driver for the eviction protection (not part of the build: a session-18
// helper's tool, kept to reproduce the two regressions that reverted the
// protection's rounds on a later hit; docs/design.md 5.8, docs/results.md
// "Measured at 42d0a01". Session 19 brought the rounds back on top of the
// order of waits: the two commands below then took 1.58 s and 0.065 s, as
// before the rounds). Build and run against a build of the library:
//   g++ -std=c++20 -O2 -I include -I build/include tools/protect_stress/protect_stress.cpp \
//       -L build/lib -Wl,-rpath,$PWD/build/lib -lucmcache $(pkg-config --cflags --libs ompi-cxx) -o /tmp/protect_stress
//   mpirun --timeout 120 -np 4 /tmp/protect_stress tasks=64 keys=8 slots=32 pattern=cycle:6 stall=3:10:1500 solo=0
//   mpirun --timeout 120 -np 4 /tmp/protect_stress tasks=64 keys=8 slots=32 pattern=window:6 lag=3:1 \
//       skip=3:0,3:1,3:2,3:3,3:4 solo=0 grace=20000 tmo=3000
// Every rank runs the same node-collective task sequence (same keys in the
// n-th task), with options that break timing or numbering. Verifies every
// byte against the sim backend's content function. Modes: solo (rank 0
// alone), protect (all ranks). Prints loads, NoSpace, max task latency.
//
// Options (all key=value):
//   tasks=64 keys=8 slots=32 sb=16384 lat=300 period=1000 jitter=0
//   pattern=fresh|hot:H|window:W|repeat:R|cycle:C
//     fresh: every task new keys; hot:H: H keys asked in every task + fresh;
//     window:W: each task picks its keys (same on every rank) from the fresh keys of the last W tasks
//               plus new ones (half reuse); repeat:R as drift bench; cycle:C: task t asks the keys of t mod C
//   lag=R:L[,R:L]  rank R lags L tasks
//   stall=R:T:MS   rank R sleeps MS before task T
//   skip=R:T       rank R does not submit task T
//   extra=R:T      rank R submits an extra task (keys of task T) before task T
//   win=1          tasks in flight per rank
//   grace=1000     protect_grace_ms
//   tmo=60000      wait bound per task; timeout (cfg) = tmo too
//   noprotect=0    also run no-protect mode
//   solo=1         run solo reference
//   dup=0          each task lists its first key twice (different dst)
#include <mpi.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "ucmcache/ucm.h"

static int g_rank, g_size, g_fail;
static std::map<std::string, std::string> opt;
static std::string S(const char* k, const char* d) { auto it = opt.find(k); return it == opt.end() ? d : it->second; }
static uint64_t U(const char* k, uint64_t d) { auto it = opt.find(k); return it == opt.end() ? d : strtoull(it->second.c_str(), 0, 10); }

static uint64_t sim_word(uint64_t lo, uint64_t hi, uint32_t shard, uint64_t w) {
  uint64_t z = lo ^ ((hi << 17) | (hi >> 47)) ^ (uint64_t{shard} << 40) ^ (w * 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double cpu_s() { rusage u{}; getrusage(RUSAGE_SELF, &u); return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + double(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6; }
static int64_t mono_ns() { timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec; }
static void sleep_until(int64_t at) { timespec t{time_t(at / 1000000000), long(at % 1000000000)}; while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, nullptr)) {} }

static ucm_key_t mk(uint64_t id) {
  ucm_key_t k{}; uint64_t lo = 7000000 + id, hi = ~lo * 31;
  memcpy(k.block.bytes, &lo, 8); memcpy(k.block.bytes + 8, &hi, 8); k.shard = 0; return k;
}

// keys of task t (ids), identical on every rank
static std::vector<uint64_t> keys_of(uint32_t t) {
  const uint32_t K = U("keys", 8);
  std::string p = S("pattern", "fresh");
  std::vector<uint64_t> ids;
  if (p.rfind("hot:", 0) == 0) {
    uint32_t H = atoi(p.c_str() + 4);
    for (uint32_t i = 0; i < H && i < K; ++i) ids.push_back(1000000000ull + i);
    for (uint32_t i = H; i < K; ++i) ids.push_back(uint64_t(t) * K + i);
  } else if (p.rfind("window:", 0) == 0) {
    uint32_t W = atoi(p.c_str() + 7);
    std::mt19937_64 r(t * 7919 + 13);
    for (uint32_t i = 0; i < K; ++i) {
      if (t > 0 && i % 2 == 0) {
        uint32_t back = 1 + r() % std::min<uint32_t>(W, t);
        uint32_t tt = t - back;
        ids.push_back(uint64_t(tt) * K + 1 + (r() % (K / 2)) * 2);  // an odd (fresh) id of an earlier task
      } else ids.push_back(uint64_t(t) * K + i);
    }
    // ensure uniqueness within task
    std::sort(ids.begin(), ids.end()); ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    uint64_t extra = 1; while (ids.size() < K) ids.push_back(5000000000ull + uint64_t(t) * K + extra++);
  } else if (p.rfind("repeat:", 0) == 0) {
    uint32_t R = atoi(p.c_str() + 7);
    uint32_t tt = (t / R) % 2 == 1 ? t - R : t;
    for (uint32_t i = 0; i < K; ++i) ids.push_back(uint64_t(tt) * K + i);
  } else if (p.rfind("cycle:", 0) == 0) {
    uint32_t C = atoi(p.c_str() + 6);
    for (uint32_t i = 0; i < K; ++i) ids.push_back(uint64_t(t % C) * K + i);
  } else {
    for (uint32_t i = 0; i < K; ++i) ids.push_back(uint64_t(t) * K + i);
  }
  if (U("dup", 0)) ids.push_back(ids[0]);
  return ids;
}

static bool has(const char* name, int r, uint32_t t, uint32_t* val = nullptr) {
  std::string v = S(name, "");
  size_t pos = 0;
  while (pos < v.size()) {
    size_t e = v.find(',', pos); if (e == std::string::npos) e = v.size();
    std::string it = v.substr(pos, e - pos); pos = e + 1;
    int rr; unsigned tt, ms = 0;
    int n = sscanf(it.c_str(), "%d:%u:%u", &rr, &tt, &ms);
    if (n >= 2 && rr == r && tt == t) { if (val) *val = ms; return true; }
  }
  return false;
}
static double lag_of(int r) {
  std::string v = S("lag", ""); size_t pos = 0;
  while (pos < v.size()) {
    size_t e = v.find(',', pos); if (e == std::string::npos) e = v.size();
    int rr; double l; if (sscanf(v.substr(pos, e - pos).c_str(), "%d:%lf", &rr, &l) == 2 && rr == r) return l;
    pos = e + 1;
  }
  return 0;
}

struct Sub { ucm_task_t h; int64_t at; uint32_t t; std::vector<ucm_load_entry_t> e; std::vector<std::vector<uint8_t>>* buf; };

static void run(const char* mode) {
  const bool solo = !strcmp(mode, "solo");
  ucm_config_t cfg; ucm_config_init(&cfg);
  const uint64_t sb = U("sb", 16384);
  cfg.shard_bytes = sb; cfg.cache_bytes = U("slots", 32) * sb; cfg.reserved_slots = U("reserved", 0);
  cfg.prealloc = U("prealloc", 0); cfg.shards_per_block = 1; cfg.max_task_entries = U("keys", 8) + 1;
  cfg.hugepages = UCM_HUGEPAGES_OFF; cfg.bind_threads = 0; cfg.copy_engine = UCM_COPY_ENGINE_HOST;
  cfg.protect = strcmp(mode, "protect") ? 0 : 1;
  cfg.protect_grace_ms = U("grace", 1000);
  cfg.timeout_ms = U("tmo", 60000);
  snprintf(cfg.backend, sizeof cfg.backend, "sim:latency_us=%u", (unsigned)U("lat", 300));
  ucm_cache_t c = nullptr;
  if (ucm_cache_init(MPI_COMM_WORLD, &cfg, &c) != UCM_OK) { fprintf(stderr, "rank %d init: %s\n", g_rank, ucm_last_error(nullptr)); ++g_fail; return; }
  const uint32_t T = U("tasks", 64), win = U("win", 1), period = U("period", 1000), jitter = U("jitter", 0);
  const int64_t tmo = U("tmo", 60000);
  const bool active = !solo || g_rank == 0;
  const double lag = solo ? 0 : lag_of(g_rank);
  std::mt19937_64 rng(g_rank * 77 + 1);
  std::vector<std::vector<std::vector<uint8_t>>> bufs(win + 1);
  std::vector<Sub> fl; size_t slot = 0;
  int64_t worst_wait = 0, worst_lat = 0; uint32_t bad = 0, errs = 0, waited_tasks = 0;
  auto finish = [&](Sub& s) {
    const int64_t w0 = mono_ns();
    ucm_result_t r = ucm_task_wait(c, s.h, tmo + 5000);
    const int64_t now = mono_ns();
    worst_wait = std::max(worst_wait, now - w0); worst_lat = std::max(worst_lat, now - s.at);
    if (now - s.at > (tmo + 2000) * 1000000ll) fprintf(stderr, "rank %d %s task %u: took %.1f s (> timeout %lld ms)\n", g_rank, mode, s.t, (now - s.at) / 1e9, (long long)tmo);
    if (r != UCM_OK) { if (errs++ < 5) fprintf(stderr, "rank %d %s task %u: %s: %s\n", g_rank, mode, s.t, ucm_result_string(r), ucm_last_error(c)); ++g_fail; return; }
    ++waited_tasks;
    for (size_t i = 0; i < s.e.size(); ++i) {
      uint64_t lo, hi; memcpy(&lo, s.e[i].key.block.bytes, 8); memcpy(&hi, s.e[i].key.block.bytes + 8, 8);
      const uint64_t* p = (const uint64_t*)s.e[i].dst;
      for (uint64_t w = 0; w < sb / 8; ++w)
        if (p[w] != sim_word(lo, hi, 0, w)) { if (bad++ < 5) fprintf(stderr, "rank %d %s task %u entry %zu: WRONG BYTES at word %" PRIu64 "\n", g_rank, mode, s.t, i, w); ++g_fail; break; }
    }
  };
  auto submit = [&](uint32_t t, uint32_t keys_t, bool own = false) {
    if (fl.size() >= win) { finish(fl.front()); fl.erase(fl.begin()); }
    auto ids = keys_of(keys_t);
    if (own) { ids.assign(U("ownkeys", 1), 0); for (size_t i = 0; i < ids.size(); ++i) ids[i] = 9000000000ull + g_rank * 100000000ull + t * 1000ull + i; }
    auto& b = bufs[slot++ % (win + 1)];
    b.assign(ids.size(), std::vector<uint8_t>(sb, 0xee));
    Sub s; s.t = t; s.buf = &b; s.e.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) { s.e[i].key = mk(ids[i]); s.e[i].dst = b[i].data(); }
    s.at = mono_ns();
    ucm_result_t r = ucm_load_task(c, s.e.data(), s.e.size(), &s.h);
    if (r != UCM_OK) { fprintf(stderr, "rank %d submit %u: %s\n", g_rank, t, ucm_last_error(c)); ++g_fail; return; }
    fl.push_back(std::move(s));
  };
  { int wr = -1; unsigned wn = 0; sscanf(S("warmup", "").c_str(), "%d:%u", &wr, &wn);
    if (!solo && wr == g_rank) for (unsigned i = 0; i < wn; ++i) submit(100000 + i, 0, true);
    while (!fl.empty()) { finish(fl.front()); fl.erase(fl.begin()); }
    if (wn && !solo) usleep((U("grace", 1000) * 1200 + 100000));
  }
  int64_t t0 = mono_ns() + 20000000; MPI_Bcast(&t0, 1, MPI_INT64_T, 0, MPI_COMM_WORLD); sleep_until(t0);
  const int64_t start = mono_ns();
  const double cpu0 = cpu_s();
  if (active) {
    for (uint32_t t = 0; t < T; ++t) {
      double at = (t + lag) * period + (jitter ? double(rng() % jitter) : 0);
      sleep_until(t0 + int64_t(at * 1000));
      uint32_t ms;
      if (!solo && has("stall", g_rank, t, &ms)) usleep(ms * 1000);
      if (!solo && has("extra", g_rank, t)) submit(t, t, U("extraown", 0));
      if (!solo && has("skip", g_rank, t)) continue;
      submit(t, t);
    }
    while (!fl.empty()) { finish(fl.front()); fl.erase(fl.begin()); }
  }
  const double secs = (mono_ns() - start) / 1e9;
  const double cpu = cpu_s() - cpu0;  // this rank's process, every thread, before the barrier's spin
  MPI_Barrier(MPI_COMM_WORLD);
  ucm_stats_t rs{}, ns{}; rs.struct_bytes = ns.struct_bytes = sizeof rs;
  ucm_cache_stats(c, &rs, &ns);
  double wsec = secs, wl = worst_lat / 1e6; double mx[2], in[2] = {wsec, wl};
  MPI_Reduce(in, mx, 2, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  double cpu_all = 0;
  MPI_Reduce(&cpu, &cpu_all, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  if (g_rank == 0) printf("%-10s loads %6" PRIu64 " no_space %7" PRIu64 " evictions %6" PRIu64 " wall %.3f s  worst task latency %.1f ms  cpu %.3f s (all ranks)\n",
                          mode, ns.owner_loads, ns.no_space, ns.evictions, mx[0], mx[1], cpu_all);
  fflush(stdout);
  MPI_Barrier(MPI_COMM_WORLD);
  if (ucm_cache_finalize(&c) != UCM_OK) { fprintf(stderr, "rank %d finalize: %s\n", g_rank, ucm_last_error(nullptr)); ++g_fail; }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank); MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  for (int i = 1; i < argc; ++i) { std::string a = argv[i]; size_t e = a.find('='); if (e != std::string::npos) opt[a.substr(0, e)] = a.substr(e + 1); }
  if (U("solo", 1)) run("solo");
  run("protect");
  if (U("noprotect", 0)) run("noprotect");
  int w = 0; MPI_Allreduce(&g_fail, &w, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return w ? 1 : 0;
}
