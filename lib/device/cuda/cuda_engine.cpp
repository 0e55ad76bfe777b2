#include "device/cuda/cuda_engine.h"

#include <cuda_runtime.h>

#include <cinttypes>
#include <deque>
#include <vector>

#include "common/log.h"

namespace ucm {
namespace {

// One CUDA stream of the copier (or the dumper). Copies queued between two
// flushes go out as one cudaMemcpyBatchAsync (CUDA >= 12.8) or one
// cudaMemcpyAsync each, followed by one event; a ticket is done when the
// event of its flush has completed.
class CudaStream final : public CopyStream {
 public:
  CudaStream(int dev, cudaStream_t s) : dev_(dev), stream_(s) {}
  ~CudaStream() override {
    cudaSetDevice(dev_);
    cudaStreamSynchronize(stream_);
    for (auto& p : inflight_) cudaEventDestroy(p.event);
    for (cudaEvent_t e : free_) cudaEventDestroy(e);
    cudaStreamDestroy(stream_);
  }

  Result copy(void* dst, const void* src, uint64_t bytes, uint64_t* ticket) override {
    dsts_.push_back(dst);
    srcs_.push_back(src);
    sizes_.push_back(bytes);
    *ticket = ++queued_;
    return Result::kOk;
  }

  Result flush() override {
    if (dsts_.empty()) return Result::kOk;
    cudaError_t e = cudaSetDevice(dev_);
#if CUDART_VERSION >= 12080
    if (e == cudaSuccess && dsts_.size() > 1) {
      cudaMemcpyAttributes attr{};
      attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t attr_idx = 0;
      e = cudaMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), dsts_.size(), &attr, &attr_idx, 1, stream_);
    } else
#endif
    {
      for (size_t i = 0; i < dsts_.size() && e == cudaSuccess; ++i)
        e = cudaMemcpyAsync(dsts_[i], srcs_[i], sizes_[i], cudaMemcpyDefault, stream_);
    }
    const size_t n = dsts_.size();
    dsts_.clear();
    srcs_.clear();
    sizes_.clear();
    if (e != cudaSuccess)
      return fail(Result::kDevice, "copying %zu shards on device %d: %s", n, dev_, cudaGetErrorString(e));
    cudaEvent_t ev;
    if (!free_.empty()) {
      ev = free_.back();
      free_.pop_back();
    } else if ((e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) {
      return fail(Result::kDevice, "cudaEventCreate on device %d: %s", dev_, cudaGetErrorString(e));
    }
    if ((e = cudaEventRecord(ev, stream_)) != cudaSuccess)
      return fail(Result::kDevice, "cudaEventRecord on device %d: %s", dev_, cudaGetErrorString(e));
    inflight_.push_back({ev, queued_});
    return Result::kOk;
  }

  bool done(uint64_t ticket) override {
    while (!inflight_.empty() && cudaEventQuery(inflight_.front().event) == cudaSuccess) retire_front();
    return ticket <= completed_;
  }

  Result wait(uint64_t ticket) override {
    UCM_CHECK(flush());
    while (completed_ < ticket && !inflight_.empty()) {
      const cudaError_t e = cudaEventSynchronize(inflight_.front().event);
      if (e != cudaSuccess)
        return fail(Result::kDevice, "waiting for copies on device %d: %s", dev_, cudaGetErrorString(e));
      retire_front();
    }
    return Result::kOk;
  }

 private:
  struct Pending {
    cudaEvent_t event;
    uint64_t last_ticket;
  };
  void retire_front() {
    completed_ = inflight_.front().last_ticket;
    free_.push_back(inflight_.front().event);
    inflight_.pop_front();
  }

  int dev_;
  cudaStream_t stream_;
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
  std::deque<Pending> inflight_;
  std::vector<cudaEvent_t> free_;
  uint64_t queued_ = 0;
  uint64_t completed_ = 0;
};

class CudaEngine final : public CopyEngine {
 public:
  explicit CudaEngine(int id) : id_(id) {}
  const char* name() const override { return "cuda"; }
  int device_id() const override { return id_; }
  // Page-aligned slots: every shard starts on its own page for DMA.
  uint64_t alignment() const override { return 4096; }
  Result register_host(void* base, uint64_t bytes) override {
    cudaError_t e = cudaSetDevice(id_);
    if (e == cudaSuccess) e = cudaHostRegister(base, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess)
      return fail(Result::kDevice, "cudaHostRegister(%p, %" PRIu64 " bytes) on device %d: %s", base, bytes, id_,
                  cudaGetErrorString(e));
    return Result::kOk;
  }
  void unregister_host(void* base) override {
    cudaSetDevice(id_);
    (void)cudaHostUnregister(base);
  }
  Result open_stream(std::unique_ptr<CopyStream>* out) override {
    cudaError_t e = cudaSetDevice(id_);
    cudaStream_t s = nullptr;
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return fail(Result::kDevice, "cudaStreamCreate on device %d: %s", id_, cudaGetErrorString(e));
    *out = std::make_unique<CudaStream>(id_, s);
    return Result::kOk;
  }
  std::string pci_bus_id() const override {
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, sizeof(id), id_) != cudaSuccess) return {};
    return id;
  }

 private:
  int id_;
};

}  // namespace

int cuda_visible_devices(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    if (why) *why = cudaGetErrorString(e);
    (void)cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

Result make_cuda_engine(int device_id, std::unique_ptr<CopyEngine>* out) {
  std::string why;
  const int n = cuda_visible_devices(&why);
  if (device_id >= n)
    return fail(Result::kDevice, "device_id %d but %d CUDA devices are visible%s%s", device_id, n,
                why.empty() ? "" : ": ", why.c_str());
  const cudaError_t e = cudaSetDevice(device_id);
  if (e != cudaSuccess) return fail(Result::kDevice, "cudaSetDevice(%d): %s", device_id, cudaGetErrorString(e));
  *out = std::make_unique<CudaEngine>(device_id);
  return Result::kOk;
}

}  // namespace ucm
