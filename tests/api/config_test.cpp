// The configuration's C API in one process: UCM_* variables parsed strictly
// (no blanks, no signs where strtoull would take them), the checks that keep
// a block addressable, and NULL arguments.
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "ucmcache/ucm.h"

namespace {

// Sets a variable for the scope of one test; restores what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) {
      had_ = true;
      old_ = old;
    }
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

bool contains(const char* s, const std::string& needle) { return std::string(s).find(needle) != std::string::npos; }

TEST(ConfigEnv, ASizeWithABlankOrASignIsAnErrorNamingTheVariableAndValue) {
  for (const char* name : {"UCM_SEGMENT_BYTES", "UCM_SHARD_BYTES", "UCM_CACHE_BYTES"}) {
    for (const char* v : {" -1", "-1", "+4096", " 4096", "4096 ", "", "0x1000", "4Q", "-0"}) {
      ScopedEnv env(name, v);
      ucm_config_t c;
      EXPECT_EQ(ucm_config_init(&c), UCM_ERR_INVALID_ARG) << name << "=\"" << v << "\"";
      EXPECT_TRUE(contains(ucm_config_error(), std::string(name) + "=" + v + " is not a size")) << ucm_config_error();
    }
  }
}

TEST(ConfigEnv, GoodSizesParse) {
  ScopedEnv seg("UCM_SEGMENT_BYTES", "2M");
  ScopedEnv shard("UCM_SHARD_BYTES", "65536");
  ScopedEnv cache("UCM_CACHE_BYTES", "1GiB");
  ucm_config_t c;
  ASSERT_EQ(ucm_config_init(&c), UCM_OK) << ucm_config_error();
  EXPECT_EQ(c.segment_bytes, uint64_t{2} << 20);
  EXPECT_EQ(c.shard_bytes, 65536u);
  EXPECT_EQ(c.cache_bytes, uint64_t{1} << 30);
}

TEST(ConfigEnv, AnIntegerWithABlankOrAPlusIsAnError) {
  for (const char* v : {" 8", "+8", "8 ", "", "--8"}) {
    ScopedEnv env("UCM_IO_DEPTH", v);
    ucm_config_t c;
    EXPECT_EQ(ucm_config_init(&c), UCM_ERR_INVALID_ARG) << "\"" << v << "\"";
    EXPECT_TRUE(contains(ucm_config_error(), std::string("UCM_IO_DEPTH=") + v + " is not an integer"))
        << ucm_config_error();
  }
  ScopedEnv dev("UCM_DEVICE_ID", "-1");
  ucm_config_t c;
  ASSERT_EQ(ucm_config_init(&c), UCM_OK) << ucm_config_error();
  EXPECT_EQ(c.device_id, -1);
}

// A config that passes every check but the one under test.
ucm_config_t valid_config() {
  ucm_config_t c;
  EXPECT_EQ(ucm_config_init(&c), UCM_OK) << ucm_config_error();
  std::snprintf(c.backend, sizeof(c.backend), "sim:latency_us=0");
  return c;
}

TEST(ConfigCheck, ABlockLargerThanTheLargestFileOffsetIsRefusedNamingBothFields) {
  ucm_config_t c = valid_config();
  ASSERT_EQ(ucm_config_check(&c), UCM_OK) << ucm_config_error();
  c.shard_bytes = uint64_t{1} << 32;  // the largest shard
  c.cache_bytes = c.shard_bytes;
  c.segment_bytes = c.shard_bytes;
  c.shards_per_block = 1u << 31;  // 2^63 bytes per block: one past off_t's range
  EXPECT_EQ(ucm_config_check(&c), UCM_ERR_INVALID_ARG);
  EXPECT_TRUE(contains(ucm_config_error(),
                       "shards_per_block 2147483648 x shard_bytes 4294967296 = 9223372036854775808 bytes per block"))
      << ucm_config_error();
  c.shards_per_block = 0xfffffffeu;  // the largest the range check allows: 2^64 - 2^33
  EXPECT_EQ(ucm_config_check(&c), UCM_ERR_INVALID_ARG);
  EXPECT_TRUE(contains(ucm_config_error(), "shards_per_block 4294967294 x shard_bytes 4294967296"))
      << ucm_config_error();
  c.shards_per_block = (1u << 31) - 1;  // 2^63 - 2^32: fits
  EXPECT_EQ(ucm_config_check(&c), UCM_OK) << ucm_config_error();
}

TEST(ConfigApi, ANullConfigIsNullPointer) {
  EXPECT_EQ(ucm_config_init(nullptr), UCM_ERR_NULL_POINTER);
  EXPECT_TRUE(contains(ucm_config_error(), "config is NULL")) << ucm_config_error();
  EXPECT_EQ(ucm_config_check(nullptr), UCM_ERR_NULL_POINTER);
  EXPECT_TRUE(contains(ucm_config_error(), "config is NULL")) << ucm_config_error();
}

}  // namespace
