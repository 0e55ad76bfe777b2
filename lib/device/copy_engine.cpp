// The one place that knows which engines were built, and which one a rank gets.
#include "device/copy_engine.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <system_error>
#include <thread>

#include "common/log.h"
#include "device/host_engine.h"
#include "ucm_build_config.h"
#include "ucm_build_config.h"
#if UCM_HAVE_CUDA
#include "device/cuda/cuda_engine.h"
#endif

namespace ucm {

const char* engine_kind_name(EngineKind k) {
  switch (k) {
    case EngineKind::kAuto: return "auto";
    case EngineKind::kCuda: return "cuda";
    case EngineKind::kHost: return "host";
    case EngineKind::kAsyncTest: return "async-test";
  }
  return "?";
}

DeviceStatus device_status() {
  DeviceStatus s;
  // The kernel driver's file exists wherever an NVIDIA GPU is set up, also
  // when the user-space driver is older than the runtime (error 35): that node
  // has GPUs, and copying with memcpy into the app's device pointers would be
  // wrong. Without it, "insufficient driver" means "no GPU here".
  s.driver_present = access("/proc/driver/nvidia/version", F_OK) == 0;
#if UCM_HAVE_CUDA
  s.cuda_built = true;
  s.visible_devices = cuda_visible_devices(&s.cuda_error);
#else
  s.cuda_error = "built without CUDA";
#endif
  // Finding NCCL at configure time is not using it: no code of the library
  // calls NCCL yet, so the library does not link it and says it is not built.
  s.nccl_built = UCM_HAVE_NCCL != 0;  // fan-out's seam calls NCCL (device/cuda/coll_nccl.cpp)
  return s;
}

std::vector<std::string> gpu_bus_ids(std::string* why) {
#if UCM_HAVE_CUDA
  return cuda_bus_ids(why);
#else
  *why = "built without CUDA";
  return {};
#endif
}

Result make_copy_engine(const EngineChoice& c, std::unique_ptr<CopyEngine>* out, EngineTaken* taken) {
  out->reset();
  *taken = EngineTaken{};
  if (!c.auto_device && c.device_id < 0) {
    taken->why = "scheduler rank (device_id < 0): no copy engine";
    return Result::kOk;
  }
  if (c.kind == EngineKind::kHost || c.kind == EngineKind::kAsyncTest) {
    taken->device_id = c.auto_device ? c.local_rank : c.device_id;
    taken->why = std::string("copy_engine=") + engine_kind_name(c.kind) + " configured: destinations are host memory";
    *out = c.kind == EngineKind::kHost ? make_host_engine(taken->device_id)
                                       : make_async_test_engine(taken->device_id, c.async);
    return Result::kOk;
  }
  const DeviceStatus s = device_status();
  const bool gpu_node = s.visible_devices > 0 || s.driver_present;
  if (c.kind == EngineKind::kAuto && c.auto_device && !gpu_node) {
    taken->device_id = c.local_rank;
    taken->why = "no GPU on this node (" + s.cuda_error + "): host engine, as copy_engine=auto allows";
    UCM_DEBUG(kDevice, "%s", taken->why.c_str());  // the rank's "device and placement" line says it at info
    *out = make_host_engine(taken->device_id);
    return Result::kOk;
  }
#if UCM_HAVE_CUDA
  int dev = c.device_id;
  if (c.auto_device) {
    if (s.visible_devices <= 0)
      return fail(Result::kDevice, "device_id auto needs a CUDA device (copy_engine=%s), but none is usable: %s%s",
                  engine_kind_name(c.kind), s.cuda_error.c_str(),
                  s.driver_present ? " (an NVIDIA driver is loaded: is it older than this CUDA runtime?)" : "");
    int current = -1;
    if (cuda_app_current_device(&current) && current >= 0 && current < s.visible_devices) {
      dev = current;
      taken->why = "auto: the app's current device " + std::to_string(dev);
    } else {
      dev = c.local_rank % s.visible_devices;
      taken->why = "auto: local rank " + std::to_string(c.local_rank) + " modulo " +
                   std::to_string(s.visible_devices) + " visible GPUs";
    }
  } else {
    taken->why = "configured device_id " + std::to_string(dev);
  }
  UCM_CHECK(make_cuda_engine(dev, out));
  taken->device_id = dev;
  return Result::kOk;
#else
  // The same words as device_status().cuda_error, so one message serves both.
  return fail(Result::kDevice, "device_id %s with copy_engine=%s needs CUDA, but this library is built without CUDA",
              c.auto_device ? "auto" : std::to_string(c.device_id).c_str(), engine_kind_name(c.kind));
#endif
}

Result register_segments(CopyEngine* engine, const std::vector<std::pair<void*, uint64_t>>& segments,
                         uint32_t max_threads, Registration* out) {
  *out = Registration{};
  const auto start = std::chrono::steady_clock::now();
  const size_t n = segments.size();
  const uint32_t threads = static_cast<uint32_t>(std::min<size_t>(n, std::max<uint32_t>(max_threads, 1)));
  std::vector<Result> results(n, Result::kOk);
  std::vector<std::string> errors(n);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      results[i] = engine->register_host(segments[i].first, segments[i].second);
      if (!ok(results[i])) errors[i] = last_error();
    }
  };
  std::vector<std::thread> pool;
  try {
    for (uint32_t t = 1; t < threads; ++t) pool.emplace_back(work);
  } catch (const std::system_error&) {
    // Fewer threads than asked: the ones we have (and this one) do the rest.
  }
  work();
  for (auto& t : pool) t.join();
  out->threads = static_cast<uint32_t>(pool.size() + 1);
  out->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  Result first = Result::kOk;
  size_t first_index = 0;
  for (size_t i = 0; i < n; ++i) {
    if (ok(results[i])) out->registered.push_back(segments[i].first);
    else if (ok(first)) first = results[i], first_index = i;
  }
  if (!ok(first))
    return fail(first, "registering segment %zu of %zu: %s", first_index, n, errors[first_index].c_str());
  return Result::kOk;
}

}  // namespace ucm
