#include "backend/posix_backend.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>

#include "common/checksum.h"
#include "common/log.h"

namespace ucm {
namespace {

constexpr uint64_t kDirectAlign = 4096;

uint32_t header_check(const ShardHeader& h) {
  return static_cast<uint32_t>(checksum64(&h, offsetof(ShardHeader, check), 0x5eed));
}

// Full-length positional I/O: loops over short transfers, retries EINTR.
// Returns bytes transferred (short only at end of file for reads) or -errno.
ssize_t pread_full(int fd, void* buf, size_t n, off_t off) {
  size_t done = 0;
  while (done < n) {
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

// Opens `path`, with O_DIRECT when asked and accepted (falls back otherwise).
int open_file(const std::string& path, int flags, bool direct) {
  int fd = -1;
  if (direct) {
    do fd = open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0644);
    while (fd < 0 && errno == EINTR);
    if (fd >= 0 || errno != EINVAL) return fd;
  }
  do fd = open(path.c_str(), flags | O_CLOEXEC, 0644);
  while (fd < 0 && errno == EINTR);
  return fd;
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
  if (o->dir.empty()) return fail(Result::kInvalidArg, "posix backend needs a directory: posix:/path/to/store");
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
    } else {
      return fail(Result::kInvalidArg, "posix backend: unknown option \"%s\"", k.c_str());
    }
  }
  return Result::kOk;
}

PosixBackend::PosixBackend(const PosixOptions& o, const BackendContext& ctx) : opts_(o), ctx_(ctx) {
  index_off_ = (uint64_t{ctx.shards_per_block} * ctx.shard_bytes + 4095) / 4096 * 4096;
}

Result PosixBackend::create(const PosixOptions& o, const BackendContext& ctx, std::unique_ptr<PosixBackend>* out) {
  struct stat st;
  if (stat(o.dir.c_str(), &st) != 0)
    return fail(Result::kInvalidArg, "posix store directory %s: %s", o.dir.c_str(), strerror(errno));
  if (!S_ISDIR(st.st_mode)) return fail(Result::kInvalidArg, "posix store path %s is not a directory", o.dir.c_str());
  // A real write probe: permission bits do not stop root, a read-only mount does.
  std::random_device rd;
  char probe[64];
  std::snprintf(probe, sizeof(probe), "/.ucm-probe-%d-%08x", static_cast<int>(getpid()), rd());
  const std::string probe_path = o.dir + probe;
  int fd = open(probe_path.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
  if (fd < 0) return fail(Result::kInvalidArg, "posix store directory %s is not writable: %s", o.dir.c_str(), strerror(errno));
  close(fd);
  bool direct_ok = false;
  if (o.direct != DirectMode::kOff) {
    fd = open(probe_path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    direct_ok = fd >= 0;
    if (fd >= 0) close(fd);
  }
  unlink(probe_path.c_str());
  if (o.direct == DirectMode::kOn && !direct_ok)
    return fail(Result::kUnsupported, "posix store: direct=on but %s does not accept O_DIRECT", o.dir.c_str());

  std::unique_ptr<PosixBackend> b(new PosixBackend(o, ctx));
  b->direct_ok_ = direct_ok;
  for (uint32_t i = 0; i < o.depth; ++i) b->threads_.emplace_back([p = b.get()] { p->worker(); });
  UCM_INFO(kBackend, "posix store at %s: %u I/O threads, O_DIRECT %s, sync %s", o.dir.c_str(), o.depth,
           direct_ok ? "available" : "not available", o.sync ? "on" : "off");
  *out = std::move(b);
  return Result::kOk;
}

PosixBackend::~PosixBackend() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
  // Requests still queued get their one completion.
  for (auto& [req, is_load] : queue_) complete_with(req, Result::kTimeout, "posix store shut down with the request queued");
}

std::string PosixBackend::block_path(const BlockId& b) const {
  char name[64];
  std::snprintf(name, sizeof(name), "/%016" PRIx64 "%016" PRIx64 ".ucmblk", b.hi, b.lo);
  return opts_.dir + name;
}

void PosixBackend::load(IoRequest* req) { submit(req, true); }
void PosixBackend::dump(IoRequest* req) { submit(req, false); }

void PosixBackend::submit(IoRequest* req, bool is_load) {
  if (reject_malformed(req, ctx_, is_load, "posix", &counters_)) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    queue_.emplace_back(req, is_load);
  }
  cv_.notify_one();
}

void PosixBackend::worker() {
  for (;;) {
    std::pair<IoRequest*, bool> item;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      item = queue_.front();
      queue_.pop_front();
    }
    if (item.second) {
      counters_.load_started();  // in flight = on an I/O thread, not queued
      do_load(item.first);
      counters_.load_finished(*item.first);
    } else {
      do_dump(item.first);
      counters_.dump_finished(*item.first);
    }
    item.first->done(item.first);
  }
}

bool PosixBackend::aligned_for_direct(const IoRequest* req) const {
  return direct_ok_ && reinterpret_cast<uintptr_t>(req->buf) % kDirectAlign == 0 && req->bytes % kDirectAlign == 0 &&
         (uint64_t{req->key.shard} * ctx_.shard_bytes) % kDirectAlign == 0;
}

Result PosixBackend::read_header(int fd, const Key& k, const std::string& path, ShardHeader* h, char* err,
                                 size_t err_len) const {
  const off_t off = static_cast<off_t>(index_off_ + uint64_t{k.shard} * sizeof(ShardHeader));
  const ssize_t n = pread_full(fd, h, sizeof(*h), off);
  if (n < 0) {
    std::snprintf(err, err_len, "posix store: reading the header of shard %u in %s: %s", k.shard, path.c_str(),
                  strerror(static_cast<int>(-n)));
    return Result::kBackend;
  }
  if (n < static_cast<ssize_t>(sizeof(*h)) || h->magic == 0) {
    std::snprintf(err, err_len, "posix store: shard %u of %s was never completely written", k.shard, path.c_str());
    return Result::kNotFound;
  }
  if (h->magic != kShardHeaderMagic || h->check != header_check(*h) || h->shard != k.shard) {
    std::snprintf(err, err_len, "posix store: the header of shard %u in %s is corrupt", k.shard, path.c_str());
    return Result::kCorrupt;
  }
  if (h->length != ctx_.shard_bytes) {
    std::snprintf(err, err_len, "posix store: shard %u in %s holds %" PRIu64 " bytes, shards are %" PRIu64, k.shard,
                  path.c_str(), h->length, ctx_.shard_bytes);
    return Result::kCorrupt;
  }
  return Result::kOk;
}

void PosixBackend::do_load(IoRequest* req) {
  const std::string path = block_path(req->key.block);
  const bool direct = aligned_for_direct(req);
  int fd = open_file(path, O_RDONLY, direct);
  if (fd < 0) {
    const int e = errno;
    req->result = e == ENOENT ? Result::kNotFound : Result::kBackend;
    std::snprintf(req->error, sizeof(req->error), "posix store: opening %s: %s", path.c_str(), strerror(e));
    return;
  }
  // The header goes through the page cache: 32 bytes are not direct-I/O sized.
  int hfd = direct ? open_file(path, O_RDONLY, false) : fd;
  ShardHeader h;
  req->result = hfd < 0 ? Result::kBackend : read_header(hfd, req->key, path, &h, req->error, sizeof(req->error));
  if (req->result == Result::kOk) {
    const ssize_t n = pread_full(fd, req->buf, req->bytes, static_cast<off_t>(uint64_t{req->key.shard} * ctx_.shard_bytes));
    if (n < 0) {
      req->result = Result::kBackend;
      std::snprintf(req->error, sizeof(req->error), "posix store: reading shard %u of %s: %s", req->key.shard,
                    path.c_str(), strerror(static_cast<int>(-n)));
    } else if (static_cast<uint64_t>(n) != req->bytes) {
      req->result = Result::kCorrupt;
      std::snprintf(req->error, sizeof(req->error), "posix store: shard %u of %s is truncated: %zd of %" PRIu64 " bytes",
                    req->key.shard, path.c_str(), n, req->bytes);
    } else if (checksum64(req->buf, req->bytes) != h.checksum) {
      req->result = Result::kCorrupt;
      std::snprintf(req->error, sizeof(req->error), "posix store: shard %u of %s fails its checksum", req->key.shard,
                    path.c_str());
    }
  }
  if (hfd >= 0 && hfd != fd) close(hfd);
  close(fd);
}

void PosixBackend::do_dump(IoRequest* req) {
  const std::string path = block_path(req->key.block);
  const bool direct = aligned_for_direct(req);
  int fd = open_file(path, O_RDWR | O_CREAT, direct);
  if (fd < 0) {
    req->result = Result::kBackend;
    std::snprintf(req->error, sizeof(req->error), "posix store: creating %s: %s", path.c_str(), strerror(errno));
    return;
  }
  int hfd = direct ? open_file(path, O_RDWR, false) : fd;
  ShardHeader h{};
  h.magic = kShardHeaderMagic;
  h.length = req->bytes;
  h.checksum = checksum64(req->buf, req->bytes);
  h.shard = req->key.shard;
  h.check = header_check(h);
  const ssize_t n = pwrite_full(fd, req->buf, req->bytes, static_cast<off_t>(uint64_t{req->key.shard} * ctx_.shard_bytes));
  ssize_t hn = 0;
  if (n >= 0 && opts_.sync && fdatasync(fd) != 0) hn = -errno;
  if (n >= 0 && hn == 0)
    hn = hfd < 0 ? -EBADF
                 : pwrite_full(hfd, &h, sizeof(h), static_cast<off_t>(index_off_ + uint64_t{req->key.shard} * sizeof(h)));
  if (n < 0 || hn < 0) {
    req->result = Result::kBackend;
    std::snprintf(req->error, sizeof(req->error), "posix store: writing shard %u %s %s: %s", req->key.shard,
                  n < 0 ? "to" : "header to", path.c_str(), strerror(static_cast<int>(n < 0 ? -n : -hn)));
  } else {
    req->result = Result::kOk;
  }
  if (hfd >= 0 && hfd != fd) close(hfd);
  close(fd);
}

void PosixBackend::touch(const BlockId* blocks, size_t n) {
  counters_.touches.fetch_add(n, std::memory_order_relaxed);
  for (size_t i = 0; i < n; ++i) {
    int fd = open(block_path(blocks[i]).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // not stored here: nothing to keep warm
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_WILLNEED);
    close(fd);
  }
}

Result PosixBackend::exists(const Key& k, bool* out) {
  *out = false;
  if (k.shard >= ctx_.shards_per_block) return Result::kOk;
  const std::string path = block_path(k.block);
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Result::kOk;
    return fail(Result::kBackend, "posix store: opening %s: %s", path.c_str(), strerror(errno));
  }
  ShardHeader h;
  char err[160];
  const Result r = read_header(fd, k, path, &h, err, sizeof(err));
  close(fd);
  *out = r == Result::kOk;
  if (r == Result::kBackend) return fail(r, "%s", err);
  return Result::kOk;
}

}  // namespace ucm
