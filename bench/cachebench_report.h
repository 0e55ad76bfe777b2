// ucm_cachebench's results and how they are reported: the anchors (UCM's v1
// index) and targets, the per-case samples, statistics, the table on stdout
// and the JSON file. Measuring lives in ucm_cachebench.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ctrl/layout.h"

namespace ucm::bench {

// UCM's v1 index, measured on this machine kind (ns per op).
constexpr double kAnchorHit = 35;
constexpr double kAnchorMiss = 80;
constexpr double kAnchorHit2Lo = 150;  // two processes on adjacent slots
constexpr double kAnchorHit2Hi = 190;
// Targets.
constexpr double kTargetHit = 30;
constexpr double kTargetMiss = 80;
constexpr double kTargetNoCliff = 1.25;  // two processes on adjacent slots vs one
constexpr double kTargetWakeRatio = 100;

// Which slots a process hits: see hit_slot() in ucm_cachebench.cpp.
enum class Layout { kOne, kAdjacent, kFar, kSame };
enum class OpKind { kHit, kMiss };

// One Get+Release case and its samples (one per rep).
struct Case {
  std::string name;
  OpKind kind;
  Layout layout;
  uint32_t keys;  // per process (hits)
  EvictMode evict;
  bool fill;  // misses: write 8 bytes into the slot before mark_ready
  int procs;
  double anchor_lo, anchor_hi;   // v1's ns/op (one number: lo == hi)
  double target;                 // 0: none (the two-process hit cases use the cliff ratio)
  std::vector<double> runs;      // ns/op per rep, averaged over processes
  std::vector<double> runs_max;  // ns/op per rep, slowest process
  std::vector<double> runs_cpu;  // CPU ns/op per rep, averaged over processes
  bool v1 = false;               // the v1 model (v1_index.h), the same-run control, not ucmcache
};

// The v1 model's line that a ucmcache line is compared with in the same run
// (same op, layout, keys, processes and fill; misses: v1 had only the ring).
const Case* v1_twin(const std::vector<Case>& cs, const Case& c);
// A ucmcache line over its twin: the median of the per-rep ratios (each
// twin runs right after its line, once per rep).
double ratio_to_twin(const Case& c, const Case& twin);
// The same-run form of a target: a line must be at most target/anchor times
// the v1 model's (hit: 30/35, miss: 80/80).
double v1_ratio_target(const Case& c);

struct WakeResult {
  const char* mode;
  int iters;
  std::vector<double> latency_us;  // per wait: waiter running - owner's mark_ready
  std::vector<double> cpu_us;      // per wait: the waiter's thread CPU time
};

// How the run was made, for the header line and the JSON.
struct RunInfo {
  bool quick;
  int reps;
  uint64_t run_ms;
  uint32_t slots;
  uint64_t slot_bytes;
  uint32_t max_ranks;
  bool hugetlb;
  double loadavg;
  int cpus[2];
  // Calibration, measured at start: what one locked read-modify-write (an
  // uncontended fetch_add) and one CLOCK_MONOTONIC read cost on this machine
  // now. The core's ops are mostly made of these; they drift with the host.
  double locked_rmw_ns;
  double clock_read_ns;
};

// Nearest-rank percentile (q in [0, 1]); 0 for an empty sample.
double percentile(std::vector<double> v, double q);
double median(const std::vector<double>& v);
double mean(const std::vector<double>& v);

std::string cpu_model();   // "model name" from /proc/cpuinfo
const char* sched_name();  // "fifo" under chrt -f, else "other"

void print_header(const RunInfo& info);
void print_ops(const std::vector<Case>& cs);
void print_wake(const WakeResult& futex, const WakeResult& poll);
// Returns false (after perror) if the file cannot be written.
bool write_json(const std::string& path, const RunInfo& info, const std::vector<Case>& cs, const WakeResult* futex,
                const WakeResult* poll);

}  // namespace ucm::bench
