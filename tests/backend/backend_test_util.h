// Helpers shared by the backend suites: completions a test can wait on, with
// the time each request completed and how often its done() ran.
#pragma once

#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "backend/backend.h"
#include "backend/sim_content.h"
#include "common/test_util.h"
#include "common/time.h"
#include "ucm_build_config.h"

namespace ucm::test {

// Counts the completions of a group of requests.
struct Batch {
  std::mutex mu;
  std::condition_variable cv;
  size_t completed = 0;
  uint64_t next_order = 0;

  // True once `n` requests have completed, false past timeout_ms.
  bool wait(size_t n, uint64_t timeout_ms = 30000) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::milliseconds(timeout_ms), [&] { return completed >= n; });
  }
  size_t count() {
    std::lock_guard<std::mutex> g(mu);
    return completed;
  }
};

// One request with what its completion reported.
struct Op {
  IoRequest req;
  Batch* batch = nullptr;
  int calls = 0;           // times done() ran; guarded by batch->mu
  uint64_t submit_ns = 0;  // set by the test just before load()/dump()
  uint64_t done_ns = 0;    // set by done()
  uint64_t order = 0;      // completion rank within the batch
};

inline void op_done(IoRequest* r) {
  Op* op = static_cast<Op*>(r->user);
  const uint64_t t = now_ns();
  std::lock_guard<std::mutex> g(op->batch->mu);
  op->done_ns = t;
  op->order = op->batch->next_order++;
  ++op->calls;
  ++op->batch->completed;
  op->batch->cv.notify_all();
}

inline void prepare(Op* op, Batch* batch, const Key& k, void* buf, uint64_t bytes) {
  op->batch = batch;
  op->req.key = k;
  op->req.buf = buf;
  op->req.bytes = bytes;
  op->req.done = &op_done;
  op->req.user = op;
  op->req.result = Result::kBadState;  // never the value a store leaves
  op->req.error[0] = '\0';
}

// Memory for shards: 4 KiB aligned (direct I/O sized), zero-filled.
struct AlignedBuf {
  std::unique_ptr<uint8_t, decltype(&std::free)> p{nullptr, &std::free};
  uint64_t bytes = 0;
  explicit AlignedBuf(uint64_t n) : bytes(n) {
    const uint64_t rounded = (n + 4095) / 4096 * 4096 + 4096;
    p.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, rounded)));
    std::memset(p.get(), 0, rounded);
  }
  uint8_t* get() const { return p.get(); }
};

// Runs one request to completion. A request that never completes is leaked
// (the store still holds it) and reported as kTimeout with a test failure.
struct SyncResult {
  Result result;
  std::string error;
};

inline SyncResult run_sync(Backend* b, bool is_load, const Key& k, void* buf, uint64_t bytes,
                           uint64_t timeout_ms = 30000) {
  auto batch = std::make_unique<Batch>();
  auto op = std::make_unique<Op>();
  prepare(op.get(), batch.get(), k, buf, bytes);
  if (is_load) b->load(&op->req);
  else b->dump(&op->req);
  if (!batch->wait(1, timeout_ms)) {
    ADD_FAILURE() << (is_load ? "load" : "dump") << " of block " << k.block.lo << " shard " << k.shard
                  << " did not complete in " << timeout_ms << " ms";
    batch.release();
    op.release();
    return {Result::kTimeout, "no completion"};
  }
  EXPECT_EQ(op->calls, 1);
  return {op->req.result, op->req.error};
}

inline SyncResult load_sync(Backend* b, const Key& k, void* buf, uint64_t bytes) {
  return run_sync(b, true, k, buf, bytes);
}
inline SyncResult dump_sync(Backend* b, const Key& k, const void* buf, uint64_t bytes) {
  return run_sync(b, false, k, const_cast<void*>(buf), bytes);
}

// A fresh directory under `base`, removed (with everything in it) at the end.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& base = "/tmp") {
    std::string tmpl = base + "/ucm-backend-test-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      ADD_FAILURE() << "mkdtemp under " << base << ": " << strerror(errno);
      return;
    }
    path = tmpl;
  }
  ~TempDir() {
    if (path.empty()) return;
    std::error_code ec;
    // Directories a test made read-only must be writable again to be emptied.
    for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
         !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
      if (it->is_directory(ec)) chmod(it->path().c_str(), 0755);
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  bool ok() const { return !path.empty(); }
};

inline std::string res(Result r) { return result_name(r); }

// Dumps shards [0, n) of each block with their sim content; true if all succeed.
inline void dump_blocks(Backend* b, const std::vector<uint64_t>& blocks, uint32_t shards, uint64_t bytes) {
  AlignedBuf buf(bytes);
  for (uint64_t blk : blocks)
    for (uint32_t s = 0; s < shards; ++s) {
      sim_fill(key(blk, s), buf.get(), bytes);
      const SyncResult r = dump_sync(b, key(blk, s), buf.get(), bytes);
      ASSERT_EQ(res(r.result), res(Result::kOk)) << "block " << blk << " shard " << s << ": " << r.error;
    }
}

// Empty where engine=uring works here; else why not (a skip's reason).
inline std::string no_ring_here() {
  if (!UCM_HAVE_URING) return "built without io_uring (meson -Dio_uring)";
  TempDir dir;
  BackendContext c{4096, 1};
  std::unique_ptr<Backend> probe;
  const Result made = make_backend("posix:" + dir.path + ",engine=uring", c, &probe);
  return made == Result::kUnsupported ? "the kernel refuses io_uring here: " + last_error() : "";
}

// Flips the bits `mask` of the byte at `off` in the file at `path`.
inline void xor_byte_at(const std::string& path, off_t off, uint8_t mask) {
  int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
  uint8_t v = 0;
  ASSERT_EQ(pread(fd, &v, 1, off), 1) << path << " at " << off;
  v ^= mask;
  ASSERT_EQ(pwrite(fd, &v, 1, off), 1) << path << " at " << off;
  close(fd);
}

// Loads them back and checks every byte.
inline void expect_blocks(Backend* b, const std::vector<uint64_t>& blocks, uint32_t shards, uint64_t bytes) {
  AlignedBuf buf(bytes);
  for (uint64_t blk : blocks)
    for (uint32_t s = 0; s < shards; ++s) {
      std::memset(buf.get(), 0xA5, bytes);
      const SyncResult r = load_sync(b, key(blk, s), buf.get(), bytes);
      ASSERT_EQ(res(r.result), res(Result::kOk)) << "block " << blk << " shard " << s << ": " << r.error;
      ASSERT_EQ(sim_verify(key(blk, s), buf.get(), bytes), bytes) << "block " << blk << " shard " << s;
    }
}

// Returns the result of loading one shard (the buffer content is not checked).
inline SyncResult load_one(Backend* b, const Key& k, uint64_t bytes) {
  AlignedBuf buf(bytes);
  return load_sync(b, k, buf.get(), bytes);
}

inline bool exists(Backend* b, const Key& k) {
  bool out = true;
  EXPECT_EQ(res(b->exists(k, &out)), res(Result::kOk)) << last_error();
  return out;
}

}  // namespace ucm::test
