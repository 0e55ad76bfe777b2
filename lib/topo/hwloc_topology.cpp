#include "topo/hwloc_topology.h"

#include <mutex>
#include <string>

namespace ucm {

hwloc_topology_t process_topology(Result* r) {
  static hwloc_topology_t topo = nullptr;
  static Result status = Result::kOk;
  static std::string why;
  static std::once_flag once;
  std::call_once(once, [] {
    hwloc_topology_t t = nullptr;
    if (hwloc_topology_init(&t) != 0) {
      status = Result::kSystem;
      why = "hwloc_topology_init failed";
      return;
    }
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(t) != 0) {
      hwloc_topology_destroy(t);
      status = Result::kSystem;
      why = "hwloc_topology_load failed";
      return;
    }
    topo = t;
  });
  *r = status;
  // Named for every caller (the once's own fail() would reach only the first).
  if (!topo) (void)fail(status, "%s", why.c_str());
  return topo;
}

}  // namespace ucm
