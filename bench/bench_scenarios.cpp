// ucm_bench's wait, evict and prealloc scenarios (see the top of ucm_bench.cpp).
#include <mpi.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "api/handles.h"
#include "backend/sim_content.h"
#include "bench_util.h"
#include "cache/cache_buffer.h"
#include "common/key.h"
#include "ctrl/layout.h"
#include "sync/futex.h"

namespace ucm::bench {
namespace {

// Each rank's n doubles, concatenated in rank order, on rank 0.
std::vector<double> gather_fixed(const std::vector<double>& v) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<double> all(rank == 0 ? v.size() * static_cast<size_t>(size) : 0);
  MPI_Gather(v.data(), static_cast<int>(v.size()), MPI_DOUBLE, all.data(), static_cast<int>(v.size()), MPI_DOUBLE, 0,
             MPI_COMM_WORLD);
  return all;
}

// Rank 0's app thread, after submitting a task whose one key its own
// dispatcher is about to own: the instant that key turns Ready, seen through
// a futex wait on the slot's word (whatever wait mode the cache runs), so the
// waiters' wake-up can be timed from it. Pins the slot as one more waiter
// while it watches.
uint64_t watch_ready(const Job& job, ucm_cache_t cache, const ucm_key_t& uk) {
  Cache* c = nullptr;
  if (resolve_handle(cache, &c) != Result::kOk) die(job, "resolve_handle", UCM_ERR_INTERNAL, "");
  CacheBuffer* cb = c->buffer();
  const Key k = ikey(uk);
  const uint64_t deadline = now_ns() + 10'000'000'000ull;
  // Until our dispatcher has claimed it (else this get() would own it).
  while (!cb->being_served(k) && now_ns() < deadline) sleep_us(10);
  GetResult g;
  if (cb->get(k, &g) != Result::kOk) die(job, "CacheBuffer::get", UCM_ERR_INTERNAL, last_error().c_str());
  if (g.kind == GetKind::kOwner) die(job, "watch_ready", UCM_ERR_INTERNAL, "the watcher became the owner");
  // The cache's own wait (it flags the waiters bit by the slot word's table,
  // ctrl/slot_word.h T9, and sleeps on the futex), not a copy of it.
  uint32_t w = g.word;
  for (;;) {
    const State st = word_state(w);
    if (st == State::kReady || st == State::kFailed || now_ns() >= deadline) break;
    if (cb->wait_for_change(g.slot, w, deadline, &w) != Result::kOk) break;
  }
  const uint64_t t = now_ns();
  cb->release(g.slot);
  return t;
}

}  // namespace

// ---- wait: poll vs futex ---------------------------------------------------------

void run_wait(Job* job) {
  const Options& o = job->opt;
  if (job->size < 2) {
    say(*job, "\n== wait: needs at least 2 ranks (a waiter); skipped ==\n");
    job->root.set("wait", Json::object().set("skipped", "needs at least 2 ranks"));
    return;
  }
  const uint64_t shard = 64 << 10;
  const int n = o.wait_tasks;
  say(*job, "\n== wait: %d one-shard tasks per mode; rank 0 owns each (sim latency %u us), ranks 1..%d wait ==\n", n,
      o.wait_latency_us, job->size - 1);
  // The waiters submit 200-1500 us after the owner (drawn per task, the same
  // for every waiter), inside the owner's load, so each finds it being served.
  std::vector<uint32_t> delay_us(static_cast<size_t>(n));
  std::mt19937 rng(12345);
  for (int i = 0; i < n; ++i) delay_us[i] = 200 + rng() % 1300;

  struct Mode {
    const char* name;
    ucm_wait_t wait;
  };
  const Mode modes[] = {{"poll", UCM_WAIT_POLL}, {"futex", UCM_WAIT_FUTEX}};
  Json jmodes = Json::array();
  Table t({"wait", "after Ready p50 us", "p90 us", "p99 us", "max us", "after watcher p50 us", "overhead p50 us", "owner overhead p50 us",
           "waiter task p50 us", "waiter CPU us/task", "owner CPU us/task", "owned by rank 0"});
  double med[2] = {0, 0}, med_ready[2] = {0, 0};
  const double latency_ns = double(o.wait_latency_us) * 1e3;
  for (int mi = 0; mi < 2; ++mi) {
    const Mode& m = modes[mi];
    ucm_config_t cfg = base_config(*job, shard, static_cast<uint64_t>(n) + 16, 1, 64, sim_spec(o.wait_latency_us, 16));
    cfg.wait = m.wait;
    // The waiters' share of a one-entry task is rank 0's stride: with a long
    // grace they leave it to rank 0 and only ever wait.
    cfg.owner_grace_us = 100000;
    ucm_cache_t cache = open_cache(*job, cfg);
    ShardBuffer buf(1, shard);
    std::vector<double> over_us(static_cast<size_t>(n)), after_owner_us(over_us), after_ready_us(over_us);
    std::vector<double> task_us(over_us), cpu_us(over_us), after_first_us(over_us);
    uint64_t owned0 = 0;
    for (int i = 0; i < n; ++i) {
      const std::vector<ucm_key_t> keys = {ukey((uint64_t{11} << 40) + (uint64_t(mi) << 32) + uint64_t(i), 0)};
      const auto e = entries_for(keys, buf);
      buf.poison();
      quiet_barrier();
      const ucm_stats_t rs0 = rank_stats(*job, cache);
      if (job->rank != 0) sleep_us(delay_us[i]);
      const uint64_t c0 = process_cpu_ns(), t0 = now_ns();
      uint64_t ready = 0;
      if (job->rank == 0) {
        ucm_task_t task = 0;
        ucm_result_t r = ucm_load_task(cache, e.data(), 1, &task);
        if (r != UCM_OK) die(*job, "ucm_load_task", r, ucm_last_error(cache));
        ready = watch_ready(*job, cache, keys[0]);
        if ((r = ucm_task_wait(cache, task, 60000)) != UCM_OK) die(*job, "ucm_task_wait", r, ucm_last_error(cache));
      } else {
        load_and_wait(*job, cache, e.data(), 1);
      }
      const uint64_t t1 = now_ns(), c1 = process_cpu_ns();
      verify_entries(job, fmt("wait/%s", m.name).c_str(), e.data(), 1, shard);
      quiet_barrier();  // before any blocking collective (they spin)
      uint64_t owner[3] = {t0, t1, ready};  // rank 0's submit, end, and the Ready it saw
      MPI_Bcast(owner, 3, MPI_UINT64_T, 0, MPI_COMM_WORLD);
      const uint64_t mine = stats_delta(rank_stats(*job, cache), rs0).owner_loads;
      uint64_t by0 = job->rank == 0 ? mine : 0, all0 = 0;
      MPI_Reduce(&by0, &all0, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
      owned0 += all0;
      // Beyond the load's due time: the owner's submit plus the store's
      // latency. On rank 0 (the owner) this is the floor: the store's own
      // wake-up, the copy, the app thread's wake-up.
      over_us[i] = (double(t1) - double(owner[0]) - latency_ns) / 1e3;
      after_owner_us[i] = (double(t1) - double(owner[1])) / 1e3;
      after_ready_us[i] = (double(t1) - double(owner[2])) / 1e3;
      // The first thread on the node to see Ready: the watcher, or a rank
      // whose task ended before the watcher got the CPU back (2 cores, more
      // threads woken at once than cores).
      const auto ends = allgather(t1);
      const uint64_t first = std::min(owner[2], *std::min_element(ends.begin(), ends.end()));
      after_first_us[i] = double(t1 - first) / 1e3;
      task_us[i] = double(t1 - t0) / 1e3;
      cpu_us[i] = double(c1 - c0) / 1e3;
    }
    const ucm_stats_t rs = rank_stats(*job, cache);
    const auto lib_p50 = allgather(rs.latency_p50_us), lib_p90 = allgather(rs.latency_p90_us);
    close_cache(*job, &cache);
    const auto all_over = gather_fixed(over_us), all_after = gather_fixed(after_owner_us);
    const auto all_ready = gather_fixed(after_ready_us), all_first = gather_fixed(after_first_us);
    const auto all_task = gather_fixed(task_us), all_cpu = gather_fixed(cpu_us);
    if (job->rank != 0) continue;
    // Rank 0's samples come first; the waiters' follow.
    const long un = static_cast<long>(n);
    auto owner_part = [&](const std::vector<double>& v) { return std::vector<double>(v.begin(), v.begin() + un); };
    auto waiter_part = [&](const std::vector<double>& v) { return std::vector<double>(v.begin() + un, v.end()); };
    const auto w_over = waiter_part(all_over), w_after = waiter_part(all_after), w_ready = waiter_part(all_ready);
    const auto w_first = waiter_part(all_first);
    const auto w_task = waiter_part(all_task), w_cpu = waiter_part(all_cpu);
    const auto o_over = owner_part(all_over), o_cpu = owner_part(all_cpu);
    med[mi] = median(w_over);
    med_ready[mi] = median(w_first);
    t.row({m.name, fmt("%.0f", med_ready[mi]), fmt("%.0f", percentile(w_first, 0.9)),
           fmt("%.0f", percentile(w_first, 0.99)), fmt("%.0f", vmax(w_first)), fmt("%.1f", median(w_ready)),
           fmt("%.0f", med[mi]),
           fmt("%.0f", median(o_over)), fmt("%.0f", median(w_task)), fmt("%.0f", median(w_cpu)),
           fmt("%.0f", median(o_cpu)), fmt("%" PRIu64 "/%d", owned0, n)});
    double cpu_sum = 0;
    for (double x : w_cpu) cpu_sum += x;
    Json j = Json::object();
    j.set("wait", m.name).set("tasks", n).set("owned_by_rank0", owned0);
    j.set("waiter_overhead_us_p50", med[mi]).set("waiter_overhead_us_p90", percentile(w_over, 0.9));
    j.set("waiter_overhead_us_p99", percentile(w_over, 0.99)).set("waiter_overhead_us_max", vmax(w_over));
    j.set("waiter_after_ready_us_p50", med_ready[mi]).set("waiter_after_ready_us_p90", percentile(w_first, 0.9));
    j.set("waiter_after_ready_us_p99", percentile(w_first, 0.99)).set("waiter_after_ready_us", Json::array_of(w_first));
    j.set("waiter_after_watcher_us_p50", median(w_ready)).set("waiter_after_watcher_us", Json::array_of(w_ready));
    j.set("owner_overhead_us_p50", median(o_over)).set("waiter_after_owner_end_us_p50", median(w_after));
    j.set("waiter_task_us_p50", median(w_task)).set("waiter_cpu_us_per_task_p50", median(w_cpu));
    j.set("waiter_cpu_us_per_task_mean", w_cpu.empty() ? 0.0 : cpu_sum / double(w_cpu.size()));
    j.set("owner_cpu_us_per_task_p50", median(o_cpu));
    j.set("lib_latency_p50_us_per_rank", Json::array_of(lib_p50)).set("lib_latency_p90_us_per_rank", Json::array_of(lib_p90));
    j.set("waiter_overhead_us", Json::array_of(w_over)).set("owner_overhead_us", Json::array_of(o_over));
    j.set("waiter_cpu_us", Json::array_of(w_cpu)).set("waiter_task_us", Json::array_of(w_task));
    jmodes.push(std::move(j));
  }
  if (job->rank != 0) return;
  t.print(*job, "wait: after Ready = waiter's task end - the first sight of Ready on the node (a futex watcher on rank "
                "0, or an earlier task end); after watcher = - the watcher's sight alone; overhead = task end - (owner's submit + sim latency); CPU = the process's CPU time across its task");
  const double ratio = med_ready[0] / med_ready[1], ratio_over = med[0] / med[1];
  std::printf("  poll/futex median after Ready: %.0fx (target >= 100x: %s); median overhead beyond the load latency: "
              "%.0fx\n",
              ratio, ratio >= 100 ? "met" : "MISSED", ratio_over);
  Json j = Json::object();
  j.set("ranks", job->size).set("latency_us", o.wait_latency_us).set("tasks", n).set("shard_bytes", shard);
  j.set("waiter_delay_us", Json::array_of(delay_us)).set("modes", std::move(jmodes));
  j.set("poll_over_futex_median_after_ready", ratio).set("poll_over_futex_median_overhead", ratio_over);
  job->root.set("wait", std::move(j));
}

// ---- evict: ring vs clock, touch --------------------------------------------------

namespace {

Json run_evict_slots(Job* job, uint32_t slots) {
  const Options& o = job->opt;
  const uint64_t shard = 64 << 10;
  constexpr uint32_t kHot = 16, kCold = 32, kTask = kHot + kCold;
  const int tasks = o.evict_tasks;
  const uint32_t io_depth = 2, latency = 2000;
  say(*job, "\n== evict: %d tasks of %u hot + %u new cold blocks on %u slots (%u KiB shards), sim latency %u us ==\n",
      tasks, kHot, kCold, slots, unsigned(shard >> 10), latency);
  struct Mode {
    const char* name;
    ucm_evict_t evict;
    bool touch;
  };
  const Mode modes[] = {{"ring", UCM_EVICT_RING, false},
                        {"ring + touch", UCM_EVICT_RING, true},
                        {"clock", UCM_EVICT_CLOCK, false},
                        {"clock + touch", UCM_EVICT_CLOCK, true}};
  std::vector<ucm_block_t> hot(kHot);
  for (uint32_t h = 0; h < kHot; ++h) hot[h] = ublock((uint64_t{9} << 40) + h);
  Table t({"mode", "hit rate", "hit rate (tasks 2..)", "hot resident at start", "node loads", "needed", "wasted",
           "wasted after 1st evicting task", "evictions", "task ms p50"});
  Json jmodes = Json::array();
  for (const Mode& m : modes) {
    ucm_config_t cfg = base_config(*job, shard, slots, 1, 64, sim_spec(latency, io_depth));
    cfg.evict = m.evict;
    cfg.io_depth = io_depth;
    cfg.prealloc = 0;  // only eviction moves keys out
    ucm_cache_t cache = open_cache(*job, cfg);
    ShardBuffer buf(kTask, shard);
    uint64_t hits = 0, loads = 0, waits = 0, needed = 0, wasted = 0, evictions = 0, hot_res = 0;
    uint64_t hits2 = 0, asked2 = 0;
    // Wasted loads once CLOCK's first lap is behind: until the first task
    // that evicts, every slot's accessed bit is still set from its load, so
    // that task's sweep clears them all and falls back to the raw cursor.
    int first_evicting = -1;
    uint64_t wasted_after = 0;
    std::vector<double> task_ms;
    Json per_task = Json::array();
    for (int k = 0; k < tasks; ++k) {
      // Every third entry is hot, so each rank's stride holds some.
      std::vector<ucm_key_t> keys(kTask);
      uint32_t c = 0;
      for (uint32_t p = 0; p < kTask; ++p)
        keys[p] = p % 3 == 0 ? ukey((uint64_t{9} << 40) + p / 3, 0)
                             : ukey((uint64_t{10} << 40) + uint64_t(k) * kCold + c++, 0);
      const auto e = entries_for(keys, buf);
      buf.poison();
      quiet_barrier();
      // What is resident before the task: what the task needs no load for.
      uint64_t resident = 0, hot_resident = 0;
      ucm_stats_t ns0{};
      if (job->rank == 0) {
        std::vector<uint8_t> where(kTask);
        const ucm_result_t r = ucm_lookup(cache, keys.data(), kTask, where.data());
        if (r != UCM_OK) die(*job, "ucm_lookup", r, ucm_last_error(cache));
        for (uint32_t p = 0; p < kTask; ++p) {
          resident += where[p] == UCM_WHERE_CACHE;
          hot_resident += p % 3 == 0 && where[p] == UCM_WHERE_CACHE;
        }
        ns0 = node_stats(*job, cache);
      }
      quiet_barrier();
      sleep_us(uint64_t{o.evict_skew_us} * static_cast<uint64_t>(job->rank));
      const uint64_t t0 = now_ns();
      if (m.touch) {
        const ucm_result_t r = ucm_touch(cache, hot.data(), hot.size());
        if (r != UCM_OK) die(*job, "ucm_touch", r, ucm_last_error(cache));
      }
      load_and_wait(*job, cache, e.data(), e.size());
      const uint64_t t1 = now_ns();
      verify_entries(job, m.name, e.data(), e.size(), shard);
      quiet_barrier();
      const auto times = allgather(double(t1 - t0) / 1e6);
      if (job->rank != 0) continue;
      const ucm_stats_t d = stats_delta(node_stats(*job, cache), ns0);
      const uint64_t need = kTask - resident;
      const uint64_t waste = d.owner_loads > need ? d.owner_loads - need : 0;
      hits += d.hits;
      loads += d.owner_loads;
      waits += d.waits;
      needed += need;
      wasted += waste;
      evictions += d.evictions;
      if (first_evicting < 0 && d.evictions > 0) first_evicting = k;
      else if (first_evicting >= 0) wasted_after += waste;
      if (k > 0) hot_res += hot_resident;
      if (k > 0) {
        hits2 += d.hits;
        asked2 += d.hits + d.owner_loads + d.waits;
      }
      task_ms.push_back(vmax(times));
      per_task.push(Json::object()
                        .set("resident_at_start", resident)
                        .set("hot_resident_at_start", hot_resident)
                        .set("node_loads", d.owner_loads)
                        .set("needed", need)
                        .set("wasted", waste)
                        .set("hits", d.hits)
                        .set("waits", d.waits)
                        .set("evictions", d.evictions)
                        .set("task_ms", vmax(times)));
    }
    close_cache(*job, &cache);
    if (job->rank != 0) continue;
    const double asked = double(hits + loads + waits);
    const double rate = asked > 0 ? double(hits) / asked : 0;
    const double rate2 = asked2 > 0 ? double(hits2) / double(asked2) : 0;
    const double hot_avg = tasks > 1 ? double(hot_res) / double(tasks - 1) : 0;
    t.row({m.name, fmt("%.1f%%", 100 * rate), fmt("%.1f%%", 100 * rate2), fmt("%.1f / %u", hot_avg, kHot),
           std::to_string(loads), std::to_string(needed), std::to_string(wasted),
           fmt("%" PRIu64 " (from task %d)", wasted_after, first_evicting + 2), std::to_string(evictions),
           fmt("%.1f", median(task_ms))});
    Json j = Json::object();
    j.set("mode", m.name).set("evict", m.evict == UCM_EVICT_CLOCK ? "clock" : "ring").set("touch", m.touch);
    j.set("hit_rate", rate).set("hit_rate_after_first", rate2).set("hot_resident_at_start_mean", hot_avg);
    j.set("hits", hits).set("node_loads", loads).set("waits", waits).set("needed_loads", needed);
    j.set("wasted_loads", wasted).set("first_evicting_task", first_evicting);
    j.set("wasted_loads_after_first_evicting_task", wasted_after).set("evictions", evictions).set("task_ms_p50", median(task_ms));
    j.set("tasks", std::move(per_task));
    jmodes.push(std::move(j));
  }
  if (job->rank != 0) return Json();
  t.print(*job, fmt("evict, %u slots: %d ranks; hit rate = node hits / (hits + loads + waits); wasted = node loads - keys of "
                    "the task not resident when it began",
                    slots, job->size)
                    .c_str());
  Json j = Json::object();
  j.set("ranks", job->size).set("hot", kHot).set("cold_per_task", kCold).set("slots", slots);
  j.set("shard_bytes", shard).set("latency_us", latency).set("io_depth", io_depth).set("tasks", tasks);
  j.set("skew_us", o.evict_skew_us).set("modes", std::move(jmodes));
  return j;
}

}  // namespace

void run_evict(Job* job) {
  Json all = Json::array();
  for (uint32_t slots : job->opt.evict_slots) all.push(run_evict_slots(job, slots));
  if (job->rank == 0) job->root.set("evict", std::move(all));
}

// ---- prealloc ------------------------------------------------------------------------

void run_prealloc(Job* job) {
  const Options& o = job->opt;
  const uint64_t shard = 64 << 10;
  // Two shards per block: the task at s+1 = 1 is the last shard, so nothing is
  // preallocated after it and the reserved pool holds only what the 2nd task uses.
  constexpr uint32_t kSlots = 256, kBlocks = 32, kSpb = 2;
  constexpr int kReps = 7, kWarmup = 2;
  const uint32_t latency = 2000, io_depth = 8;
  say(*job, "\n== prealloc: %u blocks at shard s, %u ms idle, then shard s+1; full cache of %u slots; sim latency %u "
            "us ==\n",
      kBlocks, o.prealloc_pause_ms, kSlots, latency);
  Table t({"prealloc", "2nd task ms p50", "2nd task ms min", "prealloc made", "used", "evictions in 2nd",
           "direct Get ns p50", "direct Get ns p90", "took prealloc", "evicted"});
  Json jmodes = Json::array();
  double task_p50[2] = {0, 0}, get_p50[2] = {0, 0};
  for (int pre = 0; pre < 2; ++pre) {
    ucm_config_t cfg = base_config(*job, shard, kSlots, kSpb, kSlots, sim_spec(latency, io_depth));
    cfg.prealloc = pre;
    cfg.io_depth = io_depth;
    cfg.reserved_slots = 64;
    ucm_cache_t cache = open_cache(*job, cfg);
    ShardBuffer buf(kSlots, shard);
    // Fill the regular pool with the last shard of other blocks (nothing to
    // prealloc after them), so that a cold Get has to evict.
    {
      std::vector<ucm_key_t> keys(kSlots);
      for (uint32_t i = 0; i < kSlots; ++i) keys[i] = ukey((uint64_t{12} << 40) + i, kSpb - 1);
      const auto e = entries_for(keys, buf);
      buf.poison();
      load_and_wait(*job, cache, e.data(), e.size());
      verify_entries(job, "prealloc (fill)", e.data(), e.size(), shard);
    }
    auto block_keys = [&](int set, uint32_t s) {
      std::vector<ucm_key_t> keys(kBlocks);
      for (uint32_t i = 0; i < kBlocks; ++i) keys[i] = ukey((uint64_t{13} << 40) + (uint64_t(set) << 16) + i, s);
      return keys;
    };
    // (1) through the API: the second task's time.
    std::vector<double> task2;
    uint64_t made = 0, used = 0, evicted2 = 0;
    std::vector<uint64_t> rep_made, rep_used, rep_takeovers, rep_evictions, rep_loads, rep_hits, rep_waits;
    // The first kWarmup reps are not counted: they touch the reserved pool's
    // pages for the first time (page faults on every rank), which a steady
    // state never pays.
    for (int rep = -kWarmup; rep < kReps; ++rep) {
      const auto a = block_keys(rep + kWarmup, 0), b = block_keys(rep + kWarmup, 1);
      const auto ea = entries_for(a, buf), eb = entries_for(b, buf, kBlocks);
      buf.poison();
      // Every snapshot is taken while every rank is idle, before the barrier
      // that lets the next task go (a rank leaves a barrier before another).
      quiet_barrier();
      const ucm_stats_t ns0 = node_stats(*job, cache);
      quiet_barrier();
      load_and_wait(*job, cache, ea.data(), ea.size());
      quiet_barrier();
      sleep_us(uint64_t{o.prealloc_pause_ms} * 1000);  // the dispatcher's idle window
      const ucm_stats_t ns1 = node_stats(*job, cache);
      quiet_barrier();
      const uint64_t t0 = now_ns();
      load_and_wait(*job, cache, eb.data(), eb.size());
      const uint64_t t1 = now_ns();
      verify_entries(job, "prealloc (1st task)", ea.data(), ea.size(), shard);
      verify_entries(job, "prealloc (2nd task)", eb.data(), eb.size(), shard);
      quiet_barrier();
      const auto times = allgather(double(t1 - t0) / 1e6);
      const ucm_stats_t ns2 = node_stats(*job, cache);
      quiet_barrier();  // nobody starts the next task before every rank has read ns2
      if (rep < 0) continue;
      task2.push_back(vmax(times));
      made += ns1.prealloc_made - ns0.prealloc_made;
      used += ns2.prealloc_used - ns1.prealloc_used;
      evicted2 += ns2.evictions - ns1.evictions;
      rep_made.push_back(ns1.prealloc_made - ns0.prealloc_made);
      rep_used.push_back(ns2.prealloc_used - ns1.prealloc_used);
      rep_takeovers.push_back(ns2.takeovers - ns1.takeovers);
      rep_evictions.push_back(ns2.evictions - ns1.evictions);
      rep_loads.push_back(ns2.owner_loads - ns1.owner_loads);
      rep_hits.push_back(ns2.hits - ns1.hits);
      rep_waits.push_back(ns2.waits - ns1.waits);
    }
    // (2) directly: rank 0 times CacheBuffer::get of each (block, s+1) after
    // the idle window, then fills, marks Ready and releases them as their
    // owner; every rank then loads them through the API (hits) and verifies.
    std::vector<double> get_ns;
    uint64_t took = 0, evicted = 0;
    for (int rep = 0; rep < kReps; ++rep) {
      const int set = 100 + rep;
      const auto a = block_keys(set, 0), b = block_keys(set, 1);
      const auto ea = entries_for(a, buf), eb = entries_for(b, buf, kBlocks);
      buf.poison();
      load_and_wait(*job, cache, ea.data(), ea.size());
      quiet_barrier();
      sleep_us(uint64_t{o.prealloc_pause_ms} * 1000);
      quiet_barrier();
      if (job->rank == 0) {
        Cache* c = nullptr;
        if (resolve_handle(cache, &c) != Result::kOk) die(*job, "resolve_handle", UCM_ERR_INTERNAL, "");
        CacheBuffer* cb = c->buffer();
        std::vector<GetResult> got(kBlocks);
        for (uint32_t i = 0; i < kBlocks; ++i) {
          const uint64_t g0 = now_ns();
          const Result r = cb->get(ikey(b[i]), &got[i]);
          const uint64_t g1 = now_ns();
          if (r != Result::kOk) die(*job, "CacheBuffer::get", UCM_ERR_INTERNAL, last_error().c_str());
          get_ns.push_back(double(g1 - g0));
          took += got[i].took_prealloc;
          evicted += got[i].evicted;
        }
        for (uint32_t i = 0; i < kBlocks; ++i) {
          if (got[i].kind == GetKind::kOwner) {
            sim_fill(ikey(b[i]), cb->data_at(got[i].slot), shard);
            if (cb->mark_ready(got[i].slot) != Result::kOk)
              die(*job, "CacheBuffer::mark_ready", UCM_ERR_INTERNAL, last_error().c_str());
          }
          cb->release(got[i].slot);
        }
      }
      quiet_barrier();
      load_and_wait(*job, cache, eb.data(), eb.size());
      verify_entries(job, "prealloc (direct Get)", eb.data(), eb.size(), shard);
      quiet_barrier();
    }
    close_cache(*job, &cache);
    if (job->rank != 0) continue;
    task_p50[pre] = median(task2);
    get_p50[pre] = median(get_ns);
    t.row({pre ? "1 (on)" : "0 (off)", fmt("%.2f", task_p50[pre]), fmt("%.2f", vmin(task2)), std::to_string(made),
           std::to_string(used), std::to_string(evicted2), fmt("%.0f", get_p50[pre]),
           fmt("%.0f", percentile(get_ns, 0.9)), fmt("%" PRIu64 "/%zu", took, get_ns.size()),
           fmt("%" PRIu64 "/%zu", evicted, get_ns.size())});
    Json j = Json::object();
    j.set("prealloc", pre).set("second_task_ms", Json::array_of(task2)).set("second_task_ms_p50", task_p50[pre]);
    j.set("prealloc_made", made).set("prealloc_used", used).set("evictions_in_second_task", evicted2);
    j.set("per_rep_made", Json::array_of(rep_made)).set("per_rep_used", Json::array_of(rep_used));
    j.set("per_rep_takeovers", Json::array_of(rep_takeovers)).set("per_rep_evictions", Json::array_of(rep_evictions));
    j.set("per_rep_loads", Json::array_of(rep_loads)).set("per_rep_hits", Json::array_of(rep_hits));
    j.set("per_rep_waits", Json::array_of(rep_waits));
    j.set("direct_get_ns", Json::array_of(get_ns)).set("direct_get_ns_p50", get_p50[pre]);
    j.set("direct_get_ns_p90", percentile(get_ns, 0.9)).set("direct_get_took_prealloc", took);
    j.set("direct_get_evicted", evicted);
    jmodes.push(std::move(j));
  }
  if (job->rank != 0) return;
  t.print(*job, fmt("prealloc: %d ranks, %d reps; 2nd task = every rank's task at s+1 (slowest rank); direct Get = "
                    "rank 0's CacheBuffer::get of (block, s+1)",
                    job->size, kReps)
                    .c_str());
  std::printf("  2nd task off/on: %.2fx; direct Get off/on: %.2fx (target: a prealloc'd Get faster than a cold one: %s)\n",
              task_p50[0] / task_p50[1], get_p50[0] / get_p50[1], get_p50[1] < get_p50[0] ? "met" : "MISSED");
  Json j = Json::object();
  j.set("ranks", job->size).set("blocks", kBlocks).set("slots", kSlots).set("reserved_slots", 64);
  j.set("shard_bytes", shard).set("latency_us", latency).set("io_depth", io_depth).set("reps", kReps);
  j.set("warmup_reps", kWarmup).set("pause_ms", o.prealloc_pause_ms).set("modes", std::move(jmodes));
  j.set("second_task_off_over_on", task_p50[0] / task_p50[1]).set("direct_get_off_over_on", get_p50[0] / get_p50[1]);
  job->root.set("prealloc", std::move(j));
}

}  // namespace ucm::bench
