#include "bench_util.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>

#include "api/handles.h"
#include "backend/sim_backend.h"
#include "backend/sim_content.h"
#include "common/key.h"

namespace ucm::bench {

// ---- options --------------------------------------------------------------------

namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(sep, pos);
    if (end == std::string::npos) end = s.size();
    if (end > pos) out.push_back(s.substr(pos, end - pos));
    pos = end + 1;
  }
  return out;
}

bool to_u64(const char* name, const char* v, uint64_t lo, uint64_t hi, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v, &end, 10);
  if (errno != 0 || end == v || *end != '\0' || x < lo || x > hi) {
    std::fprintf(stderr, "ucm_bench: %s %s is not an integer in %" PRIu64 "..%" PRIu64 "\n", name, v, lo, hi);
    return false;
  }
  *out = x;
  return true;
}

}  // namespace

void print_usage() {
  std::fprintf(stderr,
               "usage: mpirun -np N ucm_bench [--scenario cold|warm|wait|evict|prealloc|all[,...]] [--json PATH]\n"
               "         [--reps R] [--shard-kib K] [--latency-us L] [--io-depth D] [--shards-per-rank S]\n"
               "         [--skew-us 0,50,1000] [--skew-io-depth D] [--warm-shard-kib K] [--warm-shards N]\n"
               "         [--warm-reps R] [--wait-latency-us L] [--wait-tasks N] [--evict-tasks N]\n"
               "         [--evict-slots 128,64] [--evict-skew-us U] [--prealloc-pause-ms M]\n");
}

bool parse_options(int argc, char** argv, Options* o) {
  std::string scen = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") return false;
    if (i + 1 >= argc) {
      std::fprintf(stderr, "ucm_bench: %s: unknown, or needs a value\n", a.c_str());
      return false;
    }
    const char* v = argv[++i];
    uint64_t u = 0;
    auto num = [&](uint64_t lo, uint64_t hi) { return to_u64(a.c_str(), v, lo, hi, &u); };
    if (a == "--scenario") scen = v;
    else if (a == "--json") o->json = v;
    else if (a == "--reps") { if (!num(1, 1000)) return false; o->reps = static_cast<int>(u); }
    else if (a == "--shard-kib") { if (!num(4, 1 << 20)) return false; o->shard_kib = u; }
    else if (a == "--latency-us") { if (!num(0, 10'000'000)) return false; o->latency_us = static_cast<uint32_t>(u); }
    else if (a == "--io-depth") { if (!num(1, 1024)) return false; o->io_depth = static_cast<uint32_t>(u); }
    else if (a == "--shards-per-rank") { if (!num(1, 512)) return false; o->shards_per_rank = static_cast<uint32_t>(u); }
    else if (a == "--skew-io-depth") { if (!num(1, 1024)) return false; o->skew_io_depth = static_cast<uint32_t>(u); }
    else if (a == "--warm-shard-kib") { if (!num(4, 1 << 20)) return false; o->warm_shard_kib = u; }
    else if (a == "--warm-shards") { if (!num(1, 4096)) return false; o->warm_shards = static_cast<uint32_t>(u); }
    else if (a == "--warm-reps") { if (!num(1, 1000)) return false; o->warm_reps = static_cast<int>(u); }
    else if (a == "--wait-latency-us") { if (!num(500, 1'000'000)) return false; o->wait_latency_us = static_cast<uint32_t>(u); }
    else if (a == "--wait-tasks") { if (!num(1, 10000)) return false; o->wait_tasks = static_cast<int>(u); }
    else if (a == "--evict-tasks") { if (!num(2, 10000)) return false; o->evict_tasks = static_cast<int>(u); }
    else if (a == "--evict-skew-us") { if (!num(0, 1'000'000)) return false; o->evict_skew_us = static_cast<uint32_t>(u); }
    else if (a == "--prealloc-pause-ms") { if (!num(1, 10000)) return false; o->prealloc_pause_ms = static_cast<uint32_t>(u); }
    else if (a == "--evict-slots") {
      o->evict_slots.clear();
      for (const std::string& s : split(v, ',')) {
        if (!to_u64("--evict-slots", s.c_str(), 64, 1 << 20, &u)) return false;
        o->evict_slots.push_back(static_cast<uint32_t>(u));
      }
    } else if (a == "--skew-us") {
      o->skews_us.clear();
      for (const std::string& s : split(v, ',')) {
        if (!to_u64("--skew-us", s.c_str(), 0, 1'000'000, &u)) return false;
        o->skews_us.push_back(static_cast<uint32_t>(u));
      }
    } else {
      std::fprintf(stderr, "ucm_bench: unknown argument %s\n", a.c_str());
      return false;
    }
  }
  static const char* kAll[] = {"cold", "warm", "wait", "evict", "prealloc"};
  for (const std::string& s : split(scen, ',')) {
    if (s == "all") {
      for (const char* x : kAll) o->scenarios.push_back(x);
      continue;
    }
    if (std::find(std::begin(kAll), std::end(kAll), s) == std::end(kAll)) {
      std::fprintf(stderr, "ucm_bench: unknown scenario %s\n", s.c_str());
      return false;
    }
    o->scenarios.push_back(s);
  }
  if (o->scenarios.empty()) {
    std::fprintf(stderr, "ucm_bench: no scenario\n");
    return false;
  }
  return true;
}

// ---- JSON -----------------------------------------------------------------------

Json::Json(double v) {
  if (!std::isfinite(v)) return;
  kind_ = Kind::kNumber;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  text_ = buf;
}
Json::Json(int64_t v) : kind_(Kind::kNumber), text_(std::to_string(v)) {}
Json::Json(uint64_t v) : kind_(Kind::kNumber), text_(std::to_string(v)) {}
Json::Json(bool v) : kind_(Kind::kBool), text_(v ? "true" : "false") {}
Json::Json(const char* s) : kind_(Kind::kString), text_(s) {}
Json::Json(const std::string& s) : kind_(Kind::kString), text_(s) {}

Json Json::object() {
  Json j;
  j.kind_ = Kind::kObject;
  return j;
}
Json Json::array() {
  Json j;
  j.kind_ = Kind::kArray;
  return j;
}

Json& Json::set(const std::string& key, Json v) {
  for (auto& [k, old] : items_)
    if (k == key) {
      old = std::move(v);
      return *this;
    }
  items_.emplace_back(key, std::move(v));
  return *this;
}

Json& Json::push(Json v) {
  items_.emplace_back(std::string(), std::move(v));
  return *this;
}

namespace {
void quote(std::string* out, const std::string& s) {
  out->push_back('"');
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      *out += buf;
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}
}  // namespace

void Json::dump_to(std::string* out, int indent, int depth) const {
  switch (kind_) {
    case Kind::kNull: *out += "null"; return;
    case Kind::kNumber:
    case Kind::kBool: *out += text_; return;
    case Kind::kString: quote(out, text_); return;
    case Kind::kArray:
    case Kind::kObject: break;
  }
  const bool obj = kind_ == Kind::kObject;
  // Arrays of scalars stay on one line.
  bool flat = !obj;
  for (const auto& it : items_)
    if (it.second.kind_ == Kind::kArray || it.second.kind_ == Kind::kObject) flat = false;
  out->push_back(obj ? '{' : '[');
  for (size_t i = 0; i < items_.size(); ++i) {
    if (i) out->push_back(',');
    if (indent && !flat) {
      out->push_back('\n');
      out->append(static_cast<size_t>(indent * (depth + 1)), ' ');
    } else if (i) {
      out->push_back(' ');
    }
    if (obj) {
      quote(out, items_[i].first);
      *out += ": ";
    }
    items_[i].second.dump_to(out, indent, depth + 1);
  }
  if (indent && !flat && !items_.empty()) {
    out->push_back('\n');
    out->append(static_cast<size_t>(indent * depth), ' ');
  }
  out->push_back(obj ? '}' : ']');
}

std::string Json::dump(int indent) const {
  std::string s;
  dump_to(&s, indent, 0);
  return s;
}

// ---- the job ---------------------------------------------------------------------

void die(const Job& job, const char* what, ucm_result_t r, const char* detail) {
  std::fprintf(stderr, "ucm_bench rank %d: %s: %s: %s\n", job.rank, what, ucm_result_string(r), detail ? detail : "");
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}

void say(const Job& job, const char* f, ...) {
  if (job.rank != 0) return;
  va_list ap;
  va_start(ap, f);
  std::vprintf(f, ap);
  va_end(ap);
  std::fflush(stdout);
}

std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  std::vsnprintf(buf, sizeof(buf), f, ap);
  va_end(ap);
  return buf;
}

// ---- keys, buffers, verification --------------------------------------------------

ShardBuffer::ShardBuffer(size_t n, uint64_t shard) : n_(n), shard_(shard) {
  const size_t bytes = std::max<size_t>(n * shard, 4096);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) {
    std::fprintf(stderr, "ucm_bench: mmap of %zu bytes failed: %s\n", bytes, std::strerror(errno));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  base_ = static_cast<uint8_t*>(p);
}

ShardBuffer::~ShardBuffer() {
  if (base_) munmap(base_, std::max<size_t>(n_ * shard_, 4096));
}

ShardBuffer& ShardBuffer::operator=(ShardBuffer&& o) noexcept {
  if (this != &o) {
    if (base_) munmap(base_, std::max<size_t>(n_ * shard_, 4096));
    base_ = std::exchange(o.base_, nullptr);
    n_ = std::exchange(o.n_, 0);
    shard_ = std::exchange(o.shard_, 0);
  }
  return *this;
}

void ShardBuffer::poison() const { std::memset(base_, 0xee, n_ * shard_); }

std::vector<ucm_load_entry_t> entries_for(const std::vector<ucm_key_t>& keys, const ShardBuffer& buf, size_t first) {
  std::vector<ucm_load_entry_t> e(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    e[i].key = keys[i];
    e[i].dst = buf.at(first + i);
  }
  return e;
}

void verify_entries(Job* job, const char* where, const ucm_load_entry_t* e, size_t n, uint64_t shard_bytes) {
  for (size_t i = 0; i < n; ++i) {
    Key k;
    k.block = block_from_bytes(e[i].key.block.bytes);
    k.shard = e[i].key.shard;
    const uint64_t off = sim_verify(k, e[i].dst, shard_bytes);
    ++job->shards_verified;
    if (off != shard_bytes) {
      ++job->bad_shards;
      std::fprintf(stderr,
                   "ucm_bench rank %d: *** VERIFICATION FAILED *** in %s: block %" PRIu64 " shard %u: byte %" PRIu64
                   " of %" PRIu64 " is 0x%02x, the sim content is 0x%02x\n",
                   job->rank, where, k.block.lo, k.shard, off, shard_bytes,
                   static_cast<const uint8_t*>(e[i].dst)[off], sim_byte(k, off));
      std::fflush(stderr);
    }
  }
}

void load_and_wait(const Job& job, ucm_cache_t cache, const ucm_load_entry_t* e, size_t n) {
  ucm_task_t t = 0;
  ucm_result_t r = ucm_load_task(cache, e, n, &t);
  if (r != UCM_OK) die(job, "ucm_load_task", r, ucm_last_error(cache));
  r = ucm_task_wait(cache, t, 60000);
  if (r != UCM_OK) die(job, "ucm_task_wait", r, ucm_last_error(cache));
}

// ---- configuration, cache life ----------------------------------------------------

std::string sim_spec(uint32_t latency_us, uint32_t max_inflight) {
  // gbps=0: no bandwidth term, so a load takes exactly latency_us (plus the
  // store's thread wake-up); two workers fill buffers and complete.
  return fmt("sim:latency_us=%u,gbps=0,max_inflight=%u,workers=2", latency_us, max_inflight);
}

ucm_config_t base_config(const Job& job, uint64_t shard_bytes, uint64_t slots, uint32_t shards_per_block,
                         uint32_t max_task_entries, const std::string& backend) {
  ucm_config_t c;
  const ucm_result_t r = ucm_config_init(&c);
  if (r != UCM_OK) die(job, "ucm_config_init", r, ucm_config_error());
  // The studies copy into host buffers: the host engine, even on a GPU node.
  if (!getenv("UCM_COPY_ENGINE")) c.copy_engine = UCM_COPY_ENGINE_HOST;
  c.shard_bytes = shard_bytes;
  c.cache_bytes = slots * shard_bytes;
  c.shards_per_block = shards_per_block;
  c.max_task_entries = max_task_entries;
  c.reserved_slots = 64;
  c.hugepages = UCM_HUGEPAGES_OFF;
  c.bind_threads = 0;
  c.timeout_ms = 60000;
  c.segment_bytes = uint64_t{1} << 30;
  std::snprintf(c.backend, sizeof(c.backend), "%s", backend.c_str());
  return c;
}

ucm_cache_t open_cache(const Job& job, const ucm_config_t& cfg) {
  ucm_cache_t cache = nullptr;
  const ucm_result_t r = ucm_cache_init(MPI_COMM_WORLD, &cfg, &cache);
  if (r != UCM_OK) die(job, "ucm_cache_init", r, ucm_last_error(nullptr));
  return cache;
}

void close_cache(const Job& job, ucm_cache_t* cache) {
  const ucm_result_t r = ucm_cache_finalize(cache);
  if (r != UCM_OK) die(job, "ucm_cache_finalize", r, ucm_last_error(nullptr));
}

ucm_stats_t rank_stats(const Job& job, ucm_cache_t c) {
  ucm_stats_t s{};
  s.struct_bytes = sizeof(s);
  const ucm_result_t r = ucm_cache_stats(c, &s, nullptr);
  if (r != UCM_OK) die(job, "ucm_cache_stats", r, ucm_last_error(c));
  return s;
}

ucm_stats_t node_stats(const Job& job, ucm_cache_t c) {
  ucm_stats_t s{};
  s.struct_bytes = sizeof(s);
  const ucm_result_t r = ucm_cache_stats(c, nullptr, &s);
  if (r != UCM_OK) die(job, "ucm_cache_stats", r, ucm_last_error(c));
  return s;
}

ucm_stats_t stats_delta(const ucm_stats_t& b, const ucm_stats_t& a) {
  ucm_stats_t d = b;
#define UCM_BENCH_D(f) d.f = b.f - a.f
  UCM_BENCH_D(tasks);
  UCM_BENCH_D(shards);
  UCM_BENCH_D(hits);
  UCM_BENCH_D(owner_loads);
  UCM_BENCH_D(load_failures);
  UCM_BENCH_D(waits);
  UCM_BENCH_D(wait_ns);
  UCM_BENCH_D(takeovers);
  UCM_BENCH_D(evictions);
  UCM_BENCH_D(no_space);
  UCM_BENCH_D(prealloc_made);
  UCM_BENCH_D(prealloc_used);
  UCM_BENCH_D(failed_shards);
  UCM_BENCH_D(bytes_from_backend);
  UCM_BENCH_D(bytes_to_device);
  UCM_BENCH_D(dumps);
  UCM_BENCH_D(bytes_dumped);
#undef UCM_BENCH_D
  return d;
}

Json stats_json(const ucm_stats_t& s) {
  Json j = Json::object();
  j.set("tasks", s.tasks).set("shards", s.shards).set("hits", s.hits).set("owner_loads", s.owner_loads);
  j.set("waits", s.waits).set("wait_ns", s.wait_ns).set("takeovers", s.takeovers).set("evictions", s.evictions);
  j.set("no_space", s.no_space).set("prealloc_made", s.prealloc_made).set("prealloc_used", s.prealloc_used);
  j.set("failed_shards", s.failed_shards).set("load_failures", s.load_failures);
  j.set("bytes_from_backend", s.bytes_from_backend).set("bytes_to_device", s.bytes_to_device);
  j.set("latency_p50_us", s.latency_p50_us).set("latency_p90_us", s.latency_p90_us);
  j.set("latency_p99_us", s.latency_p99_us).set("latency_max_us", s.latency_max_us);
  return j;
}

SimBackend* sim_of(const Job& job, ucm_cache_t cache) {
  Cache* c = nullptr;
  if (resolve_handle(cache, &c) != Result::kOk || !c->backend() || std::strcmp(c->backend()->name(), "sim") != 0)
    die(job, "sim_of", UCM_ERR_INTERNAL, "the cache's backend is not the sim store");
  return static_cast<SimBackend*>(c->backend());
}

uint64_t sim_inflight(SimBackend* s) { return s->counters().inflight_loads; }
uint64_t sim_peak_inflight(SimBackend* s) { return s->counters().peak_inflight_loads; }

// ---- time, MPI, statistics --------------------------------------------------------

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t process_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void sleep_us(uint64_t us) {
  if (us == 0) return;
  timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>((us % 1000000) * 1000)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

double load_average() {
  double l[1] = {0};
  return getloadavg(l, 1) == 1 ? l[0] : -1.0;
}

void quiet_barrier(uint64_t nap_us) {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  int done = 0;
  for (;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    sleep_us(nap_us);
  }
}

std::vector<double> allgather(double v) {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<double> all(static_cast<size_t>(n));
  MPI_Allgather(&v, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  return all;
}

std::vector<uint64_t> allgather(uint64_t v) {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  std::vector<uint64_t> all(static_cast<size_t>(n));
  MPI_Allgather(&v, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD);
  return all;
}

std::vector<uint64_t> gather_vec(const std::vector<uint64_t>& v, std::vector<int>* counts) {
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int mine = static_cast<int>(v.size());
  counts->assign(static_cast<size_t>(n), 0);
  MPI_Gather(&mine, 1, MPI_INT, counts->data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  std::vector<int> displs(static_cast<size_t>(n), 0);
  int total = 0;
  for (int r = 0; r < n; ++r) {
    displs[r] = total;
    total += (*counts)[r];
  }
  std::vector<uint64_t> all(rank == 0 ? static_cast<size_t>(total) : 0);
  MPI_Gatherv(v.data(), mine, MPI_UINT64_T, all.data(), counts->data(), displs.data(), MPI_UINT64_T, 0,
              MPI_COMM_WORLD);
  return all;
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const double rank = std::ceil(q * static_cast<double>(v.size()));
  const size_t i = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return v[std::min(v.size() - 1, i)];
}

double vmax(const std::vector<double>& v) { return v.empty() ? std::nan("") : *std::max_element(v.begin(), v.end()); }
double vmin(const std::vector<double>& v) { return v.empty() ? std::nan("") : *std::min_element(v.begin(), v.end()); }

// ---- the node's backend concurrency ----------------------------------------------

InflightSampler::InflightSampler(SimBackend* sim, uint64_t period_us) : sim_(sim), period_us_(period_us) {}

InflightSampler::~InflightSampler() { stop(); }

void InflightSampler::start() {
  events_.clear();
  run_.store(true);
  thread_ = std::thread([this] {
    uint64_t last = UINT64_MAX;
    while (run_.load(std::memory_order_relaxed)) {
      const uint64_t v = sim_inflight(sim_);
      if (v != last) {
        events_.push_back(now_ns());
        events_.push_back(v);
        last = v;
      }
      sleep_us(period_us_);
    }
  });
}

void InflightSampler::stop() {
  if (!thread_.joinable()) return;
  run_.store(false);
  thread_.join();
}

uint64_t node_peak_concurrency(const std::vector<uint64_t>& all, const std::vector<int>& counts) {
  struct Ev {
    uint64_t t;
    size_t rank;
    uint64_t v;
  };
  std::vector<Ev> ev;
  size_t off = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    for (int i = 0; i + 1 < counts[r]; i += 2) ev.push_back({all[off + i], r, all[off + i + 1]});
    off += static_cast<size_t>(counts[r]);
  }
  std::sort(ev.begin(), ev.end(), [](const Ev& a, const Ev& b) { return a.t < b.t; });
  std::vector<uint64_t> cur(counts.size(), 0);
  uint64_t sum = 0, peak = 0;
  for (const Ev& e : ev) {
    sum = sum - cur[e.rank] + e.v;
    cur[e.rank] = e.v;
    peak = std::max(peak, sum);
  }
  return peak;
}

// ---- a text table -----------------------------------------------------------------

void Table::print(const Job& job, const char* title) const {
  if (job.rank != 0) return;
  std::vector<size_t> w(header_.size(), 0);
  auto widen = [&](const std::vector<std::string>& r) {
    for (size_t i = 0; i < r.size() && i < w.size(); ++i) w[i] = std::max(w[i], r[i].size());
  };
  widen(header_);
  for (const auto& r : rows_) widen(r);
  std::printf("\n%s\n", title);
  auto line = [&](const std::vector<std::string>& r) {
    std::string s = " ";
    for (size_t i = 0; i < w.size(); ++i) {
      const std::string c = i < r.size() ? r[i] : "";
      // The first column reads left to right, numbers line up on the right.
      if (i == 0) s += c + std::string(w[i] - c.size(), ' ');
      else s += std::string(w[i] - c.size(), ' ') + c;
      s += i + 1 < w.size() ? " | " : "";
    }
    std::printf("%s\n", s.c_str());
  };
  line(header_);
  std::string sep = " ";
  for (size_t i = 0; i < w.size(); ++i) sep += std::string(w[i], '-') + (i + 1 < w.size() ? "-+-" : "");
  std::printf("%s\n", sep.c_str());
  for (const auto& r : rows_) line(r);
  std::fflush(stdout);
}

}  // namespace ucm::bench
