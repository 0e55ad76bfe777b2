// Process identity that survives pid reuse: (pid, start time in clock ticks
// since boot, from /proc/<pid>/stat). A record in shared memory holds one, and
// any process can tell whether the process it names still runs.
#pragma once

#include <cstdint>

namespace ucm {

struct ProcessIdentity {
  int32_t pid = 0;
  uint32_t pad = 0;
  uint64_t start_ticks = 0;
};

// The calling process.
ProcessIdentity self_identity();

// The process that has `pid` now (start_ticks 0 if there is none).
ProcessIdentity identity_of(int32_t pid);

// True while the named process exists and is not a zombie. A pid that now
// belongs to another process (different start time) is dead.
bool is_alive(const ProcessIdentity& id);

// Start time of `pid` in clock ticks since boot; 0 if it does not exist.
// `state` (optional) receives the one-letter state (R, S, Z, ...).
uint64_t read_start_ticks(int32_t pid, char* state);

}  // namespace ucm

namespace ucm {
// True while `pid` exists and is not a zombie (no pid-reuse guard: for the
// short windows of bootstrap, where only the pid is known).
bool pid_running(int32_t pid);
}  // namespace ucm
