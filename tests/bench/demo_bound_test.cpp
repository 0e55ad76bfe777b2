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

TEST(DemoBound, RawReadBestTakesTheBetterThreadCountAndSaysWhatItTried) {
  char tmpl[] = "/tmp/ucm_demo_bound_test.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const std::string path = dir + "/0.ucmblk";
  FILE* fp = std::fopen(path.c_str(), "wb");
  ASSERT_NE(fp, nullptr);
  std::vector<char> bytes(64 * 1024, 'y');
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), fp), bytes.size());
  std::fclose(fp);
  // 1 rank: both counts are the store's 2 threads (measured once); 3 ranks: 2 and 6.
  ucm_demo::RawRead r = ucm_demo::raw_read_best({path}, 16 * 1024, {2, 2}, 1, UINT64_MAX);
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(r.tried.find("2 threads"), 0u) << r.tried;
  EXPECT_EQ(r.tried.find(", "), std::string::npos) << r.tried;
  r = ucm_demo::raw_read_best({path}, 16 * 1024, {2, 6}, 1, UINT64_MAX);
  EXPECT_EQ(r.error, "");
  EXPECT_NE(r.tried.find("2 threads"), std::string::npos) << r.tried;
  EXPECT_NE(r.tried.find(", 6 threads"), std::string::npos) << r.tried;
  EXPECT_TRUE(r.threads == 2 || r.threads == 6);
  EXPECT_EQ(r.bytes_per_pass, 64u * 1024u);
  r = ucm_demo::raw_read_best({dir + "/missing"}, 4096, {1, 4}, 1, UINT64_MAX);
  EXPECT_NE(r.error.find("missing"), std::string::npos) << r.error;
  std::filesystem::remove_all(dir);
}

// ucm_demo's decode pipeline, simulated: each KV part holds a (layer, state)
// tag; a load into a part must find it checked (never a layer still waiting
// for its check) and holding another layer or nothing, so that a load that
// wrote nothing fails its check; at most `window` tasks are in flight.
TEST(DemoPipeline, EveryWindowKeepsItsDepthAndNeverReloadsAnUncheckedOrSameLayerPart) {
  for (int layers : {1, 2, 3, 8, 16}) {
    for (int window : {1, 2, 3, 4, 7, 8, 9, 16, 17, 33}) {
      for (int extra : {0, 1, 5}) {
        const int steps = 3, total = steps * layers;
        const int parts = extra == 0 ? ucm_demo::kv_parts_for(window, layers) : window + extra;
        const bool clear = ucm_demo::clear_after_check(parts, layers);
        ASSERT_GE(parts, window);
        if (extra == 0 && layers > 1) {
          EXPECT_FALSE(clear) << "the default KV buffer needs no clearing";
        }
        struct Part {
          int layer = -1;       // the layer whose bytes it holds (-1: zeros)
          bool pending = false;  // a load in flight or not yet checked
        };
        std::vector<Part> kv(static_cast<size_t>(parts));
        std::vector<int> submitted, completed;
        int in_flight = 0, most = 0;
        auto submit = [&](int pos) {
          Part& p = kv[static_cast<size_t>(pos % parts)];
          const int layer = pos % layers;
          ASSERT_FALSE(p.pending) << "layers " << layers << " window " << window << ": pos " << pos
                                  << " loads into a part not yet checked";
          ASSERT_NE(p.layer, layer) << "layers " << layers << " window " << window << " parts " << parts << ": pos "
                                    << pos << " loads into a part that holds its own layer's bytes";
          p.pending = true;
          p.layer = layer;  // what a good load leaves there
          submitted.push_back(pos);
          most = std::max(most, ++in_flight);
        };
        auto complete = [&](int pos) {
          Part& p = kv[static_cast<size_t>(pos % parts)];
          ASSERT_TRUE(p.pending);
          ASSERT_EQ(p.layer, pos % layers);
          p.pending = false;
          if (clear) p.layer = -1;
          completed.push_back(pos);
          --in_flight;
        };
        ucm_demo::run_pipeline(total, window, submit, complete);
        ASSERT_EQ(static_cast<int>(submitted.size()), total);
        ASSERT_EQ(static_cast<int>(completed.size()), total);
        for (int i = 0; i < total; ++i) {
          ASSERT_EQ(submitted[static_cast<size_t>(i)], i);
          ASSERT_EQ(completed[static_cast<size_t>(i)], i);
        }
        EXPECT_EQ(most, std::min(window, total)) << "layers " << layers << " window " << window;
      }
    }
  }
}

}  // namespace
