#pragma once

#include <functional>
#include <memory>

#include "device/copy_engine.h"

namespace ucm {
std::unique_ptr<CopyEngine> make_host_engine(int device_id);

// An engine over host memory (nothing to register, no device, 64-byte
// alignment) whose streams `open` makes: the host engine and the async-test
// engine differ only in their streams.
std::unique_ptr<CopyEngine> make_memory_engine(const char* name, int device_id,
                                               std::function<std::unique_ptr<CopyStream>()> open);
}  // namespace ucm
