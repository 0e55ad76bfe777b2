#include "sync/process_identity.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ucm {
namespace {

// Reads /proc/<path>/stat: the one-letter state and the start time (field 22).
// Returns 0 on success, else the errno of the failure (ENOENT: no such task).
int read_stat(const char* path, char* state, uint64_t* ticks) {
  int fd;
  do fd = ::open(path, O_RDONLY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) return errno;
  char buf[1024];
  ssize_t n;
  do n = ::read(fd, buf, sizeof(buf) - 1);
  while (n < 0 && errno == EINTR);
  const int e = n < 0 ? errno : 0;
  ::close(fd);
  if (n <= 0) return n < 0 ? e : ESRCH;  // an empty stat: the task is being torn down
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and parentheses: fields after it
  // are counted from the last ')'.
  char* p = std::strrchr(buf, ')');
  if (!p || p[1] == '\0') return EINVAL;
  p += 2;  // field 3: state
  if (state) *state = *p;
  // Field 22 is starttime: skip fields 3..21 (19 fields).
  for (int field = 3; field < 22; ++field) {
    p = std::strchr(p, ' ');
    if (!p) return EINVAL;
    ++p;
  }
  *ticks = std::strtoull(p, nullptr, 10);
  return 0;
}

bool exited(char state) { return state == 'Z' || state == 'X' || state == 'x'; }

// The thread-group leader shows Z as soon as the main thread exits (for
// example through pthread_exit), while the other threads still run: the
// process lives until its last task is gone. So look at every task.
bool any_task_running(int32_t pid) {
  char dir[64];
  std::snprintf(dir, sizeof(dir), "/proc/%d/task", pid);
  DIR* d = opendir(dir);
  if (!d) return false;
  bool running = false;
  while (const dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char path[320];
    std::snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", pid, e->d_name);
    char st = 'X';
    uint64_t t = 0;
    if (read_stat(path, &st, &t) == 0 && !exited(st)) {
      running = true;
      break;
    }
  }
  closedir(d);
  return running;
}

// /proc can be unreadable (not mounted in this mount namespace, hidepid): then
// a missing /proc/<pid>/stat says nothing about <pid>.
bool proc_usable() {
  char st = '?';
  uint64_t t = 0;
  return read_stat("/proc/self/stat", &st, &t) == 0;
}

enum class Seen { kRunning, kGone, kUnknown };

// What /proc says of pid; ticks gets its start time when it exists.
Seen look_at(int32_t pid, uint64_t* ticks) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  char st = '?';
  const int e = read_stat(path, &st, ticks);
  if (e == 0) return exited(st) && !any_task_running(pid) ? Seen::kGone : Seen::kRunning;
  if ((e == ENOENT || e == ESRCH) && proc_usable()) return Seen::kGone;
  return Seen::kUnknown;
}

// Without /proc: kill(pid, 0) still tells "no such process" (ESRCH) from
// "exists" (0, or EPERM for another user's). It cannot see a zombie or a
// reused pid, so a peer may look alive longer than it is: every wait on a
// peer has its own deadline, which is the safe side of that error.
bool signal_says_exists(int32_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

}  // namespace

uint64_t read_start_ticks(int32_t pid, char* state) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  uint64_t ticks = 0;
  return read_stat(path, state, &ticks) == 0 ? ticks : 0;
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
  uint64_t ticks = 0;
  switch (look_at(id.pid, &ticks)) {
    case Seen::kRunning: return ticks == id.start_ticks;  // another start time: a reused pid
    case Seen::kGone: return false;
    case Seen::kUnknown: break;
  }
  return signal_says_exists(id.pid);
}

bool pid_running(int32_t pid) {
  if (pid <= 0) return false;
  uint64_t ticks = 0;
  switch (look_at(pid, &ticks)) {
    case Seen::kRunning: return true;
    case Seen::kGone: return false;
    case Seen::kUnknown: break;
  }
  return signal_says_exists(pid);
}

}  // namespace ucm
