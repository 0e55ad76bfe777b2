// Log-linear latency buckets (HdrHistogram's scheme, 16 sub-buckets per power
// of two) and the percentiles read from them.
//
// A value v (microseconds here, but the math is unit-free) below 16 has a
// bucket of its own. Above, each power of two [2^k, 2^(k+1)) is cut into 16
// buckets of width 2^(k-4), so a bucket's width is at most 1/16 of any value
// in it, and its midpoint is within 1/32 (3.1%) of every value in it. A
// percentile read from the buckets is that midpoint for the bucket holding
// the exact percentile's sample, so it is within 1/32 of the exact value.
// Values at or past 2^32 (71 minutes in microseconds) all count in the last
// bucket; the exact maximum is kept beside the buckets by whoever records.
//
// Pure functions over an array of counts: no atomics, no allocation, no MPI.
// The shared control region keeps kLatencyBuckets atomic counters per rank
// (queue/counters.h); readers copy them into a plain array and call these.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ucm {

constexpr uint32_t kLatencySubBits = 4;                        // 16 sub-buckets per power of two
constexpr uint32_t kLatencySub = 1u << kLatencySubBits;
constexpr uint32_t kLatencyMaxBits = 32;                       // values < 2^32 keep the 1/32 bound
constexpr uint32_t kLatencyBuckets = kLatencySub * (kLatencyMaxBits - kLatencySubBits + 1);  // 464

// The bucket of value v.
constexpr uint32_t latency_bucket(uint64_t v) {
  if (v >= (uint64_t{1} << kLatencyMaxBits)) v = (uint64_t{1} << kLatencyMaxBits) - 1;
  if (v < kLatencySub) return static_cast<uint32_t>(v);
  const uint32_t msb = 63u - static_cast<uint32_t>(__builtin_clzll(v));  // >= kLatencySubBits
  const uint32_t shift = msb - kLatencySubBits;
  return kLatencySub * (shift + 1) + static_cast<uint32_t>((v >> shift) - kLatencySub);
}

// The smallest value of bucket b, and its width (values [low, low + width)).
constexpr uint64_t latency_bucket_low(uint32_t b) {
  if (b < kLatencySub) return b;
  const uint32_t shift = b / kLatencySub - 1;
  return (uint64_t{b % kLatencySub} + kLatencySub) << shift;
}
constexpr uint64_t latency_bucket_width(uint32_t b) {
  return b < kLatencySub ? 1 : uint64_t{1} << (b / kLatencySub - 1);
}
// The value a percentile in bucket b reads as: its midpoint (its only value
// when it is one wide).
constexpr uint64_t latency_bucket_value(uint32_t b) { return latency_bucket_low(b) + latency_bucket_width(b) / 2; }

static_assert(latency_bucket(kLatencySub - 1) == kLatencySub - 1);
static_assert(latency_bucket(uint64_t{1} << kLatencyMaxBits) == kLatencyBuckets - 1);
static_assert(latency_bucket_low(kLatencyBuckets - 1) + latency_bucket_width(kLatencyBuckets - 1) ==
              uint64_t{1} << kLatencyMaxBits);

// The nearest-rank percentile num/den (0 < num <= den) of the `n` buckets in
// `hist`: the value of the ceil(total * num / den)-th smallest sample (at
// least the first), read as its bucket's midpoint. 0 when nothing was counted.
inline uint64_t latency_percentile(const uint64_t* hist, size_t n, uint64_t num, uint64_t den) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += hist[i];
  if (total == 0) return 0;
  // ceil(total * num / den) without overflow (num <= den).
  uint64_t want = (total / den) * num + ((total % den) * num + den - 1) / den;
  if (want == 0) want = 1;
  uint64_t seen = 0;
  for (size_t i = 0; i < n; ++i) {
    seen += hist[i];
    if (seen >= want) return latency_bucket_value(static_cast<uint32_t>(i));
  }
  return latency_bucket_value(static_cast<uint32_t>(n - 1));
}

}  // namespace ucm
