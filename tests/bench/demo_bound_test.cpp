// ucm_demo's bound (apps/demo_bound.h): Belady's MIN on sequences whose answer
// is known, against an exhaustive search of every eviction choice, the raw
// read of store files and the memcpy rate (what they read and copy, not how
// fast); and its KV content (apps/demo_kv.h): the check catches every wrong
// byte, a shard of another key, layer or offset.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "demo_bound.h"
#include "demo_kv.h"

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

// The words python/ucmcache/demo.py must compute too (tests/python/test_tools.py
// pins the same numbers): the two demos dump and check one content.
TEST(KvContent, GoldenWordsAndBlockIdsThePythonDemoPinsToo) {
  using namespace ucm_demo;
  const uint64_t want[4] = {0x77f34b4a4fa65212ull, 0x21615d575fad57f7ull, 0xac2173dd758d4698ull, 0x69a015a7acb27ae2ull};
  for (uint64_t i = 0; i < 4; ++i) EXPECT_EQ(kv_word(3, 5, i), want[i]) << "word " << i;
  EXPECT_EQ(kv_word(31, 15, 32767), 0x65028904d3d80feaull);
  EXPECT_EQ(block_id_word(7, 0), 0x9a4b96a6b983944bull);
  EXPECT_EQ(block_id_word(7, 1), 0x9321b6d61d2851a5ull);
  KvPattern pat(64);
  uint8_t buf[64];
  pat.fill(3, 5, buf);
  for (uint64_t i = 0; i < 4; ++i) {
    uint64_t w;
    std::memcpy(&w, buf + 8 * i, 8);
    EXPECT_EQ(w, want[i]) << "fill, word " << i;
  }
}

// Every single-byte change anywhere (both vector lanes and the scalar tail:
// 4 KiB + 40 bytes), at an address that is not 16-byte aligned; a shard of
// another block, another layer, shifted by a word, zeros, one word of another
// key at the same offset, one word of this shard from another offset.
TEST(KvContent, CheckCatchesAnyWrongByteAndAShardOfAnotherKeyLayerOrOffset) {
  using namespace ucm_demo;
  const uint64_t bytes = 4096 + 40;
  const KvPattern pat(bytes);
  std::vector<uint8_t> store(bytes + 8 + 8);
  uint8_t* p = store.data() + 8;  // 8-aligned, never 16
  pat.fill(9, 2, p);
  ASSERT_TRUE(pat.check(9, 2, p));
  for (uint64_t at = 0; at < bytes; ++at) {
    for (uint8_t flip : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      p[at] ^= flip;
      ASSERT_FALSE(pat.check(9, 2, p)) << "byte " << at << " xor " << int(flip) << " passed";
      p[at] ^= flip;
    }
  }
  ASSERT_TRUE(pat.check(9, 2, p));
  EXPECT_FALSE(pat.check(10, 2, p)) << "another block's shard passed";
  EXPECT_FALSE(pat.check(9, 3, p)) << "another layer's shard passed";
  EXPECT_FALSE(pat.check(9 + kMaxKvLayers, 2, p)) << "a block 2^16 away passed";
  std::vector<uint8_t> other(bytes + 8);
  pat.fill(9, 2, other.data());
  std::memcpy(p, other.data() + 8, bytes);  // the same shard, one word off
  EXPECT_FALSE(pat.check(9, 2, p)) << "the shard shifted by a word passed";
  std::memset(p, 0, bytes);
  EXPECT_FALSE(pat.check(9, 2, p)) << "zeros (a load that wrote nothing into a cleared part) passed";
  pat.fill(9, 2, p);
  pat.fill(4, 2, other.data());
  std::memcpy(p + 800, other.data() + 800, 8);  // word 100 of block 4
  EXPECT_FALSE(pat.check(9, 2, p)) << "a word of another block at the same offset passed";
  pat.fill(9, 2, p);
  std::memcpy(p + 800, p + 808, 8);  // word 101 at word 100
  EXPECT_FALSE(pat.check(9, 2, p)) << "a word of this shard at another offset passed";
}

// No two words of the demo's keys coincide, over every block x layer x offset
// of a small run (what the exact arguments of demo_kv.h say, and no accident
// across keys and offsets at once).
TEST(KvContent, WordsAreDistinctAcrossBlocksLayersAndOffsets) {
  std::vector<uint64_t> words;
  for (uint64_t b = 0; b < 64; ++b)
    for (uint64_t l = 0; l < 16; ++l)
      for (uint64_t i = 0; i < 512; ++i) words.push_back(ucm_demo::kv_word(b, l, i));
  std::sort(words.begin(), words.end());
  EXPECT_EQ(std::adjacent_find(words.begin(), words.end()), words.end());
  for (uint64_t b = 0; b < 4096; ++b) EXPECT_NE(ucm_demo::block_id_word(b, 0), ucm_demo::block_id_word(b, 1));
}

// The cpu bound's memcpy rate: every thread copies, every pass is counted,
// and nothing is claimed when no pass ran (never how fast).
TEST(DemoBound, MemcpyRateCopiesOnEveryThreadAndSaysWhatItMeasured) {
  const ucm_demo::CopyRate r = ucm_demo::memcpy_rate(2, 1 << 20, 3);
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.threads, 2u);
  EXPECT_EQ(r.bytes_per_thread, uint64_t{1} << 20);
  EXPECT_EQ(r.passes, 3);
  EXPECT_GT(r.median_bytes_per_s, 0);
  EXPECT_GE(r.best_bytes_per_s, r.median_bytes_per_s);
  const ucm_demo::CopyRate none = ucm_demo::memcpy_rate(1, 4096, 0);
  EXPECT_EQ(none.error, "no pass timed");
  EXPECT_EQ(none.passes, 0);
}

TEST(DemoBound, TheLargerBoundIsTheBindingOne) {
  ucm_demo::Bounds b;
  b.store_s = 0.2;
  b.cpu_s = 0.1;
  EXPECT_STREQ(b.binding(), "store");
  EXPECT_EQ(b.binding_s(), 0.2);
  b.cpu_s = 0.3;
  EXPECT_STREQ(b.binding(), "cpu");
  EXPECT_EQ(b.binding_s(), 0.3);
}

}  // namespace
