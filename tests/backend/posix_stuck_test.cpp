// The posix store's loads that hang in the kernel, for real: a read whose
// destination is memory registered with userfaultfd waits inside the read
// system call until the fault is resolved, as a read from a file on a dead
// NFS or Lustre server waits for the server. When the caller says that some
// of its requests are stuck (Backend::requests_stuck, which LoadQueue calls
// as it counts them), the store makes room for others beside them: one more
// I/O thread for each (engine=threads), one more read in the ring for each
// (engine=uring), up to its depth more. Before, `depth` hung reads held every
// thread (every place in the ring), and every other load of the rank queued
// behind them for as long as the server stayed dead. (The ring is tested on a
// FUSE file system instead: io_uring tries a buffered read inline first, and
// a userfaultfd fault there spins the ring's own thread in the kernel, where
// a read from a network file system goes to the kernel's io-wq workers.)
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
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

std::unique_ptr<PosixBackend> make_store(const std::string& dir, const std::string& engine) {
  BackendContext c;
  c.shard_bytes = kShard;
  c.shards_per_block = 1;
  std::unique_ptr<Backend> b;
  // Buffered: the read copies into the hung buffer in the kernel (a direct
  // read would hang as well, on pinning it; buffered works on every file system).
  const std::string spec = "posix:" + dir + ",depth=2,direct=off,engine=" + engine;
  const Result r = make_backend(spec, c, &b);
  EXPECT_EQ(r, Result::kOk) << spec << ": " << last_error();
  if (r != Result::kOk) return nullptr;
  return std::unique_ptr<PosixBackend>(static_cast<PosixBackend*>(b.release()));
}

void dump_blocks_1_to_3(PosixBackend* store) {
  std::vector<uint8_t> src(kShard);
  for (uint64_t b : {1, 2, 3}) {
    sim_fill(key(b, 0), src.data(), kShard);
    ASSERT_EQ(dump_sync(store, key(b, 0), src.data(), kShard).result, Result::kOk);
  }
}

// Loads of blocks 1 and 2 into h1 and h2 hang in the kernel on a store of
// depth 2; a third, of block 3, waits behind them until the caller says two
// are stuck, and then loads while they still hang. release() ends the hang:
// the two loads complete (ok_after: with their bytes).
void loads_past_two_hung_reads(PosixBackend* store, uint8_t* h1, uint8_t* h2, const std::function<void()>& release,
                               bool ok_after) {
  Batch hung;
  Op o1, o2;
  prepare(&o1, &hung, key(1, 0), h1, kShard);
  prepare(&o2, &hung, key(2, 0), h2, kShard);
  store->load(&o1.req);
  store->load(&o2.req);
  AlignedBuf dst(kShard);
  Batch other;
  Op o3;
  prepare(&o3, &other, key(3, 0), dst.get(), kShard);
  store->load(&o3.req);
  EXPECT_FALSE(other.wait(1, 300)) << "the third load did not wait: the first two did not hang";
  EXPECT_EQ(hung.count(), 0u);
  store->requests_stuck(2, 0);
  EXPECT_TRUE(other.wait(1, 10000)) << "the third load still waits behind the two hung reads";
  EXPECT_EQ(o3.req.result, Result::kOk) << o3.req.error;
  EXPECT_EQ(sim_verify(key(3, 0), dst.get(), kShard), kShard);
  EXPECT_EQ(hung.count(), 0u) << "the hung reads ended before the test released them";
  release();
  ASSERT_TRUE(hung.wait(2, 10000)) << "the hung reads did not end once released";
  if (ok_after) {
    EXPECT_EQ(o1.req.result, Result::kOk) << o1.req.error;
    EXPECT_EQ(sim_verify(key(1, 0), h1, kShard), kShard);
  } else {
    EXPECT_NE(o1.req.result, Result::kOk);
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
  ASSERT_NO_FATAL_FAILURE(dump_blocks_1_to_3(store.get()));
  loads_past_two_hung_reads(store.get(), h1.get(), h2.get(), [&] { h1.release(); h2.release(); }, true);
}

// A FUSE file system whose reads of blocks 1 and 2's shards never return
// (tests/backend/partly_hung_fs.py), over a directory the blocks were dumped
// to; killed at the end (the hung reads then fail with ENOTCONN).
class PartlyHungFs : public ::testing::Test {
 protected:
  // Mounts the file system, its reads through the page cache or not (cache:
  // "direct" or "page", partly_hung_fs.py); a test that cannot is skipped.
  void mount(const char* cache) {
    const char* script = std::getenv("UCM_TEST_PARTLY_HUNG_FS");
    if (script == nullptr || *script == '\0') GTEST_SKIP() << "UCM_TEST_PARTLY_HUNG_FS is not set (meson test sets it)";
    if (access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "no /dev/fuse";
    if (std::system("/usr/bin/python3 -c 'import fusepy' 2>/dev/null") != 0) GTEST_SKIP() << "no python3-fusepy";
    ASSERT_FALSE(backing_.path.empty());
    ASSERT_FALSE(mnt_.path.empty());
    auto writer = make_store(backing_.path, "threads");
    ASSERT_NE(writer, nullptr);
    ASSERT_NO_FATAL_FAILURE(dump_blocks_1_to_3(writer.get()));
    const std::string below = std::to_string(writer->index_offset());
    const std::string n1 = basename_of(writer->block_path(block(1)));
    const std::string n2 = basename_of(writer->block_path(block(2)));
    const std::string log = backing_.path + ".fs.log";
    server_ = fork();
    ASSERT_GE(server_, 0);
    if (server_ == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execl("/usr/bin/python3", "python3", script, backing_.path.c_str(), mnt_.path.c_str(), below.c_str(), cache,
            n1.c_str(), n2.c_str(), static_cast<char*>(nullptr));
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
  // warned: the warnings expected (the ring's thread found stuck).
  void run(const char* cache, const std::string& engine, size_t warned) {
    mount(cache);
    if (IsSkipped() || HasFatalFailure()) return;
    auto store = make_store(mnt_.path, engine);
    ASSERT_NE(store, nullptr);
    ASSERT_STREQ(store->load_engine(), engine.c_str());
    AlignedBuf b1(kShard), b2(kShard);
    {
      LogCapture log;
      loads_past_two_hung_reads(store.get(), b1.get(), b2.get(), [&] { kill_server(); }, false);
      EXPECT_EQ(log.warnings(), warned) << log.first_lines();
      if (warned > 0) {
        EXPECT_EQ(log.warnings_with("the io_uring thread has been in one system call"), warned);
      }
    }
  }

  TempDir backing_, mnt_;
  pid_t server_ = -1;
};

TEST_F(PartlyHungFs, ThreadsLoadPastTwoHungReads) { run("direct", "threads", 0); }

// FUSE runs a direct_io read inline, in the ring's own thread, which the hung
// read then holds in the kernel: the ring gives its loads to the threads.
TEST_F(PartlyHungFs, TheRingGivesItsLoadsToTheThreadsWhenItsThreadHangs) {
#if UCM_HAVE_URING
  run("direct", "uring", 1);
#else
  GTEST_SKIP() << "built without io_uring";
#endif
}

// Through the page cache, io_uring hands the hung reads to its own workers:
// the ring's thread goes on, and takes the next load into the room made
// beside them.
TEST_F(PartlyHungFs, TheRingLoadsBesideTwoHungReadsInItsWorkers) {
#if UCM_HAVE_URING
  run("page", "uring", 0);
#else
  GTEST_SKIP() << "built without io_uring";
#endif
}

// The room is bounded: a caller that says more are stuck than the depth
// gets at most depth more (here 2 + 2 threads).
TEST(PosixStuck, ThreadsAddAtMostTheDepthMore) {
  TempDir dir;
  ASSERT_FALSE(dir.path.empty());
  auto store = make_store(dir.path, "threads");
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->io_threads(), 2u);
  store->requests_stuck(1, 0);
  EXPECT_EQ(store->io_threads(), 3u);
  store->requests_stuck(0, 5);
  EXPECT_EQ(store->io_threads(), 4u);
  // Every thread still serves.
  std::vector<uint8_t> src(kShard);
  sim_fill(key(9, 0), src.data(), kShard);
  EXPECT_EQ(dump_sync(store.get(), key(9, 0), src.data(), kShard).result, Result::kOk);
  AlignedBuf dst(kShard);
  EXPECT_EQ(load_sync(store.get(), key(9, 0), dst.get(), kShard).result, Result::kOk);
  EXPECT_EQ(store->shutdown(deadline_after_ms(10000)), 0u);
}

}  // namespace
}  // namespace ucm::test
