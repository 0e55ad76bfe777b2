// ucm_demo's bound (apps/demo_bound.h): Belady's MIN on sequences whose answer
// is known, against an exhaustive search of every eviction choice, and the raw
// read of store files (what it reads, not how fast).
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "demo_bound.h"

namespace {

using ucm_demo::belady_min;

// The fewest loads over every choice of victim (tiny inputs only).
uint64_t brute_min(const std::vector<uint64_t>& seq, std::vector<uint64_t> held, size_t cap, size_t i) {
  for (; i < seq.size(); ++i)
    if (std::find(held.begin(), held.end(), seq[i]) == held.end()) break;
  if (i == seq.size()) return 0;
  if (held.size() < cap) {
    held.push_back(seq[i]);
    return 1 + brute_min(seq, held, cap, i + 1);
  }
  uint64_t best = UINT64_MAX;
  for (size_t v = 0; v < held.size(); ++v) {
    std::vector<uint64_t> h = held;
    h[v] = seq[i];
    best = std::min(best, 1 + brute_min(seq, h, cap, i + 1));
  }
  return best;
}

TEST(DemoBound, BeladyOnACycleLargerThanTheCache) {
  const std::vector<uint64_t> abc = {1, 2, 3, 1, 2, 3};
  EXPECT_EQ(belady_min(abc, {}, 2), 4u);      // a b c (evict b) a b (evict a) c
  EXPECT_EQ(belady_min(abc, {1, 2}, 2), 2u);  // c (evict b), b (evict a)
  EXPECT_EQ(belady_min(abc, {}, 3), 3u);      // only the first touches
  EXPECT_EQ(belady_min(abc, {1, 2, 3}, 3), 0u);
  EXPECT_EQ(belady_min(abc, {}, 0), 6u);
}

TEST(DemoBound, BeladyEvictsResidentKeysNeverAskedForFirstAndIgnoresExtras) {
  EXPECT_EQ(belady_min({1, 2, 1}, {9, 1}, 2), 1u);  // 2 evicts 9, never asked for
  EXPECT_EQ(belady_min({1, 2, 1}, {9, 8, 1}, 2), 2u);  // 1 is beyond capacity: not held
}

TEST(DemoBound, BeladyEqualsTheExhaustiveOptimum) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 4 + rng() % 9, keys = 2 + rng() % 4, cap = 1 + rng() % 3;
    std::vector<uint64_t> seq(n), start;
    for (auto& k : seq) k = rng() % keys;
    for (size_t j = 0; j < cap; ++j)
      if (rng() % 2) start.push_back(rng() % (keys + 1));
    std::vector<uint64_t> held;
    for (uint64_t k : start)
      if (held.size() < cap && std::find(held.begin(), held.end(), k) == held.end()) held.push_back(k);
    EXPECT_EQ(belady_min(seq, start, cap), brute_min(seq, held, cap, 0)) << "trial " << trial;
  }
}

TEST(DemoBound, RawReadReadsEveryByteOfTheFilesOncePerPass) {
  char tmpl[] = "/tmp/ucm_demo_bound_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  std::vector<std::string> paths;
  for (int f = 0; f < 3; ++f) {
    paths.push_back(dir + "/" + std::to_string(f) + ".ucmblk");
    FILE* fp = std::fopen(paths.back().c_str(), "wb");
    ASSERT_NE(fp, nullptr);
    std::vector<char> bytes(100 * 1024 + 17 * f, 'x');
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), fp), bytes.size());
    std::fclose(fp);
  }
  const uint64_t all = 3 * 100 * 1024 + 17 * 3;
  ucm_demo::RawRead r = ucm_demo::raw_read_rate(paths, 16 * 1024, 3, 2, UINT64_MAX);
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.bytes_per_pass, all);
  EXPECT_EQ(r.files, 3u);
  EXPECT_EQ(r.passes, 2);
  EXPECT_GT(r.median_bytes_per_s, 0);
  EXPECT_GE(r.best_bytes_per_s, r.median_bytes_per_s);
  // max_bytes stops after the chunk that reaches it.
  r = ucm_demo::raw_read_rate(paths, 16 * 1024, 2, 1, 20 * 1024);
  EXPECT_EQ(r.bytes_per_pass, 32u * 1024u);
  EXPECT_EQ(r.files, 1u);
  r = ucm_demo::raw_read_rate({dir + "/missing"}, 4096, 1, 1, UINT64_MAX);
  EXPECT_NE(r.error.find("missing"), std::string::npos) << r.error;
  std::filesystem::remove_all(dir);
}

}  // namespace
