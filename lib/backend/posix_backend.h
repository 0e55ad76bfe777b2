// The posix store: one file per block in a directory (local disk or a shared
// parallel file system). The embedded default.
//
// File layout (`<dir>/<block id as 32 hex digits>.ucmblk`, sparse):
//   [shard 0][shard 1]...[shard n-1] at offset s * shard_bytes
//   [index: n ShardHeader of 32 bytes] at round_up(n * shard_bytes, 4096)
// A dump writes the shard's bytes, then its header (magic, length, a checksum
// of the bytes, a check of the header itself). A load reads the header and the
// bytes and verifies both; a shard that was never completely written (no
// header, an old header over new bytes, a truncated file, a flipped bit) is a
// failed load, never data. A failing dump (disk full, file size limit) leaves
// every other shard as it was.
//
// I/O runs on `depth` threads. O_DIRECT is used when the file system accepts it
// and the buffer, length and offset are 4 KiB aligned (direct=auto), always
// (on: init fails where it cannot), or never (off). touch() asks the OS to keep
// the blocks' files resident (POSIX_FADV_WILLNEED).
//
// Spec: posix:/path[,depth=8][,direct=auto|on|off][,sync=0|1]
//   sync=1 fdatasync()s the shard before writing its header (durable dumps).
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/spec.h"

namespace ucm {

enum class DirectMode : uint8_t { kAuto, kOn, kOff };

struct PosixOptions {
  std::string dir;
  uint32_t depth = 8;
  DirectMode direct = DirectMode::kAuto;
  bool sync = false;
};

// On disk: ABI of the store's files. Change it, bump kShardHeaderMagic.
struct ShardHeader {
  uint64_t magic;     // kShardHeaderMagic: this shard was completely written
  uint64_t length;    // bytes of the shard (= shard_bytes of the writer)
  uint64_t checksum;  // checksum64 of the shard's bytes
  uint32_t shard;     // the shard index, against misplaced headers
  uint32_t check;     // low 32 bits of checksum64 of the 28 bytes above
};
static_assert(sizeof(ShardHeader) == 32);
constexpr uint64_t kShardHeaderMagic = 0x3144524853435255ull;  // "URCSHRD1"

class PosixBackend final : public Backend {
 public:
  [[nodiscard]] static Result create(const PosixOptions& o, const BackendContext& ctx, std::unique_ptr<PosixBackend>* out);
  [[nodiscard]] static Result parse_options(const Spec& spec, PosixOptions* out);
  ~PosixBackend() override;

  const char* name() const override { return "posix"; }
  void load(IoRequest* req) override;
  void dump(IoRequest* req) override;
  void touch(const BlockId* blocks, size_t n) override;
  [[nodiscard]] Result exists(const Key& k, bool* out) override;
  BackendCounters counters() const override { return counters_.snapshot(); }

  bool direct_io() const { return direct_ok_; }
  std::string block_path(const BlockId& b) const;
  uint64_t index_offset() const { return index_off_; }

 private:
  PosixBackend(const PosixOptions& o, const BackendContext& ctx);
  void submit(IoRequest* req, bool is_load);
  void worker();
  void do_load(IoRequest* req);
  void do_dump(IoRequest* req);
  bool aligned_for_direct(const IoRequest* req) const;
  Result read_header(int fd, const Key& k, const std::string& path, ShardHeader* h, char* err, size_t err_len) const;

  const PosixOptions opts_;
  const BackendContext ctx_;
  uint64_t index_off_ = 0;
  bool direct_ok_ = false;
  AtomicBackendCounters counters_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<IoRequest*, bool>> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace ucm
