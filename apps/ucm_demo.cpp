// ucm_demo: the main job. An MPI program shaped like an inference engine that
// uses ucmcache through its public C API only:
//
//   prefill  every rank computes the KV shards of a set of prompts (blocks,
//            one shard per layer) and dumps them: one write per shard per node
//   decode   steps that load the prompts back layer by layer (one task per
//            layer, one shard per block), touching the hot shared-prefix
//            blocks first, and verify every byte that lands. As an engine
//            prefetches, up to --window W layer tasks are in flight (default
//            2): layer l is verified while layers l+1..l+W-1 load, each into
//            its own part of the KV buffer (--kv-layers B layers of it, at
//            least W). --window 1 is the old demo: submit, wait, verify, next.
//            A task that fails (a corrupt shard in the store) is reported,
//            its shards counted bad, and decode goes on; the run then exits 1.
//
// With nothing configured it runs on the embedded default: the posix store in
// a fresh temporary directory (removed at the end), a cache smaller than the
// working set so that eviction and reloads happen. It prints a progress line
// per decode step and a summary: tasks, hit rate, backend loads per unique
// shard, GB/s, task latency percentiles, and its own bound (demo_bound.h):
// the raw O_DIRECT read rate of the store's files measured after decode, the
// fewest loads this cache size allows (Belady's MIN on the node's sequence of
// shard requests, from what the cache held when decode began), the decode
// time those allow, and the fraction of it reached. Issue 15 counts the
// fewest loads another way, as what 1 rank loads on the same cache: a 1-rank
// run reports its own, an N-rank run takes it from --one-rank-loads. Beside
// the store's bound, the cpus': every rank copies each shard it asks for into
// its KV buffer, and the node's copies at the memcpy rate measured in the
// same run on min(local ranks, cpus) threads take the cpu bound; the summary
// says which of the two is binding (the larger) and the fraction of it
// reached ("bound, cpu:" and "bound, binding:" lines; bound.cpu_bound_s,
// bound.binding, bound.fraction_binding in --json), and the verification's
// own rate ("verifying:", pipeline.verify_GBps_per_core).
//
//   mpirun -np 4 ucm_demo [--prompts 32] [--layers 16] [--shard-kib 256]
//                         [--cache-mib 48] [--steps 3] [--hot 4] [--store DIR]
//                         [--backend SPEC] [--raw-passes 5] [--one-rank-loads N]
//                         [--window 2] [--kv-layers B] [--decode-only]
//                         [--json PATH]
//
// --decode-only skips prefill: the store (--store DIR, kept from an earlier
// run with the same sizes) already holds the prompts, as after a restart.
#include <dirent.h>
#include <mpi.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <string>
#include <vector>

#include "demo_bound.h"
#include "demo_kv.h"
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
  int raw_passes = 5;            // at least this many raw-read passes (and 0.25 s); 0: no raw read, no bound
  int64_t one_rank_loads = -1;   // the count of the fewest loads, from a 1-rank run
  int window = 2;                // layer tasks in flight (1: submit, wait, verify, next)
  int kv_layers = 0;             // layers of KV buffer per rank (0: as the window needs, kv_layers_for)
  bool decode_only = false;      // the store already holds the prompts (--store DIR of an earlier run)
  std::string json;
};

// A whole-number option, or exit 2 naming the value (parse() checks the range).
int int_arg(const char* name, const char* v) {
  char* end = nullptr;
  errno = 0;
  const long x = std::strtol(v, &end, 10);
  if (x < INT32_MIN || x > INT32_MAX) errno = ERANGE;
  if (errno != 0 || end == v || *end != '\0') {
    std::fprintf(stderr, "ucm_demo: %s %s: not a whole number%s\n", name, v, errno == ERANGE ? " that fits" : "");
    std::exit(2);
  }
  return static_cast<int>(x);
}

[[noreturn]] void die(int rank, const char* what, ucm_result_t r, const char* detail) {
  std::fprintf(stderr, "ucm_demo rank %d: %s: %s: %s\n", rank, what, ucm_result_string(r), detail);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

// Tasks in flight per rank at most (well under the cache's pending limit).
constexpr int kMaxWindow = 256;

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
    else if (a == "--raw-passes") o->raw_passes = std::atoi(next("--raw-passes"));
    else if (a == "--one-rank-loads") o->one_rank_loads = std::atoll(next("--one-rank-loads"));
    else if (a == "--window") o->window = int_arg("--window", next("--window"));
    else if (a == "--kv-layers") o->kv_layers = int_arg("--kv-layers", next("--kv-layers"));
    else if (a == "--decode-only") o->decode_only = true;
    else if (a == "--json") o->json = next("--json");
    else if (a == "-h" || a == "--help") return false;
    else {
      std::fprintf(stderr, "ucm_demo: unknown argument %s\n", a.c_str());
      return false;
    }
  }
  if (o->prompts < 1 || o->layers < 1 || o->shard_kib < 4 || o->cache_mib < 1 || o->steps < 1 || o->hot < 0 ||
      o->hot > o->prompts || o->raw_passes < 0 || o->raw_passes > 100 || o->one_rank_loads < -1) {
    std::fprintf(stderr, "ucm_demo: out-of-range option (prompts, layers >= 1; shard-kib >= 4; 0 <= hot <= prompts; "
                         "0 <= raw-passes <= 100; one-rank-loads >= 0)\n");
    return false;
  }
  if (uint64_t(o->layers) > ucm_demo::kMaxKvLayers) {
    std::fprintf(stderr, "ucm_demo: --layers %d: at most %" PRIu64 " (the KV content tells that many layers apart)\n",
                 o->layers, ucm_demo::kMaxKvLayers);
    return false;
  }
  if (o->window < 1) {
    std::fprintf(stderr, "ucm_demo: --window %d: at least 1 (1: each layer's task is submitted, waited for and "
                         "verified before the next)\n", o->window);
    return false;
  }
  if (o->window > kMaxWindow) {
    std::fprintf(stderr, "ucm_demo: --window %d: at most %d tasks in flight\n", o->window, kMaxWindow);
    return false;
  }
  if (o->kv_layers < 0) {
    std::fprintf(stderr, "ucm_demo: --kv-layers %d: at least 1 (or 0: as many as the window needs)\n", o->kv_layers);
    return false;
  }
  if (o->kv_layers > 0 && o->kv_layers < o->window) {
    std::fprintf(stderr, "ucm_demo: --window %d is larger than the KV buffer allows: --kv-layers %d holds %d layers, "
                         "and each task in flight loads a layer into its own part of it\n",
                 o->window, o->kv_layers, o->kv_layers);
    return false;
  }
  if (o->kv_layers > kMaxWindow + 1) {
    std::fprintf(stderr, "ucm_demo: --kv-layers %d: at most %d\n", o->kv_layers, kMaxWindow + 1);
    return false;
  }
  if (o->decode_only && o->store.empty() && o->backend.empty()) {
    std::fprintf(stderr, "ucm_demo: --decode-only needs the store an earlier run wrote (--store DIR)\n");
    return false;
  }
  if (o->kv_layers == 0) o->kv_layers = ucm_demo::kv_parts_for(o->window, o->layers);
  return true;
}

// The engine's KV content (demo_kv.h): a function of (block, layer, offset),
// so any rank can verify what it got. Blocks 0..hot-1 are a shared prefix.
ucm_block_t block_id(uint64_t prompt) {
  // A block id is a hash of the tokens; here, of the prompt number.
  ucm_block_t b;
  const uint64_t lo = ucm_demo::block_id_word(prompt, 0), hi = ucm_demo::block_id_word(prompt, 1);
  std::memcpy(b.bytes, &lo, 8);
  std::memcpy(b.bytes + 8, &hi, 8);
  return b;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The posix store's directory and I/O threads from a backend spec
// "posix:/dir[,depth=8][,...]" (the path runs to the first ',' that starts
// one of the store's options); false for any other store.
bool posix_store(const std::string& spec, std::string* dir, uint32_t* depth) {
  if (spec.rfind("posix:", 0) != 0) return false;
  std::string rest = spec.substr(6);
  *depth = 8;
  size_t cut = std::string::npos;
  for (const char* k : {",depth=", ",direct=", ",sync=", ",file_mode=", ",engine="}) cut = std::min(cut, rest.find(k));
  *dir = rest.substr(0, cut);
  const size_t d = rest.find(",depth=", cut == std::string::npos ? 0 : cut);
  if (d != std::string::npos) *depth = static_cast<uint32_t>(std::max(1, std::atoi(rest.c_str() + d + 7)));
  return true;
}

// The block files in the store's directory, in name order.
std::vector<std::string> store_files(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.size() > 7 && n.compare(n.size() - 7, 7, ".ucmblk") == 0) out.push_back(dir + "/" + n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A task's wait is bounded (a hung store fails the run instead of hanging it).
constexpr int64_t kTaskWaitMs = 600'000;

uint64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

// This process's CPU time (every thread: the app's, the cache's dispatcher
// and copier, the store's I/O threads) and context switches, and this
// thread's CPU time.
struct Usage {
  double cpu_s = 0, thread_cpu_s = 0;
  uint64_t vcsw = 0, ivcsw = 0;
};
Usage usage_now() {
  Usage u;
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) == 0) {
    u.cpu_s = double(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + 1e-6 * double(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    u.vcsw = uint64_t(ru.ru_nvcsw);
    u.ivcsw = uint64_t(ru.ru_nivcsw);
  }
  u.thread_cpu_s = double(thread_cpu_ns()) / 1e9;
  return u;
}

// The CPUs the ranks on this rank's node may run on (the union of their
// affinities: a rank bound to one core still shares the node's others).
int usable_cpus() {
  cpu_set_t set, all;
  CPU_ZERO(&set);
  CPU_ZERO(&all);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) CPU_SET(0, &set);
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Allreduce(&set, &all, sizeof(set), MPI_BYTE, MPI_BOR, node);
  MPI_Comm_free(&node);
  return std::max(1, CPU_COUNT(&all));
}

// The cpu bound's memcpy buffers per thread: source and destination together
// twice a 32 MiB last-level cache, so the rate is memory's, as the copies
// out of the cache's data plane are.
constexpr uint64_t kCopyRateBytes = uint64_t{32} << 20;

// The raw read runs its passes for at least this long (and at least
// --raw-passes of them), so that its best pass is a quiet one.
constexpr double kRawMinSeconds = 0.25;

// A barrier whose waiters sleep (1 ms naps) instead of spinning in MPI, so the
// ranks that wait take no CPU from the one that measures the raw read rate.
void quiet_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    const timespec nap{0, 1000000};
    nanosleep(&nap, nullptr);
  }
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
                           "[--steps S] [--hot H] [--store DIR] [--backend SPEC] [--raw-passes P] "
                           "[--one-rank-loads N] [--window W] [--kv-layers B] [--decode-only] [--json PATH]\n");
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
  // Collective (the node's ranks): here, not where rank 0 measures the bound
  // and the others must nap rather than poll in MPI.
  const int cpus = usable_cpus();
  if (rank == 0)
    std::printf("ucm_demo: %d ranks (%d per node, %d nodes), %d prompts x %d layers x %" PRIu64
                " KiB = %.1f MiB of KV, cache %.1f MiB per node, store %s, copy engine %s\n",
                size, info.local_size, info.node_count, o.prompts, o.layers, shard >> 10,
                double(o.prompts) * o.layers * shard / (1 << 20), double(cfg.cache_bytes) / (1 << 20), cfg.backend,
                info.copy_engine);

  // ---- prefill: dump every prompt's KV, layer by layer ----------------------
  // The KV buffer: kv_layers parts of one layer each (prompts x shard); decode
  // loads the task at position pos (step * layers + layer) into part pos % kv_layers.
  const size_t part_bytes = static_cast<size_t>(o.prompts) * shard;
  std::vector<uint8_t> kv(static_cast<size_t>(o.kv_layers) * part_bytes);
  const ucm_demo::KvPattern pattern(shard);
  const auto t_prefill = std::chrono::steady_clock::now();
  for (int layer = 0; layer < o.layers && !o.decode_only; ++layer) {
    std::vector<ucm_dump_entry_t> es(o.prompts);
    for (int p = 0; p < o.prompts; ++p) {
      pattern.fill(p, layer, kv.data() + p * shard);
      es[p].key.block = block_id(p);
      es[p].key.shard = static_cast<uint32_t>(layer);
      es[p].key.reserved = 0;
      es[p].src = kv.data() + p * shard;
    }
    ucm_task_t t;
    if ((r = ucm_dump_task(cache, es.data(), es.size(), &t)) != UCM_OK) die(rank, "ucm_dump_task", r, ucm_last_error(cache));
    if ((r = ucm_task_wait(cache, t, kTaskWaitMs)) != UCM_OK) die(rank, "dump task", r, ucm_last_error(cache));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  const double prefill_s = seconds_since(t_prefill);

  // ---- the bound's start: what the cache holds, the counters --------------
  // Key id p * layers + layer. Rank 0 asks where every shard is once every
  // rank's dumps are done; the counters are read before decode starts.
  const uint64_t unique_shards = uint64_t(o.prompts) * uint64_t(o.layers);
  std::vector<uint64_t> resident;
  ucm_stats_t mine0{}, node0{};
  mine0.struct_bytes = node0.struct_bytes = sizeof(ucm_stats_t);
  if (rank == 0) {
    std::vector<ucm_key_t> keys(unique_shards);
    for (uint64_t id = 0; id < unique_shards; ++id) {
      keys[id].block = block_id(id / o.layers);
      keys[id].shard = static_cast<uint32_t>(id % o.layers);
      keys[id].reserved = 0;
    }
    std::vector<uint8_t> where(unique_shards, UCM_WHERE_NONE);
    for (uint64_t at = 0; at < unique_shards; at += cfg.max_task_entries) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(cfg.max_task_entries, unique_shards - at));
      if ((r = ucm_lookup(cache, keys.data() + at, n, where.data() + at)) != UCM_OK)
        die(rank, "ucm_lookup", r, ucm_last_error(cache));
    }
    for (uint64_t id = 0; id < unique_shards; ++id)
      if (where[id] == UCM_WHERE_CACHE) resident.push_back(id);
  }
  (void)ucm_cache_stats(cache, &mine0, rank == 0 ? &node0 : nullptr);
  MPI_Barrier(MPI_COMM_WORLD);

  // ---- decode: load the prompts back, layer by layer -------------------------
  // Up to `window` layer tasks in flight: the task of position pos + window - 1
  // is submitted before pos is waited for, so the cache and its store work on
  // later layers while this thread verifies layer pos. Part pos % kv_layers of
  // the buffer was last written by position pos - kv_layers <= pos - window,
  // already verified; it held another layer (kv_parts_for), or was cleared.
  std::vector<ucm_block_t> hot(o.hot);
  for (int p = 0; p < o.hot; ++p) hot[p] = block_id(p);
  std::fill(kv.begin(), kv.end(), 0);
  const bool clear = ucm_demo::clear_after_check(o.kv_layers, o.layers);
  const int total = o.steps * o.layers;
  uint64_t bad = 0, tasks = 0, failed_tasks = 0;
  std::string first_failure;
  // Where decode's wall time goes on this thread: in the cache's calls
  // (submit and wait), verifying, and at the per-step barrier.
  double submit_s = 0, wait_s = 0, verify_s = 0, barrier_s = 0;
  uint64_t verify_cpu_ns = 0;
  std::deque<ucm_task_t> flight;
  uint64_t flight_max = 0;
  auto part = [&](int pos) { return kv.data() + static_cast<size_t>(pos % o.kv_layers) * part_bytes; };
  auto submit = [&](int pos) {
    const int layer = pos % o.layers;
    const auto t0 = std::chrono::steady_clock::now();
    if (layer == 0 && !hot.empty() && (r = ucm_touch(cache, hot.data(), hot.size())) != UCM_OK)
      die(rank, "ucm_touch", r, ucm_last_error(cache));
    std::vector<ucm_load_entry_t> es(o.prompts);
    for (int p = 0; p < o.prompts; ++p) {
      es[p].key.block = block_id(p);
      es[p].key.shard = static_cast<uint32_t>(layer);
      es[p].key.reserved = 0;
      es[p].dst = part(pos) + p * shard;
    }
    ucm_task_t t;
    if ((r = ucm_load_task(cache, es.data(), es.size(), &t)) != UCM_OK) die(rank, "ucm_load_task", r, ucm_last_error(cache));
    flight.push_back(t);
    flight_max = std::max<uint64_t>(flight_max, flight.size());
    submit_s += seconds_since(t0);
  };
  const Usage use0 = usage_now();
  const auto t_decode = std::chrono::steady_clock::now();
  auto complete = [&](int pos) {
    const int step = pos / o.layers, layer = pos % o.layers;
    const auto t_wait = std::chrono::steady_clock::now();
    r = ucm_task_wait(cache, flight.front(), kTaskWaitMs);
    wait_s += seconds_since(t_wait);
    flight.pop_front();
    ++tasks;
    if (r != UCM_OK) {
      // A shard the store holds corrupt (or cannot read): the task fails on
      // every rank alike. Its destinations are checked all the same (the
      // failed shards' bytes are not theirs), and decode goes on.
      if (r != UCM_ERR_CORRUPT && r != UCM_ERR_BACKEND && r != UCM_ERR_NOT_FOUND) die(rank, "load task", r, ucm_last_error(cache));
      if (failed_tasks++ == 0) {
        first_failure = std::string(ucm_result_string(r)) + ": " + ucm_last_error(cache);
        std::fprintf(stderr, "ucm_demo rank %d: step %d layer %d: load task failed: %s\n", rank, step + 1, layer,
                     first_failure.c_str());
      }
    }
    const auto t_verify = std::chrono::steady_clock::now();
    const uint64_t cpu0 = thread_cpu_ns();
    for (int p = 0; p < o.prompts; ++p)
      if (!pattern.check(p, layer, part(pos) + p * shard)) ++bad;
    if (clear) std::memset(part(pos), 0, part_bytes);
    verify_cpu_ns += thread_cpu_ns() - cpu0;
    verify_s += seconds_since(t_verify);
    if (layer + 1 < o.layers) return;
    const auto t_barrier = std::chrono::steady_clock::now();
    MPI_Barrier(MPI_COMM_WORLD);
    barrier_s += seconds_since(t_barrier);
    if (rank == 0) {
      ucm_stats_t ns{};
      ns.struct_bytes = sizeof(ns);
      (void)ucm_cache_stats(cache, nullptr, &ns);
      std::printf("  decode step %d/%d: %" PRIu64 " backend loads, %" PRIu64 " hits, %" PRIu64 " evictions so far (node 0)\n",
                  step + 1, o.steps, ns.owner_loads, ns.hits, ns.evictions);
      std::fflush(stdout);
    }
  };
  ucm_demo::run_pipeline(total, o.window, submit, complete);
  const double decode_s = seconds_since(t_decode);
  const Usage use1 = usage_now();
  const double in_tasks_s = submit_s + wait_s;  // the time decode was held by the cache's calls

  // ---- the bound: raw read rate of the store's files, on rank 0 alone ------
  // The other ranks nap meanwhile (quiet_barrier), so the read has the CPUs.
  std::string store_dir;
  uint32_t store_depth = 0;
  const bool posix = posix_store(cfg.backend, &store_dir, &store_depth);
  // Every local rank has a store of its own with store_depth I/O threads, and
  // the node's loads are spread over the ranks: the node's stores can keep
  // local_size x store_depth reads in flight. The bound takes the better of
  // that and store_depth threads (on a few cores more threads can read less).
  ucm_demo::RawRead raw;
  if (rank == 0) {
    if (!posix) raw.error = "the store is not posix";
    else if (o.raw_passes == 0) raw.error = "--raw-passes 0";
    else
      raw = ucm_demo::raw_read_best(store_files(store_dir), shard,
                                    {store_depth, store_depth * static_cast<uint32_t>(info.local_size)}, o.raw_passes,
                                    unique_shards * shard, kRawMinSeconds);
  }
  // The cpu bound's memcpy rate, on as many threads as the node's copies can
  // use cores at once (min(local ranks, cpus)), the others still asleep.
  const int copy_cores = std::min(info.local_size, cpus);
  ucm_demo::CopyRate copy;
  if (rank == 0) {
    if (o.raw_passes == 0) copy.error = "--raw-passes 0";
    else copy = ucm_demo::memcpy_rate(static_cast<uint32_t>(copy_cores), kCopyRateBytes, o.raw_passes, kRawMinSeconds);
  }
  quiet_barrier();

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
  double in_tasks_max = 0;
  MPI_Reduce(&in_tasks_s, &in_tasks_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  // Where decode's time went, the slowest rank's of each part, and the CPU
  // the ranks spent in it (all threads), summed over the ranks.
  const double split[4] = {submit_s, wait_s, verify_s, barrier_s};
  double split_max[4] = {};
  MPI_Reduce(split, split_max, 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  const double cpu[3] = {use1.cpu_s - use0.cpu_s, use1.thread_cpu_s - use0.thread_cpu_s, double(verify_cpu_ns) / 1e9};
  double cpu_sum[3] = {}, cpu_max = 0;
  MPI_Reduce(cpu, cpu_sum, 3, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&cpu[0], &cpu_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  const uint64_t counts[3] = {use1.vcsw - use0.vcsw, use1.ivcsw - use0.ivcsw, failed_tasks};
  uint64_t counts_sum[3] = {};
  MPI_Reduce(counts, counts_sum, 3, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  const uint64_t my_loads = mine.owner_loads - mine0.owner_loads;
  std::vector<uint64_t> rank_loads(rank == 0 ? size : 0);
  MPI_Gather(&my_loads, 1, MPI_UINT64_T, rank_loads.data(), 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
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
    if (counts_sum[2] > 0)
      std::printf("  failed load tasks: %" PRIu64 " over all ranks (rank 0's first: %s)\n", counts_sum[2],
                  first_failure.empty() ? "none on rank 0" : first_failure.c_str());
    std::printf("  pipeline: window %d (up to %" PRIu64 " layer tasks in flight on rank 0), KV buffer of %d layers "
                "(%.1f MiB per rank)%s\n",
                o.window, flight_max, o.kv_layers, double(kv.size()) / (1 << 20),
                clear ? ", each part cleared after its check" : "");
    std::printf("  decode time, slowest rank of each: in the cache's calls %.3f s (submit %.3f, wait %.3f), "
                "verifying %.3f s, step barriers %.3f s\n",
                split_max[0] + split_max[1], split_max[0], split_max[1], split_max[2], split_max[3]);
    std::printf("  decode cpu: %.3f cpu-s over %d ranks (slowest %.3f; app threads %.3f, of which verifying %.3f), "
                "%.2f of %d cpus x decode; %" PRIu64 " voluntary, %" PRIu64 " involuntary context switches\n",
                cpu_sum[0], size, cpu_max, cpu_sum[1], cpu_sum[2], cpu_sum[0] / (double(cpus) * decode_s), cpus,
                counts_sum[0], counts_sum[1]);
    // Every rank checks every shard it asks for: copy_bytes_rank each.
    const uint64_t copy_bytes_rank = tasks * uint64_t(o.prompts) * shard;
    const double verify_rate = cpu_sum[2] > 0 ? double(copy_bytes_rank) * size / cpu_sum[2] : 0;
    std::printf("  verifying: %.2f GB/s per core (%.1f MiB checked per rank%s)\n", verify_rate / 1e9,
                double(copy_bytes_rank) / (1 << 20), clear ? ", the cpu time includes clearing" : "");

    // The bound, for node 0. Its sequence of shard requests is the program's
    // order (every local rank asks for the same keys); a shard it loaded may
    // also sit in a reserved slot when prealloc is on, so both pools count.
    std::vector<uint64_t> seq;
    seq.reserve(static_cast<size_t>(o.steps) * unique_shards);
    for (int step = 0; step < o.steps; ++step)
      for (int layer = 0; layer < o.layers; ++layer)
        for (int p = 0; p < o.prompts; ++p) seq.push_back(uint64_t(p) * o.layers + layer);
    const uint64_t capacity = uint64_t(info.regular_slots) + (cfg.prealloc ? info.reserved_slots : 0);
    const uint64_t min_loads = ucm_demo::belady_min(seq, resident, capacity);
    const uint64_t loads = node.owner_loads - node0.owner_loads;
    const int64_t one_rank = info.local_size == 1 ? int64_t(loads) : o.one_rank_loads;
    const double rate = raw.error.empty() ? raw.best_bytes_per_s : 0;
    const double achievable_s = rate > 0 ? double(min_loads) * double(shard) / rate : 0;
    const double achievable_1r_s = rate > 0 && one_rank >= 0 ? double(one_rank) * double(shard) / rate : 0;
    const double fraction = achievable_s > 0 ? achievable_s / decode_s : 0;
    const double fraction_tasks = achievable_s > 0 && in_tasks_max > 0 ? achievable_s / in_tasks_max : 0;
    const double fraction_1r = achievable_1r_s > 0 ? achievable_1r_s / decode_s : 0;
    // The cpu bound: the node's copies into the KV buffers at the memcpy rate
    // of copy_cores cores at once.
    const bool copy_known = copy.error.empty() && copy.best_bytes_per_s > 0;
    ucm_demo::Bounds bounds;
    bounds.store_s = achievable_s;
    bounds.cpu_s = copy_known ? double(copy_bytes_rank) * info.local_size / copy.best_bytes_per_s : 0;
    const double fraction_binding = bounds.binding_s() > 0 ? bounds.binding_s() / decode_s : 0;
    uint64_t lmax = 0, lmin = UINT64_MAX;
    for (uint64_t l : rank_loads) lmax = std::max(lmax, l), lmin = std::min(lmin, l);
    std::printf("  owner loads per rank in decode: max %" PRIu64 ", min %" PRIu64, lmax, lmin);
    if (lmin > 0) std::printf(" (max/min %.2f)", double(lmax) / double(lmin));
    std::printf("\n  bound: min loads %" PRIu64 " (Belady's MIN, %" PRIu64 " slots, %zu of %" PRIu64
                " shards resident when decode began) against %" PRIu64 " made (%.2fx)\n",
                min_loads, capacity, resident.size(), unique_shards, loads,
                min_loads > 0 ? double(loads) / double(min_loads) : 0.0);
    if (raw.error.empty()) {
      std::printf("  bound: raw read %.2f GB/s (%s, best of %d passes of %.1f MiB in %u files on %u threads, "
                  "the better of %s; median %.2f GB/s)\n",
                  raw.best_bytes_per_s / 1e9, raw.direct ? "O_DIRECT" : "page cache: the file system refused O_DIRECT",
                  raw.passes, double(raw.bytes_per_pass) / (1 << 20), raw.files, raw.threads, raw.tried.c_str(),
                  raw.median_bytes_per_s / 1e9);
      std::printf("  bound: achievable decode %.3f s; reached %.2f of achievable (decode %.3f s), "
                  "%.2f counting only the time in the cache's calls (%.3f s, slowest rank)\n",
                  achievable_s, fraction, decode_s, fraction_tasks, in_tasks_max);
      if (one_rank >= 0)
        std::printf("  bound, the issue's count (the loads 1 rank makes on this cache, %" PRId64
                    "%s): achievable %.3f s, reached %.2f\n",
                    one_rank, info.local_size == 1 ? ", this run" : ", --one-rank-loads", achievable_1r_s, fraction_1r);
      else
        std::printf("  bound, the issue's count: not known with %d ranks per node (give --one-rank-loads N from a "
                    "1-rank run on the same cache)\n",
                    info.local_size);
      // Not part of the bound (which is the store's): the cpu work decode did
      // (copies, checksums, every rank's verification) spread over the cpus.
      const double cpu_floor_s = cpu_sum[0] / double(cpus);
      std::printf("  cpu: decode's cpu time over the %d cpus the ranks may use is %.3f s, %.2f of achievable "
                  "(above 1: the cpus, not the store, bound this run)\n",
                  cpus, cpu_floor_s, achievable_s > 0 ? cpu_floor_s / achievable_s : 0.0);
      // The line to read: both fractions of this run's window.
      char one_rank_text[32] = "not known";
      if (one_rank >= 0) std::snprintf(one_rank_text, sizeof(one_rank_text), "%.3f", fraction_1r);
      std::printf("  result: window %d: reached %s of achievable by the 1-rank count, %.3f by Belady's MIN\n",
                  o.window, one_rank_text, fraction);
    } else {
      std::printf("  bound: raw read rate not measured (%s), so no achievable time\n", raw.error.c_str());
    }
    if (copy_known) {
      std::printf("  bound, cpu: each rank copies %.1f MiB into its KV buffer, the node %.1f MiB, at memcpy %.2f GB/s "
                  "on %u threads (%.2f GB/s per core: each thread's best copy in %d passes; median pass %.2f GB/s): %.3f s\n",
                  double(copy_bytes_rank) / (1 << 20), double(copy_bytes_rank) * info.local_size / (1 << 20),
                  copy.best_bytes_per_s / 1e9, copy.threads, copy.best_bytes_per_s / 1e9 / copy.threads, copy.passes,
                  copy.median_bytes_per_s / 1e9, bounds.cpu_s);
      if (achievable_s > 0)
        std::printf("  bound, binding: the %s (store %.3f s by Belady's MIN, cpu %.3f s); reached %.3f of it\n",
                    bounds.binding(), bounds.store_s, bounds.cpu_s, fraction_binding);
    } else {
      std::printf("  bound, cpu: memcpy rate not measured (%s)\n", copy.error.c_str());
    }

    if (!o.json.empty()) {
      FILE* f = std::fopen(o.json.c_str(), "w");
      if (!f) {
        std::fprintf(stderr, "ucm_demo: cannot write %s: %s\n", o.json.c_str(), std::strerror(errno));
        bad_all += 1;  // the run fails: its result was asked for and is lost
      } else {
        auto num = [](double v, bool known) { return known ? std::to_string(v) : std::string("null"); };
        auto esc = [](const std::string& in) {
          std::string e;
          for (char c : in) {
            if (c == '"' || c == '\\') e += '\\';
            if (static_cast<unsigned char>(c) >= 0x20) e += c;
          }
          return e;
        };
        std::fprintf(f,
                     "{\n  \"schema\": \"ucm_demo/1\",\n  \"ranks\": %d, \"local_size\": %d, \"nodes\": %d,\n"
                     "  \"prompts\": %d, \"layers\": %d, \"shard_bytes\": %" PRIu64 ", \"cache_bytes\": %" PRIu64
                     ", \"steps\": %d, \"hot\": %d,\n  \"backend\": \"%s\",\n"
                     "  \"prefill_s\": %.6f, \"decode_s\": %.6f, \"in_tasks_s_max\": %.6f, \"tasks_per_rank\": %" PRIu64
                     ",\n  \"unique_shards\": %" PRIu64 ", \"loads\": %" PRIu64 ", \"loads_per_unique\": %.4f,\n"
                     "  \"owner_loads_max\": %" PRIu64 ", \"owner_loads_min\": %" PRIu64 ", \"owner_loads_max_over_min\": %s,\n"
                     "  \"hits\": %" PRIu64 ", \"waits\": %" PRIu64 ", \"evictions\": %" PRIu64 ", \"bad_shards\": %" PRIu64 ",\n"
                     "  \"bound\": {\n    \"capacity_slots\": %" PRIu64 ", \"resident_at_start\": %zu, \"min_loads\": %" PRIu64
                     ",\n    \"raw_error\": \"%s\", \"raw_direct\": %s, \"raw_passes\": %d, \"raw_threads\": %u, "
                     "\"raw_bytes_per_pass\": %" PRIu64 ",\n    \"raw_best_GBps\": %s, \"raw_median_GBps\": %s,\n"
                     "    \"achievable_s\": %s, \"fraction\": %s, \"fraction_in_tasks\": %s,\n"
                     "    \"one_rank_loads\": %s, \"achievable_one_rank_s\": %s, \"fraction_one_rank\": %s,\n",
                     size, info.local_size, info.node_count, o.prompts, o.layers, shard, uint64_t(cfg.cache_bytes), o.steps,
                     o.hot, esc(cfg.backend).c_str(), prefill_s, decode_s, in_tasks_max, tasks, unique_shards, loads,
                     double(loads) / double(unique_shards), lmax, lmin,
                     num(lmin > 0 ? double(lmax) / double(lmin) : 0, lmin > 0).c_str(), node.hits - node0.hits,
                     node.waits - node0.waits, node.evictions - node0.evictions, bad_all, capacity, resident.size(),
                     min_loads, esc(raw.error).c_str(), raw.direct && raw.error.empty() ? "true" : "false", raw.passes,
                     raw.threads, raw.bytes_per_pass, num(raw.best_bytes_per_s / 1e9, rate > 0).c_str(),
                     num(raw.median_bytes_per_s / 1e9, rate > 0).c_str(), num(achievable_s, rate > 0).c_str(),
                     num(fraction, rate > 0).c_str(), num(fraction_tasks, rate > 0).c_str(),
                     one_rank >= 0 ? std::to_string(one_rank).c_str() : "null",
                     num(achievable_1r_s, rate > 0 && one_rank >= 0).c_str(),
                     num(fraction_1r, rate > 0 && one_rank >= 0).c_str());
        std::fprintf(f,
                     "    \"cpu_copy_bytes_per_rank\": %" PRIu64 ", \"cpu_copy_cores\": %d, \"memcpy_error\": \"%s\", "
                     "\"memcpy_threads\": %u, \"memcpy_passes\": %d,\n"
                     "    \"memcpy_best_GBps\": %s, \"memcpy_median_GBps\": %s, \"cpu_bound_s\": %s,\n"
                     "    \"binding\": %s, \"fraction_binding\": %s\n  },\n",
                     copy_bytes_rank, copy_cores, esc(copy.error).c_str(), copy.threads, copy.passes,
                     num(copy.best_bytes_per_s / 1e9, copy_known).c_str(),
                     num(copy.median_bytes_per_s / 1e9, copy_known).c_str(), num(bounds.cpu_s, copy_known).c_str(),
                     copy_known && rate > 0 ? (std::string("\"") + bounds.binding() + "\"").c_str() : "null",
                     num(fraction_binding, copy_known && rate > 0).c_str());
        std::fprintf(f,
                     "  \"pipeline\": {\n    \"window\": %d, \"kv_layers\": %d, \"flight_max\": %" PRIu64
                     ", \"failed_tasks\": %" PRIu64 ",\n"
                     "    \"submit_s_max\": %.6f, \"wait_s_max\": %.6f, \"verify_s_max\": %.6f, \"barrier_s_max\": %.6f,\n"
                     "    \"cpu_s_sum\": %.6f, \"cpu_s_max\": %.6f, \"app_thread_cpu_s_sum\": %.6f, "
                     "\"verify_cpu_s_sum\": %.6f, \"verify_GBps_per_core\": %.6f, \"cpus\": %d,\n"
                     "    \"voluntary_csw\": %" PRIu64 ", \"involuntary_csw\": %" PRIu64 ", \"raw_threads_tried\": \"%s\"\n"
                     "  }\n}\n",
                     o.window, o.kv_layers, flight_max, counts_sum[2], split_max[0], split_max[1], split_max[2],
                     split_max[3], cpu_sum[0], cpu_max, cpu_sum[1], cpu_sum[2], verify_rate / 1e9, cpus, counts_sum[0],
                     counts_sum[1],
                     esc(raw.tried).c_str());
        std::fclose(f);
      }
    }
  }
  r = ucm_cache_finalize(&cache);
  if (r != UCM_OK) die(rank, "ucm_cache_finalize", r, ucm_last_error(nullptr));
  MPI_Barrier(MPI_COMM_WORLD);
  if (own_store) std::filesystem::remove_all(store);
  MPI_Finalize();
  return bad_all == 0 || rank != 0 ? (bad == 0 ? 0 : 1) : 1;
}
