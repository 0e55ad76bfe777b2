// The configuration's C API in one process: UCM_* variables parsed strictly
// (no blanks, no signs where strtoull would take them), the checks that keep
// a block addressable, NULL arguments, and the one table of tunables every
// path reads (the same bounds from a variable and from the struct).
#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "api/config.h"
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

// The async test engine's delay is read from UCM_ASYNC_TEST_DELAY_US, as
// strictly as any UCM_* variable: before, strtoull made "abc" a 0 us delay
// and "99999999999999" a delay of three years, every copy landing after the
// task's deadline.
TEST(ConfigEnv, AnAsyncTestDelayThatIsNotMicrosecondsUpToASecondIsAnErrorNamingIt) {
  for (const char* v : {"abc", "", " 5", "-1", "+5", "5us", "1000001", "99999999999999"}) {
    ScopedEnv env("UCM_ASYNC_TEST_DELAY_US", v);
    ucm_config_t c;
    EXPECT_EQ(ucm_config_init(&c), UCM_ERR_INVALID_ARG) << "UCM_ASYNC_TEST_DELAY_US=\"" << v << "\"";
    EXPECT_TRUE(contains(ucm_config_error(), std::string("UCM_ASYNC_TEST_DELAY_US=") + v +
                                                 " is not a delay in microseconds (0-1000000)"))
        << ucm_config_error();
  }
  for (const char* v : {"0", "200", "1000000"}) {
    ScopedEnv env("UCM_ASYNC_TEST_DELAY_US", v);
    ucm_config_t c;
    EXPECT_EQ(ucm_config_init(&c), UCM_OK) << "UCM_ASYNC_TEST_DELAY_US=" << v << ": " << ucm_config_error();
    uint64_t us = 7;
    EXPECT_EQ(ucm::async_test_delay_from_env(&us), ucm::Result::kOk);
    EXPECT_EQ(us, std::strtoull(v, nullptr, 10));
  }
  uint64_t us = 7;
  EXPECT_EQ(ucm::async_test_delay_from_env(&us), ucm::Result::kOk);
  EXPECT_EQ(us, 7u) << "unset: the engine's default stays";
}

// The fan-out's stall hook, UCM_FANOUT_TEST_STALL=<local rank>:<turn>: sscanf
// took "1:2junk" and "-1:5" (a stall on rank 4294967295), and ignored "1"
// without a word.
TEST(ConfigEnv, AFanoutStallThatIsNotRankColonTurnIsAnErrorNamingIt) {
  for (const char* v : {"1", "1:", ":2", "1:2junk", "-1:5", "1:-2", " 1:2", "1:2:3", "16:1", "a:b", ""}) {
    ScopedEnv env("UCM_FANOUT_TEST_STALL", v);
    ucm_config_t c;
    EXPECT_EQ(ucm_config_init(&c), UCM_ERR_INVALID_ARG) << "UCM_FANOUT_TEST_STALL=\"" << v << "\"";
    EXPECT_TRUE(contains(ucm_config_error(), std::string("UCM_FANOUT_TEST_STALL=") + v +
                                                 " is not <local rank 0-15>:<turn>"))
        << ucm_config_error();
  }
  ScopedEnv env("UCM_FANOUT_TEST_STALL", "3:17");
  ucm_config_t c;
  EXPECT_EQ(ucm_config_init(&c), UCM_OK) << ucm_config_error();
  int64_t rank = -1;
  uint64_t turn = 0;
  EXPECT_EQ(ucm::fanout_test_stall_from_env(&rank, &turn), ucm::Result::kOk);
  EXPECT_EQ(rank, 3);
  EXPECT_EQ(turn, 17u);
}

// The logging variables are UCM_* variables like the others: a value the
// library does not know is an error naming it, not a silent default (before,
// UCM_LOG=inof and UCM_LOG_SUBSYS=quue logged at warn with no word why).
TEST(ConfigEnv, AnUnknownLogLevelOrSubsystemIsAnErrorNamingIt) {
  struct Case {
    const char* name;
    const char* value;
    const char* says;
  };
  const Case bad[] = {
      {"UCM_LOG", "inof", "UCM_LOG=inof is not one of warn|info|debug"},
      {"UCM_LOG", "INFO", "UCM_LOG=INFO is not one of warn|info|debug"},
      {"UCM_LOG", "", "UCM_LOG= is not one of warn|info|debug"},
      {"UCM_LOG_SUBSYS", "ctrl,quue", "UCM_LOG_SUBSYS=ctrl,quue: 'quue' is not one of all|common|"},
      {"UCM_LOG_SUBSYS", "ctrl queue", "UCM_LOG_SUBSYS=ctrl queue: 'ctrl queue' is not one of"},
  };
  for (const Case& b : bad) {
    ScopedEnv env(b.name, b.value);
    ucm_config_t c;
    EXPECT_EQ(ucm_config_init(&c), UCM_ERR_INVALID_ARG) << b.name << "=\"" << b.value << "\"";
    EXPECT_TRUE(contains(ucm_config_error(), b.says)) << ucm_config_error();
  }
  for (const char* level : {"warn", "info", "debug"}) {
    ScopedEnv env("UCM_LOG", level);
    ucm_config_t c;
    EXPECT_EQ(ucm_config_init(&c), UCM_OK) << "UCM_LOG=" << level << ": " << ucm_config_error();
  }
  for (const char* list : {"all", "ctrl", "ctrl,cache,queue,boot,api", "ctrl,", ""}) {
    ScopedEnv env("UCM_LOG_SUBSYS", list);
    ucm_config_t c;
    EXPECT_EQ(ucm_config_init(&c), UCM_OK) << "UCM_LOG_SUBSYS=" << list << ": " << ucm_config_error();
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

// ---- the table of tunables -------------------------------------------------

// Every UCM_* variable and default there was before the table: none may change
// (rows added since: fanout).
TEST(ConfigTable, KeepsEveryVariableNameAndDefault) {
  struct Old {
    const char* name;
    const char* env;
    std::string def;
  };
  const Old old[] = {
      {"shards_per_block", "UCM_SHARDS_PER_BLOCK", "64"}, {"shard_bytes", "UCM_SHARD_BYTES", "1048576"},
      {"cache_bytes", "UCM_CACHE_BYTES", "1073741824"},   {"reserved_slots", "UCM_RESERVED_SLOTS", "64"},
      {"max_task_entries", "UCM_MAX_TASK_ENTRIES", "4096"}, {"device_id", "UCM_DEVICE_ID", "auto"},
      {"ranks_per_node", "UCM_RANKS_PER_NODE", "0"},      {"order", "UCM_ORDER", "rotate"},
      {"evict", "UCM_EVICT", "clock"},                    {"wait", "UCM_WAIT", "futex"},
      {"prealloc", "UCM_PREALLOC", "1"},                  {"hugepages", "UCM_HUGEPAGES", "auto"},
      {"bind_threads", "UCM_BIND", "1"},                  {"timeout_ms", "UCM_TIMEOUT_MS", "30000"},
      {"liveness_ms", "UCM_LIVENESS_MS", "50"},           {"load_retries", "UCM_LOAD_RETRIES", "2"},
      {"io_depth", "UCM_IO_DEPTH", "16"},                 {"owner_grace_us", "UCM_OWNER_GRACE_US", "1000"},
      {"segment_bytes", "UCM_SEGMENT_BYTES", "1073741824"}, {"backend", "UCM_BACKEND", ""},
      {"copy_engine", "UCM_COPY_ENGINE", "auto"},         {"allow_overcommit", "UCM_OVERCOMMIT", "0"},
      {"protect", "UCM_PROTECT", "1"},                    {"protect_grace_ms", "UCM_PROTECT_GRACE_MS", "1000"},
      {"fanout", "UCM_FANOUT", "off"},             {"max_unfinished_tasks", "UCM_MAX_UNFINISHED_TASKS", "65536"},
  };
  size_t n = 0;
  const ucm::Tunable* table = ucm::tunables(&n);
  ASSERT_EQ(n, sizeof(old) / sizeof(old[0]));
  ucm_config_t defaults;
  ucm::config_defaults(&defaults);
  for (const Old& o : old) {
    const ucm::Tunable* t = nullptr;
    for (size_t i = 0; i < n; ++i)
      if (std::strcmp(table[i].name, o.name) == 0) t = &table[i];
    ASSERT_NE(t, nullptr) << o.name;
    EXPECT_STREQ(t->env, o.env) << o.name;
    EXPECT_EQ(ucm::tunable_text(defaults, *t), o.def) << o.name;
    EXPECT_NE(std::string(t->help), "") << o.name;
  }
}

// Writes a raw value into a field, as a C caller could.
void poke(ucm_config_t* c, const ucm::Tunable& t, int64_t v) {
  char* p = reinterpret_cast<char*>(c) + t.offset;
  if (t.bytes == 8) {
    const uint64_t x = static_cast<uint64_t>(v);
    std::memcpy(p, &x, 8);
  } else {
    const uint32_t x = static_cast<uint32_t>(v);
    std::memcpy(p, &x, 4);
  }
}

// Can the field hold v at all (else only the variable can say it)?
bool representable(const ucm::Tunable& t, int64_t v) {
  switch (t.type) {
    case ucm::TunableType::kUint: return v >= 0 && v <= int64_t{UINT32_MAX};
    case ucm::TunableType::kSize: return v >= 0;
    default: return v >= INT32_MIN && v <= INT32_MAX;
  }
}

TEST(ConfigTable, EveryBoundIsTheSameFromTheVariableAndTheStruct) {
  size_t n = 0;
  const ucm::Tunable* table = ucm::tunables(&n);
  for (size_t i = 0; i < n; ++i) {
    const ucm::Tunable& t = table[i];
    SCOPED_TRACE(t.name);
    if (t.type == ucm::TunableType::kString) {
      const std::string too_long(static_cast<size_t>(t.hi) + 1, 'x');
      ScopedEnv env(t.env, too_long.c_str());
      ucm_config_t c;
      EXPECT_EQ(ucm_config_init(&c), UCM_ERR_INVALID_ARG);
      EXPECT_TRUE(contains(ucm_last_error(nullptr), t.env)) << ucm_last_error(nullptr);
      ucm::config_defaults(&c);
      std::memset(reinterpret_cast<char*>(&c) + t.offset, 'x', t.bytes);  // no NUL
      EXPECT_EQ(ucm::check_fields(c), ucm::Result::kInvalidArg);
      EXPECT_TRUE(contains(ucm::last_error().c_str(), t.name)) << ucm::last_error();
      continue;
    }
    // In range: both accept the bounds themselves.
    for (int64_t v : {t.lo, t.hi}) {
      const std::string text = t.type == ucm::TunableType::kEnum ? t.names[v] : std::to_string(v);
      ScopedEnv env(t.env, text.c_str());
      ucm_config_t c;
      ASSERT_EQ(ucm_config_init(&c), UCM_OK) << t.env << "=" << text << ": " << ucm_last_error(nullptr);
      EXPECT_EQ(ucm::tunable_value(c, t), v);
      EXPECT_EQ(ucm::check_fields(c), ucm::Result::kOk) << ucm::last_error();
      ucm_config_t d;
      ucm::config_defaults(&d);
      poke(&d, t, v);
      EXPECT_EQ(ucm::check_fields(d), ucm::Result::kOk) << ucm::last_error();
    }
    // Out of range: both refuse, the variable naming itself and its value, the
    // struct naming the field and its value.
    for (int64_t v : {t.lo - 1, t.hi + 1}) {
      const std::string text = t.type == ucm::TunableType::kEnum ? "bogus" : std::to_string(v);
      {
        ScopedEnv env(t.env, text.c_str());
        ucm_config_t c;
        EXPECT_EQ(ucm_config_init(&c), UCM_ERR_INVALID_ARG) << t.env << "=" << text;
        EXPECT_TRUE(contains(ucm_last_error(nullptr), std::string(t.env) + "=" + text)) << ucm_last_error(nullptr);
      }
      if (!representable(t, v)) continue;
      ucm_config_t d;
      ucm::config_defaults(&d);
      poke(&d, t, v);
      EXPECT_EQ(ucm::check_fields(d), ucm::Result::kInvalidArg) << t.name << " = " << v;
      EXPECT_TRUE(contains(ucm::last_error().c_str(), std::string(t.name) + " " + std::to_string(v)))
          << ucm::last_error();
      std::snprintf(d.backend, sizeof(d.backend), "sim:latency_us=0");
      EXPECT_EQ(ucm_config_check(&d), UCM_ERR_INVALID_ARG) << "the public check is the same check";
    }
  }
}

TEST(ConfigTable, TheAgreementAndThePrintedConfigComeFromTheTable) {
  size_t n = 0;
  const ucm::Tunable* table = ucm::tunables(&n);
  ucm_config_t c;
  ucm::config_defaults(&c);
  std::snprintf(c.backend, sizeof(c.backend), "sim:latency_us=0");
  const std::string printed = ucm::describe_config(c);
  int layout = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_TRUE(contains(printed.c_str(), std::string(table[i].name) + "=" + ucm::tunable_text(c, table[i])))
        << printed;
    if (table[i].layout) {
      EXPECT_STREQ(ucm::agreement_field_name(layout++), table[i].name);
    }
  }
  EXPECT_EQ(layout, ucm::AgreementRecord::kFields);
  // A layout field that differs changes the record; another field does not.
  const ucm::AgreementRecord base = ucm::agreement_record(c);
  ucm_config_t d = c;
  d.max_task_entries += 1;
  const ucm::AgreementRecord other = ucm::agreement_record(d);
  EXPECT_NE(std::memcmp(&base, &other, sizeof(base)), 0);
  d = c;
  d.io_depth += 1;
  const ucm::AgreementRecord same = ucm::agreement_record(d);
  EXPECT_EQ(std::memcmp(&base, &same, sizeof(base)), 0);
}

}  // namespace

namespace {

// Another value of row t than c has, keeping the config valid.
void change(ucm_config_t* c, const ucm::Tunable& t) {
  const int64_t v = ucm::tunable_value(*c, t);
  switch (t.type) {
    case ucm::TunableType::kString: {
      char* s = reinterpret_cast<char*>(c) + t.offset;
      ASSERT_STREQ(s, "sim:latency_us=0");
      std::snprintf(s, t.bytes, "sim:latency_us=1");
      return;
    }
    case ucm::TunableType::kDevice:
      poke(c, t, v == UCM_DEVICE_AUTO ? 0 : v + 1);
      return;
    case ucm::TunableType::kSize:
      poke(c, t, v * 2 <= t.hi ? v * 2 : v / 2);
      return;
    default:
      poke(c, t, v + 1 <= t.hi ? v + 1 : v - 1);
      return;
  }
}

}  // namespace

// The control header's fingerprint covers the whole table: a config that
// differs from another in any layout row (one added later too) gives other
// control parameters, so a rank with it cannot attach to the other's planes
// and is told which parameter; a row that is no layout row changes nothing.
TEST(ConfigTable, EveryLayoutRowShapesTheControlFingerprintAndNoOtherRowDoes) {
  size_t n = 0;
  const ucm::Tunable* table = ucm::tunables(&n);
  const ucm_config_t c = valid_config();
  ucm::CtrlParams pc;
  ucm::DataParams dc;
  ASSERT_EQ(ucm::layout_from_config(c, 2, &pc, &dc), ucm::Result::kOk) << ucm::last_error();
  EXPECT_EQ(pc.tunables_hash, ucm::tunables_layout_hash(c));
  ucm::BufferCtrl ctrl;
  ASSERT_EQ(ucm::BufferCtrl::create(pc, &ctrl), ucm::Result::kOk) << ucm::last_error();
  int layout_rows = 0;
  for (size_t i = 0; i < n; ++i) {
    const ucm::Tunable& t = table[i];
    SCOPED_TRACE(t.name);
    ucm_config_t d = c;
    change(&d, t);
    ASSERT_NE(ucm::tunable_text(d, t), ucm::tunable_text(c, t));
    ASSERT_EQ(ucm::check_config(d), ucm::Result::kOk) << ucm::last_error();
    ucm::CtrlParams pd;
    ucm::DataParams dd;
    ASSERT_EQ(ucm::layout_from_config(d, 2, &pd, &dd), ucm::Result::kOk) << ucm::last_error();
    const uint64_t fc = ucm::ctrl_fingerprint(ucm::resolve_ctrl_params(pc));
    const uint64_t fd = ucm::ctrl_fingerprint(ucm::resolve_ctrl_params(pd));
    if (!t.layout) {
      EXPECT_EQ(pd.tunables_hash, pc.tunables_hash);
      EXPECT_EQ(fd, fc);
      continue;
    }
    ++layout_rows;
    EXPECT_NE(pd.tunables_hash, pc.tunables_hash);
    EXPECT_NE(fd, fc);
    ucm::BufferCtrl other;
    EXPECT_EQ(ucm::BufferCtrl::attach(ctrl.fd(), &pd, &other), ucm::Result::kConfigMismatch);
    EXPECT_TRUE(contains(ucm::last_error().c_str(), "tunables_hash: the control region has"))
        << ucm::last_error();
  }
  EXPECT_EQ(layout_rows, ucm::AgreementRecord::kFields);
}
