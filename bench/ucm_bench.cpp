// ucm_bench: the load path's optimizations, each measured against the legacy
// behaviour it replaces, side by side in one MPI job (docs/results.md).
//
// Every mode is its own ucm_cache_init .. ucm_cache_finalize with a different
// configuration, in the same job, on the sim store (lib/backend/sim_backend.h),
// so that time is the store's latency and every byte that lands can be
// checked: each destination is poisoned before a task and verified against
// sim_content.h after it; a mismatch is printed at once on the rank that saw
// it, the run ends with exit status 1 and the JSON says "verification":
// "FAILED". Scenarios (--scenario, a comma list or "all"):
//
//  cold      one task of shards_per_rank x ranks shards, cold, on every rank
//            at once. order=natural vs order=rotate, and the seed's legacy
//            emulated ("natural, shard by shard": one task per shard, each
//            waited for, so the ranks move in lockstep the way the seed's old
//            Get did; this library's dispatcher never blocks on a waiter, so
//            natural order alone does not serialize the loads). Per mode:
//            task time (the slowest rank), node makespan, backend loads per
//            unique shard, owner loads per rank (balance max/min), the node's
//            peak backend concurrency (each rank's sim in-flight count sampled
//            every 100 us, summed over ranks) and its mean (loads x latency /
//            makespan). Then the ranks skewed (rank r waits r x skew before it
//            submits): natural, and rotate with owner_grace at its default vs
//            owner_grace_us=0, at --skew-io-depth.
//  warm      every shard resident; repeated tasks of hits. GB/s into the
//            destination per rank, next to a plain memcpy of the same bytes
//            into the same destination timed by the same rank in the same
//            run: from the cache's own slots (the memory the copier reads;
//            pinned outside the timed region) and from a private copy; the
//            three rotate their order rep by rep.
//  wait      rank 0 owns a load (sim latency ~2 ms), the others wait for it:
//            wait=poll vs wait=futex; the waiters' task end beyond the load's
//            due time (owner's submit + sim latency), percentiles; waiter
//            process CPU per task.       (wait, evict, prealloc: bench_scenarios.cpp)
//  evict     a hot set in every task plus a stream of cold blocks, on a cache
//            smaller than the working set: evict=ring vs clock, each with and
//            without ucm_touch of the hot blocks; hit rate and wasted loads.
//  prealloc  a task at shard s, an idle pause, the task at s+1: prealloc=0
//            vs 1; task time of the second task, prealloc_used, and a direct
//            timing of Get on the next shard (CacheBuffer::get from rank 0).
//
// Output: a table per scenario on rank 0's stdout and one JSON file (--json).
// Node-level numbers are rank 0's node; on several nodes (node_count > 1) the
// cold scenario adds every node's backend loads, by node id and name (a table
// "cold load per node", and per_node in each cold mode's JSON).
// The app uses the public API for everything it measures; it reaches inside
// only to verify bytes (sim_content.h), to read the sim store's in-flight
// count, and for the direct Get timing.
//
//   mpirun -np 4 ucm_bench --scenario all --json docs/data/bench.json
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "api/handles.h"
#include "backend/sim_content.h"
#include "bench_util.h"
#include "cache/cache_buffer.h"
#include "common/key.h"

namespace ucm::bench {
namespace {

// ---- cold ---------------------------------------------------------------------

constexpr uint32_t kDefaultGrace = UINT32_MAX;  // leave owner_grace_us at the library's default

struct ColdMode {
  std::string name;
  std::string group;  // "order" or "skew"
  ucm_order_t order;
  uint32_t grace_us;
  uint32_t io_depth;
  uint32_t skew_us;
  bool shard_by_shard;
};

struct ColdResult {
  double task_ms = 0;      // median over reps of the slowest rank's task time
  double makespan_ms = 0;  // median over reps: first barrier exit to last completion
  std::vector<uint64_t> owner_loads;  // per rank, summed over reps
  uint64_t node_loads = 0, unique = 0;
  uint64_t peak = 0;       // max over reps of the node's sampled in-flight sum
  double mean_conc = 0;    // median over reps
  uint32_t grace_us = 0;
  // Several nodes (node_count > 1) only: per node id, the backend loads of
  // that node's cache (summed over reps, from the node's local rank 0), its
  // ranks and its name. node_loads above is rank 0's node alone.
  std::vector<uint64_t> loads_per_node;
  std::vector<int> ranks_per_node;
  std::vector<std::string> node_names;
};

// This rank's node id and node count, and (rank 0) every node's name and rank
// count, by node id: the host name, with the Slurm node name when there is one
// (pretend nodes share one host name).
struct NodeMap {
  int node_id = 0, node_count = 1, local_rank = 0;
  std::vector<int> node_of_rank;   // rank 0 only
  std::vector<int> local_of_rank;  // rank 0 only
  std::vector<int> ranks;          // rank 0 only, per node id
  std::vector<std::string> names;  // rank 0 only, per node id
};

NodeMap node_map(const Job& job, ucm_cache_t cache) {
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  const ucm_result_t r = ucm_cache_info(cache, &info);
  if (r != UCM_OK) die(job, "ucm_cache_info", r, ucm_last_error(cache));
  NodeMap m;
  m.node_id = info.node_id;
  m.node_count = info.node_count;
  m.local_rank = info.local_rank;
  const auto ids = allgather(static_cast<uint64_t>(info.node_id));
  const auto locals = allgather(static_cast<uint64_t>(info.local_rank));
  char name[128] = {};
  const char* slurm = std::getenv("SLURMD_NODENAME");
  std::snprintf(name, sizeof(name), "%s%s%s", info.host, slurm ? "/" : "", slurm ? slurm : "");
  std::vector<char> names(job.rank == 0 ? sizeof(name) * static_cast<size_t>(job.size) : 1);
  MPI_Gather(name, sizeof(name), MPI_CHAR, names.data(), sizeof(name), MPI_CHAR, 0, MPI_COMM_WORLD);
  if (job.rank != 0) return m;
  m.ranks.assign(static_cast<size_t>(m.node_count), 0);
  m.names.assign(static_cast<size_t>(m.node_count), "");
  for (int q = 0; q < job.size; ++q) {
    m.node_of_rank.push_back(static_cast<int>(ids[q]));
    m.local_of_rank.push_back(static_cast<int>(locals[q]));
    m.ranks[ids[q]]++;
    if (locals[q] == 0) m.names[ids[q]] = &names[sizeof(name) * static_cast<size_t>(q)];
  }
  return m;
}

double balance(const std::vector<uint64_t>& v) {
  if (v.empty()) return 0;
  const uint64_t mx = *std::max_element(v.begin(), v.end());
  const uint64_t mn = *std::min_element(v.begin(), v.end());
  return mn == 0 ? (mx == 0 ? 1.0 : 1.0 / 0.0) : double(mx) / double(mn);
}

std::string list_u64(const std::vector<uint64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += '/';
    s += std::to_string(v[i]);
  }
  return s;
}

ColdResult run_cold_mode(Job* job, const ColdMode& m, int mode_index, Json* out) {
  const Options& o = job->opt;
  const uint64_t shard = o.shard_kib << 10;
  const uint32_t T = o.shards_per_rank * static_cast<uint32_t>(job->size);
  const uint64_t slots = uint64_t{T} * static_cast<uint64_t>(o.reps) + 16;
  ucm_config_t cfg = base_config(*job, shard, slots, 1, std::max<uint32_t>(T, 64), sim_spec(o.latency_us, m.io_depth));
  cfg.order = m.order;
  cfg.io_depth = m.io_depth;
  cfg.prealloc = 0;  // shards_per_block is 1 anyway: nothing to prealloc
  if (m.grace_us != kDefaultGrace) cfg.owner_grace_us = m.grace_us;
  ucm_cache_t cache = open_cache(*job, cfg);
  SimBackend* sim = sim_of(*job, cache);
  InflightSampler sampler(sim, 100);
  ShardBuffer buf(T, shard);
  const NodeMap nodes = node_map(*job, cache);
  const bool multi = nodes.node_count > 1;

  ColdResult res;
  res.grace_us = cfg.owner_grace_us;
  if (multi && job->rank == 0) {
    res.loads_per_node.assign(static_cast<size_t>(nodes.node_count), 0);
    res.ranks_per_node = nodes.ranks;
    res.node_names = nodes.names;
  }
  res.owner_loads.assign(static_cast<size_t>(job->size), 0);
  std::vector<double> task_ms, makespan_ms, mean_conc;
  Json reps = Json::array();
  for (int rep = 0; rep < o.reps; ++rep) {
    const uint64_t base = (uint64_t(mode_index + 1) << 32) | (uint64_t(rep) << 20);
    std::vector<ucm_key_t> keys(T);
    for (uint32_t i = 0; i < T; ++i) keys[i] = ukey(base + i, 0);
    const auto e = entries_for(keys, buf);
    buf.poison();
    quiet_barrier();
    const ucm_stats_t rs0 = rank_stats(*job, cache), ns0 = node_stats(*job, cache);
    sampler.start();
    quiet_barrier();
    const uint64_t t_bar = now_ns();
    sleep_us(uint64_t{m.skew_us} * static_cast<uint64_t>(job->rank));
    const uint64_t t0 = now_ns();
    if (m.shard_by_shard) {
      for (uint32_t i = 0; i < T; ++i) load_and_wait(*job, cache, &e[i], 1);
    } else {
      load_and_wait(*job, cache, e.data(), e.size());
    }
    const uint64_t t1 = now_ns();
    quiet_barrier();
    sampler.stop();
    verify_entries(job, m.name.c_str(), e.data(), e.size(), shard);
    const ucm_stats_t rs = stats_delta(rank_stats(*job, cache), rs0);
    const ucm_stats_t ns = stats_delta(node_stats(*job, cache), ns0);
    const auto bars = allgather(t_bar), starts = allgather(t0), ends = allgather(t1);
    const auto owners = allgather(rs.owner_loads);
    const auto node_loads = multi ? allgather(ns.owner_loads) : std::vector<uint64_t>{};
    std::vector<int> counts;
    const auto events = gather_vec(sampler.events(), &counts);
    if (job->rank != 0) continue;
    double slowest = 0;
    for (int r = 0; r < job->size; ++r) slowest = std::max(slowest, double(ends[r] - starts[r]) / 1e6);
    const double span = double(*std::max_element(ends.begin(), ends.end()) -
                               *std::min_element(bars.begin(), bars.end())) / 1e6;
    const uint64_t peak = node_peak_concurrency(events, counts);
    const double conc = double(ns.owner_loads) * o.latency_us / 1000.0 / span;
    task_ms.push_back(slowest);
    makespan_ms.push_back(span);
    mean_conc.push_back(conc);
    res.node_loads += ns.owner_loads;
    res.unique += T;
    res.peak = std::max(res.peak, peak);
    for (int r = 0; r < job->size; ++r) res.owner_loads[r] += owners[r];
    std::vector<uint64_t> rep_per_node;
    if (multi) {
      rep_per_node.assign(static_cast<size_t>(nodes.node_count), 0);
      for (int r = 0; r < job->size; ++r)
        if (nodes.local_of_rank[r] == 0) rep_per_node[nodes.node_of_rank[r]] = node_loads[r];
      for (size_t n = 0; n < rep_per_node.size(); ++n) res.loads_per_node[n] += rep_per_node[n];
    }
    Json jr = Json::object();
    std::vector<double> per_rank_ms;
    for (int r = 0; r < job->size; ++r) per_rank_ms.push_back(double(ends[r] - starts[r]) / 1e6);
    jr.set("task_ms_per_rank", Json::array_of(per_rank_ms)).set("task_ms", slowest).set("makespan_ms", span);
    jr.set("owner_loads_per_rank", Json::array_of(owners)).set("node_loads", ns.owner_loads).set("unique", T);
    jr.set("peak_concurrency", peak).set("mean_concurrency", conc).set("node_waits", ns.waits);
    jr.set("node_hits", ns.hits);
    if (multi) jr.set("node_loads_per_node", Json::array_of(rep_per_node));
    reps.push(std::move(jr));
  }
  const auto sim_peaks = allgather(sim_peak_inflight(sim));
  close_cache(*job, &cache);
  if (job->rank != 0) return res;
  res.task_ms = median(task_ms);
  res.makespan_ms = median(makespan_ms);
  res.mean_conc = median(mean_conc);
  Json j = Json::object();
  j.set("name", m.name).set("group", m.group).set("order", m.order == UCM_ORDER_ROTATE ? "rotate" : "natural");
  j.set("owner_grace_us", res.grace_us).set("io_depth", m.io_depth).set("skew_us", m.skew_us);
  j.set("shard_by_shard", m.shard_by_shard).set("shards", T);
  j.set("task_ms", res.task_ms).set("makespan_ms", res.makespan_ms);
  j.set("owner_loads_per_rank", Json::array_of(res.owner_loads)).set("owner_balance_max_over_min", balance(res.owner_loads));
  j.set("node_loads", res.node_loads).set("unique_shards", res.unique);
  j.set("loads_per_unique", double(res.node_loads) / double(res.unique));
  j.set("peak_concurrency", res.peak).set("mean_concurrency", res.mean_conc);
  j.set("rank_peak_inflight", Json::array_of(sim_peaks));
  if (multi) {
    // Every node's cache loads each of the task's shards once: its own entry.
    Json pn = Json::array();
    for (size_t n = 0; n < res.loads_per_node.size(); ++n) {
      Json e = Json::object();
      e.set("node", static_cast<int>(n)).set("name", res.node_names[n]).set("ranks", res.ranks_per_node[n]);
      e.set("node_loads", res.loads_per_node[n]).set("unique_shards", res.unique);
      e.set("loads_per_unique", double(res.loads_per_node[n]) / double(res.unique));
      pn.push(std::move(e));
    }
    j.set("per_node", std::move(pn));
  }
  j.set("reps", std::move(reps));
  out->push(std::move(j));
  return res;
}

}  // namespace

void run_cold(Job* job) {
  const Options& o = job->opt;
  const uint32_t T = o.shards_per_rank * static_cast<uint32_t>(job->size);
  say(*job, "\n== cold: %u shards of %" PRIu64 " KiB per task, sim latency %u us, %d reps per mode ==\n", T,
      o.shard_kib, o.latency_us, o.reps);
  std::vector<ColdMode> modes = {
      {"natural", "order", UCM_ORDER_NATURAL, kDefaultGrace, o.io_depth, 0, false},
      {"rotate", "order", UCM_ORDER_ROTATE, kDefaultGrace, o.io_depth, 0, false},
      {"natural, shard by shard (seed legacy, emulated)", "order", UCM_ORDER_NATURAL, kDefaultGrace, o.io_depth, 0,
       true},
  };
  for (uint32_t skew : o.skews_us) {
    modes.push_back({fmt("natural, skew %u us", skew), "skew", UCM_ORDER_NATURAL, kDefaultGrace, o.skew_io_depth, skew,
                     false});
    modes.push_back({fmt("rotate, grace default, skew %u us", skew), "skew", UCM_ORDER_ROTATE, kDefaultGrace,
                     o.skew_io_depth, skew, false});
    modes.push_back({fmt("rotate, grace 0, skew %u us", skew), "skew", UCM_ORDER_ROTATE, 0, o.skew_io_depth, skew,
                     false});
  }
  Json jmodes = Json::array();
  std::vector<ColdResult> res;
  for (size_t i = 0; i < modes.size(); ++i) res.push_back(run_cold_mode(job, modes[i], static_cast<int>(i), &jmodes));
  if (job->rank != 0) return;

  const double rotate_ms = res[1].task_ms;
  Table t({"mode", "io depth", "grace us", "skew us", "task ms", "makespan ms", "x rotate", "loads/unique",
           "owner loads per rank", "max/min", "peak conc", "mean conc"});
  for (size_t i = 0; i < modes.size(); ++i) {
    const ColdMode& m = modes[i];
    const ColdResult& r = res[i];
    // The skew rows compare with the skew-free rotate run at the same depth.
    double ref = rotate_ms;
    if (m.group == "skew")
      for (size_t k = 0; k < modes.size(); ++k)
        if (modes[k].group == "skew" && modes[k].skew_us == 0 && modes[k].order == UCM_ORDER_ROTATE &&
            modes[k].grace_us == kDefaultGrace)
          ref = res[k].task_ms;
    t.row({m.name, std::to_string(m.io_depth), std::to_string(r.grace_us), std::to_string(m.skew_us),
           fmt("%.1f", r.task_ms), fmt("%.1f", r.makespan_ms), fmt("%.2f", r.task_ms / ref),
           fmt("%.2f", double(r.node_loads) / double(r.unique)), list_u64(r.owner_loads),
           fmt("%.2f", balance(r.owner_loads)), std::to_string(r.peak), fmt("%.2f", r.mean_conc)});
  }
  t.print(*job, fmt("cold load, %d ranks (x rotate: task time over the skew-free rotate run at the same io depth)",
                    job->size).c_str());
  const double speedup = res[0].task_ms / rotate_ms, legacy = res[2].task_ms / rotate_ms;
  const double target = 0.9 * job->size;
  std::printf("  speedup of rotate over natural: %.2fx; over the emulated shard-by-shard legacy: %.2fx "
              "(target >= 0.9 x ranks = %.1fx)\n",
              speedup, legacy, target);
  bool unique_ok = true;
  for (const ColdResult& r : res) unique_ok = unique_ok && r.node_loads == r.unique;
  const size_t node_count = res[0].loads_per_node.size();  // 0: one node
  if (node_count > 1) {
    // The table above is rank 0's node (node 0); here every node's cache.
    Table tn({"mode", "node", "name", "ranks", "node loads", "unique", "loads/unique"});
    for (size_t i = 0; i < modes.size(); ++i)
      for (size_t n = 0; n < node_count; ++n) {
        const ColdResult& r = res[i];
        unique_ok = unique_ok && r.loads_per_node[n] == r.unique;
        tn.row({modes[i].name, std::to_string(n), r.node_names[n], std::to_string(r.ranks_per_node[n]),
                std::to_string(r.loads_per_node[n]), std::to_string(r.unique),
                fmt("%.2f", double(r.loads_per_node[n]) / double(r.unique))});
      }
    tn.print(*job, fmt("cold load per node, %zu nodes (one cache each; the table above is node 0's)", node_count)
                       .c_str());
  }
  std::printf("  exactly one backend load per unique shard in every mode%s: %s\n",
              node_count > 1 ? " on every node" : "", unique_ok ? "yes" : "NO");
  Json j = Json::object();
  j.set("ranks", job->size).set("shards_per_task", T).set("shard_bytes", o.shard_kib << 10);
  j.set("latency_us", o.latency_us).set("io_depth", o.io_depth).set("skew_io_depth", o.skew_io_depth);
  j.set("reps", o.reps).set("modes", std::move(jmodes));
  j.set("speedup_rotate_over_natural", speedup).set("speedup_rotate_over_shard_by_shard", legacy);
  j.set("target_speedup", target).set("one_load_per_unique_shard", unique_ok);
  if (node_count > 1) j.set("node_count", static_cast<int>(node_count));
  job->root.set("cold", std::move(j));
}

// ---- warm ---------------------------------------------------------------------

void run_warm(Job* job) {
  const Options& o = job->opt;
  const uint64_t shard = o.warm_shard_kib << 10;
  const uint32_t T = o.warm_shards;
  say(*job, "\n== warm: %u resident shards of %" PRIu64 " KiB per task (%.1f MiB), %d reps ==\n", T, o.warm_shard_kib,
      double(T) * double(shard) / (1 << 20), o.warm_reps);
  ucm_config_t cfg = base_config(*job, shard, T + 16, 1, std::max<uint32_t>(T, 64), sim_spec(100, 16));
  ucm_cache_t cache = open_cache(*job, cfg);
  ShardBuffer dst(T, shard), src(T, shard);
  std::vector<ucm_key_t> keys(T);
  for (uint32_t i = 0; i < T; ++i) {
    keys[i] = ukey((uint64_t{7} << 40) + i, 0);
    Key k;
    k.block = block_from_bytes(keys[i].block.bytes);
    k.shard = 0;
    sim_fill(k, src.at(i), shard);  // memcpy copies the very bytes the cache holds
  }
  const auto e = entries_for(keys, dst);
  dst.poison();
  load_and_wait(*job, cache, e.data(), e.size());  // the cold load that makes them resident
  verify_entries(job, "warm (first load)", e.data(), e.size(), shard);
  quiet_barrier();
  // The cache's own bytes, for the memcpy baseline that reads the same
  // memory the copier reads (rank 0's pins on them are taken and dropped
  // outside the timed region).
  Cache* impl = nullptr;
  if (resolve_handle(cache, &impl) != Result::kOk) die(*job, "resolve_handle", UCM_ERR_INTERNAL, "");
  CacheBuffer* cb = impl->buffer();
  quiet_barrier();
  const ucm_stats_t ns0 = node_stats(*job, cache);
  const double bytes = double(T) * double(shard);
  std::vector<GetResult> pins(T);
  // One timed copy of the task's bytes into dst: 0 the ucm task, 1 memcpy
  // from the cache's slots, 2 memcpy from a private copy. Verified after.
  auto measure = [&](int what) {
    dst.poison();
    if (what == 1) {
      for (uint32_t i = 0; i < T; ++i) {
        Key k;
        k.block = block_from_bytes(keys[i].block.bytes);
        k.shard = 0;
        if (cb->get(k, &pins[i]) != Result::kOk || pins[i].kind != GetKind::kHit)
          die(*job, "CacheBuffer::get", UCM_ERR_INTERNAL, "a warm shard was not a hit");
      }
    }
    const uint64_t t0 = now_ns();
    if (what == 0) {
      load_and_wait(*job, cache, e.data(), e.size());
    } else if (what == 1) {
      for (uint32_t i = 0; i < T; ++i) std::memcpy(dst.at(i), cb->data_at(pins[i].slot), shard);
    } else {
      for (uint32_t i = 0; i < T; ++i) std::memcpy(dst.at(i), src.at(i), shard);
    }
    const uint64_t t1 = now_ns();
    if (what == 1)
      for (uint32_t i = 0; i < T; ++i) cb->release(pins[i].slot);
    verify_entries(job, what == 0 ? "warm" : "warm (memcpy baseline)", e.data(), e.size(), shard);
    return bytes / double(t1 - t0);
  };
  // Two ways: each rank alone while the others sleep (its dispatcher,
  // copier and app thread then have the 2 cores), and all ranks at once
  // (4 copiers on 2 cores: a rank's time includes waiting for a CPU).
  std::vector<double> gbps[2][3];  // [alone, together][what]
  for (int together = 0; together < 2; ++together) {
    for (int rep = 0; rep < o.warm_reps; ++rep) {
      for (int turn = 0; turn < (together ? 1 : job->size); ++turn) {
        quiet_barrier();
        if (!together && turn != job->rank) continue;
        for (int phase = 0; phase < 3; ++phase) {
          // Rotate which goes first, so drifting load hits all three alike.
          const int what = (phase + rep) % 3;
          if (together) quiet_barrier();
          gbps[together][what].push_back(measure(what));
        }
      }
    }
  }
  quiet_barrier();
  const ucm_stats_t ns = stats_delta(node_stats(*job, cache), ns0);
  close_cache(*job, &cache);
  // Per rank: the medians, and the ratios of medians.
  std::vector<double> med[2][3];
  for (int g = 0; g < 2; ++g)
    for (int w = 0; w < 3; ++w) med[g][w] = allgather(median(gbps[g][w]));
  if (job->rank != 0) return;
  Json j = Json::object();
  j.set("ranks", job->size).set("shards_per_task", T).set("shard_bytes", shard).set("reps", o.warm_reps);
  double worst[2] = {0, 0};
  for (int g = 0; g < 2; ++g) {
    const char* how = g ? "together" : "alone";
    std::vector<double> r_slots, r_priv;
    for (int r = 0; r < job->size; ++r) {
      r_slots.push_back(med[g][0][r] / med[g][1][r]);
      r_priv.push_back(med[g][0][r] / med[g][2][r]);
    }
    worst[g] = vmin(r_slots);
    Table t({"rank", "ucm GB/s", "memcpy from slots GB/s", "ucm / that", "memcpy from private copy GB/s",
             "ucm / that"});
    for (int r = 0; r < job->size; ++r)
      t.row({std::to_string(r), fmt("%.2f", med[g][0][r]), fmt("%.2f", med[g][1][r]), fmt("%.1f%%", 100 * r_slots[r]),
             fmt("%.2f", med[g][2][r]), fmt("%.1f%%", 100 * r_priv[r])});
    t.row({"median", fmt("%.2f", median(med[g][0])), fmt("%.2f", median(med[g][1])),
           fmt("%.1f%%", 100 * median(r_slots)), fmt("%.2f", median(med[g][2])), fmt("%.1f%%", 100 * median(r_priv))});
    t.print(*job, g ? fmt("warm copy, all %d ranks at once: medians of %d reps per rank", job->size, o.warm_reps).c_str()
                    : fmt("warm copy, one rank at a time (the others asleep): medians of %d reps per rank", o.warm_reps)
                          .c_str());
    Json jg = Json::object();
    jg.set("ucm_gbps_per_rank", Json::array_of(med[g][0])).set("memcpy_slots_gbps_per_rank", Json::array_of(med[g][1]));
    jg.set("memcpy_private_gbps_per_rank", Json::array_of(med[g][2]));
    jg.set("ratio_per_rank", Json::array_of(r_slots)).set("ratio_median", median(r_slots)).set("ratio_worst", worst[g]);
    jg.set("ratio_private_per_rank", Json::array_of(r_priv));
    jg.set("rank0_ucm_gbps_reps", Json::array_of(gbps[g][0])).set("rank0_memcpy_slots_gbps_reps", Json::array_of(gbps[g][1]));
    jg.set("rank0_memcpy_private_gbps_reps", Json::array_of(gbps[g][2]));
    j.set(how, std::move(jg));
  }
  // The hits the library counts: the tasks' and the baseline's pins.
  const uint64_t expect_hits = 2 * 2 * uint64_t{T} * static_cast<uint64_t>(o.warm_reps) * static_cast<uint64_t>(job->size);
  std::printf("  node hits %" PRIu64 " of %" PRIu64 " gets (tasks and baseline pins; backend loads during the reps: %" PRIu64
              "); target ucm >= 90%% of memcpy from the same slots, worst rank: alone %.1f%% (%s), together %.1f%% (%s)\n",
              ns.hits, expect_hits, ns.owner_loads, 100 * worst[0], worst[0] >= 0.9 ? "met" : "MISSED", 100 * worst[1],
              worst[1] >= 0.9 ? "met" : "MISSED");
  j.set("node_stats", stats_json(ns)).set("expected_hits", expect_hits);
  job->root.set("warm", std::move(j));
}

}  // namespace ucm::bench

int main(int argc, char** argv) {
  using namespace ucm::bench;
  MPI_Init(&argc, &argv);
  Job job;
  MPI_Comm_rank(MPI_COMM_WORLD, &job.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &job.size);
  if (!parse_options(argc, argv, &job.opt)) {
    if (job.rank == 0) print_usage();
    MPI_Finalize();
    return 2;
  }
  char host[64] = {};
  gethostname(host, sizeof(host) - 1);
  std::string cmd;
  for (int i = 0; i < argc; ++i) {
    if (i) cmd += ' ';
    cmd += argv[i];
  }
  const double load0 = load_average();
  const time_t started = time(nullptr);
  char when[64];
  strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime(&started));
  say(job, "ucm_bench %s: %d ranks on %s (%ld CPUs online, load average %.2f)\n", ucm_version_string(), job.size,
      host, sysconf(_SC_NPROCESSORS_ONLN), load0);
  const uint64_t t0 = now_ns();
  for (const std::string& s : job.opt.scenarios) {
    if (s == "cold") run_cold(&job);
    else if (s == "warm") run_warm(&job);
    else if (s == "wait") run_wait(&job);
    else if (s == "evict") run_evict(&job);
    else if (s == "prealloc") run_prealloc(&job);
  }
  uint64_t bad = 0, checked = 0;
  MPI_Allreduce(&job.bad_shards, &bad, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  MPI_Allreduce(&job.shards_verified, &checked, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  const double seconds = double(now_ns() - t0) / 1e9;
  if (job.rank == 0) {
    Json m = Json::object();
    m.set("host", host).set("nproc", static_cast<int64_t>(sysconf(_SC_NPROCESSORS_ONLN)));
    m.set("load_average_start", load0).set("load_average_end", load_average()).set("started_utc", when);
    m.set("seconds", seconds).set("command", "mpirun -np " + std::to_string(job.size) + " " + cmd);
    job.root.set("version", ucm_version_string()).set("ranks", job.size).set("machine", std::move(m));
    job.root.set("verification", bad == 0 ? "every byte right" : "FAILED");
    job.root.set("shards_verified", checked).set("bad_shards", bad);
    FILE* f = std::fopen(job.opt.json.c_str(), "w");
    if (!f) {
      std::fprintf(stderr, "ucm_bench: cannot write %s: %s\n", job.opt.json.c_str(), std::strerror(errno));
    } else {
      std::fprintf(f, "%s\n", job.root.dump(2).c_str());
      std::fclose(f);
    }
    std::printf("\nverification: %s (%" PRIu64 " shards checked, %" PRIu64 " bad); %.1f s; JSON in %s\n",
                bad == 0 ? "every byte right" : "*** FAILED ***", checked, bad, seconds, job.opt.json.c_str());
  }
  MPI_Finalize();
  return bad == 0 ? 0 : 1;
}
