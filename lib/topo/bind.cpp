#include <pthread.h>
#include <sched.h>

#include <cstring>
#include <string>

#include "topo/placement.h"

namespace ucm {

Result bind_this_thread(const Placement& p, ThreadRole role) {
  if (!p.enabled) return Result::kOk;
  const std::vector<int>& cpus = p.cpus[static_cast<int>(role)];
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) return fail(Result::kSystem, "binding a %s thread to its cpus: %s", role == ThreadRole::kDispatcher ? "dispatcher" : "copier", strerror(rc));
  return Result::kOk;
}

std::string this_thread_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (pthread_getaffinity_np(pthread_self(), sizeof(set), &set) != 0) return "?";
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    int e = c;
    while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &set)) ++e;
    if (!out.empty()) out += ",";
    out += e == c ? std::to_string(c) : std::to_string(c) + "-" + std::to_string(e);
    c = e;
  }
  return out;
}

}  // namespace ucm
