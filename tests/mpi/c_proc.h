/* For the mpi suite's C programs that kill a rank: a monotonic clock in ms,
 * and whether a process is gone (no such pid, or a zombie / dead in /proc). */
#ifndef UCM_TESTS_MPI_C_PROC_H
#define UCM_TESTS_MPI_C_PROC_H

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

static inline double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static inline int gone(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE* f = fopen(path, "r");
  if (!f) return 1;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  const char* p = strrchr(buf, ')');
  return p && (p[2] == 'Z' || p[2] == 'X');
}

#endif
