// What ucm_info -d reports about the node's processors: CPUs, NUMA nodes and
// the cores nearest a PCI device. Read-only queries on a topology loaded once
// per process; nothing here binds a thread (placement.h does that). Without
// hwloc, only the online CPU count and the process's affinity are known, and
// `why` says so.
#pragma once

#include <string>
#include <vector>

namespace ucm {

struct NumaView {
  unsigned os_index = 0;
  std::string cpus;  // OS cpu list ("0-7,16-23")
};

struct NodeView {
  bool hwloc = false;     // the fields below marked (hwloc) are filled
  int online_cpus = 0;    // sysconf(_SC_NPROCESSORS_ONLN)
  std::string allowed;    // cpus this process may run on (cpu list)
  int packages = 0;       // (hwloc)
  int cores = 0;          // (hwloc)
  int pus = 0;            // (hwloc) hardware threads
  std::vector<NumaView> numa;  // (hwloc)
  std::string why;        // why the (hwloc) fields are empty
};

NodeView node_view();

// The cpus nearest the PCI device `bus_id` ("0000:17:00.0"): those of its
// closest non-I/O ancestor. Empty, with *where saying why, when hwloc is not
// built or does not know the device.
std::string cpus_near_pci(const std::string& bus_id, std::string* where);

}  // namespace ucm
