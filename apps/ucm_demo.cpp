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
#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
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

// A whole-number option in [lo, hi], or exit 2 naming the flag and the value.
long long whole_arg(const char* name, const char* v, long long lo = INT32_MIN, long long hi = INT32_MAX) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0') {
    std::fprintf(stderr, "ucm_demo: %s %s: not a whole number%s\n", name, v, errno == ERANGE ? " that fits" : "");
    std::exit(2);
  }
  if (x < lo || x > hi) {
    if (x < lo) std::fprintf(stderr, "ucm_demo: %s %s: at least %lld\n", name, v, lo);
    else std::fprintf(stderr, "ucm_demo: %s %s: at most %lld\n", name, v, hi);
    std::exit(2);
  }
  return x;
}
// A whole number that fits an int; validate() checks its range.
int int_arg(const char* name, const char* v) { return static_cast<int>(whole_arg(name, v)); }

[[noreturn]] void die(int rank, const char* what, ucm_result_t r, const char* detail) {
  std::fprintf(stderr, "ucm_demo rank %d: %s: %s: %s\n", rank, what, ucm_result_string(r), detail);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

// Tasks in flight per rank at most (well under the cache's pending limit).
constexpr int kMaxWindow = 256;

// The flags into *o; false on --help or an unknown argument.
bool parse_flags(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&](const char* name) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "ucm_demo: %s needs a value\n", name);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--prompts") o->prompts = int(whole_arg("--prompts", next("--prompts"), 1));
    else if (a == "--layers") o->layers = int(whole_arg("--layers", next("--layers"), 1));
    else if (a == "--shard-kib") o->shard_kib = whole_arg("--shard-kib", next("--shard-kib"), 4, 1ll << 22);
    else if (a == "--cache-mib") o->cache_mib = whole_arg("--cache-mib", next("--cache-mib"), 1, 1ll << 30);
    else if (a == "--steps") o->steps = int(whole_arg("--steps", next("--steps"), 1));
    else if (a == "--hot") o->hot = int(whole_arg("--hot", next("--hot"), 0));
    else if (a == "--store") o->store = next("--store");
    else if (a == "--backend") o->backend = next("--backend");
    else if (a == "--raw-passes") o->raw_passes = int(whole_arg("--raw-passes", next("--raw-passes"), 0, 100));
    else if (a == "--one-rank-loads") o->one_rank_loads = whole_arg("--one-rank-loads", next("--one-rank-loads"), 0, INT64_MAX);
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
  return true;
}

// The options' ranges, each bad value named; then the KV buffer's default size.
// The demo verifies that what it loads is what it dumped: the sim store
// makes every shard's bytes up from its key instead (it keeps none).
bool store_keeps_dumps(const Options& o) {
  if (o.backend.rfind("sim:", 0) != 0) return true;
  std::fprintf(stderr, "ucm_demo: --backend %s: the sim store does not keep what is dumped (it makes each shard's bytes "
                       "up from its key), so no load could verify; use a posix store (--store DIR)\n",
               o.backend.c_str());
  return false;
}

bool validate(Options* o) {
  if (o->hot > o->prompts) {  // each flag's own range: parse_flags (whole_arg)
    std::fprintf(stderr, "ucm_demo: --hot %d: at most --prompts %d (the hot blocks are prompts)\n", o->hot, o->prompts);
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
  if (!store_keeps_dumps(*o)) return false;
  if (o->kv_layers == 0) o->kv_layers = ucm_demo::kv_parts_for(o->window, o->layers);
  return true;
}

bool parse(int argc, char** argv, Options* o) { return parse_flags(argc, argv, o) && validate(o); }

// Rank 0 writes --json after the run: a path it cannot write is refused
// before any work (the run's result would be lost after minutes of it). The
// check creates no file that was not there.
bool json_writable(const std::string& path) {
  struct stat st {};
  const bool existed = ::stat(path.c_str(), &st) == 0;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 || (existed && !S_ISREG(st.st_mode))) {
    const int err = fd < 0 ? errno : EISDIR;
    if (fd >= 0) ::close(fd);
    std::fprintf(stderr, "ucm_demo: --json %s: cannot write it: %s (checked before the run, whose result it holds)\n",
                 path.c_str(), std::strerror(err));
    return false;
  }
  ::close(fd);
  if (!existed) ::unlink(path.c_str());
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

// What main's phases share: the options, the store and the cache, the KV
// buffer, and what prefill and the bound's start found.
struct Run {
  int rank = 0, size = 1;
  Options o;
  char store[512] = {};
  bool own_store = false;
  ucm_config_t cfg{};
  ucm_cache_t cache = nullptr;
  ucm_cache_info_t info{};
  uint64_t shard = 0;
  int cpus = 1;
  // The KV buffer: kv_layers parts of one layer each (prompts x shard); decode
  // loads the task at position pos (step * layers + layer) into part pos % kv_layers.
  size_t part_bytes = 0;
  std::vector<uint8_t> kv;
  double prefill_s = 0;
  uint64_t unique_shards = 0;
  std::vector<uint64_t> resident;  // rank 0: the key ids the cache held when decode began
  ucm_stats_t mine0{}, node0{};
};

// The embedded default: a posix store in a fresh directory, made by rank 0.
void make_store(Run& run) {
  if (!run.o.backend.empty()) return;
  if (run.rank == 0) {
    if (!run.o.store.empty()) {
      std::snprintf(run.store, sizeof(run.store), "%s", run.o.store.c_str());
    } else {
      char tmpl[] = "/tmp/ucm_demo.XXXXXX";
      if (!mkdtemp(tmpl)) die(run.rank, "mkdtemp", UCM_ERR_SYSTEM, std::strerror(errno));
      std::snprintf(run.store, sizeof(run.store), "%s", tmpl);
      run.own_store = true;
    }
  }
  MPI_Bcast(run.store, sizeof(run.store), MPI_CHAR, 0, MPI_COMM_WORLD);
}

void open_cache(Run& run) {
  const Options& o = run.o;
  ucm_config_t& cfg = run.cfg;
  ucm_result_t r = ucm_config_init(&cfg);
  if (r != UCM_OK) die(run.rank, "ucm_config_init", r, ucm_config_error());
  // The demo's destinations are host buffers (it verifies every byte on the
  // CPU), so it asks for the host engine even on a node with GPUs.
  if (!getenv("UCM_COPY_ENGINE")) cfg.copy_engine = UCM_COPY_ENGINE_HOST;
  cfg.shard_bytes = o.shard_kib << 10;
  cfg.shards_per_block = static_cast<uint32_t>(o.layers);
  if (!getenv("UCM_CACHE_BYTES")) cfg.cache_bytes = o.cache_mib << 20;
  // A store path too long for cfg.backend is cut to fit (the precision says
  // so to the compiler, which sees run.store's 512 bytes).
  if (!o.backend.empty()) std::snprintf(cfg.backend, sizeof(cfg.backend), "%s", o.backend.c_str());
  else if (!getenv("UCM_BACKEND"))
    std::snprintf(cfg.backend, sizeof(cfg.backend), "posix:%.*s", int(sizeof(cfg.backend) - 7), run.store);

  r = ucm_cache_init(MPI_COMM_WORLD, &cfg, &run.cache);
  if (r != UCM_OK) die(run.rank, "ucm_cache_init", r, ucm_last_error(nullptr));
  run.info.struct_bytes = sizeof(run.info);
  (void)ucm_cache_info(run.cache, &run.info);
  run.shard = cfg.shard_bytes;
  // Collective (the node's ranks): here, not where rank 0 measures the bound
  // and the others must nap rather than poll in MPI.
  run.cpus = usable_cpus();
  if (run.rank == 0)
    std::printf("ucm_demo: %d ranks (%d per node, %d nodes), %d prompts x %d layers x %" PRIu64
                " KiB = %.1f MiB of KV, cache %.1f MiB per node, store %s, copy engine %s\n",
                run.size, run.info.local_size, run.info.node_count, o.prompts, o.layers, run.shard >> 10,
                double(o.prompts) * o.layers * run.shard / (1 << 20), double(cfg.cache_bytes) / (1 << 20),
                cfg.backend, run.info.copy_engine);
}

// ---- prefill: dump every prompt's KV, layer by layer ----------------------
void prefill(Run& run, const ucm_demo::KvPattern& pattern) {
  const Options& o = run.o;
  const uint64_t shard = run.shard;
  run.part_bytes = static_cast<size_t>(o.prompts) * shard;
  run.kv.assign(static_cast<size_t>(o.kv_layers) * run.part_bytes, 0);
  uint8_t* kv = run.kv.data();
  const auto t_prefill = std::chrono::steady_clock::now();
  for (int layer = 0; layer < o.layers && !o.decode_only; ++layer) {
    std::vector<ucm_dump_entry_t> es(o.prompts);
    for (int p = 0; p < o.prompts; ++p) {
      pattern.fill(p, layer, kv + p * shard);
      es[p].key.block = block_id(p);
      es[p].key.shard = static_cast<uint32_t>(layer);
      es[p].key.reserved = 0;
      es[p].src = kv + p * shard;
    }
    ucm_task_t t;
    ucm_result_t r;
    if ((r = ucm_dump_task(run.cache, es.data(), es.size(), &t)) != UCM_OK)
      die(run.rank, "ucm_dump_task", r, ucm_last_error(run.cache));
    if ((r = ucm_task_wait(run.cache, t, kTaskWaitMs)) != UCM_OK) die(run.rank, "dump task", r, ucm_last_error(run.cache));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  run.prefill_s = seconds_since(t_prefill);
}

// ---- the bound's start: what the cache holds, the counters --------------
// Key id p * layers + layer. Rank 0 asks where every shard is once every
// rank's dumps are done; the counters are read before decode starts.
void bound_start(Run& run) {
  const Options& o = run.o;
  const uint64_t unique_shards = run.unique_shards = uint64_t(o.prompts) * uint64_t(o.layers);
  run.mine0.struct_bytes = run.node0.struct_bytes = sizeof(ucm_stats_t);
  if (run.rank == 0) {
    std::vector<ucm_key_t> keys(unique_shards);
    for (uint64_t id = 0; id < unique_shards; ++id) {
      keys[id].block = block_id(id / o.layers);
      keys[id].shard = static_cast<uint32_t>(id % o.layers);
      keys[id].reserved = 0;
    }
    std::vector<uint8_t> where(unique_shards, UCM_WHERE_NONE);
    for (uint64_t at = 0; at < unique_shards; at += run.cfg.max_task_entries) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(run.cfg.max_task_entries, unique_shards - at));
      if (const ucm_result_t r = ucm_lookup(run.cache, keys.data() + at, n, where.data() + at); r != UCM_OK)
        die(run.rank, "ucm_lookup", r, ucm_last_error(run.cache));
    }
    for (uint64_t id = 0; id < unique_shards; ++id)
      if (where[id] == UCM_WHERE_CACHE) run.resident.push_back(id);
  }
  (void)ucm_cache_stats(run.cache, &run.mine0, run.rank == 0 ? &run.node0 : nullptr);
  MPI_Barrier(MPI_COMM_WORLD);
}

// What decode did on this rank.
struct Decode {
  bool clear = false;  // each KV part is cleared after its check (clear_after_check)
  uint64_t bad = 0, tasks = 0, failed_tasks = 0;
  std::string first_failure;
  // Where decode's wall time goes on this thread: in the cache's calls
  // (submit and wait), verifying, and at the per-step barrier.
  double submit_s = 0, wait_s = 0, verify_s = 0, barrier_s = 0;
  uint64_t verify_cpu_ns = 0;
  uint64_t flight_max = 0;
  double decode_s = 0;
  double in_tasks_s = 0;  // the time decode was held by the cache's calls
  Usage use0, use1;
};

// Decode's two steps per position (step * layers + layer), as run_pipeline
// calls them: submit its load task, then complete it (wait, verify, and at a
// step's last layer the step barrier and rank 0's progress line).
struct Decoder {
  Run& run;
  const ucm_demo::KvPattern& pattern;
  Decode& d;
  std::vector<ucm_block_t> hot;
  std::deque<ucm_task_t> flight;

  uint8_t* part(int pos) const {
    return run.kv.data() + static_cast<size_t>(pos % run.o.kv_layers) * run.part_bytes;
  }

  void submit(int pos) {
    const int layer = pos % run.o.layers;
    const auto t0 = std::chrono::steady_clock::now();
    ucm_result_t r;
    if (layer == 0 && !hot.empty() && (r = ucm_touch(run.cache, hot.data(), hot.size())) != UCM_OK)
      die(run.rank, "ucm_touch", r, ucm_last_error(run.cache));
    std::vector<ucm_load_entry_t> es(run.o.prompts);
    for (int p = 0; p < run.o.prompts; ++p) {
      es[p].key.block = block_id(p);
      es[p].key.shard = static_cast<uint32_t>(layer);
      es[p].key.reserved = 0;
      es[p].dst = part(pos) + p * run.shard;
    }
    ucm_task_t t;
    if ((r = ucm_load_task(run.cache, es.data(), es.size(), &t)) != UCM_OK)
      die(run.rank, "ucm_load_task", r, ucm_last_error(run.cache));
    flight.push_back(t);
    d.flight_max = std::max<uint64_t>(d.flight_max, flight.size());
    d.submit_s += seconds_since(t0);
  }

  void complete(int pos) {
    const int step = pos / run.o.layers, layer = pos % run.o.layers;
    const auto t_wait = std::chrono::steady_clock::now();
    const ucm_result_t r = ucm_task_wait(run.cache, flight.front(), kTaskWaitMs);
    d.wait_s += seconds_since(t_wait);
    flight.pop_front();
    ++d.tasks;
    if (r != UCM_OK) {
      // A shard the store holds corrupt (or cannot read): the task fails on
      // every rank alike. Its destinations are checked all the same (the
      // failed shards' bytes are not theirs), and decode goes on.
      if (r != UCM_ERR_CORRUPT && r != UCM_ERR_BACKEND && r != UCM_ERR_NOT_FOUND)
        die(run.rank, "load task", r, ucm_last_error(run.cache));
      if (d.failed_tasks++ == 0) {
        d.first_failure = std::string(ucm_result_string(r)) + ": " + ucm_last_error(run.cache);
        std::fprintf(stderr, "ucm_demo rank %d: step %d layer %d: load task failed: %s\n", run.rank, step + 1, layer,
                     d.first_failure.c_str());
      }
    }
    const auto t_verify = std::chrono::steady_clock::now();
    const uint64_t cpu0 = thread_cpu_ns();
    for (int p = 0; p < run.o.prompts; ++p)
      if (!pattern.check(p, layer, part(pos) + p * run.shard)) ++d.bad;
    if (d.clear) std::memset(part(pos), 0, run.part_bytes);
    d.verify_cpu_ns += thread_cpu_ns() - cpu0;
    d.verify_s += seconds_since(t_verify);
    if (layer + 1 < run.o.layers) return;
    const auto t_barrier = std::chrono::steady_clock::now();
    MPI_Barrier(MPI_COMM_WORLD);
    d.barrier_s += seconds_since(t_barrier);
    if (run.rank == 0) {
      ucm_stats_t ns{};
      ns.struct_bytes = sizeof(ns);
      (void)ucm_cache_stats(run.cache, nullptr, &ns);
      std::printf("  decode step %d/%d: %" PRIu64 " backend loads, %" PRIu64 " hits, %" PRIu64 " evictions so far (node 0)\n",
                  step + 1, run.o.steps, ns.owner_loads, ns.hits, ns.evictions);
      std::fflush(stdout);
    }
  }
};

// ---- decode: load the prompts back, layer by layer -------------------------
// Up to `window` layer tasks in flight: the task of position pos + window - 1
// is submitted before pos is waited for, so the cache and its store work on
// later layers while this thread verifies layer pos. Part pos % kv_layers of
// the buffer was last written by position pos - kv_layers <= pos - window,
// already verified; it held another layer (kv_parts_for), or was cleared.
void decode(Run& run, const ucm_demo::KvPattern& pattern, Decode* d) {
  Decoder dec{run, pattern, *d, std::vector<ucm_block_t>(run.o.hot), {}};
  for (int p = 0; p < run.o.hot; ++p) dec.hot[p] = block_id(p);
  std::fill(run.kv.begin(), run.kv.end(), 0);
  d->clear = ucm_demo::clear_after_check(run.o.kv_layers, run.o.layers);
  const int total = run.o.steps * run.o.layers;
  d->use0 = usage_now();
  const auto t_decode = std::chrono::steady_clock::now();
  ucm_demo::run_pipeline(
      total, run.o.window, [&](int pos) { dec.submit(pos); }, [&](int pos) { dec.complete(pos); });
  d->decode_s = seconds_since(t_decode);
  d->use1 = usage_now();
  d->in_tasks_s = d->submit_s + d->wait_s;
}

// The bound's rates, measured on rank 0.
struct Measured {
  ucm_demo::RawRead raw;
  ucm_demo::CopyRate copy;
  int copy_cores = 1;
};

// ---- the bound: raw read rate of the store's files, on rank 0 alone ------
// The other ranks nap meanwhile (quiet_barrier), so the read has the CPUs.
void measure(const Run& run, Measured* m) {
  const Options& o = run.o;
  std::string store_dir;
  uint32_t store_depth = 0;
  const bool posix = posix_store(run.cfg.backend, &store_dir, &store_depth);
  // Every local rank has a store of its own with store_depth I/O threads, and
  // the node's loads are spread over the ranks: the node's stores can keep
  // local_size x store_depth reads in flight. The bound takes the better of
  // that and store_depth threads (on a few cores more threads can read less).
  if (run.rank == 0) {
    if (!posix) m->raw.error = "the store is not posix";
    else if (o.raw_passes == 0) m->raw.error = "--raw-passes 0";
    else
      m->raw = ucm_demo::raw_read_best(store_files(store_dir), run.shard,
                                       {store_depth, store_depth * static_cast<uint32_t>(run.info.local_size)},
                                       o.raw_passes, run.unique_shards * run.shard, kRawMinSeconds);
  }
  // The cpu bound's memcpy rate, on as many threads as the node's copies can
  // use cores at once (min(local ranks, cpus)), the others still asleep.
  m->copy_cores = std::min(run.info.local_size, run.cpus);
  if (run.rank == 0) {
    if (o.raw_passes == 0) m->copy.error = "--raw-passes 0";
    else
      m->copy = ucm_demo::memcpy_rate(static_cast<uint32_t>(m->copy_cores), kCopyRateBytes, o.raw_passes,
                                      kRawMinSeconds);
  }
  quiet_barrier();
}

// The ranks' counts, reduced to rank 0 (the sums are rank 0's alone).
struct Totals {
  ucm_stats_t mine{}, node{};
  uint64_t bad_all = 0, loads_all = 0, leaders = 0;
  double gbps = 0, gbps_all = 0, in_tasks_max = 0;
  double split_max[4] = {};  // submit, wait, verify, barrier: the slowest rank's
  double cpu_sum[3] = {}, cpu_max = 0;
  uint64_t counts_sum[3] = {};  // voluntary, involuntary context switches, failed tasks
  std::vector<uint64_t> rank_loads;
};

void reduce_totals(const Run& run, const Decode& d, Totals* t) {
  t->mine.struct_bytes = t->node.struct_bytes = sizeof(ucm_stats_t);
  (void)ucm_cache_stats(run.cache, &t->mine, &t->node);
  const uint64_t node_loads = run.info.local_rank == 0 ? t->node.owner_loads : 0;
  const uint64_t leader = run.info.local_rank == 0 ? 1 : 0;
  MPI_Reduce(&d.bad, &t->bad_all, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&node_loads, &t->loads_all, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&leader, &t->leaders, 1, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  t->gbps = double(t->mine.bytes_to_device) / d.decode_s / 1e9;
  MPI_Reduce(&t->gbps, &t->gbps_all, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&d.in_tasks_s, &t->in_tasks_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  // Where decode's time went, the slowest rank's of each part, and the CPU
  // the ranks spent in it (all threads), summed over the ranks.
  const double split[4] = {d.submit_s, d.wait_s, d.verify_s, d.barrier_s};
  MPI_Reduce(split, t->split_max, 4, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  const double cpu[3] = {d.use1.cpu_s - d.use0.cpu_s, d.use1.thread_cpu_s - d.use0.thread_cpu_s,
                         double(d.verify_cpu_ns) / 1e9};
  MPI_Reduce(cpu, t->cpu_sum, 3, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
  MPI_Reduce(&cpu[0], &t->cpu_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  const uint64_t counts[3] = {d.use1.vcsw - d.use0.vcsw, d.use1.ivcsw - d.use0.ivcsw, d.failed_tasks};
  MPI_Reduce(counts, t->counts_sum, 3, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
  const uint64_t my_loads = t->mine.owner_loads - run.mine0.owner_loads;
  t->rank_loads.resize(run.rank == 0 ? run.size : 0);
  MPI_Gather(&my_loads, 1, MPI_UINT64_T, t->rank_loads.data(), 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
}

// The bound and the fractions of it reached, for node 0 (rank 0).
struct Bound {
  uint64_t copy_bytes_rank = 0;  // what each rank checked (and copied)
  double verify_rate = 0;
  uint64_t capacity = 0, min_loads = 0, loads = 0;
  int64_t one_rank = -1;
  double rate = 0, achievable_s = 0, achievable_1r_s = 0;
  double fraction = 0, fraction_tasks = 0, fraction_1r = 0;
  bool copy_known = false;
  ucm_demo::Bounds bounds;
  double fraction_binding = 0;
  uint64_t lmax = 0, lmin = UINT64_MAX;
};

Bound bound_of(const Run& run, const Decode& d, const Measured& m, const Totals& t) {
  const Options& o = run.o;
  Bound b;
  // Every rank checks every shard it asks for: copy_bytes_rank each.
  b.copy_bytes_rank = d.tasks * uint64_t(o.prompts) * run.shard;
  b.verify_rate = t.cpu_sum[2] > 0 ? double(b.copy_bytes_rank) * run.size / t.cpu_sum[2] : 0;
  // The bound, for node 0. Its sequence of shard requests is the program's
  // order (every local rank asks for the same keys); a shard it loaded may
  // also sit in a reserved slot when prealloc is on, so both pools count.
  std::vector<uint64_t> seq;
  seq.reserve(static_cast<size_t>(o.steps) * run.unique_shards);
  for (int step = 0; step < o.steps; ++step)
    for (int layer = 0; layer < o.layers; ++layer)
      for (int p = 0; p < o.prompts; ++p) seq.push_back(uint64_t(p) * o.layers + layer);
  b.capacity = uint64_t(run.info.regular_slots) + (run.cfg.prealloc ? run.info.reserved_slots : 0);
  b.min_loads = ucm_demo::belady_min(seq, run.resident, b.capacity);
  b.loads = t.node.owner_loads - run.node0.owner_loads;
  b.one_rank = run.info.local_size == 1 ? int64_t(b.loads) : o.one_rank_loads;
  b.rate = m.raw.error.empty() ? m.raw.best_bytes_per_s : 0;
  b.achievable_s = b.rate > 0 ? double(b.min_loads) * double(run.shard) / b.rate : 0;
  b.achievable_1r_s = b.rate > 0 && b.one_rank >= 0 ? double(b.one_rank) * double(run.shard) / b.rate : 0;
  b.fraction = b.achievable_s > 0 ? b.achievable_s / d.decode_s : 0;
  b.fraction_tasks = b.achievable_s > 0 && t.in_tasks_max > 0 ? b.achievable_s / t.in_tasks_max : 0;
  b.fraction_1r = b.achievable_1r_s > 0 ? b.achievable_1r_s / d.decode_s : 0;
  // The cpu bound: the node's copies into the KV buffers at the memcpy rate
  // of copy_cores cores at once.
  b.copy_known = m.copy.error.empty() && m.copy.best_bytes_per_s > 0;
  b.bounds.store_s = b.achievable_s;
  b.bounds.cpu_s = b.copy_known ? double(b.copy_bytes_rank) * run.info.local_size / m.copy.best_bytes_per_s : 0;
  b.fraction_binding = b.bounds.binding_s() > 0 ? b.bounds.binding_s() / d.decode_s : 0;
  for (uint64_t l : t.rank_loads) b.lmax = std::max(b.lmax, l), b.lmin = std::min(b.lmin, l);
  return b;
}

// ---- summary -----------------------------------------------------------
void print_summary(const Run& run, const Decode& d, const Totals& t, const Bound& b) {
  const Options& o = run.o;
  const ucm_stats_t& node = t.node;
  const double unique = double(o.prompts) * o.layers;
  const double asked = double(node.hits + node.owner_loads + node.waits);
  std::printf("ucm_demo summary (node 0 unless said):\n");
  // Dumps are not protected (docs/design.md 5.8): a shard a fast rank dumped
  // and the cache evicted before a slower rank dumped it is written again.
  std::printf("  prefill: %.3f s, %" PRIu64 " write-throughs for %.0f unique shards (%.2f per unique shard, node 0)\n",
              run.prefill_s, run.node0.dumps, unique, double(run.node0.dumps) / unique);
  // no_space: a get() that found every slot pinned or protected (a fast rank
  // waiting for slow ones to copy, docs/design.md 5.8), then retried.
  std::printf("  decode:  %" PRIu64 " tasks per rank in %.3f s, hit rate %.1f%%, waits %" PRIu64 ", evictions %" PRIu64
              ", no-space retries %" PRIu64 ", prealloc %" PRIu64 " made / %" PRIu64 " used\n",
              d.tasks, d.decode_s, asked > 0 ? 100.0 * double(node.hits) / asked : 0.0, node.waits, node.evictions,
              node.no_space, node.prealloc_made, node.prealloc_used);
  std::printf("  backend loads per unique shard per node: %.2f (%" PRIu64 " loads over %" PRIu64 " nodes)\n",
              double(t.loads_all) / double(t.leaders) / unique, t.loads_all, t.leaders);
  std::printf("  copy bandwidth: %.2f GB/s per rank, %.2f GB/s all ranks\n", t.gbps, t.gbps_all);
  std::printf("  task latency: p50 <= %" PRIu64 " us, p90 <= %" PRIu64 " us, p99 <= %" PRIu64 " us\n",
              node.latency_p50_us, node.latency_p90_us, node.latency_p99_us);
  std::printf("  verification: %s (%" PRIu64 " bad shards)\n", t.bad_all == 0 ? "every byte right" : "FAILED",
              t.bad_all);
  if (t.counts_sum[2] > 0)
    std::printf("  failed load tasks: %" PRIu64 " over all ranks (rank 0's first: %s)\n", t.counts_sum[2],
                d.first_failure.empty() ? "none on rank 0" : d.first_failure.c_str());
  std::printf("  pipeline: window %d (up to %" PRIu64 " layer tasks in flight on rank 0), KV buffer of %d layers "
              "(%.1f MiB per rank)%s\n",
              o.window, d.flight_max, o.kv_layers, double(run.kv.size()) / (1 << 20),
              d.clear ? ", each part cleared after its check" : "");
  std::printf("  decode time, slowest rank of each: in the cache's calls %.3f s (submit %.3f, wait %.3f), "
              "verifying %.3f s, step barriers %.3f s\n",
              t.split_max[0] + t.split_max[1], t.split_max[0], t.split_max[1], t.split_max[2], t.split_max[3]);
  std::printf("  decode cpu: %.3f cpu-s over %d ranks (slowest %.3f; app threads %.3f, of which verifying %.3f), "
              "%.2f of %d cpus x decode; %" PRIu64 " voluntary, %" PRIu64 " involuntary context switches\n",
              t.cpu_sum[0], run.size, t.cpu_max, t.cpu_sum[1], t.cpu_sum[2],
              t.cpu_sum[0] / (double(run.cpus) * d.decode_s), run.cpus, t.counts_sum[0], t.counts_sum[1]);
  std::printf("  verifying: %.2f GB/s per core (%.1f MiB checked per rank%s)\n", b.verify_rate / 1e9,
              double(b.copy_bytes_rank) / (1 << 20), d.clear ? ", the cpu time includes clearing" : "");
}

// The store's bound: the fewest loads, the raw read rate, the fractions reached.
void print_store_bound(const Run& run, const Decode& d, const Measured& m, const Totals& t, const Bound& b) {
  const ucm_demo::RawRead& raw = m.raw;
  std::printf("  owner loads per rank in decode: max %" PRIu64 ", min %" PRIu64, b.lmax, b.lmin);
  if (b.lmin > 0) std::printf(" (max/min %.2f)", double(b.lmax) / double(b.lmin));
  std::printf("\n  bound: min loads %" PRIu64 " (Belady's MIN, %" PRIu64 " slots, %zu of %" PRIu64
              " shards resident when decode began) against %" PRIu64 " made (%.2fx)\n",
              b.min_loads, b.capacity, run.resident.size(), run.unique_shards, b.loads,
              b.min_loads > 0 ? double(b.loads) / double(b.min_loads) : 0.0);
  if (!raw.error.empty()) {
    std::printf("  bound: raw read rate not measured (%s), so no achievable time\n", raw.error.c_str());
    return;
  }
  std::printf("  bound: raw read %.2f GB/s (%s, best of %d passes of %.1f MiB in %u files on %u threads, "
              "the better of %s; median %.2f GB/s)\n",
              raw.best_bytes_per_s / 1e9, raw.direct ? "O_DIRECT" : "page cache: the file system refused O_DIRECT",
              raw.passes, double(raw.bytes_per_pass) / (1 << 20), raw.files, raw.threads, raw.tried.c_str(),
              raw.median_bytes_per_s / 1e9);
  std::printf("  bound: achievable decode %.3f s; reached %.2f of achievable (decode %.3f s), "
              "%.2f counting only the time in the cache's calls (%.3f s, slowest rank)\n",
              b.achievable_s, b.fraction, d.decode_s, b.fraction_tasks, t.in_tasks_max);
  if (b.one_rank >= 0)
    std::printf("  bound, the issue's count (the loads 1 rank makes on this cache, %" PRId64
                "%s): achievable %.3f s, reached %.2f\n",
                b.one_rank, run.info.local_size == 1 ? ", this run" : ", --one-rank-loads", b.achievable_1r_s,
                b.fraction_1r);
  else
    std::printf("  bound, the issue's count: not known with %d ranks per node (give --one-rank-loads N from a "
                "1-rank run on the same cache)\n",
                run.info.local_size);
  // Not part of the bound (which is the store's): the cpu work decode did
  // (copies, checksums, every rank's verification) spread over the cpus.
  const double cpu_floor_s = t.cpu_sum[0] / double(run.cpus);
  std::printf("  cpu: decode's cpu time over the %d cpus the ranks may use is %.3f s, %.2f of achievable "
              "(above 1: the cpus, not the store, bound this run)\n",
              run.cpus, cpu_floor_s, b.achievable_s > 0 ? cpu_floor_s / b.achievable_s : 0.0);
  // The line to read: both fractions of this run's window.
  char one_rank_text[32] = "not known";
  if (b.one_rank >= 0) std::snprintf(one_rank_text, sizeof(one_rank_text), "%.3f", b.fraction_1r);
  std::printf("  result: window %d: reached %s of achievable by the 1-rank count, %.3f by Belady's MIN\n",
              run.o.window, one_rank_text, b.fraction);
}

// The cpus' bound: the node's copies at the memcpy rate, and which bound binds.
void print_cpu_bound(const Run& run, const Measured& m, const Bound& b) {
  const ucm_demo::CopyRate& copy = m.copy;
  if (!b.copy_known) {
    std::printf("  bound, cpu: memcpy rate not measured (%s)\n", copy.error.c_str());
    return;
  }
  std::printf("  bound, cpu: each rank copies %.1f MiB into its KV buffer, the node %.1f MiB, at memcpy %.2f GB/s "
              "on %u threads (%.2f GB/s per core: each thread's best copy in %d passes; median pass %.2f GB/s): %.3f s\n",
              double(b.copy_bytes_rank) / (1 << 20), double(b.copy_bytes_rank) * run.info.local_size / (1 << 20),
              copy.best_bytes_per_s / 1e9, copy.threads, copy.best_bytes_per_s / 1e9 / copy.threads, copy.passes,
              copy.median_bytes_per_s / 1e9, b.bounds.cpu_s);
  if (b.achievable_s > 0)
    std::printf("  bound, binding: the %s (store %.3f s by Belady's MIN, cpu %.3f s); reached %.3f of it\n",
                b.bounds.binding(), b.bounds.store_s, b.bounds.cpu_s, b.fraction_binding);
}

// ---- --json --------------------------------------------------------------
std::string json_num(double v, bool known) { return known ? std::to_string(v) : std::string("null"); }

std::string json_esc(const std::string& in) {
  std::string e;
  for (char c : in) {
    if (c == '"' || c == '\\') e += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) e += c;
  }
  return e;
}

// The run, its counts and the store's bound.
void json_run(FILE* f, const Run& run, const Decode& d, const Measured& m, const Totals& t, const Bound& b) {
  const Options& o = run.o;
  const ucm_demo::RawRead& raw = m.raw;
  const bool rate = b.rate > 0, one = b.rate > 0 && b.one_rank >= 0;
  std::fprintf(f,
               "{\n  \"schema\": \"ucm_demo/1\",\n  \"ranks\": %d, \"local_size\": %d, \"nodes\": %d,\n"
               "  \"prompts\": %d, \"layers\": %d, \"shard_bytes\": %" PRIu64 ", \"cache_bytes\": %" PRIu64
               ", \"steps\": %d, \"hot\": %d,\n  \"backend\": \"%s\",\n"
               "  \"prefill_s\": %.6f, \"prefill_writes\": %" PRIu64 ", \"decode_s\": %.6f, \"in_tasks_s_max\": %.6f, \"tasks_per_rank\": %" PRIu64
               ",\n  \"unique_shards\": %" PRIu64 ", \"loads\": %" PRIu64 ", \"loads_per_unique\": %.4f,\n"
               "  \"owner_loads_max\": %" PRIu64 ", \"owner_loads_min\": %" PRIu64 ", \"owner_loads_max_over_min\": %s,\n"
               "  \"hits\": %" PRIu64 ", \"waits\": %" PRIu64 ", \"evictions\": %" PRIu64 ", \"no_space\": %" PRIu64
               ", \"bad_shards\": %" PRIu64 ",\n"
               "  \"bound\": {\n    \"capacity_slots\": %" PRIu64 ", \"resident_at_start\": %zu, \"min_loads\": %" PRIu64
               ",\n    \"raw_error\": \"%s\", \"raw_direct\": %s, \"raw_passes\": %d, \"raw_threads\": %u, "
               "\"raw_bytes_per_pass\": %" PRIu64 ",\n    \"raw_best_GBps\": %s, \"raw_median_GBps\": %s,\n"
               "    \"achievable_s\": %s, \"fraction\": %s, \"fraction_in_tasks\": %s,\n"
               "    \"one_rank_loads\": %s, \"achievable_one_rank_s\": %s, \"fraction_one_rank\": %s,\n",
               run.size, run.info.local_size, run.info.node_count, o.prompts, o.layers, run.shard,
               uint64_t(run.cfg.cache_bytes), o.steps, o.hot, json_esc(run.cfg.backend).c_str(), run.prefill_s,
               run.node0.dumps, d.decode_s, t.in_tasks_max, d.tasks, run.unique_shards, b.loads,
               double(b.loads) / double(run.unique_shards), b.lmax, b.lmin,
               json_num(b.lmin > 0 ? double(b.lmax) / double(b.lmin) : 0, b.lmin > 0).c_str(),
               t.node.hits - run.node0.hits, t.node.waits - run.node0.waits, t.node.evictions - run.node0.evictions,
               t.node.no_space - run.node0.no_space, t.bad_all, b.capacity, run.resident.size(), b.min_loads, json_esc(raw.error).c_str(),
               raw.direct && raw.error.empty() ? "true" : "false", raw.passes, raw.threads, raw.bytes_per_pass,
               json_num(raw.best_bytes_per_s / 1e9, rate).c_str(), json_num(raw.median_bytes_per_s / 1e9, rate).c_str(),
               json_num(b.achievable_s, rate).c_str(), json_num(b.fraction, rate).c_str(),
               json_num(b.fraction_tasks, rate).c_str(), b.one_rank >= 0 ? std::to_string(b.one_rank).c_str() : "null",
               json_num(b.achievable_1r_s, one).c_str(), json_num(b.fraction_1r, one).c_str());
}

// The cpu bound (the rest of "bound") and the pipeline's own counts.
void json_cpu_pipeline(FILE* f, const Run& run, const Decode& d, const Measured& m, const Totals& t, const Bound& b) {
  const ucm_demo::CopyRate& copy = m.copy;
  const bool known = b.copy_known, both = b.copy_known && b.rate > 0;
  std::fprintf(f,
               "    \"cpu_copy_bytes_per_rank\": %" PRIu64 ", \"cpu_copy_cores\": %d, \"memcpy_error\": \"%s\", "
               "\"memcpy_threads\": %u, \"memcpy_passes\": %d,\n"
               "    \"memcpy_best_GBps\": %s, \"memcpy_median_GBps\": %s, \"cpu_bound_s\": %s,\n"
               "    \"binding\": %s, \"fraction_binding\": %s\n  },\n",
               b.copy_bytes_rank, m.copy_cores, json_esc(copy.error).c_str(), copy.threads, copy.passes,
               json_num(copy.best_bytes_per_s / 1e9, known).c_str(),
               json_num(copy.median_bytes_per_s / 1e9, known).c_str(), json_num(b.bounds.cpu_s, known).c_str(),
               both ? (std::string("\"") + b.bounds.binding() + "\"").c_str() : "null",
               json_num(b.fraction_binding, both).c_str());
  std::fprintf(f,
               "  \"pipeline\": {\n    \"window\": %d, \"kv_layers\": %d, \"flight_max\": %" PRIu64
               ", \"failed_tasks\": %" PRIu64 ",\n"
               "    \"submit_s_max\": %.6f, \"wait_s_max\": %.6f, \"verify_s_max\": %.6f, \"barrier_s_max\": %.6f,\n"
               "    \"cpu_s_sum\": %.6f, \"cpu_s_max\": %.6f, \"app_thread_cpu_s_sum\": %.6f, "
               "\"verify_cpu_s_sum\": %.6f, \"verify_GBps_per_core\": %.6f, \"cpus\": %d,\n"
               "    \"voluntary_csw\": %" PRIu64 ", \"involuntary_csw\": %" PRIu64 ", \"raw_threads_tried\": \"%s\"\n"
               "  }\n}\n",
               run.o.window, run.o.kv_layers, d.flight_max, t.counts_sum[2], t.split_max[0], t.split_max[1],
               t.split_max[2], t.split_max[3], t.cpu_sum[0], t.cpu_max, t.cpu_sum[1], t.cpu_sum[2],
               b.verify_rate / 1e9, run.cpus, t.counts_sum[0], t.counts_sum[1], json_esc(m.raw.tried).c_str());
}

// False (and a line on stderr) when the file cannot be written.
bool write_json(const Run& run, const Decode& d, const Measured& m, const Totals& t, const Bound& b) {
  FILE* f = std::fopen(run.o.json.c_str(), "w");
  if (!f) {
    std::fprintf(stderr, "ucm_demo: cannot write %s: %s\n", run.o.json.c_str(), std::strerror(errno));
    return false;
  }
  json_run(f, run, d, m, t, b);
  json_cpu_pipeline(f, run, d, m, t, b);
  std::fclose(f);
  return true;
}

// Rank 0's summary, bound and --json; bad_all counts a lost --json as a failure.
void report(const Run& run, const Decode& d, const Measured& m, Totals* t) {
  const Bound b = bound_of(run, d, m, *t);
  print_summary(run, d, *t, b);
  print_store_bound(run, d, m, *t, b);
  print_cpu_bound(run, m, b);
  if (!run.o.json.empty() && !write_json(run, d, m, *t, b))
    t->bad_all += 1;  // the run fails: its result was asked for and is lost
}

// Every rank: whether rank 0 can write --json (none given: yes).
bool json_ok_on_every_rank(const Run& run) {
  int ok = run.rank != 0 || run.o.json.empty() || json_writable(run.o.json) ? 1 : 0;
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return ok != 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Run run;
  MPI_Comm_rank(MPI_COMM_WORLD, &run.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &run.size);
  if (!parse(argc, argv, &run.o)) {
    if (run.rank == 0)
      std::fprintf(stderr, "usage: mpirun -np N ucm_demo [--prompts N] [--layers L] [--shard-kib K] [--cache-mib M] "
                           "[--steps S] [--hot H] [--store DIR] [--backend SPEC] [--raw-passes P] "
                           "[--one-rank-loads N] [--window W] [--kv-layers B] [--decode-only] [--json PATH]\n");
    MPI_Finalize();
    return 2;
  }
  if (!json_ok_on_every_rank(run)) {
    MPI_Finalize();
    return 2;
  }
  make_store(run);
  open_cache(run);
  const ucm_demo::KvPattern pattern(run.shard);
  prefill(run, pattern);
  bound_start(run);
  Decode d;
  decode(run, pattern, &d);
  Measured m;
  measure(run, &m);
  Totals t;
  reduce_totals(run, d, &t);
  if (run.rank == 0) report(run, d, m, &t);
  const ucm_result_t r = ucm_cache_finalize(&run.cache);
  if (r != UCM_OK) die(run.rank, "ucm_cache_finalize", r, ucm_last_error(nullptr));
  MPI_Barrier(MPI_COMM_WORLD);
  if (run.own_store) std::filesystem::remove_all(run.store);
  MPI_Finalize();
  return t.bad_all == 0 || run.rank != 0 ? (d.bad == 0 ? 0 : 1) : 1;
}
