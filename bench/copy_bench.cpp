// ucm_copy_bench: the host engine's copy (host_copy, device/host_copy.h)
// against memcpy, same buffers, same run.
//
//   ucm_copy_bench [--reps 5] [--set-mib 16] [--check]
//
// For each shard size (4 KiB, 16 KiB, 256 KiB, 2 MiB) and each skew of the
// destination against the page-aligned source (0: aligned alike; 16: malloc's
// large blocks, as an application's std::vector is), copies a working set of
// --set-mib MiB (at least 64 shards) shard by shard, first with memcpy, then
// with host_copy, then again, `reps` times, each timing the best of 9 passes.
// Printed per row: GB/s of each (median over the reps) and host_copy's rate
// over memcpy's, median (lowest-highest) of the per-rep ratios, and the path
// host_copy takes there (the vector loop wherever it applies: no calibration
// here), then what the cache's calibration at init measures and keeps for
// each size (device/host_copy.h). --check (suite bench) only checks the bytes
// of every copy, never a time.
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "device/host_copy.h"

namespace {

double now_s() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

uint8_t* map(size_t bytes) {
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) {
    std::perror("ucm_copy_bench: mmap");
    std::exit(2);
  }
  std::memset(m, 0, bytes);
  return static_cast<uint8_t*>(m);
}

struct Row {
  size_t shard;
  size_t skew;
  std::vector<double> mem, host, ratio;
};

using CopyFn = void (*)(void*, const void*, size_t);

void plain_memcpy(void* d, const void* s, size_t n) { std::memcpy(d, s, n); }

// Bytes per second of the best of `passes` passes over the set.
double rate(CopyFn f, uint8_t* dst, const uint8_t* src, size_t shard, size_t count, int passes) {
  double best = 1e30;
  for (int p = 0; p < passes; ++p) {
    const double t0 = now_s();
    for (size_t i = 0; i < count; ++i) f(dst + i * shard, src + i * shard, shard);
    best = std::min(best, now_s() - t0);
  }
  return double(shard * count) / best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int check(uint8_t* dst, const uint8_t* src, size_t shard, size_t count) {
  std::memset(dst, 0, shard * count);
  for (size_t i = 0; i < count; ++i) ucm::host_copy(dst + i * shard, src + i * shard, shard);
  return std::memcmp(dst, src, shard * count) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  size_t set_mib = 16;
  bool only_check = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--set-mib" && i + 1 < argc) {
      set_mib = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--check") {
      only_check = true;
    } else {
      std::fprintf(stderr, "ucm_copy_bench: bad argument %s (see the file's header)\n", a.c_str());
      return 2;
    }
  }
  if (reps < 1 || reps > 1000 || set_mib < 1 || set_mib > 4096) {
    std::fprintf(stderr, "ucm_copy_bench: --reps %d (1-1000) or --set-mib %zu (1-4096) out of range\n", reps, set_mib);
    return 2;
  }
  const size_t shards[] = {4096, 16384, 262144, 2097152};
  const size_t max_set = std::max(set_mib << 20, size_t{64} * 2097152);
  uint8_t* src = map(max_set);
  uint8_t* dst = map(max_set + 4096);
  for (size_t i = 0; i < max_set; ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  std::vector<Row> rows;
  for (size_t shard : shards)
    for (size_t skew : {size_t{0}, size_t{16}}) rows.push_back(Row{shard, skew, {}, {}, {}});
  int bad = 0;
  for (Row& r : rows) {
    const size_t count = std::max<size_t>(64, (set_mib << 20) / r.shard);
    bad += check(dst + r.skew, src, r.shard, count);
  }
  std::printf("ucm_copy_bench: vector path %s\n",
              ucm::vector_copy_available() ? "available (AVX2)" : "unavailable (memcpy only)");
  if (bad != 0 || only_check) {
    std::printf("check: %s\n", bad == 0 ? "every copy byte-exact" : "a copy was wrong");
    return bad == 0 ? 0 : 1;
  }
  std::printf("%d reps (outermost), each the best of 9 passes over %zu MiB\n", reps, set_mib);
  for (int rep = 0; rep < reps; ++rep)
    for (Row& r : rows) {
      const size_t count = std::max<size_t>(64, (set_mib << 20) / r.shard);
      const double m = rate(&plain_memcpy, dst + r.skew, src, r.shard, count, 9);
      const double h = rate(&ucm::host_copy, dst + r.skew, src, r.shard, count, 9);
      r.mem.push_back(m);
      r.host.push_back(h);
      r.ratio.push_back(h / m);
    }
  std::printf("%-9s %-5s %-7s %10s %10s  %s\n", "shard", "skew", "path", "memcpy", "host_copy", "host_copy / memcpy");
  for (Row& r : rows) {
    const bool vec = ucm::host_copy_path(dst + r.skew, src, r.shard) == ucm::CopyPath::kVector;
    std::printf("%7zu B %5zu %-7s %7.2f GB/s %7.2f GB/s  %.3f (%.3f-%.3f)\n", r.shard, r.skew, vec ? "vector" : "memcpy",
                median(r.mem) / 1e9, median(r.host) / 1e9, median(r.ratio),
                *std::min_element(r.ratio.begin(), r.ratio.end()), *std::max_element(r.ratio.begin(), r.ratio.end()));
  }
  // What ucm_cache_init measures for its shard size (host engine), and keeps:
  // the rows above take the vector loop wherever it applies (no calibration).
  std::printf("calibration (as ucm_cache_init runs it, into a +16 destination, in the CPU's caches):\n");
  for (size_t shard : shards) {
    const ucm::CopyCalibration c = ucm::calibrate_host_copy(shard);
    if (c.bytes == 0) {
      std::printf("%7zu B: not measured (memcpy at this size)\n", shard);
      continue;
    }
    std::printf("%7zu B: vector loop %6.2f GB/s, memcpy %6.2f GB/s: keeps %s\n", shard, c.vector_gbs, c.memcpy_gbs,
                c.vector ? "the vector loop" : "memcpy");
  }
  return 0;
}
