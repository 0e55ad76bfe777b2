// The log-linear latency buckets (common/latency_histogram.h): every value
// lands in the bucket that holds it, and every percentile read from the
// buckets is within 1/32 of the exact one, for a sweep of values up to 2^32
// and for random distributions.
#include "common/latency_histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace ucm {
namespace {

// |estimate - exact| <= exact / 32, in integers.
::testing::AssertionResult within_bound(uint64_t estimate, uint64_t exact) {
  const uint64_t diff = estimate > exact ? estimate - exact : exact - estimate;
  if (diff * 32 <= exact) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "estimate " << estimate << " is " << diff << " off exact " << exact
                                       << " (bound " << exact / 32.0 << ")";
}

void check_value(uint64_t v) {
  const uint32_t b = latency_bucket(v);
  ASSERT_LT(b, kLatencyBuckets) << "value " << v;
  ASSERT_LE(latency_bucket_low(b), v) << "value " << v << " bucket " << b;
  ASSERT_LT(v, latency_bucket_low(b) + latency_bucket_width(b)) << "value " << v << " bucket " << b;
  ASSERT_TRUE(within_bound(latency_bucket_value(b), v)) << "value " << v << " bucket " << b;
}

TEST(LatencyHistogram, EveryValueUpTo2To16LandsInItsBucketWithinTheBound) {
  for (uint64_t v = 0; v < (uint64_t{1} << 16); ++v) ASSERT_NO_FATAL_FAILURE(check_value(v));
}

TEST(LatencyHistogram, BucketEdgesAndASweepUpTo2To32StayWithinTheBound) {
  for (uint32_t b = 0; b < kLatencyBuckets; ++b) {
    const uint64_t low = latency_bucket_low(b), width = latency_bucket_width(b);
    ASSERT_EQ(latency_bucket(low), b);
    ASSERT_EQ(latency_bucket(low + width - 1), b);
    if (b + 1 < kLatencyBuckets) {
      ASSERT_EQ(latency_bucket_low(b + 1), low + width) << "bucket " << b;
    }
    ASSERT_NO_FATAL_FAILURE(check_value(low));
    ASSERT_NO_FATAL_FAILURE(check_value(low + width - 1));
    ASSERT_NO_FATAL_FAILURE(check_value(low + width / 2));
  }
  // A geometric sweep with a stride that is not a power of two.
  for (double v = 1; v < 4294967296.0; v *= 1.0007) ASSERT_NO_FATAL_FAILURE(check_value(static_cast<uint64_t>(v)));
  ASSERT_NO_FATAL_FAILURE(check_value((uint64_t{1} << 32) - 1));
  EXPECT_EQ(latency_bucket(uint64_t{1} << 40), kLatencyBuckets - 1) << "values past 2^32 count in the last bucket";
  EXPECT_EQ(kLatencyBuckets, 464u);
}

TEST(LatencyHistogram, A23MsMedianReadsAs23MsNotAPowerOfTwo) {
  std::vector<uint64_t> hist(kLatencyBuckets);
  for (uint64_t us : {21000, 22000, 23000, 24000, 25000}) ++hist[latency_bucket(us)];
  const uint64_t p50 = latency_percentile(hist.data(), hist.size(), 50, 100);
  EXPECT_TRUE(within_bound(p50, 23000));
  EXPECT_NE(p50, 32767u);  // what the power-of-two buckets read
}

TEST(LatencyHistogram, EmptyReadsZeroAndOneSampleReadsItself) {
  std::vector<uint64_t> hist(kLatencyBuckets);
  EXPECT_EQ(latency_percentile(hist.data(), hist.size(), 50, 100), 0u);
  ++hist[latency_bucket(7)];
  EXPECT_EQ(latency_percentile(hist.data(), hist.size(), 1, 100), 7u);
  EXPECT_EQ(latency_percentile(hist.data(), hist.size(), 100, 100), 7u);
}

// The exact nearest-rank percentile of sorted samples: the
// ceil(n * num / den)-th smallest (at least the first).
uint64_t exact_percentile(const std::vector<uint64_t>& sorted, uint64_t num, uint64_t den) {
  const uint64_t n = sorted.size();
  uint64_t k = (n * num + den - 1) / den;
  if (k == 0) k = 1;
  return sorted[k - 1];
}

TEST(LatencyHistogram, PercentilesOfRandomDistributionsAreWithinOneThirtySecondOfExact) {
  std::mt19937_64 rng(12);
  const std::pair<uint64_t, uint64_t> quantiles[] = {{1, 100}, {50, 100}, {90, 100}, {99, 100},
                                                    {999, 1000}, {1, 1}, {1, 3}};
  for (int run = 0; run < 200; ++run) {
    const size_t n = 1 + rng() % 5000;
    std::vector<uint64_t> samples(n);
    const int shape = run % 5;
    std::lognormal_distribution<double> lognormal(std::log(1000.0 + static_cast<double>(rng() % 100000)), 1.0);
    std::exponential_distribution<double> expo(1.0 / (1 + static_cast<double>(rng() % 1000000)));
    const double top = std::ldexp(1.0, 1 + static_cast<int>(rng() % 32));
    for (uint64_t& s : samples) {
      double v = 0;
      switch (shape) {
        case 0: v = lognormal(rng); break;
        case 1: v = expo(rng); break;
        case 2: v = std::exp2(std::uniform_real_distribution<double>(0, std::log2(top))(rng)); break;  // log-uniform
        case 3: v = (rng() % 2) ? 40 + static_cast<double>(rng() % 20) : 20000 + static_cast<double>(rng() % 9000); break;
        default: v = static_cast<double>(rng() % (uint64_t{1} << 32)); break;  // uniform up to 2^32
      }
      s = std::min<uint64_t>(static_cast<uint64_t>(v), (uint64_t{1} << 32) - 1);
    }
    std::vector<uint64_t> hist(kLatencyBuckets);
    for (uint64_t s : samples) ++hist[latency_bucket(s)];
    std::sort(samples.begin(), samples.end());
    for (const auto& [num, den] : quantiles)
      ASSERT_TRUE(within_bound(latency_percentile(hist.data(), hist.size(), num, den),
                               exact_percentile(samples, num, den)))
          << "run " << run << " shape " << shape << " n " << n << " quantile " << num << "/" << den;
  }
}

}  // namespace
}  // namespace ucm
