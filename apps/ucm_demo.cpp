// ucm_demo: the main job. An MPI program shaped like an inference engine that
// uses ucmcache through its public C API only:
//
//   prefill  every rank computes the KV shards of a set of prompts (blocks,
//            one shard per layer) and dumps them: one write per shard per node
//   decode   steps that load the prompts back layer by layer (one task per
//            layer, one shard per block), touching the hot shared-prefix
//            blocks first, and verify every byte that lands
//
// With nothing configured it runs on the embedded default: the posix store in
// a fresh temporary directory (removed at the end), a cache smaller than the
// working set so that eviction and reloads happen. It prints a progress line
// per decode step and a summary: tasks, hit rate, backend loads per unique
// shard, GB/s, task latency percentiles.
//
//   mpirun -np 4 ucm_demo [--prompts 32] [--layers 16] [--shard-kib 256]
//                         [--cache-mib 48] [--steps 3] [--hot 4] [--store DIR]
//                         [--backend SPEC]
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ucmcache/ucm.h"

namespace {

struct Options {
  int prompts = 32;
  int layers = 16;
  uint64_t shard_kib = 256;
  uint64_t cache_mib = 48;
  int steps = 3;
  int hot = 4;
  std::string store;
  std::string backend;
};

[[noreturn]] void die(int rank, const char* what, ucm_result_t r, const char* detail) {
  std::fprintf(stderr, "ucm_demo rank %d: %s: %s: %s\n", rank, what, ucm_result_string(r), detail);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ucm_demo: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--prompts") o->prompts = std::atoi(next("--prompts"));
    else if (a == "--layers") o->layers = std::atoi(next("--layers"));
    else if (a == "--shard-kib") o->shard_kib = std::strtoull(next("--shard-kib"), nullptr, 10);
    else if (a == "--cache-mib") o->cache_mib = std::strtoull(next("--cache-mib"), nullptr, 10);
    else if (a == "--steps") o->steps = std::atoi(next("--steps"));
    else if (a == "--hot") o->hot = std::atoi(next("--hot"));
    else if (a == "--store") o->store = next("--store");
    else if (a == "--backend") o->backend = next("--backend");
    else if (a == "-h" || a == "--help") return false;
    else {
      std::fprintf(stderr, "ucm_demo: unknown argument %s\n", a.c_str());
      return false;
    }
  }
  if (o->prompts < 1 || o->layers < 1 || o->shard_kib < 4 || o->cache_mib < 1 || o->steps < 1 || o->hot < 0 ||
      o->hot > o->prompts) {
    std::fprintf(stderr, "ucm_demo: out-of-range option (prompts, layers >= 1; shard-kib >= 4; 0 <= hot <= prompts)\n");
    return false;
  }
  return true;
}

// The engine's KV content: a function of (block, layer, offset), so any rank
// can verify what it got. Blocks 0..hot-1 are a shared prefix.
uint64_t kv_word(uint64_t block, uint32_t layer, uint64_t i) {
  uint64_t z = block * 0x9E3779B97F4A7C15ull ^ (uint64_t{layer} << 48) ^ (i * 0xBF58476D1CE4E5B9ull);
  z = (z ^ (z >> 31)) * 0x94D049BB133111EBull;
  return z ^ (z >> 29);
}

void fill_kv(uint64_t block, uint32_t layer, uint8_t* p, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes / 8; ++i) {
    const uint64_t w = kv_word(block, layer, i);
    std::memcpy(p + 8 * i, &w, 8);
  }
}

bool check_kv(uint64_t block, uint32_t layer, const uint8_t* p, uint64_t bytes) {
  for (uint64_t i = 0; i < bytes / 8; ++i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    if (w != kv_word(block, layer, i)) return false;
  }
  return true;
}

ucm_block_t block_id(uint64_t prompt) {
  // A block id is a hash of the tokens; here, of the prompt number.
  ucm_block_t b;
  const uint64_t lo = kv_word(prompt, 0xffff, 1), hi = kv_word(prompt, 0xfffe, 2);
  std::memcpy(b.bytes, &lo, 8);
  std::memcpy(b.bytes + 8, &hi, 8);
  return b;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Options o;
  if (!parse(argc, argv, &o)) {
    if (rank == 0)
      std::fprintf(stderr, "usage: mpirun -np N ucm_demo [--prompts N] [--layers L] [--shard-kib K] [--cache-mib M] "
                           "[--steps S] [--hot H] [--store DIR] [--backend SPEC]\n");
    MPI_Finalize();
    return 2;
  }

  // The embedded default: a posix store in a fresh directory, made by rank 0.
  char store[512] = {};
  bool own_store = false;
  if (o.backend.empty()) {
    if (rank == 0) {
      if (!o.store.empty()) {
        std::snprintf(store, sizeof(store), "%s", o.store.c_str());
      } else {
        char tmpl[] = "/tmp/ucm_demo.XXXXXX";
        if (!mkdtemp(tmpl)) die(rank, "mkdtemp", UCM_ERR_SYSTEM, std::strerror(errno));
        std::snprintf(store, sizeof(store), "%s", tmpl);
        own_store = true;
      }
    }
    MPI_Bcast(store, sizeof(store), MPI_CHAR, 0, MPI_COMM_WORLD);
  }

  ucm_config_t cfg;
  ucm_result_t r = ucm_config_init(&cfg);
  if (r != UCM_OK) die(rank, "ucm_config_init", r, ucm_config_error());
  // The demo's destinations are host buffers (it verifies every byte on the
  // CPU), so it asks for the host engine even on a node with GPUs.
  if (!getenv("UCM_COPY_ENGINE")) cfg.copy_engine = UCM_COPY_ENGINE_HOST;
  cfg.shard_bytes = o.shard_kib << 10;
  cfg.shards_per_block = static_cast<uint32_t>(o.layers);
  if (!getenv("UCM_CACHE_BYTES")) cfg.cache_bytes = o.cache_mib << 20;
  if (!o.backend.empty()) std::snprintf(cfg.backend, sizeof(cfg.backend), "%s", o.backend.c_str());
  else if (!getenv("UCM_BACKEND")) std::snprintf(cfg.backend, sizeof(cfg.backend), "posix:%s", store);

  ucm_cache_t cache = nullptr;
  r = ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache);
  if (r != UCM_OK) die(rank, "ucm_cache_init", r, ucm_last_error(nullptr));
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  (void)ucm_cache_info(cache, &info);
  const uint64_t shard = cfg.shard_bytes;
  if (rank == 0)
    std::printf("ucm_demo: %d ranks (%d per node, %d nodes), %d prompts x %d layers x %" PRIu64
                " KiB = %.1f MiB of KV, cache %.1f MiB per node, store %s, copy engine %s\n",
                size, info.local_size, info.node_count, o.prompts, o.layers, shard >> 10,
                double(o.prompts) * o.layers * shard / (1 << 20), double(cfg.cache_bytes) / (1 << 20), cfg.backend,
                info.copy_engine);

  // ---- prefill: dump every prompt's KV, layer by layer ----------------------
  std::vector<uint8_t> kv(static_cast<size_t>(o.prompts) * shard);
  const auto t_prefill = std::chrono::steady_clock::now();
  for (int layer = 0; layer < o.layers; ++layer) {
    std::vector<ucm_dump_entry_t> es(o.prompts);
    for (int p = 0; p < o.prompts; ++p) {
      fill_kv(p, layer, kv.data() + p * shard, shard);
      es[p].key.block = block_id(p);
      es[p].key.shard = static_cast<uint32_t>(layer);
      es[p].key.reserved = 0;
      es[p].src = kv.data() + p * shard;
    }
    ucm_task_t t;
    if ((r = ucm_dump_task(cache, es.data(), es.size(), &t)) != UCM_OK) die(rank, "ucm_dump_task", r, ucm_last_error(cache));
    if ((r = ucm_task_wait(cache, t, -1)) != UCM_OK) die(rank, "dump task", r, ucm_last_error(cache));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double prefill_s = seconds_since(t_prefill);

  // ---- decode: load the prompts back, layer by layer -------------------------
  std::vector<ucm_block_t> hot(o.hot);
  for (int p = 0; p < o.hot; ++p) hot[p] = block_id(p);
  std::fill(kv.begin(), kv.end(), 0);
  uint64_t bad = 0, tasks = 0;
  const auto t_decode = std::chrono::steady_clock::now();
  for (int step = 0; step < o.steps; ++step) {
    if (!hot.empty() && (r = ucm_touch(cache, hot.data(), hot.size())) != UCM_OK)
      die(rank, "ucm_touch", r, ucm_last_error(cache));
    for (int layer = 0; layer < o.layers; ++layer) {
      std::vector<ucm_load_entry_t> es(o.prompts);
      for (int p = 0; p < o.prompts; ++p) {
        es[p].key.block = block_id(p);
        es[p].key.shard = static_cast<uint32_t>(layer);
        es[p].key.reserved = 0;
        es[p].dst = kv.data() + p * shard;
      }
      ucm_task_t t;
      if ((r = ucm_load_task(cache, es.data(), es.size(), &t)) != UCM_OK) die(rank, "ucm_load_task", r, ucm_last_error(cache));
      if ((r = ucm_task_wait(cache, t, -1)) != UCM_OK) die(rank, "load task", r, ucm_last_error(cache));
      ++tasks;
      for (int p = 0; p < o.prompts; ++p)
        if (!check_kv(p, layer, kv.data() + p * shard, shard)) ++bad;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
      ucm_stats_t ns{};
      ns.struct_bytes = sizeof(ns);
      (void)ucm_cache_stats(cache, nullptr, &ns);
      std::printf("  decode step %d/%d: %" PRIu64 " backend loads, %" PRIu64 " hits, %" PRIu64 " evictions so far (node 0)\n",
                  step + 1, o.steps, ns.owner_loads, ns.hits, ns.evictions);
      std::fflush(stdout);
    }
  }
  const double decode_s = seconds_since(t_decode);

  // ---- summary -----------------------------------------------------------
  ucm_stats_t mine{}, node{};
  mine.struct_bytes = node.struct_bytes = sizeof(ucm_stats_t);
  (void)ucm_cache_stats(cache, &mine, &node);
  uint64_t bad_all = 0, loads_all = 0, leaders = 0;
  const uint64_t node_loads = info.local_rank == 0 ? node.owner_loads : 0;
  const uint64_t leader = info.local_rank == 0 ? 1 : 0;
  MPI_Reduce(&bad, &bad_all, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&node_loads, &loads_all, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&leader, &leaders, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  double gbps = double(mine.bytes_to_device) / decode_s / 1e9, gbps_all = 0;
  MPI_Reduce(&gbps, &gbps_all, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    const double unique = double(o.prompts) * o.layers;
    const double asked = double(node.hits + node.owner_loads + node.waits);
    std::printf("ucm_demo summary (node 0 unless said):\n");
    std::printf("  prefill: %.3f s, %" PRIu64 " shards written through once per node (%.0f unique)\n", prefill_s,
                node.dumps, unique);
    std::printf("  decode:  %" PRIu64 " tasks per rank in %.3f s, hit rate %.1f%%, waits %" PRIu64 ", evictions %" PRIu64
                ", prealloc %" PRIu64 " made / %" PRIu64 " used\n",
                tasks, decode_s, asked > 0 ? 100.0 * double(node.hits) / asked : 0.0, node.waits, node.evictions,
                node.prealloc_made, node.prealloc_used);
    std::printf("  backend loads per unique shard per node: %.2f (%" PRIu64 " loads over %" PRIu64 " nodes)\n",
                double(loads_all) / double(leaders) / unique, loads_all, leaders);
    std::printf("  copy bandwidth: %.2f GB/s per rank, %.2f GB/s all ranks\n", gbps, gbps_all);
    std::printf("  task latency: p50 <= %" PRIu64 " us, p90 <= %" PRIu64 " us, p99 <= %" PRIu64 " us\n",
                node.latency_p50_us, node.latency_p90_us, node.latency_p99_us);
    std::printf("  verification: %s (%" PRIu64 " bad shards)\n", bad_all == 0 ? "every byte right" : "FAILED", bad_all);
  }
  r = ucm_cache_finalize(&cache);
  if (r != UCM_OK) die(rank, "ucm_cache_finalize", r, ucm_last_error(nullptr));
  MPI_Barrier(MPI_COMM_WORLD);
  if (own_store) std::filesystem::remove_all(store);
  MPI_Finalize();
  return bad_all == 0 || rank != 0 ? (bad == 0 ? 0 : 1) : 1;
}
