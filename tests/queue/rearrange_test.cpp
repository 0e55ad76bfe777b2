// RearrangeIndex (seed 3.1, scenario A): the order in which local rank r of n
// visits a task's entries. Rotate: its own stride first, then the next rank's.
#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "queue/rearrange.h"

namespace ucm::test {
namespace {

std::vector<uint32_t> order(uint32_t count, uint32_t rank, uint32_t ranks, bool rotate = true) {
  std::vector<uint32_t> out;
  rearrange_order(count, rank, ranks, rotate, &out);
  return out;
}

std::vector<uint32_t> natural(uint32_t count) {
  std::vector<uint32_t> v;
  for (uint32_t i = 0; i < count; ++i) v.push_back(i);
  return v;
}

bool is_permutation_of_count(const std::vector<uint32_t>& v, uint32_t count) {
  if (v.size() != count) return false;
  std::set<uint32_t> s(v.begin(), v.end());
  return s.size() == count && (count == 0 || *s.rbegin() == count - 1);
}

TEST(Rearrange, SeedScenarioAFourRanksTwelveShards) {
  // The seed: rank r takes its own stride r, r+4, r+8, then rotates to the next.
  EXPECT_EQ(order(12, 0, 4), (std::vector<uint32_t>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(order(12, 1, 4), (std::vector<uint32_t>{1, 5, 9, 2, 6, 10, 3, 7, 11, 0, 4, 8}));
  EXPECT_EQ(order(12, 2, 4), (std::vector<uint32_t>{2, 6, 10, 3, 7, 11, 0, 4, 8, 1, 5, 9}));
  EXPECT_EQ(order(12, 3, 4), (std::vector<uint32_t>{3, 7, 11, 0, 4, 8, 1, 5, 9, 2, 6, 10}));
}

TEST(Rearrange, SeedScenarioAEveryStepTouchesFourDistinctShards) {
  // "In the first 3 steps the four ranks hit mutually disjoint shards each
  // step; after sweeping their own stride they rotate, still keeping
  // different shards per step."
  std::vector<std::vector<uint32_t>> o;
  for (uint32_t r = 0; r < 4; ++r) o.push_back(order(12, r, 4));
  for (size_t step = 0; step < 12; ++step) {
    std::set<uint32_t> at;
    for (uint32_t r = 0; r < 4; ++r) at.insert(o[r][step]);
    EXPECT_EQ(at.size(), 4u) << "step " << step;
  }
  // The first three steps cover all 12 shards: each rank owns exactly its stride.
  std::set<uint32_t> first3;
  for (uint32_t r = 0; r < 4; ++r)
    for (size_t step = 0; step < 3; ++step) {
      first3.insert(o[r][step]);
      EXPECT_EQ(o[r][step] % 4, r) << "rank " << r << " step " << step << " is in its own stride";
    }
  EXPECT_EQ(first3.size(), 12u);
}

TEST(Rearrange, CountNotDivisibleByRanks) {
  // 10 entries, 4 ranks: strides of 3, 3, 2, 2 entries.
  EXPECT_EQ(order(10, 0, 4), (std::vector<uint32_t>{0, 4, 8, 1, 5, 9, 2, 6, 3, 7}));
  EXPECT_EQ(order(10, 1, 4), (std::vector<uint32_t>{1, 5, 9, 2, 6, 3, 7, 0, 4, 8}));
  EXPECT_EQ(order(10, 2, 4), (std::vector<uint32_t>{2, 6, 3, 7, 0, 4, 8, 1, 5, 9}));
  EXPECT_EQ(order(10, 3, 4), (std::vector<uint32_t>{3, 7, 0, 4, 8, 1, 5, 9, 2, 6}));
  // 7 entries, 3 ranks.
  EXPECT_EQ(order(7, 2, 3), (std::vector<uint32_t>{2, 5, 0, 3, 6, 1, 4}));
  // Every combination is a permutation that starts with the rank's own stride.
  for (uint32_t ranks = 1; ranks <= 8; ++ranks)
    for (uint32_t count = 0; count <= 40; ++count)
      for (uint32_t r = 0; r < ranks; ++r) {
        const auto o = order(count, r, ranks);
        ASSERT_TRUE(is_permutation_of_count(o, count)) << count << " entries, rank " << r << " of " << ranks;
        const uint32_t own = r < count ? (count - r + ranks - 1) / ranks : 0;
        for (uint32_t i = 0; i < own; ++i)
          EXPECT_EQ(o[i], r + i * ranks) << count << " entries, rank " << r << " of " << ranks << ", position " << i;
      }
}

TEST(Rearrange, FewerEntriesThanRanks) {
  // Rank 3 of 4 with 2 entries has an empty stride: it starts with the next
  // non-empty one (rank 0's).
  EXPECT_EQ(order(2, 3, 4), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(order(2, 1, 4), (std::vector<uint32_t>{1, 0}));
  EXPECT_EQ(order(1, 2, 4), (std::vector<uint32_t>{0}));
  EXPECT_TRUE(order(0, 2, 4).empty());
}

TEST(Rearrange, OneRankIsNaturalOrder) {
  EXPECT_EQ(order(12, 0, 1), natural(12));
  EXPECT_EQ(order(5, 0, 1), natural(5));
}

TEST(Rearrange, NaturalOrderIgnoresTheRank) {
  // The legacy control group: every rank walks 0, 1, 2, ... in lockstep.
  for (uint32_t r = 0; r < 4; ++r) EXPECT_EQ(order(12, r, 4, false), natural(12)) << "rank " << r;
  EXPECT_EQ(order(10, 3, 4, false), natural(10));
}

TEST(Rearrange, ReusesTheOutputVector) {
  std::vector<uint32_t> out{99, 98, 97, 96, 95, 94, 93, 92, 91, 90, 89, 88, 87};
  rearrange_order(4, 1, 2, true, &out);
  EXPECT_EQ(out, (std::vector<uint32_t>{1, 3, 0, 2}));
}

}  // namespace
}  // namespace ucm::test
