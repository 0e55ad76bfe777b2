// The posix store: one file per block in a directory (local disk or a shared
// parallel file system). The embedded default.
//
// File layout (`<dir>/<block id as 32 hex digits>.ucmblk`, sparse):
//   [shard 0][shard 1]...[shard n-1] at offset s * shard_bytes
//   [index: n ShardHeader of 64 bytes] at round_up(n * shard_bytes, 4096)
// A dump writes the shard's bytes, then its header (magic, the full key it was
// written under, length, a checksum of the bytes, a check of the header
// itself), holding an open-file-description write lock (F_OFD_SETLKW) on the
// header's 64 bytes from before the bytes until its fd closes: writers of one
// shard in other stores (other nodes on a shared file system) take turns, so
// the last leaves its bytes and header whole. A load reads the header and the bytes and verifies both: a header
// of another key (a block file under another block's name: a copy, a restore,
// a tool's bug), of another length, of the older format, a truncated shard, a
// flipped bit is Result::kCorrupt naming the key and the file (it will not
// heal: never retry it); a shard never written is kNotFound. A failing dump
// (disk full, file size limit) leaves every other shard as it was.
//
// The directory is a trust boundary (README "The store directory is a trust
// boundary"). create() refuses a directory that is not owned by the job's
// effective user or that group or others may write: they could plant or
// replace block files. The directory is opened once and every block file is
// opened relative to it (openat), with O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC,
// then fstat()ed: anything but a regular file owned by the job's user (a
// symlink, a FIFO, a directory, another user's file) is refused, never
// followed, never waited on. Files are created with file_mode (0600). The
// store creates no directories.
//
// I/O runs on `depth` threads, or (engine=uring, built with -Dio_uring) loads
// run on one io_uring thread with up to `depth` shard reads in the kernel at
// once (posix_uring.h): the reads keep the disk busy while the thread is not
// scheduled, and one wake-up completes every read that landed. Dumps always
// run on the threads. engine=auto takes io_uring where it was built and the
// kernel allows it, the threads otherwise. requests_stuck() makes room beside
// requests a dead server holds (spare threads, ring places), and a ring whose
// own thread the file system holds hands its loads to the threads. O_DIRECT is used when the file system accepts it
// and the buffer, length and offset meet its alignment (statx STATX_DIOALIGN
// on a file there; 4096 where the kernel does not say), direct=auto; always
// where aligned (on: init fails where the file system refuses O_DIRECT); or
// never (off). A direct transfer the file system still refuses (EINVAL) is
// redone buffered on the same request, which is marked direct_fallback; the
// store then stops trying direct I/O (logged once). touch() asks the OS to keep
// the blocks' files resident (POSIX_FADV_WILLNEED) where loads read through
// the page cache; where they read direct, only the files' header indexes
// (what a direct load still reads through the page cache): the whole file
// would be read from the disk beside the loads, into pages no load reads.
//
// Spec: posix:/path[,depth=8][,direct=auto|on|off][,sync=0|1][,file_mode=0600]
//                   [,engine=auto|threads|uring][,spare=8*depth]
//   spare: at most this many I/O threads (or ring places) more than depth,
//   added beside requests held in the kernel (below).
//   sync=1 fdatasync()s the shard before writing its header (durable dumps).
//   file_mode: octal permission bits of the block files, at least 0600; the
//   store sets them exactly (umask aside) on every file it writes.
//   The path runs to the first ',' that starts a key=value option, so it may
//   hold '=' and ',' (see spec.h).
#pragma once

#include <sched.h>
#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/spec.h"

namespace ucm {

enum class DirectMode : uint8_t { kAuto, kOn, kOff };
enum class LoadEngine : uint8_t { kAuto, kThreads, kUring };

class PosixRing;

// The system calls the calling thread made for the store (occupancy()).
uint64_t& posix_thread_syscalls();

struct PosixOptions {
  std::string dir;
  uint32_t depth = 8;
  DirectMode direct = DirectMode::kAuto;
  bool sync = false;
  uint32_t file_mode = 0600;
  LoadEngine engine = LoadEngine::kAuto;
  // Threads (engine=threads) or ring places (engine=uring) the store adds, at
  // most, beside requests the file system has held for kHeldNs (a dead
  // server's files); UINT32_MAX: 8 x depth.
  uint32_t spare = UINT32_MAX;
  // Not in the spec: the direct-I/O alignment to assume instead of what the
  // kernel reports (0: ask the kernel). Lets a test make the kernel refuse a
  // direct transfer the store believes aligned, the case the fallback is for.
  uint32_t dio_align_claim = 0;
};

// On disk: ABI of the store's files. Change it, bump kShardHeaderMagic.
// 64 bytes, so a header never straddles a sector or a page.
struct ShardHeader {
  uint64_t magic;     // kShardHeaderMagic: this shard was completely written
  uint64_t block_hi;  // the key the shard was written under: a file under
  uint64_t block_lo;  //   another block's name is caught here
  uint32_t shard;     //   (and a header at another shard's place)
  uint32_t reserved0; // 0
  uint64_t length;    // bytes of the shard (= shard_bytes of the writer)
  uint64_t checksum;  // checksum64 of the shard's bytes
  uint64_t reserved1; // 0
  uint32_t reserved2; // 0
  uint32_t check;     // low 32 bits of checksum64 of the 60 bytes above
};
static_assert(sizeof(ShardHeader) == 64);
constexpr uint64_t kShardHeaderMagic = 0x3244524853435255ull;     // "URCSHRD2"
constexpr uint64_t kShardHeaderMagicOld1 = 0x3144524853435255ull; // "URCSHRD1": 32-byte headers without the block

class PosixBackend final : public Backend {
 public:
  [[nodiscard]] static Result create(const PosixOptions& o, const BackendContext& ctx, std::unique_ptr<PosixBackend>* out);
  [[nodiscard]] static Result parse_options(const Spec& spec, PosixOptions* out);
  ~PosixBackend() override;

  const char* name() const override { return "posix"; }
  void load(IoRequest* req) override;
  void dump(IoRequest* req) override;
  void touch(const BlockId* blocks, size_t n) override;
  // kOk with *out for a regular file of ours (a corrupt or older-format shard
  // is "not held"); an error naming the file where its state cannot be known
  // (unreadable, or not a regular file of this user).
  [[nodiscard]] Result exists(const Key& k, bool* out) override;
  BackendCounters counters() const override { return counters_.snapshot(); }
  // Bounded: threads still in the kernel at the deadline are detached
  // (backend.h). From then on a thread that returns touches the request's
  // buffer in user space, or calls done(), only if it is not abandoned.
  uint32_t shutdown(uint64_t deadline_ns) override;
  // A caller's word that some requests are stuck: the store looks at its
  // threads (and ring) now. While requests wait, it keeps `depth` threads
  // (ring places) that are not held in the kernel, adding up to `spare` in
  // its life (a spare thread stays until shutdown).
  void requests_stuck(uint32_t loads, uint32_t dumps) override;
  // Takes back a request still queued (for the threads, or for the ring).
  [[nodiscard]] bool cancel(IoRequest* req) override;
  // How long a request is in the kernel before it counts as held there (its
  // thread, or its place in the ring, is replaced while others wait).
  static constexpr uint64_t kHeldNs = 200'000'000;
  // When a read of `bytes` in the kernel means its block file's server is
  // down (file_held_locked, PosixRing::file_held): kHeldNs and the time the
  // bytes take at 32 MiB/s, well below any working disk, so that a large
  // shard on a busy one is not taken for a dead server (helper-22: 8 MiB
  // shards from 4 nodes at once). Writes never count: a write is slow for
  // good reasons (the kernel's dirty-page throttling, sync=1's fdatasync).
  static constexpr uint64_t held_file_ns(uint64_t bytes) { return kHeldNs + bytes / 32 * 1'000'000'000 / (1024 * 1024); }
  // The I/O threads the store runs now (depth, and the spares).
  uint32_t io_threads();

  // How full the store kept its I/O threads (counts, not times): each load is
  // counted as it starts with the number of loads then on I/O threads,
  // itself included; a dry spell is a worker finding nothing queued with no
  // other load in flight (the store ran empty). Logged at DEBUG by shutdown().
  struct Occupancy {
    uint64_t loads = 0;            // loads started on an I/O thread
    uint64_t busy_sum = 0;         // sum over them of the loads in flight at their start
    uint64_t at_full_depth = 0;    // started with all `depth` threads busy
    uint64_t queue_empty = 0;      // started leaving nothing queued behind them
    uint64_t dry_spells = 0;       // the store went from a load in flight to none, nothing queued
    uint64_t syscalls = 0;         // system calls made for loads (open, fstat, reads, fcntl, close)
    uint64_t fixed_reads = 0;      // loads read by the ring into a registered buffer (BackendContext::buffers)
  };
  Occupancy occupancy();

  // Whether direct I/O is (still) used: false once the file system refused it.
  bool direct_io() const { return direct_ok_.load(std::memory_order_relaxed); }
  // Whether loads into the cache's slots read direct: direct I/O is used and
  // a shard is sized for it (the slots are page-aligned). touch() then warms
  // the header indexes alone: no load reads a shard from the page cache.
  bool loads_read_direct() const;
  uint32_t dio_mem_align() const { return dio_mem_align_; }
  uint32_t dio_offset_align() const { return dio_off_align_; }
  std::string block_path(const BlockId& b) const;
  // What runs the loads: "uring" or "threads".
  const char* load_engine() const;
  uint64_t index_offset() const { return index_off_; }

 private:
  friend class PosixRing;
  PosixBackend(const PosixOptions& o, const BackendContext& ctx, int dir_fd);
  void submit(IoRequest* req, bool is_load);
  void worker(uint32_t idx);
  void watch();
  // The watcher looks at the ring when its thread's call began at `since`
  // passes kHeldNs; look_at_ring() is that look.
  void watch_ring(uint64_t since);
  // The watcher looks at `at` if not sooner (under mu_).
  void arm_watch_locked(uint64_t at);
  // Fails req, not started, as a request of a block file another request of
  // which is held in the kernel (both engines).
  void fail_held_file(IoRequest* req);
  void look_at_ring();
  // A request on an I/O thread, up to its done().
  void run_request(IoRequest* req, bool is_load);
  // Whether a thread's request of block b's file is held in the kernel (under mu_).
  bool file_held_locked(const BlockId& b, uint64_t now) const;
  void do_load(IoRequest* req);
  // A load in two halves around the shard's read (both engines): open the
  // file and check its header (false: req is finished, with its error), then
  // check what `n` (bytes read, or -errno) brought and close the file.
  bool begin_load(IoRequest* req, int* fd, ShardHeader* h);
  void end_load(IoRequest* req, int fd, const ShardHeader& h, ssize_t n);
  // Occupancy: a load starts, a load ends (nothing_queued: behind it). The
  // _locked halves run under mu_: the I/O threads count a load in flight in
  // the same hold that takes it off queue_, and decide a dry spell in the
  // same hold that reads queue_, so no interleaving of threads loses one.
  void note_load_start(bool nothing_queued);
  void note_load_end(bool nothing_queued);
  void note_load_start_locked(bool nothing_queued);
  void note_load_end_locked(bool nothing_queued);
  Result start_ring();
  void log_occupancy();
  uint32_t wait_workers(uint64_t deadline_ns);
  // One more I/O thread (under mu_, not stopping); false when the system
  // would not start one (warned).
  bool add_spare_locked();
  // Adds threads beside held ones, or takes what cannot start into *refused
  // and returns how many threads are held (under mu_); refuse() completes
  // those (unlocked).
  size_t rebalance_locked(std::deque<std::pair<IoRequest*, bool>>* refused);
  void refuse(std::deque<std::pair<IoRequest*, bool>>* refused, size_t held);
  void do_dump(IoRequest* req);
  bool aligned_for_direct(const IoRequest* req) const;
  Result open_block(const Key& k, bool for_dump, int* fd, char* err, size_t err_len) const;
  Result open_error(int e, const Key& k, bool for_dump, const std::string& path, char* err, size_t err_len) const;
  ssize_t transfer(IoRequest* req, int fd, bool is_load);
  void stop_direct(const char* why);
  void lock_shard(int fd, const Key& k);  // a dump's turn at the shard among other stores' writers
  Result read_header(int fd, const Key& k, const std::string& path, ShardHeader* h, char* err, size_t err_len) const;

  const PosixOptions opts_;
  const BackendContext ctx_;
  const int dir_fd_;  // the store directory, opened once: every block file is opened relative to it
  const uid_t euid_;
  uint64_t index_off_ = 0;
  uint32_t dio_mem_align_ = 4096;
  uint32_t dio_off_align_ = 4096;
  std::atomic<bool> direct_ok_{false};
  std::atomic<bool> direct_refused_logged_{false};
  std::atomic<bool> lock_refused_logged_{false};
  AtomicBackendCounters counters_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<IoRequest*, bool>> queue_;
  bool stopping_ = false;
  uint32_t exited_ = 0;  // under mu_: workers that returned
  uint32_t in_request_ = 0;  // under mu_: workers between taking a request and its done()
  uint32_t busy_loads_ = 0;  // under mu_: loads on an I/O thread now
  Occupancy occ_;            // under mu_, but for occ_.syscalls
  std::atomic<uint64_t> load_syscalls_{0};
  std::atomic<uint64_t> fixed_reads_{0};  // Occupancy::fixed_reads
  std::atomic<bool> logged_occupancy_{false};
  std::condition_variable exit_cv_;
  std::vector<std::thread> threads_;
  std::thread watcher_;                  // watch(): never in the kernel for long, always joined
  std::condition_variable watch_cv_;
  // When watch() looks next (kNoDeadline: never); written under mu_, read
  // without it by watch_ring's fast path.
  std::atomic<uint64_t> watch_at_{UINT64_MAX};
  const uint32_t spare_;                 // threads (ring places) beyond depth, at most
  std::vector<uint64_t> busy_since_;     // under mu_: per thread, when its request began (0: idle); depth + spare_
  std::vector<BlockId> busy_block_;      // under mu_: per thread, its request's block (while busy_since_ != 0)
  std::vector<uint64_t> busy_read_;      // under mu_: per thread, its load's bytes (0: a dump, or idle)
  cpu_set_t affinity_;          // where the I/O threads run (create()'s thread's CPUs)
  bool has_affinity_ = false;
  struct RingDeleter {
    void operator()(PosixRing* r) const;
  };
  std::unique_ptr<PosixRing, RingDeleter> ring_;  // engine uring: runs the loads
  // Shared by a worker while it reads or writes a request's buffer in user
  // space or runs its done(); shutdown() takes it exclusively to abandon the
  // workers it leaves behind, before the caller fences the buffers off.
  std::shared_mutex buf_mu_;
  bool abandoned_ = false;  // under buf_mu_
};

}  // namespace ucm
