// The collective seam of fan-out (queue/fanout.h): one node communicator and
// the two things the protocol asks of it. Two implementations: MPI
// (boot/coll_mpi.cpp, MPI_Iallgather / MPI_Ibcast over the node
// communicator, host buffers) and NCCL (device/cuda/coll_nccl.cpp, device
// buffers). The protocol itself never includes MPI or NCCL. The seam sits in
// common/: queue/ (the protocol), boot/ (MPI) and device/cuda/ (NCCL) all
// use it, and device/ is a layer below queue/ (docs/design.md, section 3).
//
// Every call is bounded by its absolute deadline (and by the stop flag the
// owner passes in): past it the call returns kTimeout; a communicator error
// is kSystem (MPI) or kDevice (NCCL). After any failure the owner calls
// abort() and never uses the communicator again: a collective that one rank
// left cannot be resumed.
//
// The buffers' contract, which makes a give-up safe: when a call returns,
// with any result, nothing more is read from or written into the buffers it
// was given. MPI cannot cancel a collective, so it works through staging
// buffers of its own and, on a give-up, leaves them to the late transfer
// (never freed); NCCL aborts the communicator and drains its stream first.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/result.h"

namespace ucm {

struct BcastOp {
  void* buf;       // read on `root`, written on every other rank
  uint64_t bytes;  // equal on every rank
  uint32_t root;   // a local rank
};

class Collective {
 public:
  virtual ~Collective() = default;
  virtual const char* name() const = 0;  // "mpi", "nccl"
  virtual std::string describe() const = 0;
  virtual uint32_t rank() const = 0;
  virtual uint32_t size() const = 0;
  // `bytes` of host memory from every rank into `all` (size() * bytes, in rank order).
  [[nodiscard]] virtual Result allgather(const void* mine, void* all, size_t bytes, uint64_t deadline_ns) = 0;
  // One grouped round of broadcasts (every rank passes the same ops, in the same order).
  [[nodiscard]] virtual Result broadcast(const BcastOp* ops, size_t n, uint64_t deadline_ns) = 0;
  // After a failed call: stops what is still in flight where the library can;
  // no call follows.
  virtual void abort() = 0;
  // Set by the owner: the waits return kFinalized once it is true.
  void set_stop_flag(const std::atomic<bool>* stop) { stop_ = stop; }

 protected:
  bool stop_requested() const { return stop_ && stop_->load(std::memory_order_acquire); }
  const std::atomic<bool>* stop_ = nullptr;
};

}  // namespace ucm
