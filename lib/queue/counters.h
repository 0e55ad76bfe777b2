// The load queue's per-rank counters: tasks and shards through this rank, its
// store I/O, its copies, and its task latency. They live in the node's shared
// control region, in the part of rank r's RankRecord that the region reserves
// for the queue (ctrl/layout.h, RankRecord::queue_area), so ucm_cache_stats
// can sum every rank's. Only rank r's queue writes them (relaxed adds; the
// maximum is a CAS max over the threads of rank r that complete tasks);
// recovery never does. The layout is the region's ABI: a change here bumps
// kCtrlAbi (ctrl/layout.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>

#include "common/latency_histogram.h"
#include "ctrl/layout.h"

namespace ucm {

struct QueueCounters {
  std::atomic<uint64_t> tasks;
  std::atomic<uint64_t> shards;
  std::atomic<uint64_t> backend_loads;      // loads this rank issued as owner
  std::atomic<uint64_t> load_failures;      // of those, failed
  std::atomic<uint64_t> wait_ns;            // time copier items spent waiting for Ready
  std::atomic<uint64_t> bytes_from_backend;
  std::atomic<uint64_t> bytes_to_device;
  std::atomic<uint64_t> dumps;              // shards this rank wrote through
  std::atomic<uint64_t> bytes_dumped;
  std::atomic<uint64_t> failed_shards;      // entries that failed their task
  std::atomic<uint64_t> direct_fallbacks;   // backend I/Os refused as direct, redone buffered
  // Task latency, submit to completion, in microseconds: log-linear buckets
  // (common/latency_histogram.h, within 1/32 of the exact value) and the
  // exact maximum.
  std::atomic<uint64_t> latency_max_us;
  std::atomic<uint64_t> latency_us[kLatencyBuckets];
  std::atomic<uint64_t> inline_tasks;       // load tasks copied and completed on the submitting thread
  // Their hits: counted here, not in RankCounters.hits, which the cache bumps
  // with a plain store on the dispatcher's get() (one writer); several
  // submitting threads add here. ucm_cache_stats reports the sum as hits.
  std::atomic<uint64_t> inline_hits;
  // Gets that waited for a free slot until half of their task's time was gone
  // and then looked with no eviction protection (ctrl/protect_relax.h).
  std::atomic<uint64_t> protect_overrides;
};
static_assert(sizeof(QueueCounters) == 8 * (15 + kLatencyBuckets));
static_assert(sizeof(QueueCounters) <= sizeof(RankRecord::queue_area), "the queue's counters outgrew their part of the rank record");
static_assert(alignof(QueueCounters) <= 8);

inline QueueCounters& queue_counters(RankRecord& r) { return *std::launder(reinterpret_cast<QueueCounters*>(r.queue_area)); }
inline const QueueCounters& queue_counters(const RankRecord& r) {
  return *std::launder(reinterpret_cast<const QueueCounters*>(r.queue_area));
}

}  // namespace ucm
