// NodeView with hwloc (over the process's one topology, hwloc_topology.h).
#include <hwloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "topo/hwloc_topology.h"
#include "topo/node_view.h"

namespace ucm {
namespace {

std::string list(hwloc_const_bitmap_t set) {
  char* s = nullptr;
  if (hwloc_bitmap_list_asprintf(&s, set) < 0 || !s) return "";
  std::string out(s);
  free(s);
  return out;
}

}  // namespace

NodeView node_view() {
  NodeView v;
  v.online_cpus = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  Result loaded = Result::kOk;
  hwloc_topology_t topo = process_topology(&loaded);
  if (!topo) {
    v.why = "hwloc could not load the topology";
    return v;
  }
  v.hwloc = true;
  v.allowed = list(hwloc_topology_get_allowed_cpuset(topo));
  v.packages = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE);
  v.cores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  v.pus = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU);
  const int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
    v.numa.push_back({o->os_index, o->cpuset ? list(o->cpuset) : ""});
  }
  return v;
}

std::string cpus_near_pci(const std::string& bus_id, std::string* where) {
  Result loaded = Result::kOk;
  hwloc_topology_t topo = process_topology(&loaded);
  if (!topo) {
    *where = "hwloc could not load the topology";
    return "";
  }
  hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(topo, bus_id.c_str());
  hwloc_obj_t anc = pci ? hwloc_get_non_io_ancestor_obj(topo, pci) : nullptr;
  if (!anc || !anc->cpuset) {
    *where = "hwloc does not know PCI device " + bus_id;
    return "";
  }
  char type[32];
  hwloc_obj_type_snprintf(type, sizeof(type), anc, 0);
  *where = std::string(type) + " " + std::to_string(anc->logical_index);
  return list(anc->cpuset);
}

}  // namespace ucm
