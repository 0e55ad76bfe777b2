// ucm_fanout_bench: fan-out against per-rank copies, in the same run, under
// mpirun (one node). For each mode it loads the same keys cold, then warm
// (--reps times), and reports the host-memory bytes read from the cache's
// slots per byte delivered to the ranks' destinations (the node's
// bytes_to_device over N x the task's bytes: 1.0 per-rank, 1/N with fan-out)
// and the warm wall time per task. On a machine without GPUs the engine is
// memcpy and the broadcasts are MPI's: the read ratio is the result, the
// speed is not (it needs NVLink GPUs and UCM_FANOUT=nccl; run with
// --mode nccl there). Every destination is checked byte for byte.
//
// mpirun -np 4 ucm_fanout_bench [--keys 256] [--shard-bytes 1M] [--reps 5]
//                               [--mode mpi|nccl] [--latency-us 100] [--json FILE]
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/sim_content.h"
#include "common/key.h"
#include "ucmcache/ucm.h"

namespace {

struct Options {
  uint64_t keys = 256;
  uint64_t shard_bytes = 1 << 20;
  int reps = 5;
  unsigned latency_us = 100;  // the sim store's per-load latency
  ucm_fanout_t mode = UCM_FANOUT_MPI;
  std::string json;
};

struct Outcome {
  double read_per_delivered = 0;
  double warm_ms = 0;
  uint64_t node_reads = 0, fallbacks = 0;
};

[[noreturn]] void die(int rank, const char* what, ucm_cache_t c) {
  std::fprintf(stderr, "rank %d: %s: %s\n", rank, what, ucm_last_error(c));
  MPI_Abort(MPI_COMM_WORLD, 2);
  std::abort();
}

ucm_key_t key_of(uint64_t i) {
  ucm_key_t k{};
  const uint64_t block = 900000 + i / 8, hi = ~block;
  std::memcpy(k.block.bytes, &block, 8);
  std::memcpy(k.block.bytes + 8, &hi, 8);
  k.shard = static_cast<uint32_t>(i % 8);
  return k;
}

Outcome run(const Options& o, ucm_fanout_t mode, int rank, int size) {
  ucm_config_t cfg;
  if (ucm_config_init(&cfg) != UCM_OK) die(rank, "ucm_config_init", nullptr);
  cfg.shard_bytes = o.shard_bytes;
  cfg.cache_bytes = (o.keys + 8) * o.shard_bytes;
  cfg.shards_per_block = 8;
  cfg.max_task_entries = static_cast<uint32_t>(o.keys);
  cfg.reserved_slots = 16;
  cfg.hugepages = UCM_HUGEPAGES_OFF;
  cfg.bind_threads = 0;
  cfg.fanout = mode;
  if (o.mode == UCM_FANOUT_MPI) cfg.copy_engine = UCM_COPY_ENGINE_HOST;
  // The sim store: its content is a function of the key, so every byte that
  // lands is checked without a dump first.
  std::snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=%u", o.latency_us);
  ucm_cache_t cache = nullptr;
  if (ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache) != UCM_OK) die(rank, "ucm_cache_init", nullptr);
  std::vector<std::vector<uint8_t>> buf(o.keys, std::vector<uint8_t>(o.shard_bytes));
  MPI_Barrier(MPI_COMM_WORLD);
  ucm_stats_t before{};
  before.struct_bytes = sizeof(before);
  if (ucm_cache_stats(cache, nullptr, &before) != UCM_OK) die(rank, "stats", cache);
  std::vector<ucm_load_entry_t> e(o.keys);
  double warm_s = 0;
  for (int rep = 0; rep <= o.reps; ++rep) {  // rep 0: the first (store) load, not timed
    for (uint64_t i = 0; i < o.keys; ++i) {
      std::memset(buf[i].data(), 0, o.shard_bytes);
      e[i] = {key_of(i), buf[i].data()};
    }
    MPI_Barrier(MPI_COMM_WORLD);
    const auto t0 = std::chrono::steady_clock::now();
    ucm_task_t t;
    if (ucm_load_task(cache, e.data(), e.size(), &t) != UCM_OK || ucm_task_wait(cache, t, -1) != UCM_OK)
      die(rank, "load", cache);
    MPI_Barrier(MPI_COMM_WORLD);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) warm_s += s;
    for (uint64_t i = 0; i < o.keys; ++i) {
      ucm::Key k;
      k.block = ucm::block_from_bytes(e[i].key.block.bytes);
      k.shard = e[i].key.shard;
      const uint64_t at = ucm::sim_verify(k, buf[i].data(), o.shard_bytes);
      if (at != o.shard_bytes) {
        std::fprintf(stderr, "rank %d: key %llu differs at byte %llu\n", rank, (unsigned long long)i,
                     (unsigned long long)at);
        MPI_Abort(MPI_COMM_WORLD, 3);
      }
    }
  }
  ucm_stats_t after{}, mine{};
  after.struct_bytes = mine.struct_bytes = sizeof(after);
  if (ucm_cache_stats(cache, &mine, &after) != UCM_OK) die(rank, "stats", cache);
  Outcome out;
  out.node_reads = after.bytes_to_device - before.bytes_to_device;
  const double delivered = static_cast<double>(size) * o.keys * o.shard_bytes * (o.reps + 1);
  out.read_per_delivered = static_cast<double>(out.node_reads) / delivered;
  out.warm_ms = o.reps ? warm_s * 1e3 / o.reps : 0;
  uint64_t fb = mine.fanout_fallbacks;
  MPI_Allreduce(&fb, &out.fallbacks, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
  if (ucm_cache_finalize(&cache) != UCM_OK) die(rank, "ucm_cache_finalize", nullptr);
  return out;
}

uint64_t parse_size(const char* s) {
  char* end = nullptr;
  uint64_t v = std::strtoull(s, &end, 10);
  if (*end == 'K' || *end == 'k') v <<= 10;
  if (*end == 'M' || *end == 'm') v <<= 20;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : "";
    if (a == "--keys") o.keys = std::strtoull(v, nullptr, 10), ++i;
    else if (a == "--shard-bytes") o.shard_bytes = parse_size(v), ++i;
    else if (a == "--reps") o.reps = std::atoi(v), ++i;
    else if (a == "--mode") o.mode = std::strcmp(v, "nccl") == 0 ? UCM_FANOUT_NCCL : UCM_FANOUT_MPI, ++i;
    else if (a == "--json") o.json = v, ++i;
    else if (a == "--latency-us") o.latency_us = static_cast<unsigned>(std::strtoul(v, nullptr, 10)), ++i;
    else {
      if (rank == 0)
        std::fprintf(stderr, "usage: mpirun -np N %s [--keys 256] [--shard-bytes 1M] [--reps 5] [--mode mpi|nccl] "
                     "[--latency-us 100] [--json FILE]\n", argv[0]);
      MPI_Finalize();
      return a == "--help" ? 0 : 1;
    }
  }
  if (o.keys == 0 || o.shard_bytes == 0 || o.reps < 0) {
    if (rank == 0) std::fprintf(stderr, "--keys and --shard-bytes must be > 0, --reps >= 0\n");
    MPI_Finalize();
    return 1;
  }
  const Outcome per_rank = run(o, UCM_FANOUT_OFF, rank, size);
  const Outcome fan = run(o, o.mode, rank, size);
  if (rank == 0) {
    const char* mode = o.mode == UCM_FANOUT_NCCL ? "nccl" : "mpi";
    std::printf("ucm_fanout_bench: %d ranks, %llu keys x %llu bytes, %d warm reps\n", size,
                (unsigned long long)o.keys, (unsigned long long)o.shard_bytes, o.reps);
    std::printf("%-22s %14s %12s\n", "mode", "read/delivered", "warm ms");
    std::printf("%-22s %14.4f %12.3f\n", "per-rank copies", per_rank.read_per_delivered, per_rank.warm_ms);
    std::printf("%-22s %14.4f %12.3f\n", (std::string("fan-out (") + mode + ")").c_str(), fan.read_per_delivered,
                fan.warm_ms);
    std::printf("host reads, fan-out / per-rank: %.4f (ideal 1/%d = %.4f); fallbacks %llu\n",
                per_rank.read_per_delivered > 0 ? fan.read_per_delivered / per_rank.read_per_delivered : 0.0, size,
                1.0 / size, (unsigned long long)fan.fallbacks);
    if (o.mode == UCM_FANOUT_MPI)
      std::printf("note: host engine and MPI broadcasts: the read ratio is the result; the speed of fan-out needs "
                  "NVLink GPUs (--mode nccl on a GPU node)\n");
    if (!o.json.empty()) {
      if (FILE* f = std::fopen(o.json.c_str(), "w")) {
        std::fprintf(f,
                     "{\"ranks\": %d, \"keys\": %llu, \"shard_bytes\": %llu, \"reps\": %d, \"mode\": \"%s\",\n"
                     " \"per_rank\": {\"read_per_delivered\": %.6f, \"warm_ms\": %.4f},\n"
                     " \"fanout\": {\"read_per_delivered\": %.6f, \"warm_ms\": %.4f, \"fallbacks\": %llu}}\n",
                     size, (unsigned long long)o.keys, (unsigned long long)o.shard_bytes, o.reps, mode,
                     per_rank.read_per_delivered, per_rank.warm_ms, fan.read_per_delivered, fan.warm_ms,
                     (unsigned long long)fan.fallbacks);
        std::fclose(f);
      }
    }
  }
  const bool good = fan.fallbacks == 0 && per_rank.read_per_delivered > 0.99 && per_rank.read_per_delivered < 1.01 &&
                    fan.read_per_delivered * size > 0.99 && fan.read_per_delivered * size < 1.01;
  MPI_Finalize();
  return good ? 0 : 4;
}
