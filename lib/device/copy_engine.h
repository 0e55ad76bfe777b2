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

// One ordered channel of copies, used by one thread (the copier, or the
// dispatcher for dumps). Copies complete in submission order; a ticket names
// a copy, and done(t) means it and every copy before it have landed.
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
  // PCI bus id of the device ("0000:17:00.0"), empty for the host engine.
  virtual std::string pci_bus_id() const = 0;
  [[nodiscard]] virtual Result open_stream(std::unique_ptr<CopyStream>* out) = 0;
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
