// NodeView without hwloc: the CPU count and this process's affinity only.
#include <sched.h>
#include <unistd.h>

#include "topo/node_view.h"

namespace ucm {

NodeView node_view() {
  NodeView v;
  v.online_cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (!CPU_ISSET(c, &set)) continue;
      int e = c;
      while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, &set)) ++e;
      if (!v.allowed.empty()) v.allowed += ',';
      v.allowed += e == c ? std::to_string(c) : std::to_string(c) + "-" + std::to_string(e);
      c = e;
    }
  }
  v.why = "built without hwloc";
  return v;
}

std::string cpus_near_pci(const std::string&, std::string* where) {
  *where = "built without hwloc";
  return "";
}

}  // namespace ucm
