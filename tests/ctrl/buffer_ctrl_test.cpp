// The control region's header contract: every corruption is a precise error.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include <sched.h>
#include <sys/mount.h>

#include <gtest/gtest.h>

#include "common/test_util.h"
#include "ctrl/layout.h"

namespace ucm::test {
namespace {

// Maps the region of `c` writable, to corrupt it as a stray writer would.
CtrlHeader* writable_header(const BufferCtrl& c, void** map) {
  *map = mmap(nullptr, c.region_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, c.fd(), 0);
  EXPECT_NE(*map, MAP_FAILED);
  return static_cast<CtrlHeader*>(*map);
}

Result attach_result(int fd, const CtrlParams* expect = nullptr) {
  BufferCtrl other;
  return BufferCtrl::attach(fd, expect, &other);
}

bool error_has(const char* needle) { return last_error().find(needle) != std::string::npos; }

TEST(CtrlHeader, AttachSeesTheCreatorsLayoutAndWrites) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(100, 10), &c), Result::kOk) << last_error();
  EXPECT_EQ(c.bucket_count(), 128u) << "next power of two >= 110 slots";
  BufferCtrl d;
  const CtrlParams expect = params(100, 10);
  ASSERT_EQ(BufferCtrl::attach(c.fd(), &expect, &d), Result::kOk) << last_error();
  EXPECT_EQ(d.total_slots(), 110u);
  EXPECT_NE(d.fd(), c.fd()) << "attach keeps its own fd";
  c.slot(7).key_lo.store(0xabcdef);
  EXPECT_EQ(d.slot(7).key_lo.load(), 0xabcdefu) << "one region, two mappings";
}

TEST(CtrlHeader, FlippedMagicIsRefused) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(8), &c), Result::kOk);
  void* m;
  writable_header(c, &m)->magic ^= 1;
  EXPECT_EQ(attach_result(c.fd()), Result::kCorrupt);
  EXPECT_TRUE(error_has("bad magic")) << last_error();
  munmap(m, c.region_bytes());
}

TEST(CtrlHeader, UninitializedRegionSaysSo) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(8), &c), Result::kOk);
  void* m;
  writable_header(c, &m)->magic = 0;
  EXPECT_EQ(attach_result(c.fd()), Result::kCorrupt);
  EXPECT_TRUE(error_has("never initialized")) << last_error();
  munmap(m, c.region_bytes());
}

TEST(CtrlHeader, OtherAbiIsRefused) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(8), &c), Result::kOk);
  void* m;
  writable_header(c, &m)->abi = kCtrlAbi + 1;
  EXPECT_EQ(attach_result(c.fd()), Result::kAbiMismatch);
  const std::string want = "ABI " + std::to_string(kCtrlAbi + 1) + ", this library speaks ABI " + std::to_string(kCtrlAbi);
  EXPECT_TRUE(error_has(want.c_str())) << last_error();
  munmap(m, c.region_bytes());
}

TEST(CtrlHeader, OtherHeaderSizeIsRefused) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(8), &c), Result::kOk);
  void* m;
  writable_header(c, &m)->header_bytes = 96;
  EXPECT_EQ(attach_result(c.fd()), Result::kAbiMismatch);
  EXPECT_TRUE(error_has("header is 96 bytes")) << last_error();
  munmap(m, c.region_bytes());
}

TEST(CtrlHeader, FingerprintThatDisagreesWithTheParametersIsRefused) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(8), &c), Result::kOk);
  void* m;
  writable_header(c, &m)->fingerprint ^= 0x100;
  EXPECT_EQ(attach_result(c.fd()), Result::kCorrupt);
  EXPECT_TRUE(error_has("fingerprint")) << last_error();
  munmap(m, c.region_bytes());
}

TEST(CtrlHeader, ACorruptedParameterIsCaughtByTheFingerprint) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(8), &c), Result::kOk);
  void* m;
  writable_header(c, &m)->params.regular_slots = 9;
  EXPECT_EQ(attach_result(c.fd()), Result::kCorrupt);
  EXPECT_TRUE(error_has("does not match its own parameters")) << last_error();
  munmap(m, c.region_bytes());
}

// Flips the lowest bit of field f of the parameters at `p`.
void flip(CtrlParams* p, const CtrlParamField& f) { reinterpret_cast<uint8_t*>(p)[f.offset] ^= 1; }

// Every field of the parameters, flipped in the header: a rank that knows
// what it expects names that field (and only it), as a corruption.
TEST(CtrlHeader, EachFlippedParameterIsNamedByARankThatKnowsWhatToExpect) {
  ASSERT_EQ(ctrl_param_fields().size(), 8u);
  for (const CtrlParamField& f : ctrl_param_fields()) {
    SCOPED_TRACE(f.name);
    BufferCtrl c;
    CtrlParams p = resolve_ctrl_params(params(8, 2, 64, 4));
    p.tunables_hash = 0x1234;
    ASSERT_EQ(BufferCtrl::create(p, &c), Result::kOk) << last_error();
    void* m;
    flip(&writable_header(c, &m)->params, f);
    EXPECT_EQ(attach_result(c.fd(), &p), Result::kCorrupt);
    EXPECT_TRUE(error_has((std::string(f.name) + ": the control header has " +
                           std::to_string(f.value(p) ^ 1) + ", this rank expects " + std::to_string(f.value(p)))
                              .c_str()))
        << last_error();
    for (const CtrlParamField& g : ctrl_param_fields())
      if (&g != &f) {
        EXPECT_FALSE(error_has((std::string(g.name) + ":").c_str())) << last_error();
      }
    munmap(m, c.region_bytes());
  }
}

TEST(CtrlHeader, AFlippedFingerprintOverSoundParametersSaysTheParametersAreSound) {
  BufferCtrl c;
  const CtrlParams p = params(8);
  ASSERT_EQ(BufferCtrl::create(p, &c), Result::kOk);
  void* m;
  writable_header(c, &m)->fingerprint ^= 1;
  EXPECT_EQ(attach_result(c.fd(), &p), Result::kCorrupt);
  EXPECT_TRUE(error_has("its parameters are the ones this rank expects")) << last_error();
  munmap(m, c.region_bytes());
}

// The one list of fields: each one feeds the fingerprint and is named by a
// difference; nothing else is.
TEST(CtrlParamsFields, EveryFieldFeedsTheFingerprintAndIsNamedAlone) {
  CtrlParams base = resolve_ctrl_params(params(100, 10, 4096, 8, 3, EvictMode::kRing));
  base.tunables_hash = 77;
  uint32_t covered = 0;
  for (const CtrlParamField& f : ctrl_param_fields()) {
    SCOPED_TRACE(f.name);
    covered += f.bytes;
    CtrlParams other = base;
    flip(&other, f);
    EXPECT_NE(ctrl_fingerprint(other), ctrl_fingerprint(base));
    const std::string diff = ctrl_params_diff(other, base, "A", "B");
    EXPECT_EQ(diff, std::string(f.name) + ": A has " + std::to_string(f.value(other)) + ", B expects " +
                        std::to_string(f.value(base)));
  }
  EXPECT_EQ(covered, sizeof(CtrlParams));
  EXPECT_EQ(ctrl_params_diff(base, base, "A", "B"), "");
}

TEST(CtrlHeader, AnOffsetThatDisagreesWithTheParametersIsRefused) {
  for (const bool stored : {false, true}) {
    BufferCtrl c;
    ASSERT_EQ(BufferCtrl::create(params(8), &c), Result::kOk);
    void* m;
    CtrlHeader* h = writable_header(c, &m);
    (stored ? h->stored_off : h->accessed_off) += 64;
    EXPECT_EQ(attach_result(c.fd()), Result::kCorrupt) << (stored ? "stored_off" : "accessed_off");
    EXPECT_TRUE(error_has("offsets disagree")) << last_error();
    munmap(m, c.region_bytes());
  }
}

TEST(CtrlHeader, TheStoredWordsLieApartFromTheHitPathsLinesAndInsideTheRegion) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(100, 28), &c), Result::kOk);
  const CtrlHeader& h = c.header();
  EXPECT_EQ(h.stored_off % 64, 0u);
  EXPECT_GE(h.stored_off, h.accessed_off + c.total_slots()) << "after the accessed bytes, not among them";
  EXPECT_LE(h.stored_off + 4ull * c.total_slots(), c.region_bytes());
  for (uint32_t i = 0; i < c.total_slots(); ++i) ASSERT_EQ(c.stored(i).load(), 0u) << "slot " << i;
  c.stored(c.total_slots() - 1).store(0x1234);
  EXPECT_EQ(c.accessed(c.total_slots() - 1).load(), 0u);
}

TEST(CtrlHeader, TruncatedRegionIsRefused) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(64), &c), Result::kOk);
  // A copy of the region cut short, sealed like a real one.
  const size_t cut = c.region_bytes() / 2;
  int fd = memfd_create("truncated", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  void* src = mmap(nullptr, c.region_bytes(), PROT_READ, MAP_SHARED, c.fd(), 0);
  ASSERT_EQ(write(fd, src, cut), static_cast<ssize_t>(cut));
  ASSERT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
  EXPECT_EQ(attach_result(fd), Result::kCorrupt);
  EXPECT_TRUE(error_has("truncated")) << last_error();

  // Shorter than the header itself.
  int tiny = memfd_create("tiny", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_EQ(write(tiny, src, 100), 100);
  ASSERT_EQ(fcntl(tiny, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  EXPECT_EQ(attach_result(tiny), Result::kCorrupt);
  EXPECT_TRUE(error_has("the header alone needs 128")) << last_error();
  munmap(src, c.region_bytes());
  close(fd);
  close(tiny);
}

TEST(CtrlHeader, UnsealedRegionIsRefused) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(8), &c), Result::kOk);
  int fd = memfd_create("unsealed", MFD_CLOEXEC);
  void* src = mmap(nullptr, c.region_bytes(), PROT_READ, MAP_SHARED, c.fd(), 0);
  ASSERT_EQ(write(fd, src, c.region_bytes()), static_cast<ssize_t>(c.region_bytes()));
  EXPECT_EQ(attach_result(fd), Result::kCorrupt);
  EXPECT_TRUE(error_has("not sealed")) << last_error();
  munmap(src, c.region_bytes());
  close(fd);
}

TEST(CtrlHeader, MismatchedExpectationNamesTheFieldAndBothValues) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(8, 0, 4096), &c), Result::kOk);
  CtrlParams other = params(8, 0, 8192);
  EXPECT_EQ(attach_result(c.fd(), &other), Result::kConfigMismatch);
  EXPECT_TRUE(error_has("slot_bytes: the control region has 4096, this rank expects 8192")) << last_error();
  other = params(8, 0, 4096, 16, 4, EvictMode::kRing);
  EXPECT_EQ(attach_result(c.fd(), &other), Result::kConfigMismatch);
  EXPECT_TRUE(error_has("evict: the control region has 0, this rank expects 1")) << last_error();
  // A layout tunable the struct does not spell out (api/config.h).
  other = params(8, 0, 4096);
  other.tunables_hash = 5;
  EXPECT_EQ(attach_result(c.fd(), &other), Result::kConfigMismatch);
  EXPECT_TRUE(error_has("tunables_hash: the control region has 0, this rank expects 5")) << last_error();
}

TEST(CtrlParamsCheck, EveryBadValueIsNamed) {
  BufferCtrl c;
  EXPECT_EQ(BufferCtrl::create(params(8, 0, 0), &c), Result::kInvalidArg);
  EXPECT_TRUE(error_has("slot_bytes is 0")) << last_error();
  EXPECT_EQ(BufferCtrl::create(params(0), &c), Result::kInvalidArg);
  EXPECT_TRUE(error_has("regular_slots is 0")) << last_error();
  EXPECT_EQ(BufferCtrl::create(params(8, 0, 64, 0), &c), Result::kInvalidArg);
  EXPECT_TRUE(error_has("shards_per_block 0")) << last_error();
  EXPECT_EQ(BufferCtrl::create(params(8, 0, 64, 4, 17), &c), Result::kInvalidArg);
  EXPECT_TRUE(error_has("max_ranks 17")) << last_error();
  CtrlParams p = params(8);
  p.bucket_count = 12;
  EXPECT_EQ(BufferCtrl::create(p, &c), Result::kInvalidArg);
  EXPECT_TRUE(error_has("bucket_count 12 is not a power of two")) << last_error();
  p = params(8);
  p.evict = static_cast<EvictMode>(7);
  EXPECT_EQ(BufferCtrl::create(p, &c), Result::kInvalidArg);
  EXPECT_TRUE(error_has("evict mode 7")) << last_error();
}

TEST(CtrlRanks, JoinRefusesALiveHolderAndNamesIt) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(8), &c), Result::kOk);
  ASSERT_EQ(c.join(1), Result::kOk);
  EXPECT_TRUE(c.rank_alive(1));
  EXPECT_EQ(c.join(1), Result::kBadState);
  EXPECT_TRUE(error_has("already attached by live pid")) << last_error();
  EXPECT_EQ(c.join(4), Result::kInvalidArg);
  EXPECT_TRUE(error_has("local rank 4 >= max_ranks 4")) << last_error();
  c.leave(1);
  EXPECT_FALSE(c.rank_alive(1));
  EXPECT_EQ(c.join(1), Result::kOk);
}

// A rank records (pid, start time) so that peers can tell it from a later
// process with its pid. One that cannot read its start time must not join
// with a 0 there: every peer would judge it dead and steal its locks.
TEST(CtrlRanks, ARankThatCannotEstablishItsIdentityFailsJoinClearly) {
  BufferCtrl c;
  ASSERT_EQ(BufferCtrl::create(params(8), &c), Result::kOk);
  pid_t child = fork_child([&] {
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        mount("none", "/proc", "tmpfs", 0, nullptr) != 0)
      return 77;
    if (c.join(2) != Result::kSystem) return 1;
    if (last_error().find("cannot establish its own identity") == std::string::npos) return 2;
    if (c.rank(2).state.load() != static_cast<uint32_t>(RankState::kFree)) return 3;  // the record is left free
    return 0;
  });
  const int rc = wait_child(child, 10000);
  if (rc == 77) GTEST_SKIP() << "cannot hide /proc in a mount namespace here (needs root)";
  EXPECT_EQ(rc, 0) << "1: join did not fail with kSystem, 2: the message does not say why, 3: record left taken";
}

}  // namespace
}  // namespace ucm::test
