// The CUDA copy engine (built only with CUDA). Runtime API only: never the
// driver library, so binaries start where no driver is installed.
#pragma once

#include <memory>

#include "device/copy_engine.h"

namespace ucm {
// Number of visible devices; 0 with *why set when the runtime reports an error
// (no driver answers with "insufficient driver", not "no device").
int cuda_visible_devices(std::string* why);
[[nodiscard]] Result make_cuda_engine(int device_id, std::unique_ptr<CopyEngine>* out);
}  // namespace ucm
