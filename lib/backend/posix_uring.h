// The posix store's io_uring engine for loads (engine=uring; built with
// -Dio_uring, liburing). One thread per store prepares each load (opens the
// block file and checks its header, as the thread engine does), puts the
// shard's read in the kernel's queue, and completes whatever reads landed:
// checksum, close, done(). Up to `depth` reads are in the kernel at once (and
// up to depth more beside reads the caller counts as stuck: requests_stuck), so
// the disk stays busy while the thread waits for a CPU, and one wake-up
// completes every read that landed meanwhile (the thread engine needs one
// thread, and one wake-up, per read).
//
// A wake-up, in this order: reap every completion (a read that landed leaves
// the kernel's count and closes its file at once: land(), so that the store
// never holds more than `depth` files open); prepare the queued loads into the
// places that freed and submit each read as soon as it is prepared; only then
// checksum and done() the landed ones (end_landed()). The disk is never
// kept a read short for the checks of others (ucm_demo kept 4 of 8 reads in
// the kernel when the checks came first, docs/results.md).
//
// New requests reach a waiting ring thread through an eventfd whose read is
// always queued in the ring; a submitter writes it only when the thread said
// (under mu_) that it is about to wait with room for more.
//
// Direct reads into the memory the store was told loads land in
// (BackendContext::buffers: the cache's data plane) are READ_FIXED: that
// memory is registered with the ring once at create(), in chunks of at most
// 1 GiB (fixed_buffers.h), so the kernel pins no page per read. A read whose
// destination no one chunk holds, and every buffered read, is a plain read;
// a registration the kernel refuses is warned once and leaves them all plain.
//
// A direct read the file system refuses (EINVAL) is redone buffered on the
// same request (direct_fallback) and direct I/O stops for the store, as on the
// threads; a short read is continued where it stopped, and a read that ends
// at the end of the file leaves the shard truncated (kCorrupt). shutdown()
// completes the queued requests (kTimeout) and waits until the reads in the
// kernel landed or the deadline passed; a thread still waiting on the kernel
// then is detached by the store (posix_backend.h) and touches no buffer and
// calls no done() once it returns.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/fixed_buffers.h"
#include "backend/posix_backend.h"

struct io_uring;
struct io_uring_cqe;

namespace ucm {

class PosixRing {
 public:
  // kUnsupported where the kernel refuses io_uring (the message says why).
  [[nodiscard]] static Result create(PosixBackend* store, uint32_t depth, uint32_t spare, std::unique_ptr<PosixRing>* out);
  ~PosixRing();  // after stop() and wait_exit() returned true

  // false: the ring has given up (given_up) and did not take req.
  [[nodiscard]] bool submit(IoRequest* req);
  // The caller counts some of its loads as stuck: the ring's thread looks at
  // its reads now (it also does on its own, places()).
  // When the ring's own thread has been held in a call into the file system
  // for PosixBackend::kHeldNs (a read the file system ran inline and that does not
  // return, an open, a header read or a close that does not), the ring takes
  // no more loads (given_up) and returns the queued ones, for the store's
  // threads. For good: the store's loads stay on the threads.
  // only_if_queued: give up only when loads wait in the ring's queue (the
  // store's watcher, which looks whether or not anyone said so).
  std::deque<IoRequest*> requests_stuck(bool only_if_queued = false);
  // Since when the ring's thread has been in a call into the file system (0: in none).
  uint64_t call_since() const { return call_since_.load(std::memory_order_seq_cst); }  // CallMark says why
  // Takes back a load still queued here (PosixBackend::cancel).
  bool cancel(IoRequest* req);
  // No load is to be submitted here any more: its thread was found stuck.
  bool given_up() const { return given_up_.load(std::memory_order_acquire); }
  // Completes the queued requests (kTimeout); the reads in the kernel finish.
  void stop();
  // Whether the ring thread returned by the deadline (it is then joined).
  bool wait_exit(uint64_t deadline_ns);
  // Stuck in the kernel past the deadline: left behind for the process's
  // life (the kernel still completes into it), on a list that keeps it
  // reachable, so that it is never freed and is not a leak.
  static void abandon(PosixRing* ring);  // takes ownership

 private:
  struct Read;
  PosixRing(PosixBackend* store, uint32_t depth, uint32_t spare);
  // Places for reads now (ring thread): depth, and one more per held read
  // (up to spare_); none_left: every place is held and none may be added.
  struct Places {
    uint32_t places = 0;
    uint32_t held = 0;
    bool none_left = false;
  };
  Places places() const;
  // When the next read in the kernel counts as held (kNoDeadline: none).
  uint64_t next_held_ns() const;
  // Whether a read of block b's file is held in the kernel (ring thread).
  bool file_held(const BlockId& b) const;
  void refuse_held_file(IoRequest* req);
  void refuse(std::deque<IoRequest*>* refused, uint32_t held);
  void register_buffers();
  void main();
  void start_queued();
  bool prepare(IoRequest* req, Read* rd, bool nothing_queued);
  void queue_read(Read* rd);
  bool wait_and_reap();
  void submit_queued();
  void on_read(Read* rd, int res, bool abandoned);
  void land(Read* rd, ssize_t n);
  void end_landed();
  void end_read(Read* rd, ssize_t n);
  void note_end();
  void finish(Read* rd);
  void deliver(Read* rd);
  void count_syscalls();
  void arm_bell();

  PosixBackend* const store_;
  const uint32_t depth_;
  const uint32_t spare_;
  std::vector<Read*> live_;        // the ring thread's: reads in the kernel (for held ones: places())
  std::unique_ptr<io_uring> ring_;
  FixedBuffers fixed_;  // registered with ring_ (empty: none); set before the thread starts
  int bell_fd_ = -1;
  uint64_t bell_buf_ = 0;
  std::mutex mu_;
  std::condition_variable exit_cv_;
  std::deque<IoRequest*> queue_;  // under mu_
  bool asleep_ = false;            // under mu_: the thread waits with room for more
  bool stopping_ = false;          // under mu_
  bool exited_ = false;            // under mu_
  std::atomic<bool> given_up_{false};
  // Since when the ring thread has been in a system call that may run a
  // file system's code (prepare, submit); 0: in none (its wait for
  // completions is not one). RAII: CallMark.
  std::atomic<uint64_t> call_since_{0};
  struct CallMark {
    explicit CallMark(PosixRing* r);
    ~CallMark();
    PosixRing* ring;
  };
  uint32_t in_flight_ = 0;         // the ring thread's: reads in the kernel
  struct Landed {
    Read* rd;
    ssize_t n;  // the shard's bytes read, or -errno
  };
  std::vector<Landed> landed_;     // the ring thread's: out of the kernel, checks and done() to run
  uint64_t syscalls_counted_ = 0;  // the ring thread's: its system calls already in the store's count
  std::atomic<uint32_t> busy_{0};  // loads taken from queue_ and not yet done()
  std::thread thread_;
};

}  // namespace ucm
