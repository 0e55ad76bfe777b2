// The CUDA copy engine (built only with CUDA). Runtime API only: never the
// driver library, so binaries start where no driver is installed. The few
// driver calls it needs (the current context, an allocation's range) are
// fetched at run time through cudaGetDriverEntryPoint*.
//
// Every call the engine makes on an app thread (init, registration, stream
// creation and destruction, the pointer checks, finalize) runs inside a
// DeviceGuard: it saves the thread's current context, switches to the
// engine's device, and restores the app's context afterwards, and it clears
// the thread's pending error for whatever the library's calls left there
// (unless the app already had one pending when the library was called).
//
// A context-fatal error (illegal address, launch failure, ...: "the process
// must be terminated and relaunched") seen by any stream marks the engine
// dead: every later call fails at once with a message that says so, logged
// once, and settles whatever was in flight (the DMA engine is gone with the
// context, so pins may be released).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "device/copy_engine.h"

namespace ucm {
// Number of visible devices; 0 with *why set when the runtime reports an error
// (no driver answers with "insufficient driver", not "no device").
int cuda_visible_devices(std::string* why);
// The visible devices' PCI bus ids in ordinal order (empty, *why set, on error).
std::vector<std::string> cuda_bus_ids(std::string* why);
// True when the calling thread has a current CUDA context (the app chose a
// device); *dev is then its ordinal.
bool cuda_app_current_device(int* dev);
[[nodiscard]] Result make_cuda_engine(int device_id, std::unique_ptr<CopyEngine>* out);
// True for the errors after which the CUDA context is unusable.
bool cuda_error_is_fatal(int cuda_error);
}  // namespace ucm
