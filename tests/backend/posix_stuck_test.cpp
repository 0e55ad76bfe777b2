// The posix store's loads that hang in the kernel, for real: a read whose
// destination is memory registered with userfaultfd waits inside the read
// system call until the fault is resolved, as a read from a file on a dead
// NFS or Lustre server waits for the server. When the caller says that some
// of its requests are stuck (Backend::requests_stuck, which LoadQueue calls
// as it counts them), and on its own once a request has been in the kernel
// for kHeldNs, the store makes room for others beside the held ones: more
// I/O threads (engine=threads), more reads in the ring (engine=uring), up to
// `spare` more. Before, `depth` hung reads held every thread (every place in
// the ring), and every other load of the rank queued behind them for as
// long as the server stayed dead. (The ring is tested on a
// FUSE file system instead: io_uring tries a buffered read inline first, and
// a userfaultfd fault there spins the ring's own thread in the kernel, where
// a read from a network file system goes to the kernel's io-wq workers.)
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/posix_backend.h"
#include "backend/sim_content.h"
#include "backend_test_util.h"
#include "common/log_capture.h"
#include "ucm_build_config.h"

namespace ucm::test {
namespace {

constexpr uint64_t kShard = 4096;
constexpr bool kRingBuilt = UCM_HAVE_URING != 0;

// Memory whose first touch waits until release(): a read into it hangs in
// the kernel (copy_to_user, or the pinning of a direct read, faults and
// waits on the userfaultfd).
class HungBuffer {
 public:
  HungBuffer() {
    uffd_ = static_cast<int>(syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
    if (uffd_ < 0) {
      why_ = std::string("userfaultfd: ") + strerror(errno);
      return;
    }
    uffdio_api api{};
    api.api = UFFD_API;
    if (ioctl(uffd_, UFFDIO_API, &api) != 0) {
      why_ = std::string("UFFDIO_API: ") + strerror(errno);
      return;
    }
    void* p = mmap(nullptr, kShard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      why_ = std::string("mmap: ") + strerror(errno);
      return;
    }
    mem_ = static_cast<uint8_t*>(p);
    uffdio_register reg{};
    reg.range.start = reinterpret_cast<uintptr_t>(mem_);
    reg.range.len = kShard;
    reg.mode = UFFDIO_REGISTER_MODE_MISSING;
    if (ioctl(uffd_, UFFDIO_REGISTER, &reg) != 0) why_ = std::string("UFFDIO_REGISTER: ") + strerror(errno);
  }
  ~HungBuffer() {
    release();
    if (mem_ != nullptr) munmap(mem_, kShard);
    if (uffd_ >= 0) close(uffd_);
  }
  HungBuffer(const HungBuffer&) = delete;
  HungBuffer& operator=(const HungBuffer&) = delete;
  // Empty when it hangs reads; else why it cannot here (the test skips).
  const std::string& why_not() const { return why_; }
  uint8_t* get() const { return mem_; }
  // Ends the wait: the page is zero-filled and the read goes on into it.
  void release() {
    if (released_ || !why_.empty()) return;
    released_ = true;
    uffdio_zeropage z{};
    z.range.start = reinterpret_cast<uintptr_t>(mem_);
    z.range.len = kShard;
    if (ioctl(uffd_, UFFDIO_ZEROPAGE, &z) != 0 && errno != EEXIST) ADD_FAILURE() << "UFFDIO_ZEROPAGE: " << strerror(errno);
  }

 private:
  int uffd_ = -1;
  uint8_t* mem_ = nullptr;
  bool released_ = false;
  std::string why_;
};

std::unique_ptr<PosixBackend> make_store(const std::string& dir, const std::string& engine, uint32_t depth = 2,
                                         const std::string& extra = "", uint32_t shards = 1) {
  BackendContext c;
  c.shard_bytes = kShard;
  c.shards_per_block = shards;
  std::unique_ptr<Backend> b;
  // Buffered: the read copies into the hung buffer in the kernel (a direct
  // read would hang as well, on pinning it; buffered works on every file system).
  const std::string spec = "posix:" + dir + ",depth=" + std::to_string(depth) + ",direct=off,engine=" + engine + extra;
  const Result r = make_backend(spec, c, &b);
  EXPECT_EQ(r, Result::kOk) << spec << ": " << last_error();
  if (r != Result::kOk) return nullptr;
  return std::unique_ptr<PosixBackend>(static_cast<PosixBackend*>(b.release()));
}

// Blocks 1..n, each one shard of its own bytes.
void dump_blocks(PosixBackend* store, uint64_t n) {
  std::vector<uint8_t> src(kShard);
  for (uint64_t b = 1; b <= n; ++b) {
    sim_fill(key(b, 0), src.data(), kShard);
    ASSERT_EQ(dump_sync(store, key(b, 0), src.data(), kShard).result, Result::kOk);
  }
}

// How a run goes: the loads of blocks 1..H (H = hung.size(), the store's
// depth) into hung[] hang in the kernel; a load of block H + 1 waits behind
// them until they count as held (PosixBackend::kHeldNs, the store's own
// look), and then loads while they still hang. The caller's word that H are
// stuck (requests_stuck) comes too: told_first, before it sends that load
// (as the queue does: it counts its loads stuck, then sends the next into
// the place); otherwise once the load has waited 100 ms. release() ends the
// hang: the hung loads complete (ok_after: with their bytes).
struct HungRun {
  std::vector<uint8_t*> hung;
  std::function<void()> release;
  bool ok_after = true;
  bool told_first = false;
};

void loads_past_hung_reads(PosixBackend* store, const HungRun& run) {
  const auto h = static_cast<uint32_t>(run.hung.size());
  Batch hung;
  std::vector<Op> ops(h);
  for (uint32_t i = 0; i < h; ++i) {
    prepare(&ops[i], &hung, key(i + 1, 0), run.hung[i], kShard);
    store->load(&ops[i].req);
  }
  AlignedBuf dst(kShard);
  Batch other;
  Op next;
  const Key k = key(h + 1, 0);
  prepare(&next, &other, k, dst.get(), kShard);
  if (run.told_first) {
    usleep(300'000);  // the hung loads reach the kernel
    store->requests_stuck(h, 0);
    store->load(&next.req);
  } else {
    store->load(&next.req);
    // Before kHeldNs no store can tell a held read from a slow one.
    EXPECT_FALSE(other.wait(1, 100)) << "the last load did not wait: the others did not hang";
    store->requests_stuck(h, 0);
  }
  EXPECT_EQ(hung.count(), 0u) << "the hung reads ended before the test released them";
  EXPECT_TRUE(other.wait(1, 10000)) << "the last load still waits behind the " << h << " hung reads";
  EXPECT_EQ(next.req.result, Result::kOk) << next.req.error;
  EXPECT_EQ(sim_verify(k, dst.get(), kShard), kShard);
  EXPECT_EQ(hung.count(), 0u) << "the hung reads ended before the test released them";
  run.release();
  ASSERT_TRUE(hung.wait(h, 10000)) << "the hung reads did not end once released";
  for (uint32_t i = 0; i < h; ++i) {
    if (run.ok_after) {
      EXPECT_EQ(ops[i].req.result, Result::kOk) << ops[i].req.error;
      EXPECT_EQ(sim_verify(key(i + 1, 0), run.hung[i], kShard), kShard);
    } else {
      EXPECT_NE(ops[i].req.result, Result::kOk);
    }
  }
  EXPECT_EQ(store->shutdown(deadline_after_ms(10000)), 0u);
}

TEST(PosixStuck, ThreadsLoadPastTwoHungReads) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  HungBuffer h1, h2;
  if (!h1.why_not().empty()) GTEST_SKIP() << "no userfaultfd here: " << h1.why_not();
  auto store = make_store(dir.path, "threads");
  ASSERT_NE(store, nullptr);
  ASSERT_NO_FATAL_FAILURE(dump_blocks(store.get(), 3));
  HungRun run;
  run.hung = {h1.get(), h2.get()};
  run.release = [&] {
    h1.release();
    h2.release();
  };
  loads_past_hung_reads(store.get(), run);
}

// A FUSE file system whose reads of the shards of blocks 1..H never return
// (tests/backend/partly_hung_fs.py), over a directory blocks 1..H + 1 were
// dumped to; killed at the end (the hung reads then fail with ENOTCONN).
class PartlyHungFs : public ::testing::Test {
 protected:
  // Mounts the file system, its reads through the page cache or not (cache:
  // "direct" or "page", partly_hung_fs.py); a test that cannot is skipped.
  void mount(const char* cache, uint32_t hung) {
    const char* script = std::getenv("UCM_TEST_PARTLY_HUNG_FS");
    if (script == nullptr || *script == '\0') GTEST_SKIP() << "UCM_TEST_PARTLY_HUNG_FS is not set (meson test sets it)";
    if (access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "no /dev/fuse";
    if (std::system("/usr/bin/python3 -c 'import fusepy' 2>/dev/null") != 0) GTEST_SKIP() << "no python3-fusepy";
    ASSERT_FALSE(backing_.path.empty());
    ASSERT_FALSE(mnt_.path.empty());
    auto writer = make_store(backing_.path, "threads");
    ASSERT_NE(writer, nullptr);
    ASSERT_NO_FATAL_FAILURE(dump_blocks(writer.get(), hung + 1));
    std::vector<std::string> args = {"python3", script, backing_.path, mnt_.path,
                                     std::to_string(writer->index_offset()), cache};
    for (uint64_t b = 1; b <= hung; ++b) args.push_back(basename_of(writer->block_path(block(b))));
    const std::string log = backing_.path + ".fs.log";
    server_ = fork();
    ASSERT_GE(server_, 0);
    if (server_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // a test killed midway takes its server with it
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv("/usr/bin/python3", argv.data());
      _exit(127);
    }
    const uint64_t until = deadline_after_ms(20000);
    while (!mounted() && now_ns() < until && waitpid(server_, nullptr, WNOHANG) == 0) usleep(20000);
    if (!mounted()) {
      std::string why;
      if (FILE* f = fopen(log.c_str(), "r")) {
        char line[256];
        while (fgets(line, sizeof(line), f) != nullptr) why += line;
        fclose(f);
      }
      unlink(log.c_str());
      GTEST_SKIP() << "the FUSE file system did not mount here: " << why;
    }
    unlink(log.c_str());
  }
  void TearDown() override { kill_server(); }
  void kill_server() {
    if (server_ <= 0) return;
    kill(server_, SIGKILL);
    waitpid(server_, nullptr, 0);
    server_ = -1;
    umount2(mnt_.path.c_str(), MNT_DETACH);
  }
  bool mounted() const {
    FILE* f = fopen("/proc/mounts", "r");
    if (f == nullptr) return false;
    char dev[512], at[512], type[64];
    bool found = false;
    while (!found && fscanf(f, "%511s %511s %63s %*[^\n]", dev, at, type) == 3)
      found = mnt_.path == at && std::string(type).rfind("fuse", 0) == 0;
    fclose(f);
    return found;
  }
  static std::string basename_of(const std::string& p) { return p.substr(p.rfind('/') + 1); }
  // Mounts with `hung` hung files and opens a store there (null: skipped, or failed).
  std::unique_ptr<PosixBackend> mounted_store(const char* cache, uint32_t hung, const std::string& engine,
                                              uint32_t depth) {
    mount(cache, hung);
    if (IsSkipped() || HasFatalFailure()) return nullptr;
    auto store = make_store(mnt_.path, engine, depth);
    EXPECT_NE(store, nullptr);
    return store;
  }
  void second_request_of_a_held_file(const char* cache, const std::string& engine);
  void behind_six_hung_reads(const char* cache, const std::string& engine);
  // `hung` loads hang on a store of that depth; warned: the warnings
  // expected (the ring's thread found stuck).
  void run(const char* cache, const std::string& engine, uint32_t hung, bool told_first, size_t warned) {
    auto store = mounted_store(cache, hung, engine, hung);
    if (!store) return;
    ASSERT_STREQ(store->load_engine(), engine.c_str());
    std::vector<std::unique_ptr<AlignedBuf>> bufs;
    HungRun r;
    for (uint32_t i = 0; i < hung; ++i) {
      bufs.push_back(std::make_unique<AlignedBuf>(kShard));
      r.hung.push_back(bufs.back()->get());
    }
    r.release = [&] { kill_server(); };
    r.ok_after = false;
    r.told_first = told_first;
    {
      LogCapture log;
      loads_past_hung_reads(store.get(), r);
      EXPECT_EQ(log.warnings(), warned) << log.first_lines();
      if (warned > 0) {
        EXPECT_EQ(log.warnings_with("the io_uring thread has been in one call into the file system"), warned);
      }
    }
  }

  TempDir backing_, mnt_;
  pid_t server_ = -1;
};

TEST_F(PartlyHungFs, ThreadsLoadPastTwoHungReads) { run("direct", "threads", 2, false, 0); }

// A second request of a block file whose first read the server holds is
// not started (it would hold a second thread as long): it fails at once,
// naming the file; another file still loads.
TEST_F(PartlyHungFs, ASecondRequestOfAHeldFileIsNotStarted) { second_request_of_a_held_file("direct", "threads"); }

TEST_F(PartlyHungFs, TheRingStartsNoSecondRequestOfAHeldFile) {
  if (!kRingBuilt) GTEST_SKIP() << "built without io_uring";
  second_request_of_a_held_file("page", "uring");
}

// As PosixStuck.ALoadQueuedBehindManyHungReadsGetsAThreadInTheEnd, on
// the FUSE file system and both engines: six hung reads at depth 2, and a
// good load behind them.
void PartlyHungFs::behind_six_hung_reads(const char* cache, const std::string& engine) {
  auto store = mounted_store(cache, 6, engine, 2);
  if (!store) return;
  std::vector<std::unique_ptr<AlignedBuf>> bufs;
  std::vector<Op> ops(6);
  Batch hung;
  for (uint64_t i = 0; i < 6; ++i) {
    bufs.push_back(std::make_unique<AlignedBuf>(kShard));
    prepare(&ops[i], &hung, key(i + 1, 0), bufs.back()->get(), kShard);
    store->load(&ops[i].req);
  }
  AlignedBuf dst(kShard);
  const SyncResult r = run_sync(store.get(), true, key(7, 0), dst.get(), kShard, 10000);
  EXPECT_EQ(r.result, Result::kOk) << r.error;
  EXPECT_EQ(sim_verify(key(7, 0), dst.get(), kShard), kShard);
  EXPECT_EQ(hung.count(), 0u);
  kill_server();
  ASSERT_TRUE(hung.wait(6, 10000));
  EXPECT_EQ(store->shutdown(deadline_after_ms(10000)), 0u);
}

TEST_F(PartlyHungFs, ThreadsGiveALoadBehindSixHungReadsAThread) { behind_six_hung_reads("direct", "threads"); }

TEST_F(PartlyHungFs, TheRingGivesALoadBehindSixHungReadsAPlace) {
  if (!kRingBuilt) GTEST_SKIP() << "built without io_uring";
  behind_six_hung_reads("page", "uring");
}

void PartlyHungFs::second_request_of_a_held_file(const char* cache, const std::string& engine) {
  auto store = mounted_store(cache, 1, engine, 2);
  if (!store) return;
  AlignedBuf b1(kShard), b2(kShard), b3(kShard);
  Batch hung;
  Op first;
  prepare(&first, &hung, key(1, 0), b1.get(), kShard);
  store->load(&first.req);
  usleep(300'000);  // held past kHeldNs
  const SyncResult again = run_sync(store.get(), true, key(1, 0), b2.get(), kShard, 10000);
  EXPECT_EQ(again.result, Result::kBackend) << again.error;
  EXPECT_NE(again.error.find("another request of this block file has been held in the kernel"), std::string::npos)
      << again.error;
  EXPECT_NE(again.error.find(basename_of(store->block_path(block(1)))), std::string::npos) << again.error;
  const SyncResult other = run_sync(store.get(), true, key(2, 0), b3.get(), kShard, 10000);
  EXPECT_EQ(other.result, Result::kOk) << other.error;
  EXPECT_EQ(sim_verify(key(2, 0), b3.get(), kShard), kShard);
  EXPECT_EQ(hung.count(), 0u);
  kill_server();
  ASSERT_TRUE(hung.wait(1, 10000));
  EXPECT_EQ(store->shutdown(deadline_after_ms(10000)), 0u);
}

// FUSE runs a direct_io read inline, in the ring's own thread, which the hung
// read then holds in the kernel: the ring gives its loads to the threads.
TEST_F(PartlyHungFs, TheRingGivesItsLoadsToTheThreadsWhenItsThreadHangs) {
  if (!kRingBuilt) GTEST_SKIP() << "built without io_uring";
  run("direct", "uring", 2, false, 1);
}

// Through the page cache, io_uring hands the hung reads to its own workers:
// the ring's thread goes on, and takes the next load into the room made
// beside them, also when the room is made before the load comes (the ring's
// thread then waits with every place taken, and must be woken for it).
TEST_F(PartlyHungFs, TheRingLoadsBesideTwoHungReadsInItsWorkers) {
  if (!kRingBuilt) GTEST_SKIP() << "built without io_uring";
  run("page", "uring", 2, false, 0);
}

TEST_F(PartlyHungFs, TheRingIsWokenForRoomMadeBeforeTheNextLoad) {
  if (!kRingBuilt) GTEST_SKIP() << "built without io_uring";
  run("page", "uring", 2, true, 0);
}

// Eight hung reads at depth 8: past the kernel's default of io-wq workers
// for one thread on a small node (4 per CPU), so the ring raises it.
TEST_F(PartlyHungFs, TheRingLoadsBesideEightHungReadsInItsWorkers) {
  if (!kRingBuilt) GTEST_SKIP() << "built without io_uring";
  run("page", "uring", 8, true, 0);
}

// Hung reads in waves, each wave on threads the store added for the last:
// while requests wait, the store keeps `depth` threads that are not held.
// (It used to add at most `depth` threads in its life, and a rank whose
// store met more hung files than that failed every load after: helper-18.)
TEST(PosixStuck, ThreadsServeBesideWaveAfterWaveOfHungReads) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  auto store = make_store(dir.path, "threads");
  ASSERT_NE(store, nullptr);
  ASSERT_NO_FATAL_FAILURE(dump_blocks(store.get(), 7));
  std::vector<std::unique_ptr<HungBuffer>> bufs;
  std::vector<std::unique_ptr<Op>> hung_ops;
  Batch hung;
  for (int wave = 0; wave < 3; ++wave) {
    for (int i = 0; i < 2; ++i) {
      bufs.push_back(std::make_unique<HungBuffer>());
      if (!bufs.back()->why_not().empty()) GTEST_SKIP() << "no userfaultfd here: " << bufs.back()->why_not();
      hung_ops.push_back(std::make_unique<Op>());
      // Files of their own (a second request of a held file is not started).
      prepare(hung_ops.back().get(), &hung, key(1 + 2 * wave + i, 0), bufs.back()->get(), kShard);
      store->load(&hung_ops.back()->req);
    }
    usleep(300'000);  // held past kHeldNs
    AlignedBuf dst(kShard);
    SCOPED_TRACE("wave " + std::to_string(wave));
    const SyncResult r = run_sync(store.get(), true, key(7, 0), dst.get(), kShard, 10000);
    EXPECT_EQ(r.result, Result::kOk) << r.error;
    EXPECT_EQ(sim_verify(key(7, 0), dst.get(), kShard), kShard);
  }
  EXPECT_EQ(hung.count(), 0u);
  EXPECT_EQ(store->io_threads(), 8u);  // 2, and 2 more for each wave's 2 held
  for (auto& b : bufs) b->release();
  ASSERT_TRUE(hung.wait(hung_ops.size(), 10000));
  EXPECT_EQ(store->shutdown(deadline_after_ms(10000)), 0u);
}

// Six hung reads at once on a store of depth 2, and a good load queued
// behind them: the spares added for the first two held take the next two
// hung ones, and so on, until one takes the good load (helper-19: the
// watcher was not armed again for spares that took requests that hung, and
// the good load waited out its caller's deadline).
TEST(PosixStuck, ALoadQueuedBehindManyHungReadsGetsAThreadInTheEnd) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  auto store = make_store(dir.path, "threads");
  ASSERT_NE(store, nullptr);
  ASSERT_NO_FATAL_FAILURE(dump_blocks(store.get(), 7));
  std::vector<std::unique_ptr<HungBuffer>> bufs;
  std::vector<Op> ops(6);
  Batch hung;
  for (uint64_t i = 0; i < 6; ++i) {
    bufs.push_back(std::make_unique<HungBuffer>());
    if (!bufs.back()->why_not().empty()) GTEST_SKIP() << "no userfaultfd here: " << bufs.back()->why_not();
    prepare(&ops[i], &hung, key(i + 1, 0), bufs.back()->get(), kShard);
    store->load(&ops[i].req);
  }
  AlignedBuf dst(kShard);
  const SyncResult r = run_sync(store.get(), true, key(7, 0), dst.get(), kShard, 10000);
  EXPECT_EQ(r.result, Result::kOk) << r.error;
  EXPECT_EQ(sim_verify(key(7, 0), dst.get(), kShard), kShard);
  EXPECT_EQ(hung.count(), 0u);
  for (auto& b : bufs) b->release();
  ASSERT_TRUE(hung.wait(6, 10000));
  EXPECT_EQ(store->shutdown(deadline_after_ms(10000)), 0u);
}

// At most `spare` more (spare=2: 4 threads): with all 4 held, what is queued
// cannot start, and fails at once, saying why, instead of at its caller's
// deadline.
TEST(PosixStuck, QueuedRequestsFailWhenEveryThreadIsHeldAndNoMoreMayBeAdded) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  auto store = make_store(dir.path, "threads", 2, ",spare=2");
  ASSERT_NE(store, nullptr);
  ASSERT_NO_FATAL_FAILURE(dump_blocks(store.get(), 5));
  std::vector<std::unique_ptr<HungBuffer>> bufs;
  std::vector<Op> ops(4);
  Batch hung;
  for (uint64_t i = 0; i < 4; ++i) {
    bufs.push_back(std::make_unique<HungBuffer>());
    if (!bufs.back()->why_not().empty()) GTEST_SKIP() << "no userfaultfd here: " << bufs.back()->why_not();
    prepare(&ops[i], &hung, key(i + 1, 0), bufs.back()->get(), kShard);
    store->load(&ops[i].req);
    if (i == 1) usleep(300'000);  // the first two held: the next two get threads of their own
  }
  usleep(300'000);
  EXPECT_EQ(store->io_threads(), 4u);
  AlignedBuf dst(kShard);
  {
    LogCapture log;
    const SyncResult r = run_sync(store.get(), true, key(5, 0), dst.get(), kShard, 10000);
    EXPECT_EQ(r.result, Result::kBackend) << r.error;
    EXPECT_NE(r.error.find("all 4 I/O threads are held in the kernel"), std::string::npos) << r.error;
    EXPECT_EQ(log.warnings_with("all 4 I/O threads are held in the kernel"), 1u) << log.first_lines();
  }
  EXPECT_EQ(hung.count(), 0u);
  for (auto& b : bufs) b->release();
  ASSERT_TRUE(hung.wait(4, 10000));
  EXPECT_EQ(store->shutdown(deadline_after_ms(10000)), 0u);
}

// A request the store has not started is taken back (its done() never
// runs); one on a thread is not.
TEST(PosixStuck, AQueuedRequestIsTakenBackAndAStartedOneIsNot) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  HungBuffer h1, h2;
  if (!h1.why_not().empty()) GTEST_SKIP() << "no userfaultfd here: " << h1.why_not();
  auto store = make_store(dir.path, "threads");
  ASSERT_NE(store, nullptr);
  ASSERT_NO_FATAL_FAILURE(dump_blocks(store.get(), 3));
  Batch hung, other;
  Op o1, o2, o3;
  prepare(&o1, &hung, key(1, 0), h1.get(), kShard);
  prepare(&o2, &hung, key(2, 0), h2.get(), kShard);
  store->load(&o1.req);
  store->load(&o2.req);
  AlignedBuf dst(kShard);
  prepare(&o3, &other, key(3, 0), dst.get(), kShard);
  store->load(&o3.req);
  usleep(100'000);  // both threads in their reads (not yet held: nothing is added)
  EXPECT_TRUE(store->cancel(&o3.req));
  EXPECT_FALSE(store->cancel(&o1.req));
  EXPECT_FALSE(store->cancel(&o3.req));
  h1.release();
  h2.release();
  ASSERT_TRUE(hung.wait(2, 10000));
  EXPECT_FALSE(other.wait(1, 300)) << "the request taken back ran";
  EXPECT_EQ(store->shutdown(deadline_after_ms(10000)), 0u);
}

// A dump that takes long is not its block file's server gone: the block's
// other shards still load. Its source here waits on a page fault (a
// userfaultfd); in life the kernel's dirty-page throttling, or sync=1's
// fdatasync on a busy disk, hold a write for seconds. Before, 200 ms into
// any request every other request of its block file was refused as held in
// the kernel (helper-22: 8 MiB shards dumped by 4 nodes at once).
TEST(PosixStuck, ASlowDumpDoesNotMakeItsBlockFileCountAsHeld) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto b = make_store(dir.path, "threads", 2, "", 4);
  ASSERT_NE(b, nullptr);
  std::vector<uint8_t> src(kShard), got(kShard);
  sim_fill(key(9200, 0), src.data(), kShard);
  ASSERT_EQ(dump_sync(b.get(), key(9200, 0), src.data(), kShard).result, Result::kOk);
  HungBuffer slow;
  if (!slow.why_not().empty()) GTEST_SKIP() << "no userfaultfd to hold a dump: " << slow.why_not();
  Batch batch;
  Op w;
  prepare(&w, &batch, key(9200, 1), slow.get(), kShard);
  b->dump(&w.req);
  usleep(300'000);  // past kHeldNs
  EXPECT_EQ(batch.count(), 0u) << "the dump's source did not hold it";
  const SyncResult l = load_sync(b.get(), key(9200, 0), got.data(), kShard);
  EXPECT_EQ(res(l.result), res(Result::kOk)) << l.error;
  EXPECT_EQ(got, src);
  slow.release();
  ASSERT_TRUE(batch.wait(1));
  EXPECT_EQ(res(w.req.result), res(Result::kOk)) << w.req.error;
}

}  // namespace
}  // namespace ucm::test
