// Copy engines: how bytes move from a cache slot to where a rank wants them.
//
// Three engines, reached only through make_copy_engine(), so nothing outside
// device/ knows which one it has:
//   cuda        (device/cuda/, built when CUDA is found): registered host
//               memory, one stream per channel, batched copies, events.
//   host        memcpy at submission; destinations are host memory. Runs only
//               when configured, or when the node has no GPU at all and the
//               config allows it (never as a silent stand-in for a GPU whose
//               driver failed: the app would hand it device pointers).
//   async-test  for tests only: copies land on a worker thread a set delay
//               after their flush, optionally out of order, with injectable
//               flush faults, so the copier's pipeline logic runs on a CPU as
//               it will on a device.
//
// The stream contract, which every engine keeps and the copier relies on:
//   - copy() queues one copy and hands out its ticket (1, 2, 3, ...). It fails
//     only when nothing was queued (no ticket).
//   - flush() starts everything queued. When it fails, some of those copies may
//     already be in flight: their tickets are failed, but they are NOT settled
//     until the stream proves it has passed them (a device event, a stream
//     synchronize) or the context is known dead. Until then the source and
//     destination must stay valid: a caller keeps its pins.
//   - done(t) is true when copy t landed and every copy before it settled. A
//     failed ticket is never done().
//   - wait(t) flushes, blocks (bounded) until t is settled, and returns kOk if
//     it landed, or the failure (kDevice) once it is settled.
#pragma once

#include <cstddef>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/result.h"

namespace ucm {

// One ordered channel of copies, used by one thread (the copier, or the
// dispatcher for dumps). See the contract above.
class CopyStream {
 public:
  virtual ~CopyStream() = default;
  // Queues a copy of `bytes` from src to dst (host or device memory, as the
  // engine's kind allows) and returns its ticket.
  [[nodiscard]] virtual Result copy(void* dst, const void* src, uint64_t bytes, uint64_t* ticket) = 0;
  // Starts everything queued (engines may gather copies into one batch).
  [[nodiscard]] virtual Result flush() = 0;
  virtual bool done(uint64_t ticket) = 0;
  [[nodiscard]] virtual Result wait(uint64_t ticket) = 0;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual const char* name() const = 0;
  virtual int device_id() const = 0;
  // Shard sizes must be a multiple of this for the engine's copies.
  virtual uint64_t alignment() const = 0;
  [[nodiscard]] virtual Result register_host(void* base, uint64_t bytes) = 0;
  virtual void unregister_host(void* base) = 0;
  // PCI bus id of the device ("0000:17:00.0"), empty for the host engines.
  virtual std::string pci_bus_id() const = 0;
  [[nodiscard]] virtual Result open_stream(std::unique_ptr<CopyStream>* out) = 0;
  // Checks that each of ptrs[0..n) starts `bytes` of memory this engine may
  // copy to or from on the app's side (CUDA: memory of this rank's device).
  // On failure *bad is the index of the first bad pointer and the detail says
  // why. Engines without a way to tell (host memory) accept everything.
  [[nodiscard]] virtual Result check_app_buffers(const void* const* ptrs, size_t n, uint64_t bytes, size_t* bad) {
    (void)ptrs, (void)n, (void)bytes, (void)bad;
    return Result::kOk;
  }
  // False when check_app_buffers() accepts every pointer whatever it is (the
  // engines over host memory), so that a task's submit need not gather its
  // pointers to ask. True unless an engine says otherwise.
  virtual bool checks_app_buffers() const { return true; }
};

struct DeviceStatus {
  bool cuda_built = false;
  bool nccl_built = false;    // the library calls NCCL (fan-out's seam is built in)
  int visible_devices = 0;    // 0 without CUDA, or when the runtime reports an error
  bool driver_present = false;// a GPU driver is loaded (/proc/driver/nvidia): a node with GPUs
  std::string cuda_error;     // why there are no devices, when CUDA is built
};

DeviceStatus device_status();

// PCI bus ids ("0000:17:00.0") of the visible GPUs, in ordinal order; empty
// with *why set when CUDA is not built or the runtime reports an error.
std::vector<std::string> gpu_bus_ids(std::string* why);

enum class EngineKind : int32_t {
  kAuto = 0,       // CUDA where the node has GPUs; host only where it has none (no driver)
  kCuda = 1,       // CUDA, or fail with the runtime's reason
  kHost = 2,       // memcpy, destinations are host memory
  kAsyncTest = 3,  // tests only: see the file comment
};
const char* engine_kind_name(EngineKind k);

// Lets a test decide when the async-test engine's copies land: each landing
// (a copy that is due) takes one permit; open() lets everything through.
class AsyncTestGate {
 public:
  void allow(uint64_t n);
  void open();
  // Takes a permit, waiting up to `slice_ms` for one; false if none came.
  bool take(uint32_t slice_ms);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t permits_ = 0;
  bool open_ = false;
};

// What the async-test engine saw, for tests of the copier's pipeline.
struct AsyncTestStats {
  std::atomic<uint64_t> copies{0};     // copy() calls
  std::atomic<uint64_t> flushes{0};    // flush() calls that started copies
  std::atomic<uint64_t> max_batch{0};  // most copies one flush started
  std::atomic<uint64_t> waiting{0};    // wait() calls blocked right now
};

// Options of the async-test engine.
struct AsyncTestOptions {
  uint64_t delay_us = 200;      // a copy lands this long after its flush
  bool reorder = false;         // copies of one flush land in a shuffled order
  uint64_t fail_flush = 0;      // flush number N (1-based; 0: none) fails ...
  uint64_t fail_after = 0;      // ... after putting its first fail_after copies in flight
  uint64_t seed = 1;            // of the shuffle
  std::shared_ptr<AsyncTestGate> gate;  // null: copies land when due
  std::shared_ptr<AsyncTestStats> stats;  // null: not counted
};

struct EngineChoice {
  EngineKind kind = EngineKind::kAuto;
  bool auto_device = true;      // device_id was `auto`: pick one (see make_copy_engine)
  int device_id = 0;            // the configured device when !auto_device; < 0: a scheduler rank
  int local_rank = 0;           // for `auto` without an app device: local rank modulo GPUs
  AsyncTestOptions async;       // for kAsyncTest
};

struct EngineTaken {
  int device_id = -1;           // the device the engine copies to (< 0: none, a scheduler)
  std::string why;              // how it was chosen, in words ("auto: the app's current device 1")
};

// Picks and builds the engine. A configured device, or kCuda, or kAuto on a
// node with a GPU driver, needs a working CUDA device: anything else fails
// with the runtime's reason (kDevice). The host engine runs for kHost, or for
// kAuto with an `auto` device on a node without any GPU driver. `auto` takes
// the app's current device when the calling thread has a CUDA context, else
// local rank modulo visible GPUs. A scheduler rank (configured device < 0)
// gets no engine (*out stays null).
[[nodiscard]] Result make_copy_engine(const EngineChoice& choice, std::unique_ptr<CopyEngine>* out,
                                      EngineTaken* taken);

// Registers each segment (base, bytes) with the engine, on up to `max_threads`
// threads at once (peers measured about 0.1 s per GB for cudaHostRegister on
// one thread). `registered` lists the bases that succeeded, also on failure,
// so the caller unregisters exactly those; the first failure is returned.
struct Registration {
  std::vector<void*> registered;
  double seconds = 0;   // wall time of the whole registration
  uint32_t threads = 0; // threads used
};
[[nodiscard]] Result register_segments(CopyEngine* engine, const std::vector<std::pair<void*, uint64_t>>& segments,
                                       uint32_t max_threads, Registration* out);

std::unique_ptr<CopyEngine> make_async_test_engine(int device_id, const AsyncTestOptions& o);

}  // namespace ucm
