// Copy engines: how bytes move from a cache slot to where a rank wants them.
//
// `host` (memcpy) is always built; `cuda` (device/cuda/) is built when CUDA is
// found and is reached only through make_copy_engine(), so nothing outside
// device/ knows which one it has. An engine registers the node's data-plane
// segments once (CUDA: cudaHostRegister, so DMA reads the shared pages
// directly) and says which shard-size multiple its copies need.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/result.h"

namespace ucm {

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual const char* name() const = 0;
  virtual int device_id() const = 0;
  // Shard sizes must be a multiple of this for the engine's copies.
  virtual uint64_t alignment() const = 0;
  [[nodiscard]] virtual Result register_host(void* base, uint64_t bytes) = 0;
  virtual void unregister_host(void* base) = 0;
  // PCI bus id of the device ("0000:17:00.0"), empty for the host engine.
  virtual std::string pci_bus_id() const = 0;
};

struct DeviceStatus {
  bool cuda_built = false;
  bool nccl_built = false;
  int visible_devices = 0;   // 0 without CUDA, or when the driver has none
  std::string cuda_error;    // why there are none, when CUDA is built
};

DeviceStatus device_status();

// device_id >= 0: that GPU (the CUDA engine), or the host engine when CUDA is
// not built / has no devices and `allow_host_fallback`. A scheduler rank
// (device_id < 0) gets no engine (*out stays null).
[[nodiscard]] Result make_copy_engine(int device_id, bool allow_host_fallback, std::unique_ptr<CopyEngine>* out);

}  // namespace ucm
