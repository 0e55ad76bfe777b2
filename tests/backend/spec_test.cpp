// Store specs: every malformed spec is a kInvalidArg whose last_error() names
// the bad part, and well-formed ones build the store they name.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/spec.h"
#include "backend_test_util.h"
#include "common/result.h"

namespace ucm::test {
namespace {

BackendContext ctx() {
  BackendContext c;
  c.shard_bytes = 4096;
  c.shards_per_block = 4;
  return c;
}

// Expects `spec` to be rejected as kInvalidArg with an error containing each of `needles`.
void expect_rejected(const std::string& spec, std::initializer_list<const char*> needles) {
  SCOPED_TRACE("spec \"" + spec + "\"");
  clear_last_error();
  std::unique_ptr<Backend> b;
  const Result r = make_backend(spec, ctx(), &b);
  EXPECT_EQ(std::string(result_name(r)), result_name(Result::kInvalidArg));
  EXPECT_EQ(b, nullptr);
  for (const char* n : needles) EXPECT_NE(last_error().find(n), std::string::npos) << "error: " << last_error();
}

TEST(Spec, SplitsSchemePathAndOptions) {
  Spec s;
  ASSERT_EQ(res(parse_spec("posix:/a/b,depth=3,direct=off", &s)), res(Result::kOk)) << last_error();
  EXPECT_EQ(s.scheme, "posix");
  EXPECT_EQ(s.positional, "/a/b");
  ASSERT_EQ(s.options.size(), 2u);
  EXPECT_EQ(s.options[0], std::make_pair(std::string("depth"), std::string("3")));
  EXPECT_EQ(s.options[1], std::make_pair(std::string("direct"), std::string("off")));

  ASSERT_EQ(res(parse_spec("sim", &s)), res(Result::kOk)) << last_error();
  EXPECT_EQ(s.scheme, "sim");
  EXPECT_TRUE(s.positional.empty());
  EXPECT_TRUE(s.options.empty());
}

// The positional part runs to the first ',' that starts a `key=` option (key:
// a letter or '_', then letters, digits, '_'), so a path may hold '=' and ','.
TEST(Spec, APathMayHoldEqualsSignsAndCommas) {
  const struct {
    const char* text;
    const char* positional;
    size_t options;
  } cases[] = {
      {"posix:/data/run=5", "/data/run=5", 0},
      {"posix:/data/run=5,depth=3", "/data/run=5", 1},
      {"posix:/a=b=c,direct=off,sync=1", "/a=b=c", 2},
      {"posix:/a,b/c,depth=2", "/a,b/c", 1},
      {"posix:/x=1,y", "/x=1,y", 0},
      {"posix:/p,9=s,depth=1", "/p,9=s", 1},
      {"posix:./k=v", "./k=v", 0},
      {"posix:/a,", "/a", 0},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    Spec s;
    ASSERT_EQ(res(parse_spec(c.text, &s)), res(Result::kOk)) << last_error();
    EXPECT_EQ(s.positional, c.positional);
    EXPECT_EQ(s.options.size(), c.options);
  }
  // What cannot be a path: an item of the form key=... right after the scheme
  // is an option, so a relative path of that form is written ./key=...
  Spec s;
  ASSERT_EQ(res(parse_spec("posix:run=5", &s)), res(Result::kOk));
  EXPECT_TRUE(s.positional.empty());
  expect_rejected("posix:run=5", {"directory", "./"});
}

TEST(Spec, BadFileModesAreNamed) {
  expect_rejected("posix:/tmp,file_mode=0999", {"file_mode=0999", "octal"});
  expect_rejected("posix:/tmp,file_mode=rw", {"file_mode=rw", "octal"});
  expect_rejected("posix:/tmp,file_mode=", {"file_mode="});
  expect_rejected("posix:/tmp,file_mode=-600", {"file_mode=-600"});
  expect_rejected("posix:/tmp,file_mode=04600", {"file_mode=04600", "0777"});
  expect_rejected("posix:/tmp,file_mode=0400", {"file_mode=0400", "0600"});
  expect_rejected("posix:/tmp,file_mode=0200", {"file_mode=0200", "0600"});
}

TEST(Spec, UnknownSchemeIsNamed) {
  expect_rejected("s3:bucket", {"s3"});
  expect_rejected("Sim:latency_us=1", {"Sim"});
}

TEST(Spec, MissingSchemeIsRejected) {
  expect_rejected("", {"no scheme"});
  expect_rejected(":latency_us=1", {":latency_us=1"});
}

TEST(Spec, UnknownOptionIsNamed) {
  expect_rejected("sim:latency_us=5,colour=red", {"colour"});
  expect_rejected("posix:/tmp,bogus=1", {"bogus"});
}

// A repeated option is a typo or a clash ("direct=on,...,direct=off"); the
// last one used to win silently.
TEST(Spec, AnOptionGivenTwiceIsNamed) {
  expect_rejected("posix:/tmp,direct=on,depth=2,direct=off", {"direct", "twice"});
  expect_rejected("sim:latency_us=0,latency_us=5", {"latency_us", "twice"});
  expect_rejected("sim:fail_keys=1.1+", {"fail_keys", "empty"});
  expect_rejected("sim:hang_keys=1.1++2.2", {"hang_keys", "empty"});
}

TEST(Spec, ItemThatIsNotKeyValueIsNamed) {
  expect_rejected("sim:latency_us=1,oops", {"oops"});
  expect_rejected("sim:fast", {"fast"});
}

TEST(Spec, BadNumbersAreNamed) {
  expect_rejected("sim:latency_us=abc", {"latency_us=abc"});
  expect_rejected("sim:latency_us=", {"latency_us="});
  expect_rejected("sim:latency_us=1.5", {"latency_us=1.5"});
  expect_rejected("sim:latency_us=0x10", {"latency_us=0x10"});
  expect_rejected("sim:max_inflight=-3", {"max_inflight=-3"});
  expect_rejected("sim:seed=99999999999999999999999", {"seed=99999999999999999999999"});
  expect_rejected("sim:gbps=fast", {"gbps=fast"});
  expect_rejected("sim:fail_fraction=1e999", {"fail_fraction=1e999"});
  expect_rejected("posix:/tmp,depth=4x", {"depth=4x"});
  expect_rejected("posix:/tmp,sync=yes", {"sync=yes"});
}

TEST(Spec, OutOfRangeValuesAreNamed) {
  expect_rejected("sim:max_inflight=0", {"max_inflight=0", "range"});
  expect_rejected("sim:workers=0", {"workers=0", "range"});
  expect_rejected("sim:workers=1000", {"workers=1000", "range"});
  expect_rejected("sim:latency_us=60000001", {"latency_us=60000001", "range"});
  expect_rejected("sim:gbps=-1", {"gbps=-1", "range"});
  expect_rejected("sim:fail_fraction=1.5", {"fail_fraction=1.5", "range"});
  expect_rejected("sim:fail_fraction=nan", {"fail_fraction=nan"});
  expect_rejected("posix:/tmp,depth=0", {"depth=0", "range"});
  expect_rejected("posix:/tmp,depth=5000", {"depth=5000", "range"});
  expect_rejected("posix:/tmp,sync=2", {"sync=2", "range"});
}

TEST(Spec, BadEnumValuesAreNamed) {
  expect_rejected("sim:populated=some", {"populated=some"});
  expect_rejected("posix:/tmp,direct=maybe", {"direct=maybe"});
}

TEST(Spec, BadFaultKeyListsAreNamed) {
  expect_rejected("sim:fail_keys=12", {"\"12\"", "fail_keys"});
  expect_rejected("sim:hang_keys=1.2+x.3", {"x.3", "hang_keys"});
  expect_rejected("sim:fail_keys=1.", {"\"1.\""});
  expect_rejected("sim:fail_keys=.4", {"\".4\""});
}

// An unsigned value must not wrap a negative number into a huge one, with or
// without leading blanks, and a shard index must not wrap either.
TEST(Spec, NegativeNumbersNeverWrap) {
  expect_rejected("sim:seed=-1", {"seed=-1"});
  expect_rejected("sim:seed= -1", {"seed= -1"});
  expect_rejected("sim:fail_keys=7.-1", {"7.-1"});
  expect_rejected("sim:fail_keys=7.4294967296", {"7.4294967296"});
}

// The shard part may be longer than the block part ("1.23"): both parse.
TEST(Spec, FaultKeysParseWhateverTheDigitCounts) {
  for (const char* spec : {"sim:fail_keys=1.23", "sim:fail_keys=12.3", "sim:hang_keys=7.10+100.1",
                           "sim:fail_keys=5.12+123456789.3+1.100"}) {
    SCOPED_TRACE(spec);
    clear_last_error();
    std::unique_ptr<Backend> b;
    EXPECT_EQ(res(make_backend(spec, ctx(), &b)), res(Result::kOk)) << last_error();
  }
}

TEST(Spec, PosixWithoutAPathIsRejected) {
  expect_rejected("posix", {"directory"});
  expect_rejected("posix:", {"directory"});
  expect_rejected("posix:depth=4", {"directory"});
}

TEST(Spec, ZeroSizedContextIsRejected) {
  std::unique_ptr<Backend> b;
  BackendContext c = ctx();
  c.shard_bytes = 0;
  EXPECT_EQ(res(make_backend("sim", c, &b)), res(Result::kInvalidArg));
  EXPECT_NE(last_error().find("shard_bytes"), std::string::npos) << last_error();
  c = ctx();
  c.shards_per_block = 0;
  EXPECT_EQ(res(make_backend("sim", c, &b)), res(Result::kInvalidArg));
  EXPECT_NE(last_error().find("shards_per_block"), std::string::npos) << last_error();
}

TEST(Spec, WellFormedSpecsBuildTheirStore) {
  for (const char* spec : {"sim", "sim:", "sim:latency_us=0,gbps=0,max_inflight=1,workers=1,fail_fraction=0,seed=0,"
                                         "populated=dumped,fail_keys=1.0+2.3,hang_keys=4.1",
                           "sim:gbps=2.5,populated=all,seed=18446744073709551615"}) {
    SCOPED_TRACE(spec);
    std::unique_ptr<Backend> b;
    ASSERT_EQ(res(make_backend(spec, ctx(), &b)), res(Result::kOk)) << last_error();
    EXPECT_STREQ(b->name(), "sim");
  }
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::unique_ptr<Backend> b;
  ASSERT_EQ(res(make_backend("posix:" + dir.path + ",depth=1,direct=off,sync=1", ctx(), &b)), res(Result::kOk)) << last_error();
  EXPECT_STREQ(b->name(), "posix");
}

}  // namespace
}  // namespace ucm::test
