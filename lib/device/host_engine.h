#pragma once

#include <memory>

#include "device/copy_engine.h"

namespace ucm {
std::unique_ptr<CopyEngine> make_host_engine(int device_id);
}  // namespace ucm
