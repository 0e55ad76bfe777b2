// ucm_h2d_bench: what the library's warm path costs against the plain CUDA
// copy it wraps. Run under mpirun with 1..4 ranks on one GPU:
//
//   mpirun -np 2 ucm_h2d_bench [--quick] [--hugepages on|off|auto]
//                             [--shards 64K,256K,1M,4M] [--bytes 256M] [--iters 5]
//                             [--json out.json]
//
// Per shard size, every rank loads the same working set (--bytes) into
// cudaMalloc memory: once cold (from the sim store, so the node cache holds
// it), then --iters times warm through ucm_load_task (slot -> device, the
// path this library exists for). In the same run, the same bytes go from a
// cudaMallocHost buffer with one cudaMemcpyAsync per shard on one stream.
// Ranks step together (barriers), so a row's GB/s is the node's: all ranks'
// bytes over the slowest rank's time. It also reports the registration time
// of the data plane (ucm_cache_info.register_seconds) per GiB. Without a
// device it says why and exits 0 (JSON with "device": null).
#include <mpi.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ucmcache/ucm.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

uint64_t parse_size(const std::string& s) {
  char* end = nullptr;
  uint64_t v = std::strtoull(s.c_str(), &end, 10);
  if (*end == 'K' || *end == 'k') v <<= 10;
  else if (*end == 'M' || *end == 'm') v <<= 20;
  else if (*end == 'G' || *end == 'g') v <<= 30;
  return v;
}

struct Options {
  std::vector<uint64_t> shards{64 << 10, 256 << 10, 1 << 20, 4 << 20};
  uint64_t bytes = 256ull << 20;  // working set per rank and shard size
  int iters = 5;
  ucm_hugepages_t huge = UCM_HUGEPAGES_AUTO;
  std::string json;
};

struct Row {
  uint64_t shard;
  double ucm_gbs, cuda_gbs;
  double ucm_p50_task_ms;
  double register_s, register_s_per_gib;
  int hugetlb;
};

ucm_key_t key_of(uint64_t b, uint32_t s) {
  ucm_key_t k{};
  std::memcpy(k.block.bytes, &b, 8);
  k.shard = s;
  return k;
}

// Seconds of the slowest rank.
double max_over_ranks(double v) {
  double m = 0;
  MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

bool run_shard(const Options& o, uint64_t shard, int rank, int size, Row* row, std::string* why) {
  const uint64_t n = std::max<uint64_t>(1, o.bytes / shard);
  ucm_config_t cfg;
  if (ucm_config_init(&cfg) != UCM_OK) return *why = ucm_config_error(), false;
  cfg.copy_engine = UCM_COPY_ENGINE_CUDA;
  cfg.shard_bytes = shard;
  cfg.shards_per_block = 1;
  cfg.cache_bytes = (n + 16) * shard;
  cfg.max_task_entries = static_cast<uint32_t>(std::max<uint64_t>(n, 1));
  cfg.hugepages = o.huge;
  cfg.bind_threads = 1;
  std::snprintf(cfg.backend, sizeof(cfg.backend), "sim:latency_us=0");
  ucm_cache_t cache = nullptr;
  if (ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache) != UCM_OK) return *why = ucm_last_error(nullptr), false;
  ucm_cache_info_t info{};
  info.struct_bytes = sizeof(info);
  (void)ucm_cache_info(cache, &info);

  void* dev = nullptr;
  void* pinned = nullptr;
  cudaStream_t stream = nullptr;
  bool okay = cudaMalloc(&dev, n * shard) == cudaSuccess && cudaMallocHost(&pinned, n * shard) == cudaSuccess &&
              cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess;
  if (!okay) *why = "cudaMalloc/cudaMallocHost/cudaStreamCreate failed";
  std::vector<ucm_load_entry_t> es(n);
  for (uint64_t i = 0; i < n; ++i) es[i] = ucm_load_entry_t{key_of(1000 + i, 0), static_cast<uint8_t*>(dev) + i * shard};
  std::vector<double> task_s;
  double ucm_total = 0, cuda_total = 0;
  if (okay) {
    std::memset(pinned, 0x5a, n * shard);
    ucm_task_t t = 0;
    // Cold: fills the node cache from the store.
    okay = ucm_load_task(cache, es.data(), n, &t) == UCM_OK && ucm_task_wait(cache, t, 120000) == UCM_OK;
    if (!okay) *why = ucm_last_error(cache);
    for (int it = 0; okay && it < o.iters; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double a = now_s();
      okay = ucm_load_task(cache, es.data(), n, &t) == UCM_OK && ucm_task_wait(cache, t, 120000) == UCM_OK;
      const double mine = now_s() - a;
      if (!okay) *why = ucm_last_error(cache);
      task_s.push_back(mine);
      ucm_total += max_over_ranks(mine);

      MPI_Barrier(MPI_COMM_WORLD);
      const double b = now_s();
      for (uint64_t i = 0; i < n; ++i)
        (void)cudaMemcpyAsync(static_cast<uint8_t*>(dev) + i * shard, static_cast<uint8_t*>(pinned) + i * shard, shard,
                              cudaMemcpyHostToDevice, stream);
      okay = okay && cudaStreamSynchronize(stream) == cudaSuccess;
      cuda_total += max_over_ranks(now_s() - b);
    }
  }
  if (stream) (void)cudaStreamDestroy(stream);
  if (pinned) (void)cudaFreeHost(pinned);
  if (dev) (void)cudaFree(dev);
  (void)ucm_cache_finalize(&cache);
  if (!okay) return false;
  std::sort(task_s.begin(), task_s.end());
  const double node_bytes = static_cast<double>(n * shard) * size * o.iters;
  row->shard = shard;
  row->ucm_gbs = node_bytes / ucm_total / 1e9;
  row->cuda_gbs = node_bytes / cuda_total / 1e9;
  row->ucm_p50_task_ms = task_s[task_s.size() / 2] * 1e3;
  row->register_s = max_over_ranks(info.register_seconds);
  row->register_s_per_gib = info.data_bytes ? row->register_s / (static_cast<double>(info.data_bytes) / (1 << 30)) : 0;
  row->hugetlb = info.hugetlb;
  (void)rank;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--quick") {
      o.bytes = 64ull << 20;
      o.iters = 3;
    } else if (a == "--bytes") {
      o.bytes = parse_size(next());
    } else if (a == "--iters") {
      o.iters = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--hugepages") {
      const std::string v = next();
      o.huge = v == "on" ? UCM_HUGEPAGES_ON : v == "off" ? UCM_HUGEPAGES_OFF : UCM_HUGEPAGES_AUTO;
    } else if (a == "--shards") {
      o.shards.clear();
      std::string v = next();
      for (size_t p = 0; p < v.size();) {
        const size_t c = v.find(',', p);
        o.shards.push_back(parse_size(v.substr(p, c == std::string::npos ? std::string::npos : c - p)));
        p = c == std::string::npos ? v.size() : c + 1;
      }
    } else if (a == "--json") {
      o.json = next();
    } else {
      if (rank == 0) std::fprintf(stderr, "usage: ucm_h2d_bench [--quick] [--bytes N] [--iters N] [--hugepages on|off|auto] [--shards 64K,1M] [--json FILE]\n");
      MPI_Finalize();
      return 2;
    }
  }
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  std::string reason = e == cudaSuccess ? (devices ? "" : "no CUDA device") : cudaGetErrorString(e);
  if (e != cudaSuccess) (void)cudaGetLastError();
  FILE* js = nullptr;
  if (rank == 0 && !o.json.empty()) js = std::fopen(o.json.c_str(), "w");
  if (!reason.empty()) {
    if (rank == 0) std::printf("ucm_h2d_bench: no device: %s\n", reason.c_str());
    if (js) std::fprintf(js, "{\"bench\": \"h2d\", \"device\": null, \"reason\": \"%s\"}\n", reason.c_str()), std::fclose(js);
    MPI_Finalize();
    return 0;
  }
  cudaDeviceProp prop{};
  (void)cudaGetDeviceProperties(&prop, 0);
  if (rank == 0) {
    std::printf("ucm_h2d_bench: %d rank(s) on %s, %llu MiB per rank, %d warm iterations, hugepages=%s\n", size,
                prop.name, static_cast<unsigned long long>(o.bytes >> 20), o.iters,
                o.huge == UCM_HUGEPAGES_ON ? "on" : o.huge == UCM_HUGEPAGES_OFF ? "off" : "auto");
    std::printf("%10s %12s %14s %8s %14s %12s %10s %8s\n", "shard", "ucm GB/s", "cudaMemcpy GB/s", "ratio",
                "ucm task p50", "register s", "s per GiB", "hugetlb");
  }
  if (js) std::fprintf(js, "{\"bench\": \"h2d\", \"device\": \"%s\", \"ranks\": %d, \"bytes_per_rank\": %llu, "
                           "\"iters\": %d, \"rows\": [", prop.name, size, static_cast<unsigned long long>(o.bytes), o.iters);
  int status = 0;
  bool first = true;
  for (uint64_t shard : o.shards) {
    Row row{};
    std::string why;
    const bool ran = run_shard(o, shard, rank, size, &row, &why);
    if (!ran) {
      status = 1;
      if (rank == 0) std::printf("%9lluK failed: %s\n", static_cast<unsigned long long>(shard >> 10), why.c_str());
      continue;
    }
    if (rank == 0) {
      std::printf("%9lluK %12.2f %14.2f %8.2f %12.3fms %12.3f %10.3f %8d\n", static_cast<unsigned long long>(shard >> 10),
                  row.ucm_gbs, row.cuda_gbs, row.ucm_gbs / row.cuda_gbs, row.ucm_p50_task_ms, row.register_s,
                  row.register_s_per_gib, row.hugetlb);
      std::fflush(stdout);
    }
    if (js)
      std::fprintf(js, "%s{\"shard_bytes\": %llu, \"ucm_gbs\": %.3f, \"cuda_gbs\": %.3f, \"ratio\": %.3f, "
                       "\"ucm_task_p50_ms\": %.3f, \"register_s\": %.4f, \"register_s_per_gib\": %.4f, \"hugetlb\": %d}",
                   first ? "" : ", ", static_cast<unsigned long long>(row.shard), row.ucm_gbs, row.cuda_gbs,
                   row.ucm_gbs / row.cuda_gbs, row.ucm_p50_task_ms, row.register_s, row.register_s_per_gib, row.hugetlb);
    first = false;
  }
  if (js) std::fprintf(js, "]}\n"), std::fclose(js);
  MPI_Finalize();
  return status;
}
