#include "backend/posix_uring.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "common/log.h"
#include "common/thread_name.h"
#include "common/time.h"
#include "common/trace.h"

namespace ucm {

// One load between its preparation and its done().
struct PosixRing::Read {
  IoRequest* req = nullptr;
  int fd = -1;
  bool direct = false;
  uint64_t got = 0;  // bytes of the shard read so far
  int chunk = -1;    // the registered chunk holding the whole destination, or -1
  uint64_t start_ns = 0;  // when it went into the kernel (held after PosixBackend::kHeldNs)
  ShardHeader h{};
};

namespace {

constexpr uint64_t kBellTag = 0;  // user_data of the eventfd's read; every other one is a Read*

// The file status flags of a block file read through the ring: O_NONBLOCK
// (open_block's, for FIFOs; the file is known regular by now) would make the
// ring answer EAGAIN instead of waiting for the disk.
bool set_ring_flags(int fd, bool direct) {
  ++posix_thread_syscalls();
  return fcntl(fd, F_SETFL, direct ? O_DIRECT : 0) == 0;
}

}  // namespace

PosixRing::PosixRing(PosixBackend* store, uint32_t depth, uint32_t spare) : store_(store), depth_(depth), spare_(spare) {}

Result PosixRing::create(PosixBackend* store, uint32_t depth, uint32_t spare, std::unique_ptr<PosixRing>* out) {
  std::unique_ptr<PosixRing> r(new PosixRing(store, depth, spare));
  r->ring_ = std::make_unique<io_uring>();
  // One entry per read in the kernel (depth, and up to spare more beside
  // held ones) and one for the bell.
  const uint32_t entries = depth + spare + 1;
  const int e = io_uring_queue_init(entries, r->ring_.get(), 0);
  if (e < 0) {
    r->ring_.reset();
    return fail(Result::kUnsupported, "posix store: io_uring_queue_init(%u): %s", entries, strerror(-e));
  }
  r->landed_.reserve(depth + spare);  // no allocation on the ring thread
  r->live_.reserve(depth + spare);
  r->register_buffers();
  r->bell_fd_ = eventfd(0, EFD_CLOEXEC);
  if (r->bell_fd_ < 0) return fail(Result::kSystem, "posix store: eventfd: %s", strerror(errno));
  r->arm_bell();
  r->thread_ = std::thread([p = r.get()] { p->main(); });
  *out = std::move(r);
  return Result::kOk;
}

// Pinned once here, the data plane's pages need no pinning per direct read
// (which profiling put at ~5% of a decode's CPU). Only a store that reads
// direct registers: a buffered read pins nothing, and registering would pin
// the whole plane for nothing. The kernel may refuse (RLIMIT_MEMLOCK, too
// many buffers, memory it cannot pin, an old kernel): the reads stay plain.
void PosixRing::register_buffers() {
  if (store_->ctx_.buffers.empty() || !store_->direct_io()) return;
  fixed_ = FixedBuffers(store_->ctx_.buffers);
  const std::vector<iovec>& v = fixed_.iovecs();
  uint64_t bytes = 0;
  for (const iovec& c : v) bytes += c.iov_len;
  const int e = v.empty() ? 0 : io_uring_register_buffers(ring_.get(), v.data(), static_cast<unsigned>(v.size()));
  if (e == 0) {
    UCM_INFO(kBackend, "posix store at %s: %zu registered buffer(s), %" PRIu64 " bytes, for direct reads",
             store_->opts_.dir.c_str(), v.size(), bytes);
    return;
  }
  const size_t chunks = v.size();
  fixed_.clear();
  // Without CAP_IPC_LOCK the kernel counts the pages against RLIMIT_MEMLOCK
  // (summed over the user's processes: every rank registers the plane), which
  // for a user is far below any real data plane (Debian's default is 8 MiB):
  // the normal case of a job that is not root, said at info, not warned.
  rlimit lim{};
  if (e == -ENOMEM && getrlimit(RLIMIT_MEMLOCK, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY) {
    UCM_INFO(kBackend, "posix store at %s: %" PRIu64 " bytes of data plane to register for direct reads do not fit "
             "RLIMIT_MEMLOCK (ulimit -l) %" PRIu64 " bytes (counted over the user's processes): direct reads pin "
             "their pages each time instead (raise the limit, or run with CAP_IPC_LOCK, to register them once)",
             store_->opts_.dir.c_str(), bytes, static_cast<uint64_t>(lim.rlim_cur));
    return;
  }
  UCM_WARN("posix store at %s: io_uring_register_buffers (%zu chunk(s), %" PRIu64 " bytes): %s; "
           "direct reads pin their pages each time instead",
           store_->opts_.dir.c_str(), chunks, bytes, strerror(-e));
}

PosixRing::~PosixRing() {
  if (thread_.joinable()) thread_.join();
  if (ring_) io_uring_queue_exit(ring_.get());
  if (bell_fd_ >= 0) close(bell_fd_);
}

bool PosixRing::submit(IoRequest* req) {
  bool wake = false;
  bool refused = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (given_up_.load(std::memory_order_relaxed)) return false;
    refused = stopping_;
    if (!refused) {
      queue_.push_back(req);
      wake = asleep_;
      asleep_ = false;
    }
  }
  if (refused) {
    complete_with(req, Result::kTimeout, "posix store shut down before the request was queued");
    return true;
  }
  if (!wake) return true;
  const uint64_t one = 1;
  ++posix_thread_syscalls();
  (void)!write(bell_fd_, &one, sizeof(one));
  return true;
}

PosixRing::CallMark::CallMark(PosixRing* r) : ring(r) {
  const uint64_t now = now_ns();
  // seq_cst here, in watch_ring's look at watch_at_, and on the watcher's
  // side (it clears watch_at_, then reads call_since_): a store then a load on
  // each side, so at least one sees the other's; with relaxed both could miss
  // (x86's store buffer), leaving the watcher unarmed for a call that hangs.
  ring->call_since_.store(now, std::memory_order_seq_cst);
  // The store's watcher looks PosixBackend::kHeldNs from now whether this call came
  // back (a thread the kernel holds cannot say so itself).
  ring->store_->watch_ring(now);
}
PosixRing::CallMark::~CallMark() { ring->call_since_.store(0, std::memory_order_relaxed); }

std::deque<IoRequest*> PosixRing::requests_stuck(bool only_if_queued) {
  bool wake = false;
  std::deque<IoRequest*> handed;
  {
    std::lock_guard<std::mutex> g(mu_);
    const uint64_t since = call_since_.load(std::memory_order_relaxed);
    if (!given_up_.load(std::memory_order_relaxed) && since != 0 && now_ns() - since >= PosixBackend::kHeldNs &&
        (!only_if_queued || !queue_.empty())) {
      // Under mu_: the thread takes nothing queued from here on.
      given_up_.store(true, std::memory_order_release);
      handed.swap(queue_);
      UCM_WARN("posix store at %s: the io_uring thread has been in one call into the file system for over %llu ms "
               "(a read, an open or a close that does not return); loads go to the store's I/O threads from now on",
               store_->opts_.dir.c_str(), static_cast<unsigned long long>(PosixBackend::kHeldNs / 1'000'000));
      return handed;
    }
    // The thread counts held reads itself (places()); it may wait with every
    // place taken, said not asleep_, so no submit() rings: the bell makes it
    // look now (the caller sends the load that takes a place after this call).
    wake = !stopping_;
    if (wake) asleep_ = false;
  }
  if (wake) {
    const uint64_t one = 1;
    (void)!write(bell_fd_, &one, sizeof(one));
  }
  return handed;
}

bool PosixRing::cancel(IoRequest* req) {
  std::lock_guard<std::mutex> g(mu_);
  const auto at = std::find(queue_.begin(), queue_.end(), req);
  if (at == queue_.end()) return false;
  queue_.erase(at);
  return true;
}

void PosixRing::stop() {
  std::deque<IoRequest*> queued;
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
    queued.swap(queue_);
  }
  const uint64_t one = 1;
  (void)!write(bell_fd_, &one, sizeof(one));
  for (IoRequest* req : queued) complete_with(req, Result::kTimeout, "posix store shut down with the request queued");
}

// A ring with no load taken holds nothing and only has to be scheduled to
// leave: it is waited for past the deadline, as the store's idle threads are.
bool PosixRing::wait_exit(uint64_t deadline_ns) {
  {
    std::unique_lock<std::mutex> lk(mu_);
    while (!exited_) {
      const uint64_t now = now_ns();
      const bool idle = busy_.load(std::memory_order_acquire) == 0;
      if (now >= deadline_ns && !idle) return false;
      if (deadline_ns == kNoDeadline || idle) exit_cv_.wait(lk);
      else exit_cv_.wait_for(lk, std::chrono::nanoseconds(deadline_ns - now));
    }
  }
  if (thread_.joinable()) thread_.join();
  return true;
}

void PosixRing::abandon(PosixRing* ring) {
  static std::mutex mu;
  static auto* kept = new std::vector<PosixRing*>;  // never destroyed: the rings must outlive every static
  if (ring->thread_.joinable()) ring->thread_.detach();
  std::lock_guard<std::mutex> g(mu);
  kept->push_back(ring);
}

void PosixRing::arm_bell() {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  // The ring has room for the bell and every read (create()).
  io_uring_prep_read(sqe, bell_fd_, &bell_buf_, sizeof(bell_buf_), 0);
  io_uring_sqe_set_data64(sqe, kBellTag);
}

// Every system call of the ring thread is a load's: counted into the store's
// occupancy before each done() (whoever it wakes sees them) and after each wait.
void PosixRing::count_syscalls() {
  const uint64_t now = posix_thread_syscalls();
  store_->load_syscalls_.fetch_add(now - syscalls_counted_, std::memory_order_relaxed);
  syscalls_counted_ = now;
}

void PosixRing::main() {
  name_this_thread("uring");
  // The kernel runs a read it cannot start without blocking (a page-cache
  // fill, a file system without nowait) on this thread's io-wq workers, at
  // most min(entries, 4 x CPUs) at once by default: on a small node fewer
  // than the places beside held reads (places()). Per thread: set here.
  unsigned workers[2] = {depth_ + spare_ + 1, 0};  // bounded (regular files), unbounded unchanged
  if (const int e = io_uring_register_iowq_max_workers(ring_.get(), workers); e < 0)
    UCM_INFO(kBackend, "posix store at %s: io_uring_register_iowq_max_workers: %s (the kernel's default stays)",
             store_->opts_.dir.c_str(), strerror(-e));
  syscalls_counted_ = posix_thread_syscalls();
  for (;;) {
    // The kernel first: the reads that landed gave their places to queued
    // loads, which go in before the landed ones' checksums and done().
    start_queued();
    end_landed();
    {
      std::lock_guard<std::mutex> g(mu_);
      if (stopping_ && in_flight_ == 0) break;
    }
    if (!wait_and_reap()) {  // abandoned by shutdown()
      end_landed();
      return;
    }
  }
  std::lock_guard<std::mutex> g(mu_);
  exited_ = true;
  exit_cv_.notify_all();
}

// Takes what is queued while there is room, prepares each load and queues
// its read; says (asleep_) whether the wait that follows has room for more.
void PosixRing::start_queued() {
  for (;;) {
    IoRequest* req = nullptr;
    bool nothing_queued = false;
    const Places p = places();
    std::deque<IoRequest*> refused;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (!queue_.empty() && p.none_left) refused.swap(queue_);
      if (queue_.empty() || in_flight_ >= p.places || given_up_.load(std::memory_order_relaxed)) {
        asleep_ = !stopping_ && in_flight_ < p.places;
        if (refused.empty()) break;
      } else {
        req = queue_.front();
        queue_.pop_front();
        busy_.fetch_add(1, std::memory_order_relaxed);
        nothing_queued = queue_.empty();
      }
    }
    if (!refused.empty()) {
      refuse(&refused, p.held);
      continue;
    }
    if (file_held(req->key.block)) {
      refuse_held_file(req);
      continue;
    }
    auto* rd = new Read;
    rd->req = req;
    if (!prepare(req, rd, nothing_queued)) continue;  // completed (and rd freed)
    ++in_flight_;
    rd->start_ns = now_ns();
    live_.push_back(rd);
    queue_read(rd);
    // Into the kernel now, not after the next load's preparation (an open,
    // an fstat, a header read) nor after the checks of what landed.
    submit_queued();
  }
  submit_queued();  // the rest of a short read, a read the kernel asked to redo
}

// Reads in the kernel for kHeldNs hold their places, maybe for good (a dead
// server): the ring keeps `depth` places that are not held, up to spare_
// more. With every place held and none to add, nothing queued can start.
PosixRing::Places PosixRing::places() const {
  Places p;
  p.places = depth_;
  if (in_flight_ < depth_) return p;
  const uint64_t now = now_ns();
  for (const Read* rd : live_) p.held += now - rd->start_ns >= PosixBackend::kHeldNs ? 1 : 0;
  p.places = depth_ + std::min(p.held, spare_);
  p.none_left = p.held >= in_flight_ && in_flight_ >= depth_ + spare_;
  return p;
}

uint64_t PosixRing::next_held_ns() const {
  uint64_t next = kNoDeadline;
  const uint64_t now = now_ns();
  for (const Read* rd : live_)
    if (now - rd->start_ns < PosixBackend::kHeldNs) next = std::min(next, rd->start_ns + PosixBackend::kHeldNs);
  return next;
}

bool PosixRing::file_held(const BlockId& b) const {
  const uint64_t now = now_ns();
  for (const Read* rd : live_)
    if (rd->req->key.block == b && now - rd->start_ns >= PosixBackend::held_file_ns(rd->req->bytes)) return true;
  return false;
}

void PosixRing::refuse_held_file(IoRequest* req) {
  store_->counters_.rejected(true);
  store_->fail_held_file(req);
  req->done(req);
  busy_.fetch_sub(1, std::memory_order_release);
}

void PosixRing::refuse(std::deque<IoRequest*>* refused, uint32_t held) {
  UCM_WARN("posix store at %s: all %u reads in the ring are held in the kernel (each for over %llu ms) by a file "
           "system that does not return them (a server down?); %zu queued load(s) fail",
           store_->opts_.dir.c_str(), held, static_cast<unsigned long long>(PosixBackend::kHeldNs / 1'000'000),
           refused->size());
  for (IoRequest* req : *refused) {
    store_->counters_.rejected(true);
    complete_with(req, Result::kBackend,
                  "posix store at %s: all %u reads in the ring are held in the kernel by a file system that does not "
                  "return them (a server down?); this load was not started",
                  store_->opts_.dir.c_str(), held);
  }
  refused->clear();
}

void PosixRing::submit_queued() {
  if (io_uring_sq_ready(ring_.get()) == 0) return;
  const CallMark mark(this);  // a file system may run the read inline, and never return
  ++posix_thread_syscalls();
  (void)io_uring_submit(ring_.get());  // what the kernel did not take goes in with the next wait
}

// The thread engine's first half of a load (open, header), then the file's
// flags for the ring. false: the request is completed (its error, or the
// store was abandoned while it ran).
bool PosixRing::prepare(IoRequest* req, Read* rd, bool nothing_queued) {
  UCM_TRACE(TraceRange::kBackendLoad);
  store_->note_load_start(nothing_queued);
  store_->counters_.load_started();
  bool ok = false;
  {
    const CallMark mark(this);  // the open and the header read: a dead server holds them too
    ok = store_->begin_load(req, &rd->fd, &rd->h);
    if (ok) {
      rd->direct = store_->aligned_for_direct(req);
      if (!set_ring_flags(rd->fd, rd->direct) && rd->direct) {
        // The file system takes no O_DIRECT (the thread engine's fcntl case).
        if (errno == EINVAL) {
          req->direct_fallback = true;
          store_->stop_direct("fcntl O_DIRECT: Invalid argument");
        }
        rd->direct = false;
        ok = set_ring_flags(rd->fd, false);
        if (!ok) store_->end_load(req, rd->fd, rd->h, -errno);
      }
    }
  }
  if (!ok) {
    finish(rd);
    return false;
  }
  rd->chunk = fixed_.find(req->buf, req->bytes);
  return true;
}

void PosixRing::queue_read(Read* rd) {
  io_uring_sqe* sqe = io_uring_get_sqe(ring_.get());
  while (sqe == nullptr) {  // never with 2 x depth + 1 entries; submitting frees them anyway
    const CallMark mark(this);
    ++posix_thread_syscalls();
    (void)io_uring_submit(ring_.get());
    sqe = io_uring_get_sqe(ring_.get());
  }
  IoRequest* req = rd->req;
  const uint64_t off = uint64_t{req->key.shard} * store_->ctx_.shard_bytes + rd->got;
  uint8_t* const to = static_cast<uint8_t*>(req->buf) + rd->got;  // a short read's rest: still in rd->chunk
  const auto len = static_cast<unsigned>(req->bytes - rd->got);
  // Buffered, a fixed read would gain nothing, and would write past a fenced
  // data plane (buffer_data.h fence_off) where a plain one faults.
  if (rd->direct && rd->chunk >= 0) io_uring_prep_read_fixed(sqe, rd->fd, to, len, off, rd->chunk);
  else io_uring_prep_read(sqe, rd->fd, to, len, off);
  io_uring_sqe_set_data(sqe, rd);
}

// Submits what is queued, waits for one completion and handles every one
// that landed. Once shutdown() abandoned the store, a read that returns from
// the kernel is still counted (the store's counters say it ended), but it is
// neither continued nor completed. false: abandoned, and no read is left in
// the kernel (the thread returns).
bool PosixRing::wait_and_reap() {
  io_uring_cqe* cqe = nullptr;
  submit_queued();  // under its mark: the wait below then only waits
  ++posix_thread_syscalls();
  // With every place taken (no submit rings then), the thread looks again
  // when the next read counts as held: a load queued meanwhile may take the
  // place added beside it. Reads that land first end the wait as always.
  const uint64_t next = in_flight_ >= depth_ ? next_held_ns() : kNoDeadline;
  int w = 0;
  if (next == kNoDeadline) {
    w = io_uring_submit_and_wait(ring_.get(), 1);
  } else {
    const uint64_t now = now_ns();
    const uint64_t in = next > now ? next - now : 0;
    __kernel_timespec ts{static_cast<long long>(in / 1'000'000'000), static_cast<long long>(in % 1'000'000'000)};
    io_uring_cqe* first = nullptr;
    w = io_uring_submit_and_wait_timeout(ring_.get(), &first, 1, &ts, nullptr);
    if (w == -ETIME) w = 0;
  }
  if (w < 0 && w != -EINTR && w != -EAGAIN && w != -EBUSY)
    UCM_WARN("posix store at %s: io_uring_submit_and_wait: %s", store_->opts_.dir.c_str(), strerror(-w));
  bool abandoned = false;
  {
    std::shared_lock<std::shared_mutex> g(store_->buf_mu_);
    abandoned = store_->abandoned_;
  }
  unsigned head = 0, seen = 0;
  io_uring_for_each_cqe(ring_.get(), head, cqe) {
    ++seen;
    const uint64_t tag = io_uring_cqe_get_data64(cqe);
    const int res = cqe->res;
    if (tag != kBellTag) on_read(reinterpret_cast<Read*>(tag), res, abandoned);
    else if (!abandoned) arm_bell();
  }
  io_uring_cq_advance(ring_.get(), seen);
  count_syscalls();
  return !abandoned || in_flight_ > 0;
}

// A shard's read landed (res: bytes, or -errno): continue it, redo it
// buffered, or finish the load.
void PosixRing::on_read(Read* rd, int res, bool abandoned) {
  IoRequest* req = rd->req;
  if (abandoned) return land(rd, res < 0 ? res : -EIO);  // nothing more goes into the buffer
  if (res == -EAGAIN || res == -EINTR) return queue_read(rd);
  if (res == -EINVAL && rd->direct) {
    // Aligned as the kernel said, refused all the same: buffered from here.
    req->direct_fallback = true;
    store_->stop_direct("a direct read: Invalid argument");
    rd->direct = false;
    if (set_ring_flags(rd->fd, false)) return queue_read(rd);
    res = -errno;
  }
  if (res > 0) {
    rd->got += static_cast<uint64_t>(res);
    if (rd->got < req->bytes) return queue_read(rd);  // short: the rest, from where it stopped
  }
  land(rd, res < 0 ? res : static_cast<ssize_t>(rd->got));
}

// The read is out of the kernel for good (n: the shard's bytes read, or
// -errno): its place goes to the next queued load at once; its checks and
// done() wait for end_landed(). Its file is closed now, before the refill
// opens the next ones: the store holds at most `depth` files open, as the
// thread engine does (a landed read kept open past the refill doubled that,
// and a process with `depth` descriptors to spare failed loads with EMFILE).
void PosixRing::land(Read* rd, ssize_t n) {
  if (rd->fd >= 0) {
    const CallMark mark(this);  // a network file system's close talks to its server
    ++posix_thread_syscalls();
    close(rd->fd);
    rd->fd = -1;
  }
  --in_flight_;
  live_.erase(std::find(live_.begin(), live_.end(), rd));
  store_->counters_.load_io_ended();
  note_end();
  landed_.push_back(Landed{rd, n});
}

void PosixRing::end_landed() {
  for (const Landed& l : landed_) end_read(l.rd, l.n);
  landed_.clear();
}

// A landed read's checks, then done().
void PosixRing::end_read(Read* rd, ssize_t n) {
  // Every read of it was fixed (a direct read refused and redone buffered was not).
  if (rd->direct && rd->chunk >= 0) store_->fixed_reads_.fetch_add(1, std::memory_order_relaxed);
  {
    UCM_TRACE(TraceRange::kBackendLoad);
    store_->end_load(rd->req, rd->fd, rd->h, n);
  }
  deliver(rd);
}

// The store's occupancy: a load left the kernel (or never reached it).
void PosixRing::note_end() {
  bool nothing_queued = false;
  {
    std::lock_guard<std::mutex> g(mu_);
    nothing_queued = queue_.empty();
  }
  store_->note_load_end(nothing_queued);
}

// A load that failed in its preparation: nothing reached the kernel.
void PosixRing::finish(Read* rd) {
  store_->counters_.load_io_ended();
  note_end();
  deliver(rd);
}

// The load is over (req->result says how): the counters, then its one done().
void PosixRing::deliver(Read* rd) {
  IoRequest* req = rd->req;
  delete rd;
  count_syscalls();
  store_->counters_.load_counted(*req);
  {
    std::shared_lock<std::shared_mutex> g(store_->buf_mu_);
    if (store_->abandoned_) return;  // whoever gave us the request is gone
    req->done(req);
  }
  busy_.fetch_sub(1, std::memory_order_release);
}

}  // namespace ucm
