// The posix store as a trust boundary, on real files: a shard answers only for
// the key it was written under (a block file under another block's name is
// corrupt, an older on-disk format is refused as such), and the store never
// follows a link, never blocks on a FIFO, never touches a file another user
// owns, creates its files 0600 (or the configured mode), and refuses a store
// directory another user owns or may write. "Another user" is a real one:
// `nobody`, through setpriv.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/posix_backend.h"
#include "backend/sim_content.h"
#include "backend_test_util.h"
#include "common/checksum.h"

namespace ucm::test {
namespace {

constexpr uint64_t kBytes = 4096;
constexpr uint32_t kShards = 4;
constexpr uid_t kNobody = 65534;

bool contains(const std::string& s, const std::string& needle) { return s.find(needle) != std::string::npos; }

std::unique_ptr<PosixBackend> open_store(const std::string& dir, const std::string& extra = "") {
  BackendContext c{kBytes, kShards};
  std::unique_ptr<Backend> b;
  clear_last_error();
  const Result r = make_backend("posix:" + dir + extra, c, &b);
  EXPECT_EQ(res(r), res(Result::kOk)) << dir << extra << ": " << last_error();
  if (r != Result::kOk) return nullptr;
  return std::unique_ptr<PosixBackend>(static_cast<PosixBackend*>(b.release()));
}

// The refusal of `dir` as a store: its result, last_error() in *err.
Result refuse(const std::string& dir, std::string* err) {
  BackendContext c{kBytes, kShards};
  std::unique_ptr<Backend> b;
  clear_last_error();
  const Result r = make_backend("posix:" + dir, c, &b);
  *err = last_error();
  return r;
}

// How the store names a key in its messages: the load queue's spelling.
std::string key_words(const Key& k) {
  char buf[80];
  std::snprintf(buf, sizeof(buf), "block %016" PRIx64 "%016" PRIx64 " shard %u", k.block.hi, k.block.lo, k.shard);
  return buf;
}

void dump_all(Backend* b, uint64_t blk) {
  AlignedBuf buf(kBytes);
  for (uint32_t s = 0; s < kShards; ++s) {
    sim_fill(key(blk, s), buf.get(), kBytes);
    const SyncResult r = dump_sync(b, key(blk, s), buf.get(), kBytes);
    ASSERT_EQ(res(r.result), res(Result::kOk)) << "shard " << s << ": " << r.error;
  }
}

// Whether the store says it holds k; an error (logged by the caller) is "no".
bool exists_or_error(Backend* b, const Key& k) {
  bool out = false;
  return b->exists(k, &out) == Result::kOk && out;
}

SyncResult load_into(Backend* b, const Key& k, AlignedBuf* buf) {
  std::memset(buf->get(), 0xA5, kBytes);
  return load_sync(b, k, buf->get(), kBytes);
}

std::string read_file(const std::string& path) {
  std::string out;
  FILE* f = fopen(path.c_str(), "rb");
  if (!f) return "<unreadable>";
  char buf[256];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  fclose(f);
  return out;
}

void write_file(const std::string& path, const std::string& text) {
  FILE* f = fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path << ": " << strerror(errno);
  fwrite(text.data(), 1, text.size(), f);
  fclose(f);
}

unsigned mode_of(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return 0xffff;
  return st.st_mode & 07777;
}

// Runs argv as the unprivileged user `nobody` (setpriv, as root): its exit
// code, or -1 where that is not possible here (then the caller skips).
int run_as_nobody(const std::vector<std::string>& argv) {
  if (geteuid() != 0 || access("/usr/bin/setpriv", X_OK) != 0) return -1;
  std::vector<std::string> full{"/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"};
  full.insert(full.end(), argv.begin(), argv.end());
  std::vector<char*> cargv;
  for (std::string& s : full) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (devnull >= 0) {
      dup2(devnull, 1);
      dup2(devnull, 2);
    }
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  const int rc = wait_child(pid, 30000);
  return rc == 127 ? -1 : rc;
}

// Sets the umask for one scope (it is process-wide: restore it always).
struct UmaskScope {
  mode_t old;
  explicit UmaskScope(mode_t m) : old(umask(m)) {}
  ~UmaskScope() { umask(old); }
};

// ---- a shard answers only for its own key -------------------------------------

TEST(PosixTrust, ABlockFileUnderAnotherBlocksNameIsCorruptNamingKeyAndFile) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto b = open_store(dir.path);
  ASSERT_NE(b, nullptr);
  dump_all(b.get(), 7);
  // A copy (a restore from backup, a tool's bug) and a rename.
  std::filesystem::copy_file(b->block_path(block(7)), b->block_path(block(8)));
  ASSERT_EQ(rename(b->block_path(block(7)).c_str(), b->block_path(block(9)).c_str()), 0) << strerror(errno);
  AlignedBuf buf(kBytes);
  for (uint64_t blk : {8, 9})
    for (uint32_t s = 0; s < kShards; ++s) {
      SCOPED_TRACE("block " + std::to_string(blk) + " shard " + std::to_string(s));
      const SyncResult r = load_into(b.get(), key(blk, s), &buf);
      EXPECT_EQ(res(r.result), res(Result::kCorrupt)) << r.error;
      EXPECT_TRUE(contains(r.error, key_words(key(blk, s)))) << "names the key asked for: " << r.error;
      EXPECT_TRUE(contains(r.error, b->block_path(block(blk)))) << "names the file: " << r.error;
      EXPECT_TRUE(contains(r.error, key_words(key(7, s)))) << "names the key it holds: " << r.error;
      EXPECT_FALSE(exists_or_error(b.get(), key(blk, s)));
    }
  // The owner of block 8 re-dumps one shard: that one is whole, the rest stay refused.
  sim_fill(key(8, 2), buf.get(), kBytes);
  ASSERT_EQ(res(dump_sync(b.get(), key(8, 2), buf.get(), kBytes).result), res(Result::kOk));
  ASSERT_EQ(res(load_into(b.get(), key(8, 2), &buf).result), res(Result::kOk));
  EXPECT_EQ(sim_verify(key(8, 2), buf.get(), kBytes), kBytes);
  EXPECT_EQ(res(load_into(b.get(), key(8, 1), &buf).result), res(Result::kCorrupt));
}

// A file of the first format (32-byte headers, magic "URCSHRD1") is refused as
// older, never read as data.
TEST(PosixTrust, AFileOfTheOlderFormatIsRefusedAsOlder) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto b = open_store(dir.path);
  ASSERT_NE(b, nullptr);
  struct OldHeader {
    uint64_t magic, length, checksum;
    uint32_t shard, check;
  };
  const std::string path = b->block_path(block(7));
  const int fd = open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0) << strerror(errno);
  AlignedBuf buf(kBytes);
  for (uint32_t s = 0; s < kShards; ++s) {
    sim_fill(key(7, s), buf.get(), kBytes);
    ASSERT_EQ(pwrite(fd, buf.get(), kBytes, static_cast<off_t>(s * kBytes)), ssize_t(kBytes));
    OldHeader h{0x3144524853435255ull, kBytes, checksum64(buf.get(), kBytes), s, 0};
    h.check = static_cast<uint32_t>(checksum64(&h, 28, 0x5eed));
    ASSERT_EQ(pwrite(fd, &h, sizeof(h), static_cast<off_t>(b->index_offset() + s * sizeof(h))), ssize_t(sizeof(h)));
  }
  close(fd);
  for (uint32_t s : {0u, 1u}) {
    const SyncResult r = load_into(b.get(), key(7, s), &buf);
    EXPECT_EQ(res(r.result), res(Result::kCorrupt)) << "shard " << s << ": " << r.error;
    EXPECT_TRUE(contains(r.error, "older format") && contains(r.error, path)) << r.error;
  }
}

// ---- what the store opens ---------------------------------------------------

TEST(PosixTrust, ASymlinkUnderABlocksNameIsNeverFollowed) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto b = open_store(dir.path);
  ASSERT_NE(b, nullptr);
  const std::string victim = dir.path + "/victim.txt";
  write_file(victim, "an unrelated file");
  const std::string name = b->block_path(block(8));
  ASSERT_EQ(symlink(victim.c_str(), name.c_str()), 0) << strerror(errno);
  AlignedBuf buf(kBytes);
  sim_fill(key(8, 0), buf.get(), kBytes);
  const SyncResult d = dump_sync(b.get(), key(8, 0), buf.get(), kBytes);
  EXPECT_NE(res(d.result), res(Result::kOk)) << "a dump through a planted link";
  EXPECT_TRUE(contains(d.error, name) && contains(d.error, "link")) << d.error;
  EXPECT_EQ(read_file(victim), "an unrelated file") << "the link's target was written";
  const SyncResult l = load_into(b.get(), key(8, 0), &buf);
  EXPECT_EQ(res(l.result), res(Result::kCorrupt)) << l.error;
  EXPECT_TRUE(contains(l.error, name) && contains(l.error, "link")) << l.error;
  bool present = true;
  EXPECT_NE(res(b->exists(key(8, 0), &present)), res(Result::kOk));
  EXPECT_FALSE(present);
  const BlockId blocks[] = {block(8)};
  b->touch(blocks, 1);
  // A link to a whole valid block file of the same key is refused too.
  dump_all(b.get(), 9);
  ASSERT_EQ(unlink(name.c_str()), 0);
  ASSERT_EQ(symlink(b->block_path(block(9)).c_str(), b->block_path(block(10)).c_str()), 0);
  EXPECT_EQ(res(load_into(b.get(), key(10, 0), &buf).result), res(Result::kCorrupt));
}

// Exit codes of the FIFO child.
constexpr int kFifoOk = 0, kFifoNoStore = 30, kFifoLoad = 31, kFifoExists = 32, kFifoDump = 33;

TEST(PosixTrust, AFifoUnderABlocksNameNeverBlocks) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  // In a child: a store that blocks would hang its I/O thread for good.
  const pid_t child = fork_child([&] {
    auto b = open_store(dir.path);
    if (!b) return kFifoNoStore;
    const std::string name = b->block_path(block(8));
    if (mkfifo(name.c_str(), 0600) != 0) return kFifoNoStore;
    const BlockId blocks[] = {block(8), block(8)};
    b->touch(blocks, 2);  // the app thread: open() of a FIFO blocked it forever
    AlignedBuf buf(kBytes);
    const SyncResult l = load_into(b.get(), key(8, 1), &buf);
    if (l.result != Result::kCorrupt || !contains(l.error, name)) {
      fprintf(stderr, "load of a FIFO: %s: %s\n", result_name(l.result), l.error.c_str());
      return kFifoLoad;
    }
    bool present = true;
    if (b->exists(key(8, 1), &present) == Result::kOk || present) return kFifoExists;
    const SyncResult d = dump_sync(b.get(), key(8, 1), buf.get(), kBytes);
    if (d.result == Result::kOk) return kFifoDump;
    return kFifoOk;
  });
  ASSERT_GT(child, 0);
  const int rc = wait_child(child, 30000);
  EXPECT_EQ(rc, kFifoOk) << (rc == -1 ? "the store blocked on a FIFO (killed after 30 s)" : "see the child's stderr");
}

TEST(PosixTrust, ADirectoryUnderABlocksNameIsCorruptAndExistsSaysSo) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto b = open_store(dir.path);
  ASSERT_NE(b, nullptr);
  const std::string name = b->block_path(block(8));
  ASSERT_EQ(mkdir(name.c_str(), 0700), 0);
  AlignedBuf buf(kBytes);
  const SyncResult l = load_into(b.get(), key(8, 0), &buf);
  EXPECT_EQ(res(l.result), res(Result::kCorrupt)) << l.error;
  EXPECT_TRUE(contains(l.error, name) && contains(l.error, "not a regular file")) << l.error;
  bool present = true;
  clear_last_error();
  EXPECT_NE(res(b->exists(key(8, 0), &present)), res(Result::kOk));
  EXPECT_FALSE(present);
  EXPECT_TRUE(contains(last_error(), name)) << last_error();
  EXPECT_NE(res(dump_sync(b.get(), key(8, 0), buf.get(), kBytes).result), res(Result::kOk));
}

TEST(PosixTrust, ABlockFileAnotherUserOwnsIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another user needs root";
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  auto b = open_store(dir.path);
  ASSERT_NE(b, nullptr);
  dump_all(b.get(), 7);
  const std::string name = b->block_path(block(7));
  ASSERT_EQ(chown(name.c_str(), kNobody, kNobody), 0) << strerror(errno);
  AlignedBuf buf(kBytes);
  const SyncResult l = load_into(b.get(), key(7, 0), &buf);
  EXPECT_EQ(res(l.result), res(Result::kCorrupt)) << l.error;
  EXPECT_TRUE(contains(l.error, name) && contains(l.error, "owned by uid 65534")) << l.error;
  sim_fill(key(7, 0), buf.get(), kBytes);
  EXPECT_NE(res(dump_sync(b.get(), key(7, 0), buf.get(), kBytes).result), res(Result::kOk));
  struct stat st;
  ASSERT_EQ(stat(name.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kNobody) << "the store took the file over";
}

// ---- what the store creates -------------------------------------------------

TEST(PosixTrust, BlockFilesAre0600WhateverTheUmaskAndNobodyCannotReadThem) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  ASSERT_EQ(chmod(dir.path.c_str(), 0755), 0);  // traversable by nobody: only the file's mode stops it
  {
    UmaskScope um(0);
    auto b = open_store(dir.path);
    ASSERT_NE(b, nullptr);
    dump_all(b.get(), 7);
    EXPECT_EQ(mode_of(b->block_path(block(7))), 0600u);
    // A file an older version left 0644 is put back to the store's mode by the next dump.
    ASSERT_EQ(chmod(b->block_path(block(7)).c_str(), 0644), 0);
    dump_all(b.get(), 7);
    EXPECT_EQ(mode_of(b->block_path(block(7))), 0600u);
    const int rc = run_as_nobody({"/bin/cat", b->block_path(block(7))});
    if (rc == -1) GTEST_SKIP() << "cannot run a command as nobody here (needs root and setpriv)";
    EXPECT_NE(rc, 0) << "nobody read a block file";
  }
  // The configured mode, exactly, even under a stricter umask; then nobody can read.
  UmaskScope um(077);
  auto b = open_store(dir.path, ",file_mode=0644");
  ASSERT_NE(b, nullptr);
  dump_all(b.get(), 8);
  EXPECT_EQ(mode_of(b->block_path(block(8))), 0644u);
  EXPECT_EQ(run_as_nobody({"/bin/cat", b->block_path(block(8))}), 0) << "file_mode=0644: nobody may read";
}

// ---- the store directory -----------------------------------------------------

TEST(PosixTrust, AStoreDirectoryOthersMayWriteIsRefusedWithTheFix) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  for (mode_t m : {0777, 0770, 01777, 0722}) {
    SCOPED_TRACE(m);
    ASSERT_EQ(chmod(dir.path.c_str(), m), 0);
    std::string err;
    EXPECT_EQ(res(refuse(dir.path, &err)), res(Result::kInvalidArg));
    char mode_text[16];
    std::snprintf(mode_text, sizeof(mode_text), "0%o", static_cast<unsigned>(m));
    EXPECT_TRUE(contains(err, dir.path) && contains(err, mode_text) && contains(err, "chmod go-w")) << err;
  }
  ASSERT_EQ(chmod(dir.path.c_str(), 0755), 0);
  EXPECT_NE(open_store(dir.path), nullptr);
}

// What another user plants while the directory is open to them stays refused
// once it is closed again: the store follows no link and opens no file it
// does not own.
TEST(PosixTrust, WhatNobodyPlantedIsRefused) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  std::string name7, name8;
  {
    auto b = open_store(dir.path);
    ASSERT_NE(b, nullptr);
    name7 = b->block_path(block(7));
    name8 = b->block_path(block(8));
  }
  const std::string victim = dir.path + "/victim.txt";
  write_file(victim, "root's file");
  ASSERT_EQ(chmod(dir.path.c_str(), 0777), 0);
  const int rc = run_as_nobody({"/bin/ln", "-s", victim, name7});
  if (rc == -1) GTEST_SKIP() << "cannot run a command as nobody here (needs root and setpriv)";
  ASSERT_EQ(rc, 0) << "nobody could not plant a link in a 0777 directory";
  ASSERT_EQ(run_as_nobody({"/usr/bin/truncate", "-s", "65536", name8}), 0);
  std::string err;
  EXPECT_EQ(res(refuse(dir.path, &err)), res(Result::kInvalidArg)) << "a directory nobody may write";
  ASSERT_EQ(chmod(dir.path.c_str(), 0755), 0);
  auto b = open_store(dir.path);
  ASSERT_NE(b, nullptr);
  AlignedBuf buf(kBytes);
  sim_fill(key(7, 0), buf.get(), kBytes);
  EXPECT_NE(res(dump_sync(b.get(), key(7, 0), buf.get(), kBytes).result), res(Result::kOk));
  EXPECT_NE(res(dump_sync(b.get(), key(8, 0), buf.get(), kBytes).result), res(Result::kOk));
  EXPECT_EQ(read_file(victim), "root's file");
  EXPECT_EQ(res(load_into(b.get(), key(7, 0), &buf).result), res(Result::kCorrupt));
  const SyncResult l = load_into(b.get(), key(8, 0), &buf);
  EXPECT_EQ(res(l.result), res(Result::kCorrupt)) << l.error;
  EXPECT_TRUE(contains(l.error, "owned by uid 65534")) << l.error;
}

TEST(PosixTrust, AStoreDirectoryAnotherUserOwnsIsRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another user needs root";
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  ASSERT_EQ(chmod(dir.path.c_str(), 0755), 0);
  ASSERT_EQ(chown(dir.path.c_str(), kNobody, kNobody), 0) << strerror(errno);
  std::string err;
  EXPECT_EQ(res(refuse(dir.path, &err)), res(Result::kInvalidArg));
  EXPECT_TRUE(contains(err, dir.path) && contains(err, "owned by uid 65534")) << err;
}

// A link to a good directory is a good store: the check is on the directory
// the store opens (and keeps open), not on the name that led there.
TEST(PosixTrust, AStoreDirectoryReachedThroughALinkIsChecked) {
  TempDir dir;
  ASSERT_TRUE(dir.ok());
  const std::string real = dir.path + "/real", link = dir.path + "/link";
  ASSERT_EQ(mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(symlink(real.c_str(), link.c_str()), 0);
  {
    auto b = open_store(link);
    ASSERT_NE(b, nullptr);
    dump_all(b.get(), 7);
  }
  EXPECT_EQ(mode_of(real + "/" + std::filesystem::path(open_store(real)->block_path(block(7))).filename().string()),
            0600u);
  ASSERT_EQ(chmod(real.c_str(), 0777), 0);
  std::string err;
  EXPECT_EQ(res(refuse(link, &err)), res(Result::kInvalidArg));
  EXPECT_TRUE(contains(err, "chmod go-w")) << err;
}

// ---- spec: paths with '=' and ',' -------------------------------------------

TEST(PosixTrust, AStoreDirectoryWhosePathHoldsAnEqualsSignWorks) {
  TempDir base;
  ASSERT_TRUE(base.ok());
  for (const char* sub : {"/run=5", "/a,b", "/x=1,y", "/p=q,9=s"}) {
    SCOPED_TRACE(sub);
    const std::string d = base.path + sub;
    ASSERT_EQ(mkdir(d.c_str(), 0700), 0) << strerror(errno);
    for (const char* extra : {"", ",depth=2,direct=off"}) {
      auto b = open_store(d, extra);
      ASSERT_NE(b, nullptr);
      dump_all(b.get(), 7);
      EXPECT_EQ(b->block_path(block(7)).rfind(d + "/", 0), 0u) << b->block_path(block(7));
      EXPECT_EQ(mode_of(b->block_path(block(7))), 0600u);
    }
  }
}

}  // namespace
}  // namespace ucm::test
