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

// The calling process. start_ticks is 0 when /proc/self/stat cannot be read
// (no /proc in this mount namespace): such a process cannot be told from a
// later one with its pid, so it must not put this identity in a shared record.
ProcessIdentity self_identity();

// The process that has `pid` now (start_ticks 0 if there is none).
ProcessIdentity identity_of(int32_t pid);

// True while some thread of the named process runs (a process whose main
// thread exited while others run shows 'Z' for its pid, and is alive). A pid
// that now belongs to another process (different start time) is dead. Where
// /proc cannot be read, a process is alive while kill(pid, 0) finds it (no
// pid-reuse guard then: callers bound their waits).
bool is_alive(const ProcessIdentity& id);

// Start time of `pid` in clock ticks since boot; 0 if it does not exist.
// `state` (optional) receives the one-letter state (R, S, Z, ...).
uint64_t read_start_ticks(int32_t pid, char* state);

}  // namespace ucm

namespace ucm {
// True while some thread of `pid` runs (no pid-reuse guard: for the short
// windows of bootstrap, where only the pid is known).
bool pid_running(int32_t pid);
}  // namespace ucm
