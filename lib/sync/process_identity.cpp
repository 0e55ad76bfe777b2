#include "sync/process_identity.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ucm {

uint64_t read_start_ticks(int32_t pid, char* state) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: fields after it
  // are counted from the last ')'.
  char* p = std::strrchr(buf, ')');
  if (!p || p[1] == '\0') return 0;
  p += 2;  // field 3: state
  if (state) *state = *p;
  // Field 22 is starttime: skip fields 3..21 (19 fields).
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (!p) return 0;
    ++p;
  }
  return std::strtoull(p, nullptr, 10);
}

ProcessIdentity self_identity() {
  ProcessIdentity id;
  id.pid = static_cast<int32_t>(getpid());
  id.start_ticks = read_start_ticks(id.pid, nullptr);
  return id;
}

ProcessIdentity identity_of(int32_t pid) {
  ProcessIdentity id;
  id.pid = pid;
  id.start_ticks = pid > 0 ? read_start_ticks(pid, nullptr) : 0;
  return id;
}

bool is_alive(const ProcessIdentity& id) {
  if (id.pid <= 0) return false;
  char state = '?';
  uint64_t ticks = read_start_ticks(id.pid, &state);
  if (ticks == 0) return false;
  if (state == 'Z' || state == 'X' || state == 'x') return false;
  return ticks == id.start_ticks;
}

}  // namespace ucm

namespace ucm {
bool pid_running(int32_t pid) {
  char state = '?';
  return pid > 0 && read_start_ticks(pid, &state) != 0 && state != 'Z' && state != 'X' && state != 'x';
}
}  // namespace ucm
