#include "backend/posix_backend.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>

#include "ucm_build_config.h"
#include "common/time.h"

#if UCM_HAVE_URING
#include "backend/posix_uring.h"
#endif
#include "common/checksum.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "common/trace.h"

namespace ucm {
namespace {

// Where the kernel does not report a direct-I/O alignment: a page, which every
// file system that takes O_DIRECT accepts (a larger need is caught by the
// EINVAL fallback).
constexpr uint32_t kDefaultDirectAlign = 4096;

uint32_t header_check(const ShardHeader& h) {
  return static_cast<uint32_t>(checksum64(&h, offsetof(ShardHeader, check), 0x5eed));
}

// System calls this thread made through the helpers below (occupancy()).
thread_local uint64_t t_syscalls = 0;

}  // namespace

uint64_t& posix_thread_syscalls() { return t_syscalls; }

void PosixBackend::RingDeleter::operator()(PosixRing* r) const {
#if UCM_HAVE_URING
  delete r;
#else
  (void)r;  // never made without io_uring
#endif
}

namespace {

// Full-length positional I/O: loops over short transfers, retries EINTR.
// Returns bytes transferred (short only at end of file for reads) or -errno.
ssize_t pread_full(int fd, void* buf, size_t n, off_t off) {
  size_t done = 0;
  while (done < n) {
    ++t_syscalls;
    ssize_t r = pread(fd, static_cast<uint8_t*>(buf) + done, n - done, off + static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

ssize_t pwrite_full(int fd, const void* buf, size_t n, off_t off) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = pwrite(fd, static_cast<const uint8_t*>(buf) + done, n - done, off + static_cast<off_t>(done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return -EIO;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

int openat_retry(int dir_fd, const char* name, int flags, mode_t mode) {
  int fd;
  do ++t_syscalls, fd = openat(dir_fd, name, flags, mode);
  while (fd < 0 && errno == EINTR);
  return fd;
}

// The file status flags a block file is opened with (open_block): F_SETFL
// takes the whole set and ignores the access mode and the creation flags
// (O_RDONLY, O_CREAT, O_NOFOLLOW; O_CLOEXEC is the descriptor's), so
// set_direct knows the set without asking for it.
constexpr int kStatusFlags = O_NONBLOCK;

// Turns O_DIRECT on or off for one open file (each request has its own fd):
// one F_SETFL, no F_GETFL.
bool set_direct(int fd, bool on) {
  ++t_syscalls;
  return fcntl(fd, F_SETFL, kStatusFlags | (on ? O_DIRECT : 0)) == 0;
}

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISSOCK(m)) return "a socket";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISLNK(m)) return "a symbolic link";
  return "not a regular file";
}

std::string block_name(const BlockId& b) {
  char name[64];
  std::snprintf(name, sizeof(name), "%016" PRIx64 "%016" PRIx64 ".ucmblk", b.hi, b.lo);
  return name;
}

// "posix store: block <hex> shard <s> in <path>: <detail>": every message
// about a key names the key (as the load queue does) and the file.
void key_error(char* err, size_t len, const Key& k, const std::string& path, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
void key_error(char* err, size_t len, const Key& k, const std::string& path, const char* fmt, ...) {
  const int n = std::snprintf(err, len, "posix store: block %016" PRIx64 "%016" PRIx64 " shard %u in %s: ", k.block.hi,
                              k.block.lo, k.shard, path.c_str());
  if (n < 0 || static_cast<size_t>(n) >= len) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err + n, len - static_cast<size_t>(n), fmt, ap);
  va_end(ap);
}

}  // namespace

Result make_posix_backend(const Spec& spec, const BackendContext& ctx, std::unique_ptr<Backend>* out) {
  PosixOptions o;
  UCM_CHECK(PosixBackend::parse_options(spec, &o));
  std::unique_ptr<PosixBackend> b;
  UCM_CHECK(PosixBackend::create(o, ctx, &b));
  *out = std::move(b);
  return Result::kOk;
}

Result PosixBackend::parse_options(const Spec& spec, PosixOptions* o) {
  o->dir = spec.positional;
  if (o->dir.empty())
    return fail(Result::kInvalidArg, "posix backend needs a directory: posix:/path/to/store%s",
                spec.options.empty() ? "" : " (a relative path of the form key=... is written ./key=...)");
  for (const auto& [k, v] : spec.options) {
    uint64_t u = 0;
    if (k == "depth") {
      UCM_CHECK(spec_u64(k, v, 1, 1024, &u));
      o->depth = static_cast<uint32_t>(u);
    } else if (k == "direct") {
      if (v == "auto") o->direct = DirectMode::kAuto;
      else if (v == "on") o->direct = DirectMode::kOn;
      else if (v == "off") o->direct = DirectMode::kOff;
      else return fail(Result::kInvalidArg, "backend option direct=%s is not auto, on or off", v.c_str());
    } else if (k == "sync") {
      UCM_CHECK(spec_u64(k, v, 0, 1, &u));
      o->sync = u == 1;
    } else if (k == "file_mode") {
      UCM_CHECK(spec_octal(k, v, 0777, &u));
      // The store must read and rewrite its own files whoever it runs as.
      if ((u & 0600) != 0600)
        return fail(Result::kInvalidArg, "backend option file_mode=%s lacks owner read and write (0600)", v.c_str());
      o->file_mode = static_cast<uint32_t>(u);
    } else if (k == "spare") {
      UCM_CHECK(spec_u64(k, v, 0, 4096, &u));
      o->spare = static_cast<uint32_t>(u);
    } else if (k == "engine") {
      if (v == "auto") o->engine = LoadEngine::kAuto;
      else if (v == "threads") o->engine = LoadEngine::kThreads;
      else if (v == "uring") o->engine = LoadEngine::kUring;
      else return fail(Result::kInvalidArg, "backend option engine=%s is not auto, threads or uring", v.c_str());
    } else {
      return fail(Result::kInvalidArg, "posix backend: unknown option \"%s\"", k.c_str());
    }
  }
  return Result::kOk;
}

PosixBackend::PosixBackend(const PosixOptions& o, const BackendContext& ctx, int dir_fd)
    : opts_(o),
      ctx_(ctx),
      dir_fd_(dir_fd),
      euid_(geteuid()),
      spare_(o.spare == UINT32_MAX ? std::min(8 * o.depth, 4096u) : o.spare) {
  index_off_ = (uint64_t{ctx.shards_per_block} * ctx.shard_bytes + 4095) / 4096 * 4096;
  busy_since_.assign(o.depth + spare_, 0);
  busy_block_.assign(o.depth + spare_, BlockId{});
  busy_read_.assign(o.depth + spare_, 0);
}

namespace {

// The directory is opened once, following links on the way (a link to a
// good directory is a good store), and everything after is relative to that
// open directory: renaming or relinking the path later cannot move the store
// elsewhere.
Result open_store_dir(const std::string& dir, int* out) {
  int dfd;
  do dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  while (dfd < 0 && errno == EINTR);
  if (dfd < 0) {
    if (errno == ENOTDIR) return fail(Result::kInvalidArg, "posix store path %s is not a directory", dir.c_str());
    return fail(Result::kInvalidArg, "posix store directory %s: %s", dir.c_str(), strerror(errno));
  }
  *out = dfd;
  return Result::kOk;
}

// Whoever may write the directory may plant, replace or remove block files:
// only the job's own user may. Root too: a root job's files in a directory
// another user owns could be swapped under it (root writing there is not the
// danger; trusting what is there is).
Result check_store_dir_owner(int dfd, const std::string& dir) {
  struct stat st;
  if (fstat(dfd, &st) != 0) return fail(Result::kSystem, "posix store directory %s: fstat: %s", dir.c_str(), strerror(errno));
  const uid_t euid = geteuid();
  if (st.st_uid != euid)
    return fail(Result::kInvalidArg,
                "posix store directory %s (mode 0%o) is owned by uid %u, not by this job's user (uid %u): another user "
                "controls what is in it; use a directory of your own (mkdir -m 700)",
                dir.c_str(), static_cast<unsigned>(st.st_mode & 07777), static_cast<unsigned>(st.st_uid),
                static_cast<unsigned>(euid));
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return fail(Result::kInvalidArg,
                "posix store directory %s (mode 0%o, owner uid %u) is writable by group or others, who could plant or "
                "replace block files; fix: chmod go-w %s",
                dir.c_str(), static_cast<unsigned>(st.st_mode & 07777), static_cast<unsigned>(st.st_uid), dir.c_str());
  return Result::kOk;
}

// What a probe file in the directory tells about direct I/O there.
struct DirectProbe {
  bool ok = false;
  uint32_t mem_align = kDefaultDirectAlign;
  uint32_t off_align = kDefaultDirectAlign;
};

// A real write probe: permission bits do not stop root, a read-only mount
// does. The probe file is also asked whether O_DIRECT works there.
Result probe_store_dir(int dfd, const PosixOptions& o, DirectProbe* out) {
  std::random_device rd;
  char probe[64];
  std::snprintf(probe, sizeof(probe), ".ucm-probe-%d-%08x", static_cast<int>(getpid()), rd());
  int fd = openat_retry(dfd, probe, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return fail(Result::kInvalidArg, "posix store directory %s is not writable: %s", o.dir.c_str(), strerror(errno));
  DirectProbe p;
  p.ok = o.direct != DirectMode::kOff && set_direct(fd, true);
  // The alignment direct I/O needs, as the kernel says for a file there (it
  // answers for regular files only, so the probe is asked, not the directory).
#ifdef STATX_DIOALIGN
  struct statx sx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN) &&
      sx.stx_dio_mem_align != 0 && sx.stx_dio_offset_align != 0) {
    p.mem_align = sx.stx_dio_mem_align;
    p.off_align = sx.stx_dio_offset_align;
  }
#endif
  if (o.dio_align_claim != 0) p.mem_align = p.off_align = o.dio_align_claim;
  close(fd);
  unlinkat(dfd, probe, 0);
  if (o.direct == DirectMode::kOn && !p.ok)
    return fail(Result::kUnsupported, "posix store: direct=on but %s does not accept O_DIRECT", o.dir.c_str());
  *out = p;
  return Result::kOk;
}

}  // namespace

namespace {

// A block file is its shards, then (at the next 4 KiB) one header per shard.
// The config checks that the shards fit in off_t; the index must fit too.
Result check_block_file_fits(const BackendContext& ctx) {
  constexpr uint64_t kMaxOffset = static_cast<uint64_t>(std::numeric_limits<off_t>::max());
  const uint64_t spb = ctx.shards_per_block;
  uint64_t shards = 0;
  const bool wraps = __builtin_mul_overflow(spb, ctx.shard_bytes, &shards);
  const uint64_t index = spb * sizeof(ShardHeader);
  if (!wraps && shards <= kMaxOffset - 4095 && (shards + 4095) / 4096 * 4096 <= kMaxOffset - index) return Result::kOk;
  return fail(Result::kInvalidArg,
              "posix store: a block file of shards_per_block %u x shard_bytes %" PRIu64
              " bytes, followed by its index of %u %zu-byte shard headers, ends past the largest file offset (%" PRIu64
              "): use fewer or smaller shards per block",
              ctx.shards_per_block, ctx.shard_bytes, ctx.shards_per_block, sizeof(ShardHeader), kMaxOffset);
}

}  // namespace

namespace {

// Opening the directory, its checks and the probe: the system calls that a
// hung file system blocks.
struct DirOpened {
  Result result = Result::kOk;
  std::string error;  // when result is not kOk
  int fd = -1;
  DirectProbe direct;
};

DirOpened open_and_probe(const PosixOptions& o) {
  DirOpened d;
  d.result = open_store_dir(o.dir, &d.fd);
  // The checks are on the directory itself, as opened.
  if (ok(d.result)) d.result = check_store_dir_owner(d.fd, o.dir);
  if (ok(d.result)) d.result = probe_store_dir(d.fd, o, &d.direct);
  if (!ok(d.result)) {
    d.error = last_error();
    if (d.fd >= 0) close(d.fd), d.fd = -1;
  }
  return d;
}

// With a deadline the calls run on a thread of their own, which touches only
// this (shared with it), so the caller can give up on it.
struct DirOpening {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;       // under mu
  bool abandoned = false;  // under mu: the caller gave up; the thread closes the fd
  DirOpened got;           // under mu, once done
};

Result open_store_bounded(const PosixOptions& o, uint64_t deadline_ns, int* dfd, DirectProbe* direct) {
  DirOpened got;
  if (deadline_ns == UINT64_MAX) {
    got = open_and_probe(o);
  } else {
    auto s = std::make_shared<DirOpening>();
    std::thread([s, o] {
      name_this_thread("open");
      DirOpened mine = open_and_probe(o);
      std::lock_guard<std::mutex> g(s->mu);
      if (s->abandoned && mine.fd >= 0) close(mine.fd);
      if (!s->abandoned) s->got = std::move(mine);
      s->done = true;
      s->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> g(s->mu);
    for (uint64_t now = now_ns(); !s->done; now = now_ns()) {
      if (now >= deadline_ns) {
        s->abandoned = true;
        return fail(Result::kTimeout,
                    "posix store directory %s: opening and probing it had not finished by init's deadline (is its "
                    "file system hung?); the call is left on a thread of its own",
                    o.dir.c_str());
      }
      s->cv.wait_for(g, std::chrono::nanoseconds(std::min<uint64_t>(deadline_ns - now, 100'000'000)));
    }
    got = std::move(s->got);
  }
  if (!ok(got.result)) return fail(got.result, "%s", got.error.c_str());
  *dfd = got.fd;
  *direct = got.direct;
  return Result::kOk;
}

}  // namespace

Result PosixBackend::create(const PosixOptions& o, const BackendContext& ctx, std::unique_ptr<PosixBackend>* out) {
  UCM_CHECK(check_block_file_fits(ctx));
  int dfd = -1;
  DirectProbe direct;
  UCM_CHECK(open_store_bounded(o, ctx.open_deadline_ns, &dfd, &direct));
  struct DirCloser {
    int fd;
    ~DirCloser() {
      if (fd >= 0) close(fd);
    }
  } guard{dfd};

  std::unique_ptr<PosixBackend> b(new PosixBackend(o, ctx, dfd));
  guard.fd = -1;
  b->direct_ok_.store(direct.ok, std::memory_order_relaxed);
  b->dio_mem_align_ = direct.mem_align;
  b->dio_off_align_ = direct.off_align;
  UCM_CHECK(b->start_ring());
  // Where the store's threads may run (the creating thread's: the app's at
  // init, unpinned); spares made later from pinned threads take it too.
  CPU_ZERO(&b->affinity_);
  b->has_affinity_ = sched_getaffinity(0, sizeof(b->affinity_), &b->affinity_) == 0;
  for (uint32_t i = 0; i < o.depth; ++i) b->threads_.emplace_back([p = b.get(), i] { p->worker(i); });
  b->watcher_ = std::thread([p = b.get()] { p->watch(); });
  UCM_NODE_INFO(kBackend,
                "store: posix at %s: %u I/O threads (%u more at most beside requests the file system holds), loads on "
                "%s, O_DIRECT %s (alignment: memory %u, offset %u), sync %s, files 0%o",
                o.dir.c_str(), o.depth, b->spare_, b->load_engine(), direct.ok ? "available" : "not available", direct.mem_align,
                direct.off_align, o.sync ? "on" : "off", o.file_mode);
  *out = std::move(b);
  return Result::kOk;
}

// engine=uring: the ring or an init error; auto: the ring where the kernel
// gives one, the threads otherwise (said once at INFO).
Result PosixBackend::start_ring() {
  if (opts_.engine == LoadEngine::kThreads) return Result::kOk;
#if UCM_HAVE_URING
  std::unique_ptr<PosixRing> r;
  const Result res = PosixRing::create(this, opts_.depth, spare_, &r);
  if (res == Result::kOk) {
    ring_.reset(r.release());
    return Result::kOk;
  }
  if (opts_.engine == LoadEngine::kUring) return res;
  UCM_NODE_INFO(kBackend, "store: posix at %s: loads on threads (%s)", opts_.dir.c_str(), last_error().c_str());
  return Result::kOk;
#else
  if (opts_.engine == LoadEngine::kAuto) return Result::kOk;
  return fail(Result::kUnsupported, "posix store: engine=uring, but ucmcache was built without io_uring "
                                    "(meson -Dio_uring=enabled, with liburing-dev)");
#endif
}

const char* PosixBackend::load_engine() const {
#if UCM_HAVE_URING
  if (ring_ && !ring_->given_up()) return "uring";
#endif
  return "threads";
}

PosixBackend::~PosixBackend() {
  // Unbounded here: a caller that must not wait forever calls shutdown()
  // first, and keeps the object if it reports threads left behind.
  (void)shutdown(kNoDeadline);
  close(dir_fd_);
}

void PosixBackend::log_occupancy() {
  if (logged_occupancy_.exchange(true)) return;
  const Occupancy o = occupancy();
  if (o.loads > 0)
    UCM_DEBUG(kBackend,
              "posix store at %s: %" PRIu64 " loads on %u I/O %s, %.2f in flight on average as one started, %" PRIu64
              " at full depth, %" PRIu64 " leaving nothing queued, %" PRIu64 " dry spells (nothing queued or in flight), "
              "%.1f system calls per load, %" PRIu64 " fixed reads (into registered buffers)",
              opts_.dir.c_str(), o.loads, opts_.depth, std::strcmp(load_engine(), "uring") == 0 ? "slots of one io_uring" : "threads",
              double(o.busy_sum) / double(o.loads), o.at_full_depth, o.queue_empty, o.dry_spells,
              double(o.syscalls) / double(o.loads), o.fixed_reads);
}

// Left behind are the threads inside a request at the deadline (in the
// kernel, or about to be). An idle thread holds nothing and only has to be
// scheduled to leave, so with none inside a request every thread is joined,
// even when the deadline has passed already (finalize's deadline may be
// spent by a peer that never came). Returns the threads inside a request.
uint32_t PosixBackend::wait_workers(uint64_t deadline_ns) {
  std::unique_lock<std::mutex> lk(mu_);
  const size_t n = threads_.size();
  while (exited_ < n && in_request_ > 0) {
    const uint64_t now = now_ns();
    if (now >= deadline_ns) break;
    if (deadline_ns == kNoDeadline) exit_cv_.wait(lk);
    else exit_cv_.wait_for(lk, std::chrono::nanoseconds(deadline_ns - now));
  }
  return in_request_;
}

uint32_t PosixBackend::shutdown(uint64_t deadline_ns) {
  log_occupancy();
  std::deque<std::pair<IoRequest*, bool>> queued;
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
    queued.swap(queue_);
  }
  cv_.notify_all();
  watch_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();  // it waits on nothing but mu_
#if UCM_HAVE_URING
  if (ring_) ring_->stop();  // its queued requests are completed too
#endif
  // Requests still queued get their one completion.
  for (auto& [req, is_load] : queued) complete_with(req, Result::kTimeout, "posix store shut down with the request queued");
  uint32_t left = wait_workers(deadline_ns);
#if UCM_HAVE_URING
  const bool ring_stuck = ring_ && !ring_->wait_exit(deadline_ns);
  left += ring_stuck ? 1 : 0;
#endif
  if (left == 0) {
    for (auto& t : threads_) t.join();
    threads_.clear();
    return 0;
  }
  {
    // Waits out a worker in the middle of a checksum or a done(); the stuck
    // ones are in the kernel and hold nothing.
    std::unique_lock<std::shared_mutex> g(buf_mu_);
    abandoned_ = true;
  }
  for (auto& t : threads_) t.detach();
  threads_.clear();
#if UCM_HAVE_URING
  if (ring_stuck) PosixRing::abandon(ring_.release());  // the stuck read returns into the ring: never freed
#endif
  UCM_WARN("posix store at %s: %u I/O thread(s) still in the kernel %s after shutdown began: detached, never joined",
           opts_.dir.c_str(), left, deadline_ns == kNoDeadline ? "" : "at the deadline");
  return left;
}

std::string PosixBackend::block_path(const BlockId& b) const { return opts_.dir + "/" + block_name(b); }

void PosixBackend::load(IoRequest* req) {
#if UCM_HAVE_URING
  if (ring_ && !ring_->given_up()) {
    if (reject_malformed(req, ctx_, true, "posix", &counters_)) return;
    if (ring_->submit(req)) return;
    // The ring gave up meanwhile: the threads take it (counted once: not rejected again).
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!stopping_) {
        queue_.emplace_back(req, true);
        req = nullptr;
      }
    }
    if (req != nullptr) complete_with(req, Result::kTimeout, "posix store shut down before the request was queued");
    else cv_.notify_one();
    return;
  }
#endif
  submit(req, true);
}
void PosixBackend::dump(IoRequest* req) { submit(req, false); }

void PosixBackend::submit(IoRequest* req, bool is_load) {
  if (reject_malformed(req, ctx_, is_load, "posix", &counters_)) return;
  std::deque<std::pair<IoRequest*, bool>> refused;
  size_t held = 0;
  bool stopped = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    stopped = stopping_;  // shutdown() completed what it held: this would wait for its destruction
    if (!stopped) {
      queue_.emplace_back(req, is_load);
      if (in_request_ >= threads_.size()) held = rebalance_locked(&refused);  // no thread idle: are some held for good?
    }
  }
  if (stopped) return complete_with(req, Result::kTimeout, "posix store shut down before the request was queued");
  refuse(&refused, held);
  cv_.notify_one();
}

PosixBackend::Occupancy PosixBackend::occupancy() {
  std::lock_guard<std::mutex> g(mu_);
  Occupancy o = occ_;
  o.syscalls = load_syscalls_.load(std::memory_order_relaxed);
  o.fixed_reads = fixed_reads_.load(std::memory_order_relaxed);
  return o;
}

void PosixBackend::worker(uint32_t idx) {
  name_this_thread("posix");
  for (;;) {
    std::pair<IoRequest*, bool> item;
    bool nothing_queued = false;
    bool refused = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) break;
      item = queue_.front();
      queue_.pop_front();
      ++in_request_;
      nothing_queued = queue_.empty();
      const uint64_t now = now_ns();
      refused = file_held_locked(item.first->key.block, now);
      if (!refused) {
        busy_since_[idx] = now;
        busy_block_[idx] = item.first->key.block;
        busy_read_[idx] = item.second ? item.first->bytes : 0;
        if (item.second) note_load_start_locked(nothing_queued);
        // Requests wait behind this one: the watcher looks when it would
        // count as held (a spare that takes a request that hangs, too).
        if (!nothing_queued) arm_watch_locked(now + kHeldNs);
      }
    }
    if (refused) {
      counters_.rejected(item.second);
      fail_held_file(item.first);
    } else {
      run_request(item.first, item.second);
    }
    std::shared_lock<std::shared_mutex> g(buf_mu_);
    // Left behind by shutdown(): whoever gave us the request is gone.
    if (abandoned_) return;
    item.first->done(item.first);
    std::lock_guard<std::mutex> lk(mu_);
    --in_request_;
    busy_since_[idx] = 0;
    busy_read_[idx] = 0;
  }
  std::lock_guard<std::mutex> g(mu_);
  ++exited_;
  exit_cv_.notify_all();
}

void PosixBackend::run_request(IoRequest* req, bool is_load) {
  if (is_load) {
    UCM_TRACE(TraceRange::kBackendLoad);
    counters_.load_started();  // in flight = on an I/O thread, not queued
    const uint64_t calls0 = t_syscalls;
    do_load(req);
    load_syscalls_.fetch_add(t_syscalls - calls0, std::memory_order_relaxed);
    counters_.load_finished(*req);
    // Before done(): whoever the completion wakes sees this load ended.
    std::lock_guard<std::mutex> g(mu_);
    note_load_end_locked(queue_.empty());
  } else {
    UCM_TRACE(TraceRange::kBackendDump);
    do_dump(req);
    counters_.dump_finished(*req);
  }
}

bool PosixBackend::loads_read_direct() const {
  return direct_io() && ctx_.shard_bytes % dio_off_align_ == 0 && ctx_.shard_bytes % dio_mem_align_ == 0;
}

bool PosixBackend::aligned_for_direct(const IoRequest* req) const {
  return direct_io() && reinterpret_cast<uintptr_t>(req->buf) % dio_mem_align_ == 0 &&
         req->bytes % dio_off_align_ == 0 && (uint64_t{req->key.shard} * ctx_.shard_bytes) % dio_off_align_ == 0;
}

// Why a block file did not open. ENOENT is "no file" (kNotFound), unless the
// store directory itself is gone (removed while the job ran; the open
// directory then has no links): every load misses and every dump fails
// (with O_CREAT nothing else gives ENOENT), and both say why.
Result PosixBackend::open_error(int e, const Key& k, bool for_dump, const std::string& path, char* err,
                                size_t err_len) const {
  struct stat dst;
  if (e == ENOENT && fstat(dir_fd_, &dst) == 0 && dst.st_nlink == 0) {
    key_error(err, err_len, k, path, "the store directory %s was removed while the job ran", opts_.dir.c_str());
    return for_dump ? Result::kBackend : Result::kNotFound;
  }
  if (e == ENOENT) {
    key_error(err, err_len, k, path, "no such file");
    return for_dump ? Result::kBackend : Result::kNotFound;
  }
  if (e == ELOOP) {
    key_error(err, err_len, k, path, "a symbolic link; the store follows no links");
    return Result::kCorrupt;
  }
  if (e == EISDIR) {
    key_error(err, err_len, k, path, "not a regular file (a directory)");
    return Result::kCorrupt;
  }
  key_error(err, err_len, k, path, "opening: %s", strerror(e));
  return Result::kBackend;
}

// Opens the block file of k: never following a link, never waiting (a FIFO
// opens at once with O_NONBLOCK, which changes nothing for a regular file),
// and only a regular file this user owns. What else is found under a block's
// name is kCorrupt: like a wrong header it is the store's content, it will not
// heal on a retry, and the remedy is the same (remove it); kNotFound is only
// "no file".
Result PosixBackend::open_block(const Key& k, bool for_dump, int* out, char* err, size_t err_len) const {
  *out = -1;
  const std::string name = block_name(k.block);
  const std::string path = opts_.dir + "/" + name;
  const int flags = (for_dump ? O_RDWR | O_CREAT : O_RDONLY) | O_NOFOLLOW | kStatusFlags | O_CLOEXEC;
  const int fd = openat_retry(dir_fd_, name.c_str(), flags, static_cast<mode_t>(opts_.file_mode));
  if (fd < 0) return open_error(errno, k, for_dump, path, err, err_len);
  struct stat st;
  Result r = Result::kOk;
  ++t_syscalls;
  if (fstat(fd, &st) != 0) {
    key_error(err, err_len, k, path, "fstat: %s", strerror(errno));
    r = Result::kBackend;
  } else if (!S_ISREG(st.st_mode)) {
    key_error(err, err_len, k, path, "not a regular file (%s)", file_kind(st.st_mode));
    r = Result::kCorrupt;
  } else if (st.st_uid != euid_) {
    key_error(err, err_len, k, path, "owned by uid %u, not by this job's user (uid %u)", static_cast<unsigned>(st.st_uid),
              static_cast<unsigned>(euid_));
    r = Result::kCorrupt;
  } else if (for_dump && (st.st_mode & 07777) != opts_.file_mode && fchmod(fd, static_cast<mode_t>(opts_.file_mode)) != 0) {
    // Exactly the configured mode: the umask may have narrowed it, an older
    // version may have left it 0644.
    key_error(err, err_len, k, path, "fchmod 0%o: %s", opts_.file_mode, strerror(errno));
    r = Result::kBackend;
  }
  if (r != Result::kOk) {
    close(fd);
    return r;
  }
  *out = fd;
  return Result::kOk;
}

void PosixBackend::stop_direct(const char* why) {
  direct_ok_.store(false, std::memory_order_relaxed);
  if (!direct_refused_logged_.exchange(true, std::memory_order_relaxed))
    UCM_WARN("posix store at %s: the file system refused direct I/O (%s); using buffered I/O from now on "
             "(counted as direct_fallbacks)", opts_.dir.c_str(), why);
}

// The shard's bytes, direct where the request is aligned for it. The file
// system may still refuse (EINVAL: at fcntl where it takes no O_DIRECT at
// all, at the transfer where its real alignment is stricter than reported):
// the transfer is then redone buffered, the request marked, and direct I/O
// dropped for good. Leaves a dump's fd buffered for the header written after
// it; a load read its header first and closes the fd next, so its fd is left
// as it is (one fcntl per direct load, not four).
ssize_t PosixBackend::transfer(IoRequest* req, int fd, bool is_load) {
  const off_t off = static_cast<off_t>(uint64_t{req->key.shard} * ctx_.shard_bytes);
  auto io = [&] {
    return is_load ? pread_full(fd, req->buf, req->bytes, off) : pwrite_full(fd, req->buf, req->bytes, off);
  };
  if (!aligned_for_direct(req)) return io();
  if (!set_direct(fd, true)) {
    if (errno == EINVAL) {
      req->direct_fallback = true;
      stop_direct("fcntl O_DIRECT: Invalid argument");
    }
    return io();
  }
  ssize_t n = io();
  const bool refused = n == -EINVAL;
  if ((refused || !is_load) && !set_direct(fd, false)) return refused ? n : (n < 0 ? n : -EIO);
  if (refused) {
    req->direct_fallback = true;
    stop_direct(is_load ? "a direct read: Invalid argument" : "a direct write: Invalid argument");
    n = io();
  }
  return n;
}

Result PosixBackend::read_header(int fd, const Key& k, const std::string& path, ShardHeader* h, char* err,
                                 size_t err_len) const {
  const off_t off = static_cast<off_t>(index_off_ + uint64_t{k.shard} * sizeof(ShardHeader));
  std::memset(h, 0, sizeof(*h));
  const ssize_t n = pread_full(fd, h, sizeof(*h), off);
  if (n < 0) {
    key_error(err, err_len, k, path, "reading the header: %s", strerror(static_cast<int>(-n)));
    return Result::kBackend;
  }
  // The first format had 32-byte headers at the same index offset, so one of
  // its magics shows at the start of a 64-byte slot or half-way into it.
  uint64_t second_half_magic = 0;
  std::memcpy(&second_half_magic, reinterpret_cast<const uint8_t*>(h) + 32, sizeof(second_half_magic));
  if (h->magic == kShardHeaderMagicOld1 || second_half_magic == kShardHeaderMagicOld1) {
    key_error(err, err_len, k, path, "written in an older format (without the key); remove the file or use a new directory");
    return Result::kCorrupt;
  }
  if (n == 0 || (n == static_cast<ssize_t>(sizeof(*h)) && h->magic == 0)) {
    key_error(err, err_len, k, path, "never completely written");
    return Result::kNotFound;
  }
  if (n < static_cast<ssize_t>(sizeof(*h))) {
    key_error(err, err_len, k, path, "the header is cut short (%zd of %zu bytes)", n, sizeof(*h));
    return Result::kCorrupt;
  }
  if (h->magic != kShardHeaderMagic || h->check != header_check(*h)) {
    key_error(err, err_len, k, path, "the header is corrupt");
    return Result::kCorrupt;
  }
  if (h->block_hi != k.block.hi || h->block_lo != k.block.lo || h->shard != k.shard) {
    key_error(err, err_len, k, path,
              "the header says block %016" PRIx64 "%016" PRIx64 " shard %u (a file under another block's name?)",
              h->block_hi, h->block_lo, h->shard);
    return Result::kCorrupt;
  }
  if (h->length != ctx_.shard_bytes) {
    key_error(err, err_len, k, path, "holds %" PRIu64 " bytes, shards are %" PRIu64, h->length, ctx_.shard_bytes);
    return Result::kCorrupt;
  }
  return Result::kOk;
}

bool PosixBackend::begin_load(IoRequest* req, int* fd, ShardHeader* h) {
  *fd = -1;
  req->result = open_block(req->key, false, fd, req->error, sizeof(req->error));
  if (req->result != Result::kOk) return false;
  // The header goes through the page cache: 64 bytes are not direct-I/O sized.
  req->result = read_header(*fd, req->key, block_path(req->key.block), h, req->error, sizeof(req->error));
  if (req->result == Result::kOk) return true;
  ++t_syscalls;
  close(*fd);
  *fd = -1;
  return false;
}

void PosixBackend::end_load(IoRequest* req, int fd, const ShardHeader& h, ssize_t n) {
  if (n < 0) {
    req->result = Result::kBackend;
    key_error(req->error, sizeof(req->error), req->key, block_path(req->key.block), "reading the shard: %s",
              strerror(static_cast<int>(-n)));
  } else if (static_cast<uint64_t>(n) != req->bytes) {
    req->result = Result::kCorrupt;
    key_error(req->error, sizeof(req->error), req->key, block_path(req->key.block),
              "the shard is truncated: %zd of %" PRIu64 " bytes", n, req->bytes);
  } else {
    // User space reads the buffer: not once shutdown() has abandoned us
    // (the buffer may be fenced off by then).
    std::shared_lock<std::shared_mutex> g(buf_mu_);
    if (abandoned_) {
      req->result = Result::kTimeout;
    } else if (checksum64(req->buf, req->bytes) != h.checksum) {
      req->result = Result::kCorrupt;
      key_error(req->error, sizeof(req->error), req->key, block_path(req->key.block), "the shard fails its checksum");
    }
  }
  if (fd < 0) return;  // closed already (the ring closes a read's file as it lands)
  ++t_syscalls;
  close(fd);
}

void PosixBackend::do_load(IoRequest* req) {
  int fd = -1;
  ShardHeader h;
  if (!begin_load(req, &fd, &h)) return;
  end_load(req, fd, h, transfer(req, fd, true));
}

void PosixBackend::note_load_start(bool nothing_queued) {
  std::lock_guard<std::mutex> g(mu_);
  note_load_start_locked(nothing_queued);
}

void PosixBackend::note_load_start_locked(bool nothing_queued) {
  ++busy_loads_;
  ++occ_.loads;
  occ_.busy_sum += busy_loads_;
  if (busy_loads_ >= opts_.depth) ++occ_.at_full_depth;
  if (nothing_queued) ++occ_.queue_empty;
}

void PosixBackend::note_load_end(bool nothing_queued) {
  // Before done(): whoever the completion wakes sees this load ended.
  std::lock_guard<std::mutex> g(mu_);
  note_load_end_locked(nothing_queued);
}

void PosixBackend::note_load_end_locked(bool nothing_queued) {
  --busy_loads_;
  if (busy_loads_ == 0 && nothing_queued) ++occ_.dry_spells;
}

// Writers of one shard in other stores (other nodes on a shared file system,
// other jobs) take turns for its bytes and its header: an open-file-description
// write lock on the shard's header, held until the dump closes its fd. Without
// it, two nodes dumping one key with different bytes could leave one's bytes
// under the other's header: both said OK, and the shard failed its checksum
// for good (helper-21). A file system that keeps no locks is written as
// before (warned once). A dump, waiting for its turn or not, never makes its
// block file count as held (file_held_locked counts reads only): the block's
// other shards are written and read meanwhile (helper-22).
void PosixBackend::lock_shard(int fd, const Key& k) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = static_cast<off_t>(index_off_ + uint64_t{k.shard} * sizeof(ShardHeader));
  fl.l_len = sizeof(ShardHeader);
  while (fcntl(fd, F_OFD_SETLKW, &fl) != 0) {
    if (errno == EINTR) continue;
    if (!lock_refused_logged_.exchange(true, std::memory_order_relaxed))
      UCM_WARN("posix store at %s: the file system keeps no file locks (%s): dumps of one shard from several nodes "
               "at once are not kept apart",
               opts_.dir.c_str(), strerror(errno));
    return;
  }
}

void PosixBackend::do_dump(IoRequest* req) {
  const std::string path = block_path(req->key.block);
  int fd = -1;
  req->result = open_block(req->key, true, &fd, req->error, sizeof(req->error));
  if (req->result != Result::kOk) return;
  ShardHeader h{};
  h.magic = kShardHeaderMagic;
  h.block_hi = req->key.block.hi;
  h.block_lo = req->key.block.lo;
  h.shard = req->key.shard;
  h.length = req->bytes;
  {
    std::shared_lock<std::shared_mutex> g(buf_mu_);
    if (abandoned_) {
      close(fd);
      req->result = Result::kTimeout;
      return;
    }
    h.checksum = checksum64(req->buf, req->bytes);
  }
  h.check = header_check(h);
  lock_shard(fd, req->key);  // released by the close below
  const ssize_t n = transfer(req, fd, false);
  // With sync on, OK means durable, in this order: the shard's bytes (so a
  // header never vouches for bytes a power cut lost), then the header that
  // says the shard exists, then the file's name in its directory. The name
  // is synced on every dump, not only by the one that created the file: a
  // concurrent dump of another shard may have created it and not be done.
  const char* what = "shard";
  ssize_t err = n < 0 ? n : 0;
  if (err == 0 && opts_.sync && fdatasync(fd) != 0) err = -errno, what = "shard (fdatasync)";
  if (err == 0) {
    const ssize_t hn =
        pwrite_full(fd, &h, sizeof(h), static_cast<off_t>(index_off_ + uint64_t{req->key.shard} * sizeof(h)));
    if (hn < 0) err = hn, what = "header";
  }
  if (err == 0 && opts_.sync && fdatasync(fd) != 0) err = -errno, what = "header (fdatasync)";
  if (err == 0 && opts_.sync && fsync(dir_fd_) != 0) err = -errno, what = "directory entry (fsync of the store directory)";
  if (err < 0) {
    req->result = Result::kBackend;
    key_error(req->error, sizeof(req->error), req->key, path, "writing the %s: %s", what,
              strerror(static_cast<int>(-err)));
  } else {
    req->result = Result::kOk;
  }
  close(fd);
}

void PosixBackend::touch(const BlockId* blocks, size_t n) {
  counters_.touches.fetch_add(n, std::memory_order_relaxed);
  // Direct loads read only their headers through the page cache: warming the
  // shards too would read whole files from the disk beside the loads, into
  // pages no load reads.
  const bool headers_only = loads_read_direct();
  const off_t index_len = static_cast<off_t>(uint64_t{ctx_.shards_per_block} * sizeof(ShardHeader));
  char err[sizeof(IoRequest::error)];
  for (size_t i = 0; i < n; ++i) {
    Key k;
    k.block = blocks[i];
    int fd = -1;
    // Not stored here, or not a file of ours: nothing to keep warm.
    if (open_block(k, false, &fd, err, sizeof(err)) != Result::kOk) continue;
    if (headers_only) (void)posix_fadvise(fd, static_cast<off_t>(index_off_), index_len, POSIX_FADV_WILLNEED);
    else (void)posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
    close(fd);
  }
}

Result PosixBackend::exists(const Key& k, bool* out) {
  *out = false;
  if (k.shard >= ctx_.shards_per_block) return Result::kOk;
  char err[sizeof(IoRequest::error)];
  int fd = -1;
  Result r = open_block(k, false, &fd, err, sizeof(err));
  if (r == Result::kNotFound) return Result::kOk;
  if (r != Result::kOk) return fail(r, "%s", err);
  ShardHeader h;
  r = read_header(fd, k, block_path(k.block), &h, err, sizeof(err));
  close(fd);
  // A shard that fails its checks is not held (a load would fail it); only a
  // read error leaves the answer unknown.
  *out = r == Result::kOk;
  if (r == Result::kBackend) return fail(r, "%s", err);
  return Result::kOk;
}

}  // namespace ucm
