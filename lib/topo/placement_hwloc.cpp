// Placement with hwloc (over the process's one topology, hwloc_topology.h).
#include <hwloc.h>

#include <cstdio>

#include "common/log.h"
#include "topo/hwloc_topology.h"
#include "topo/placement.h"

namespace ucm {
namespace {

std::string cpu_list(const std::vector<int>& cpus) {
  std::string s;
  for (int c : cpus) {
    if (!s.empty()) s += ',';
    s += std::to_string(c);
  }
  return s;
}

// The cores threads may run on: the allowed ones near the GPU when hwloc
// finds it, else all allowed ones. `where` says which, for the summary.
hwloc_bitmap_t scope_near_gpu(hwloc_topology_t topo, const std::string& gpu_bus_id, std::string* where) {
  hwloc_const_cpuset_t allowed = hwloc_topology_get_allowed_cpuset(topo);
  hwloc_bitmap_t scope = hwloc_bitmap_dup(allowed);
  *where = "all allowed cores";
  if (gpu_bus_id.empty()) return scope;
  hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(topo, gpu_bus_id.c_str());
  hwloc_obj_t anc = pci ? hwloc_get_non_io_ancestor_obj(topo, pci) : nullptr;
  char buf[160];
  if (anc && anc->cpuset && hwloc_bitmap_intersects(anc->cpuset, allowed)) {
    hwloc_bitmap_and(scope, scope, anc->cpuset);
    char type[32];
    hwloc_obj_type_snprintf(type, sizeof(type), anc, 0);
    std::snprintf(buf, sizeof(buf), "cores of %s %u near GPU %s", type, anc->logical_index, gpu_bus_id.c_str());
  } else {
    std::snprintf(buf, sizeof(buf), "all allowed cores (GPU %s not found by hwloc)", gpu_bus_id.c_str());
  }
  *where = buf;
  return scope;
}

// The candidate cores, in logical order, each as its PUs' OS indexes.
std::vector<std::vector<int>> cores_in(hwloc_topology_t topo, hwloc_const_bitmap_t scope) {
  std::vector<std::vector<int>> cores;
  const int ncores = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE);
  for (int i = 0; i < ncores; ++i) {
    hwloc_obj_t core = hwloc_get_obj_by_type(topo, HWLOC_OBJ_CORE, static_cast<unsigned>(i));
    if (!core->cpuset || !hwloc_bitmap_intersects(core->cpuset, scope)) continue;
    std::vector<int> pus;
    int pu;
    hwloc_bitmap_foreach_begin(pu, core->cpuset) {
      if (hwloc_bitmap_isset(scope, static_cast<unsigned>(pu))) pus.push_back(pu);
    }
    hwloc_bitmap_foreach_end();
    cores.push_back(pus);
  }
  return cores;
}

// Local rank r's dispatcher on core 2r, its copier on core 2r+1 (mod the
// candidates); shared when the node has fewer cores than queue threads.
Placement assign_cores(const std::vector<std::vector<int>>& cores, int local_rank, int local_size,
                       const std::string& where) {
  Placement p;
  const size_t n = cores.size();
  const size_t d = (2 * static_cast<size_t>(local_rank)) % n;
  const size_t c = (2 * static_cast<size_t>(local_rank) + 1) % n;
  p.enabled = true;
  p.cpus[0] = cores[d];
  p.cpus[1] = cores[c];
  p.shared = n < 2 * static_cast<size_t>(local_size);
  char buf[512];
  std::snprintf(buf, sizeof(buf), "dispatcher on cpu %s, copier on cpu %s (%s%s)", cpu_list(p.cpus[0]).c_str(),
                cpu_list(p.cpus[1]).c_str(), where.c_str(),
                p.shared ? "; shared: fewer cores than the node's queue threads" : "");
  p.summary = buf;
  return p;
}

}  // namespace

Result plan_placement(int local_rank, int local_size, const std::string& gpu_bus_id, bool enable, Placement* out) {
  Placement p;
  if (!enable) {
    p.summary = "not bound (binding switched off)";
    *out = p;
    return Result::kOk;
  }
  Result loaded = Result::kOk;
  hwloc_topology_t topo = process_topology(&loaded);
  if (!topo) return fail(loaded, "loading the hwloc topology failed");
  std::string where;
  hwloc_bitmap_t scope = scope_near_gpu(topo, gpu_bus_id, &where);
  const std::vector<std::vector<int>> cores = cores_in(topo, scope);
  hwloc_bitmap_free(scope);
  if (cores.empty()) {
    p.summary = "not bound (hwloc found no usable core)";
    *out = p;
    return Result::kOk;
  }
  *out = assign_cores(cores, local_rank, local_size, where);
  return Result::kOk;
}

}  // namespace ucm
