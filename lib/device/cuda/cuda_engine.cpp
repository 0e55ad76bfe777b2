#include "device/cuda/cuda_engine.h"

#include <cuda_runtime.h>

#include <cinttypes>

#include "common/log.h"

namespace ucm {
namespace {

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
