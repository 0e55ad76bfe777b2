// Names for the library's long-lived threads, as `top -H`, `perf`, gdb and
// /proc/PID/task/TID/comm show them: "ucm-" + a role + the local rank where
// the thread knows it ("ucm-disp0", "ucm-copy0", "ucm-posix", "ucm-posix-watch", "ucm-uring",
// "ucm-sim", "ucm-fanout0", "ucm-ask0", "ucm-touch0"). The kernel keeps 15
// bytes; a longer name is cut.
// Naming never fails the caller: a thread without a name only reads worse in
// a profile.
#pragma once

#include <pthread.h>

#include <cstdint>
#include <cstdio>

namespace ucm {

constexpr uint32_t kNoThreadRank = ~0u;

inline void name_this_thread(const char* role, uint32_t rank = kNoThreadRank) {
  char name[48];
  if (rank == kNoThreadRank)
    std::snprintf(name, sizeof name, "ucm-%.16s", role);
  else
    std::snprintf(name, sizeof name, "ucm-%.16s%u", role, rank);
  name[15] = '\0';  // the kernel's limit (pthread_setname_np refuses a longer one)
  (void)pthread_setname_np(pthread_self(), name);
}

}  // namespace ucm
