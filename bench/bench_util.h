// ucm_bench's shared pieces: options, the job (rank, size, verification
// tally, JSON root), a small JSON tree, keys and destination buffers, byte
// verification against the sim store's content, stats deltas, MPI gathers,
// order statistics, a text table, and a sampler of the sim store's in-flight
// loads (for the node's peak backend concurrency).
//
// Everything here runs on every rank unless its comment says "rank 0".
#pragma once

#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/numbered_key.h"
#include "ucmcache/ucm.h"

namespace ucm {
class SimBackend;
}

namespace ucm::bench {

// ---- options --------------------------------------------------------------------

struct Options {
  std::vector<std::string> scenarios;  // cold, warm, wait, evict, prealloc
  std::string json = "ucm_bench.json";
  int reps = 3;
  // cold
  uint64_t shard_kib = 64;
  uint32_t latency_us = 4000;
  uint32_t io_depth = 1;
  uint32_t shards_per_rank = 8;
  std::vector<uint32_t> skews_us = {0, 50, 1000};
  uint32_t skew_io_depth = 8;
  // warm
  uint64_t warm_shard_kib = 256;
  uint32_t warm_shards = 128;
  int warm_reps = 20;
  // wait
  uint32_t wait_latency_us = 2000;
  int wait_tasks = 30;
  // evict
  int evict_tasks = 12;
  std::vector<uint32_t> evict_slots = {128, 64};
  uint32_t evict_skew_us = 0;
  // prealloc
  uint32_t prealloc_pause_ms = 20;
};

// Parses argv; false (with a message) on a bad argument or --help.
bool parse_options(int argc, char** argv, Options* o);
void print_usage();

// ---- a small JSON tree ----------------------------------------------------------

class Json {
 public:
  enum class Kind { kNull, kNumber, kString, kBool, kArray, kObject };
  Json() = default;
  Json(double v);  // NaN and infinities become null
  Json(int v) : Json(static_cast<int64_t>(v)) {}
  Json(int64_t v);
  Json(uint64_t v);
  Json(uint32_t v) : Json(static_cast<uint64_t>(v)) {}
  Json(bool v);
  Json(const char* s);
  Json(const std::string& s);
  static Json object();
  static Json array();
  template <typename T>
  static Json array_of(const std::vector<T>& v) {
    Json a = array();
    for (const T& x : v) a.push(Json(x));
    return a;
  }

  Json& set(const std::string& key, Json v);  // on an object
  Json& push(Json v);                         // on an array
  std::string dump(int indent = 0) const;

 private:
  void dump_to(std::string* out, int indent, int depth) const;
  Kind kind_ = Kind::kNull;
  std::string text_;  // a number's or string's text
  std::vector<std::pair<std::string, Json>> items_;  // object members (array: keys empty)
};

// ---- the job ---------------------------------------------------------------------

struct Job {
  int rank = 0;
  int size = 1;
  Options opt;
  Json root = Json::object();
  uint64_t shards_verified = 0;  // this rank
  uint64_t bad_shards = 0;       // this rank
};

// Prints on every rank that calls it, then aborts the job.
[[noreturn]] void die(const Job& job, const char* what, ucm_result_t r, const char* detail);

// rank 0 only prints.
void say(const Job& job, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// ---- keys, buffers, verification --------------------------------------------------

// Keys are ukey(b, s) and ublock(b) of common/numbered_key.h, the numbering
// the tests use.
using ::ucm::ikey;
using ::ucm::ublock;
using ::ucm::ukey;

// Page-aligned destination memory for n shards of `shard` bytes.
class ShardBuffer {
 public:
  ShardBuffer() = default;
  ShardBuffer(size_t n, uint64_t shard);
  ~ShardBuffer();
  ShardBuffer(ShardBuffer&& o) noexcept { *this = std::move(o); }
  ShardBuffer& operator=(ShardBuffer&& o) noexcept;
  ShardBuffer(const ShardBuffer&) = delete;
  ShardBuffer& operator=(const ShardBuffer&) = delete;
  uint8_t* at(size_t i) const { return base_ + i * shard_; }
  size_t count() const { return n_; }
  uint64_t shard_bytes() const { return shard_; }
  void poison() const;  // every byte 0xee: a copy that did not happen shows

 private:
  uint8_t* base_ = nullptr;
  size_t n_ = 0;
  uint64_t shard_ = 0;
};

// Entries for keys[i] -> buf.at(first + i).
std::vector<ucm_load_entry_t> entries_for(const std::vector<ucm_key_t>& keys, const ShardBuffer& buf, size_t first = 0);

// Checks every byte of every entry against the sim content; a mismatch is
// printed at once (loudly) and counted in job->bad_shards.
void verify_entries(Job* job, const char* where, const ucm_load_entry_t* e, size_t n, uint64_t shard_bytes);

// Submits and waits; any failure aborts the job.
void load_and_wait(const Job& job, ucm_cache_t cache, const ucm_load_entry_t* e, size_t n);

// ---- configuration, cache life ----------------------------------------------------

// The study's baseline: host engine, no hugepages (none are reserved here),
// threads not pinned (more threads than cores), the sim store.
ucm_config_t base_config(const Job& job, uint64_t shard_bytes, uint64_t slots, uint32_t shards_per_block,
                         uint32_t max_task_entries, const std::string& backend);
std::string sim_spec(uint32_t latency_us, uint32_t max_inflight);
ucm_cache_t open_cache(const Job& job, const ucm_config_t& cfg);
void close_cache(const Job& job, ucm_cache_t* cache);

ucm_stats_t rank_stats(const Job& job, ucm_cache_t c);
ucm_stats_t node_stats(const Job& job, ucm_cache_t c);
// b - a, field by field (counters only; percentiles are copied from b).
ucm_stats_t stats_delta(const ucm_stats_t& b, const ucm_stats_t& a);
Json stats_json(const ucm_stats_t& s);

// The sim store behind this rank's handle (each rank has its own instance).
SimBackend* sim_of(const Job& job, ucm_cache_t cache);
// Backend loads in flight in this rank's sim store now, and their peak so far.
uint64_t sim_inflight(SimBackend* s);
uint64_t sim_peak_inflight(SimBackend* s);

// ---- time, MPI, statistics --------------------------------------------------------

uint64_t now_ns();
uint64_t process_cpu_ns();
void sleep_us(uint64_t us);
double load_average();

// A barrier that sleeps instead of spinning: Open MPI's blocking calls poll
// the shared-memory transport at full speed, and on a machine with fewer
// cores than ranks a rank that waits there takes the CPU from the ranks
// still being measured. Exit granularity: `nap_us`.
void quiet_barrier(uint64_t nap_us = 50);

// Every rank's value, on every rank.
std::vector<double> allgather(double v);
std::vector<uint64_t> allgather(uint64_t v);
// Every rank's vector, concatenated in rank order, on rank 0 (empty elsewhere);
// counts[r] is rank r's length (rank 0 only).
std::vector<uint64_t> gather_vec(const std::vector<uint64_t>& v, std::vector<int>* counts);

double median(std::vector<double> v);
double percentile(std::vector<double> v, double q);  // nearest rank, q in [0, 1]
double vmax(const std::vector<double>& v);
double vmin(const std::vector<double>& v);

// ---- the node's backend concurrency ----------------------------------------------

// Samples this rank's sim in-flight count every `period_us` on its own thread
// and keeps the changes (time, value).
class InflightSampler {
 public:
  InflightSampler(SimBackend* sim, uint64_t period_us);
  ~InflightSampler();
  void start();
  void stop();
  // (t_ns, value) pairs, flattened.
  const std::vector<uint64_t>& events() const { return events_; }

 private:
  SimBackend* sim_;
  uint64_t period_us_;
  std::atomic<bool> run_{false};
  std::thread thread_;
  std::vector<uint64_t> events_;
};

// Rank 0: the peak over time of the sum of every rank's in-flight count, from
// the gathered events of all ranks (gather_vec of events()).
uint64_t node_peak_concurrency(const std::vector<uint64_t>& all, const std::vector<int>& counts);

// ---- a text table (rank 0) --------------------------------------------------------

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void row(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }
  void print(const Job& job, const char* title) const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));

// ---- scenarios --------------------------------------------------------------------

void run_cold(Job* job);
void run_warm(Job* job);
void run_wait(Job* job);
void run_evict(Job* job);
void run_prealloc(Job* job);

}  // namespace ucm::bench
