// The one place that knows which engines were built.
#include "device/copy_engine.h"

#include "common/log.h"
#include "device/host_engine.h"
#include "ucm_build_config.h"
#if UCM_HAVE_CUDA
#include "device/cuda/cuda_engine.h"
#endif

namespace ucm {

DeviceStatus device_status() {
  DeviceStatus s;
#if UCM_HAVE_CUDA
  s.cuda_built = true;
  s.visible_devices = cuda_visible_devices(&s.cuda_error);
#else
  s.cuda_error = "built without CUDA";
#endif
  s.nccl_built = UCM_HAVE_NCCL;
  return s;
}

Result make_copy_engine(int device_id, bool allow_host_fallback, std::unique_ptr<CopyEngine>* out) {
  out->reset();
  if (device_id < 0) return Result::kOk;  // a scheduler rank copies nothing
  const DeviceStatus s = device_status();
#if UCM_HAVE_CUDA
  if (s.visible_devices > 0) return make_cuda_engine(device_id, out);
#endif
  if (!allow_host_fallback)
    return fail(Result::kDevice, "device_id %d asked for, but no GPU is usable: %s", device_id, s.cuda_error.c_str());
  UCM_INFO(kDevice, "no usable GPU (%s): device %d copies with the host engine", s.cuda_error.c_str(), device_id);
  *out = make_host_engine(device_id);
  return Result::kOk;
}

}  // namespace ucm
