#include "device/cuda/cuda_engine.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <deque>
#include <mutex>
#include <vector>

#include "common/log.h"
#include "device/ticket_ledger.h"

namespace ucm {
namespace {

// ---- driver entry points, fetched through the runtime -------------------------

using CuResult = int;
using CuContext = void*;
using CuDevicePtr = unsigned long long;
using CtxGetCurrentFn = CuResult (*)(CuContext*);
using CtxSetCurrentFn = CuResult (*)(CuContext);
using MemGetAddressRangeFn = CuResult (*)(CuDevicePtr*, size_t*, CuDevicePtr);

struct DriverCalls {
  CtxGetCurrentFn ctx_get = nullptr;
  CtxSetCurrentFn ctx_set = nullptr;
  MemGetAddressRangeFn address_range = nullptr;
};

void* driver_symbol(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
#else
  const cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return fn;
}

const DriverCalls& driver_calls() {
  static const DriverCalls calls = [] {
    DriverCalls c;
    c.ctx_get = reinterpret_cast<CtxGetCurrentFn>(driver_symbol("cuCtxGetCurrent"));
    c.ctx_set = reinterpret_cast<CtxSetCurrentFn>(driver_symbol("cuCtxSetCurrent"));
    c.address_range = reinterpret_cast<MemGetAddressRangeFn>(driver_symbol("cuMemGetAddressRange"));
    if (!c.ctx_get || !c.ctx_set) c.ctx_get = nullptr, c.ctx_set = nullptr;
    return c;
  }();
  return calls;
}

// Switches the calling thread to `dev` and gives the app back exactly what it
// had: its current context (none, if it had none: restoring "device 0" with
// cudaSetDevice would create a context there) and a clean error state.
class DeviceGuard {
 public:
  explicit DeviceGuard(int dev) {
    app_error_pending_ = cudaPeekAtLastError() != cudaSuccess;
    const DriverCalls& d = driver_calls();
    if (d.ctx_get) {
      saved_ctx_valid_ = d.ctx_get(&saved_ctx_) == 0;
    } else if (cudaGetDevice(&saved_dev_) != cudaSuccess) {
      saved_dev_ = -1;
    }
    set_error_ = cudaSetDevice(dev);
  }
  ~DeviceGuard() {
    const DriverCalls& d = driver_calls();
    if (saved_ctx_valid_) (void)d.ctx_set(saved_ctx_);
    else if (saved_dev_ >= 0) (void)cudaSetDevice(saved_dev_);
    if (!app_error_pending_) (void)cudaGetLastError();
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t set_error() const { return set_error_; }

 private:
  bool app_error_pending_ = false;
  bool saved_ctx_valid_ = false;
  CuContext saved_ctx_ = nullptr;
  int saved_dev_ = -1;
  cudaError_t set_error_ = cudaSuccess;
};

// What all streams of one engine share: whether the context died.
struct EngineState {
  int dev = 0;
  std::atomic<bool> dead{false};
  std::once_flag warned;
  std::mutex mu;
  std::string why;  // the fatal error, under mu

  // Records e if it is fatal; true if the context is dead (now or before).
  bool note(cudaError_t e, const char* during) {
    if (e != cudaSuccess && cuda_error_is_fatal(static_cast<int>(e))) {
      {
        std::lock_guard<std::mutex> g(mu);
        if (why.empty())
          why = std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ") during " + during;
      }
      dead.store(true, std::memory_order_release);
      std::call_once(warned, [&] {
        UCM_WARN("device %d: the CUDA context is dead after %s; the copy engine refuses all further work: the "
                 "process must be relaunched",
                 dev, reason().c_str());
      });
    }
    return dead.load(std::memory_order_acquire);
  }
  std::string reason() {
    std::lock_guard<std::mutex> g(mu);
    return why;
  }
  Result refuse() {
    return fail(Result::kDevice, "device %d: the CUDA context is dead (%s): the process must be relaunched", dev,
                reason().c_str());
  }
};

// One CUDA stream of the copier (or the dumper). Copies queued between two
// flushes go out as one cudaMemcpyBatchAsync (where the runtime has it; one
// cudaMemcpyAsync each when the batch call fails at run time) followed by one
// blocking-sync event, so a waiting copier sleeps instead of spinning. A
// ticket is done when the event of its flush has completed; a failed flush
// still records its event (or synchronizes the stream), so copies that did go
// out keep their ticket unsettled until the device has passed them.
class CudaStream final : public CopyStream {
 public:
  CudaStream(std::shared_ptr<EngineState> st, cudaStream_t s) : st_(std::move(st)), stream_(s) {}
  ~CudaStream() override {
    DeviceGuard g(st_->dev);
    (void)cudaStreamSynchronize(stream_);
    for (auto& p : inflight_) (void)cudaEventDestroy(p.event);
    for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
    (void)cudaStreamDestroy(stream_);
  }

  Result copy(void* dst, const void* src, uint64_t bytes, uint64_t* ticket) override {
    if (st_->dead.load(std::memory_order_acquire)) return st_->refuse();
    dsts_.push_back(dst);
    srcs_.push_back(src);
    sizes_.push_back(bytes);
    *ticket = ++queued_;
    return Result::kOk;
  }

  Result flush() override {
    if (dsts_.empty()) return Result::kOk;
    const size_t n = dsts_.size();
    const uint64_t first = queued_ - n + 1, last = queued_;
    if (st_->dead.load(std::memory_order_acquire)) {
      clear_queue();
      // Nothing went out, and nothing will: settled and failed at once.
      ledger_.mark_failed(first, last, "the CUDA context is dead: " + st_->reason());
      completed_ = std::max(completed_, last);
      return st_->refuse();
    }
    DeviceGuard g(st_->dev);
    cudaError_t e = g.set_error();
    if (e == cudaSuccess) e = enqueue();
    clear_queue();
    char why[256] = {};
    if (e != cudaSuccess) {
      st_->note(e, "cudaMemcpyAsync");
      std::snprintf(why, sizeof(why), "copying %zu shards (tickets %" PRIu64 "..%" PRIu64 ") on device %d: %s", n,
                    first, last, st_->dev, cudaGetErrorString(e));
      ledger_.mark_failed(first, last, why);
    }
    // Cover every ticket of this flush, enqueued or not, with an event.
    const cudaError_t ev_err = cover(last);
    if (e != cudaSuccess) return fail(Result::kDevice, "%s", why);
    if (ev_err != cudaSuccess)
      return fail(Result::kDevice, "recording the event of tickets %" PRIu64 "..%" PRIu64 " on device %d: %s", first,
                  last, st_->dev, cudaGetErrorString(ev_err));
    return Result::kOk;
  }

  bool done(uint64_t ticket) override {
    retire(false);
    return ticket <= completed_ && ledger_.failed(ticket) == nullptr;
  }

  Result wait(uint64_t ticket) override {
    (void)flush();  // a failure is in the ledger; wait for what went out
    if (completed_ < ticket) retire(true, ticket);
    if (completed_ < ticket) {
      // Only a dead context stops retire(true) early: nothing will land.
      ledger_.mark_failed(completed_ + 1, queued_, "the CUDA context is dead: " + st_->reason());
      completed_ = queued_;
    }
    ledger_.forget_before(ticket);
    if (const std::string* why = ledger_.failed(ticket)) return fail(Result::kDevice, "%s", why->c_str());
    return Result::kOk;
  }

 private:
  struct Pending {
    cudaEvent_t event;
    uint64_t last_ticket;
  };

  cudaError_t enqueue() {
    const size_t n = dsts_.size();
    cudaError_t e = cudaErrorNotSupported;
#if CUDART_VERSION >= 12080
    if (n > 1 && batch_ok_) {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_idx = 0;
#if CUDART_VERSION >= 13000
      // CUDA 13: no failure index.
      e = cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), n, &attr, &attr_idx, 1, stream_);
#else
      // CUDA 12.8 and 12.9 report the index of the failing copy.
      size_t fail_idx = SIZE_MAX;
      e = cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), n, &attr, &attr_idx, 1, &fail_idx, stream_);
#endif
      if (e == cudaSuccess) return e;
      if (cuda_error_is_fatal(static_cast<int>(e))) return e;
      // The batch call is refused (driver too old, a pointer kind it does not
      // take): copy one by one, now and from here on. Copies the batch may
      // have put in flight are copied again: the same bytes, harmless.
      (void)cudaGetLastError();
      batch_ok_ = false;
      UCM_INFO(kDevice, "device %d: cudaMemcpyBatchAsync failed (%s): copying one by one", st_->dev,
               cudaGetErrorString(e));
    }
#endif
    e = cudaSuccess;
    for (size_t i = 0; i < n && e == cudaSuccess; ++i)
      e = cudaMemcpyAsync(dsts_[i], srcs_[i], sizes_[i], cudaMemcpyDefault, stream_);
    return e;
  }

  // Records an event after the copies of tickets up to `last`. Without an
  // event, the stream is synchronized instead, so the tickets settle only
  // once the device has passed them (or the context is gone).
  cudaError_t cover(uint64_t last) {
    cudaEvent_t ev = nullptr;
    cudaError_t e = cudaSuccess;
    if (!free_.empty()) {
      ev = free_.back();
      free_.pop_back();
    } else {
      e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync);
    }
    if (e == cudaSuccess) e = cudaEventRecord(ev, stream_);
    if (e == cudaSuccess) {
      inflight_.push_back({ev, last});
      return e;
    }
    if (ev) (void)cudaEventDestroy(ev);
    st_->note(e, "cudaEventRecord");
    const cudaError_t s = cudaStreamSynchronize(stream_);
    st_->note(s, "cudaStreamSynchronize");
    // Settled either way: the stream drained, or the context died with it.
    retire(true, UINT64_MAX);
    completed_ = std::max(completed_, last);
    if (s != cudaSuccess) ledger_.mark_failed(last, last, std::string("stream lost: ") + cudaGetErrorString(s));
    return e;
  }

  // Retires completed events; with `block`, waits (blocking sync) until
  // `upto` is settled. Stops early only when the context is dead.
  void retire(bool block, uint64_t upto = 0) {
    while (!inflight_.empty()) {
      Pending& p = inflight_.front();
      cudaError_t e = cudaEventQuery(p.event);
      if (e == cudaErrorNotReady) {
        if (!block || completed_ >= upto) return;
        e = cudaEventSynchronize(p.event);
      }
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (st_->note(e, "waiting for copies")) return;
        // A non-fatal error from the event: the copies before it did not
        // all land. Their tickets fail, and settle now.
        ledger_.mark_failed(completed_ + 1, p.last_ticket,
                            std::string("waiting for copies on device ") + std::to_string(st_->dev) + ": " +
                                cudaGetErrorString(e));
      }
      completed_ = p.last_ticket;
      free_.push_back(p.event);
      inflight_.pop_front();
    }
  }

  void clear_queue() {
    dsts_.clear();
    srcs_.clear();
    sizes_.clear();
  }

  std::shared_ptr<EngineState> st_;
  cudaStream_t stream_;
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
  std::deque<Pending> inflight_;
  std::vector<cudaEvent_t> free_;
  TicketLedger ledger_;
  uint64_t queued_ = 0;
  uint64_t completed_ = 0;
  bool batch_ok_ = true;
};

class CudaEngine final : public CopyEngine {
 public:
  explicit CudaEngine(int id) : st_(std::make_shared<EngineState>()) { st_->dev = id; }
  const char* name() const override { return "cuda"; }
  int device_id() const override { return st_->dev; }
  // Page-aligned slots: every shard starts on its own page for DMA.
  uint64_t alignment() const override { return 4096; }

  Result register_host(void* base, uint64_t bytes) override {
    if (st_->dead.load(std::memory_order_acquire)) return st_->refuse();
    DeviceGuard g(st_->dev);
    cudaError_t e = g.set_error();
    int supported = 0;
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&supported, cudaDevAttrHostRegisterSupported, st_->dev);
    if (e == cudaSuccess && !supported)
      return fail(Result::kUnsupported,
                  "device %d cannot register host memory (cudaDevAttrHostRegisterSupported is 0): the shared cache "
                  "cannot be read by DMA on this system",
                  st_->dev);
    if (e == cudaSuccess) e = cudaHostRegister(base, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
      st_->note(e, "cudaHostRegister");
      return fail(Result::kDevice, "cudaHostRegister(%p, %" PRIu64 " bytes) on device %d: %s", base, bytes, st_->dev,
                  cudaGetErrorString(e));
    }
    return Result::kOk;
  }

  void unregister_host(void* base) override {
    DeviceGuard g(st_->dev);
    (void)cudaHostUnregister(base);
  }

  Result open_stream(std::unique_ptr<CopyStream>* out) override {
    if (st_->dead.load(std::memory_order_acquire)) return st_->refuse();
    DeviceGuard g(st_->dev);
    cudaError_t e = g.set_error();
    cudaStream_t s = nullptr;
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      st_->note(e, "cudaStreamCreate");
      return fail(Result::kDevice, "cudaStreamCreate on device %d: %s", st_->dev, cudaGetErrorString(e));
    }
    *out = std::make_unique<CudaStream>(st_, s);
    return Result::kOk;
  }

  std::string pci_bus_id() const override {
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, sizeof(id), st_->dev) != cudaSuccess) {
      (void)cudaGetLastError();
      return {};
    }
    return id;
  }

  // Each pointer must start `bytes` of memory on this device. Pointers into
  // an allocation already checked in this call are looked up, not asked
  // again (an allocation's range comes from cuMemGetAddressRange); nothing is
  // kept across calls, so a freed allocation is caught on the next task.
  Result check_app_buffers(const void* const* ptrs, size_t n, uint64_t bytes, size_t* bad) override {
    if (st_->dead.load(std::memory_order_acquire)) return st_->refuse();
    struct Range {
      uintptr_t lo, hi;
    };
    std::vector<Range> seen;
    DeviceGuard g(st_->dev);
    const DriverCalls& d = driver_calls();
    for (size_t i = 0; i < n; ++i) {
      const uintptr_t p = reinterpret_cast<uintptr_t>(ptrs[i]);
      bool hit = false;
      for (const Range& r : seen)
        if (p >= r.lo && p < r.hi) {
          if (r.hi - p < bytes) {
            *bad = i;
            return fail(Result::kInvalidArg, "%p: only %" PRIu64 " bytes of its allocation remain, %" PRIu64
                        " are copied", ptrs[i], static_cast<uint64_t>(r.hi - p), bytes);
          }
          hit = true;
          break;
        }
      if (hit) continue;
      cudaPointerAttributes a{};
      const cudaError_t e = cudaPointerGetAttributes(&a, ptrs[i]);
      if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *bad = i;
        return fail(Result::kInvalidArg, "%p is not memory CUDA knows (%s)", ptrs[i], cudaGetErrorString(e));
      }
      if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) {
        *bad = i;
        return fail(Result::kInvalidArg, "%p is %s, not memory of device %d", ptrs[i],
                    a.type == cudaMemoryTypeHost ? "pinned host memory" : "not device memory (host memory, or freed)",
                    st_->dev);
      }
      if (a.device != st_->dev) {
        *bad = i;
        return fail(Result::kInvalidArg, "%p is memory of device %d, not of this rank's device %d", ptrs[i],
                    a.device, st_->dev);
      }
      CuDevicePtr base = 0;
      size_t size = 0;
      if (d.address_range && d.address_range(&base, &size, static_cast<CuDevicePtr>(p)) == 0) {
        const Range r{static_cast<uintptr_t>(base), static_cast<uintptr_t>(base + size)};
        if (r.hi - p < bytes) {
          *bad = i;
          return fail(Result::kInvalidArg, "%p: only %" PRIu64 " bytes of its allocation remain, %" PRIu64
                      " are copied", ptrs[i], static_cast<uint64_t>(r.hi - p), bytes);
        }
        seen.push_back(r);
      }
    }
    return Result::kOk;
  }

 private:
  std::shared_ptr<EngineState> st_;
};

}  // namespace

bool cuda_error_is_fatal(int e) {
  switch (e) {
    case 214:  // cudaErrorECCUncorrectable
    case 226:  // cudaErrorContained
    case 700:  // cudaErrorIllegalAddress
    case 702:  // cudaErrorLaunchTimeout
    case 710:  // cudaErrorAssert
    case 714:  // cudaErrorHardwareStackError
    case 715:  // cudaErrorIllegalInstruction
    case 716:  // cudaErrorMisalignedAddress
    case 717:  // cudaErrorInvalidAddressSpace
    case 718:  // cudaErrorInvalidPc
    case 719:  // cudaErrorLaunchFailure
    case 721:  // cudaErrorTensorMemoryLeak
    case 810:  // cudaErrorMpsClientTerminated
    case 911:  // cudaErrorExternalDevice
      return true;
    default:
      return false;
  }
}

int cuda_visible_devices(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
    (void)cudaGetLastError();  // the library's error, not the app's
    return 0;
  }
  return n;
}

std::vector<std::string> cuda_bus_ids(std::string* why) {
  std::vector<std::string> ids;
  const int n = cuda_visible_devices(why);
  for (int d = 0; d < n; ++d) {
    char bus[32] = {};
    const cudaError_t e = cudaDeviceGetPCIBusId(bus, sizeof(bus), d);
    if (e != cudaSuccess) {
      *why = "device " + std::to_string(d) + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
      (void)cudaGetLastError();
      return {};
    }
    ids.emplace_back(bus);
  }
  return ids;
}

bool cuda_app_current_device(int* dev) {
  const DriverCalls& d = driver_calls();
  CuContext ctx = nullptr;
  if (!d.ctx_get || d.ctx_get(&ctx) != 0 || ctx == nullptr) return false;
  if (cudaGetDevice(dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

Result make_cuda_engine(int device_id, std::unique_ptr<CopyEngine>* out) {
  std::string why;
  const int n = cuda_visible_devices(&why);
  if (device_id < 0 || device_id >= n)
    return fail(Result::kDevice, "device_id %d but %d CUDA devices are visible%s%s", device_id, n,
                why.empty() ? "" : ": ", why.c_str());
  DeviceGuard g(device_id);
  if (g.set_error() != cudaSuccess)
    return fail(Result::kDevice, "cudaSetDevice(%d): %s", device_id, cudaGetErrorString(g.set_error()));
  *out = std::make_unique<CudaEngine>(device_id);
  return Result::kOk;
}

}  // namespace ucm
