// NUMA placement of the data plane, by the raw syscalls (no libnuma).
//
// The data plane is read by the node's GPUs (host-to-device copies), so its
// pages belong near them: interleaved over the NUMA nodes of the node's GPUs
// when they span several, preferred on the one node they share otherwise
// (preferred, not bound: a node that runs out spills over instead of failing
// a populate). Without GPU information (none visible, or firmware that gives
// no numa_node), the plane is interleaved over every node with memory, or
// preferred on the only one. The GPUs are NVIDIA PCI display/3D devices
// under /sys/bus/pci/devices, in bus order, filtered by CUDA_VISIBLE_DEVICES
// when it lists indexes (UUIDs cannot be matched from /sys: then all count,
// and the reason says so). Each rank computes its own mask; the caller ORs
// them over the node, so the plane does not follow one rank's view alone.
//
// The policy is set with mbind() on each segment's mapping before it is
// populated. For an ordinary memfd (shmem) it is the file's shared policy, so
// every rank's mapping reports it (get_mempolicy(MPOL_F_ADDR)); for hugetlb
// it is the creator's mapping's, which is the one that faults the pages in.
#pragma once

#include <cstdint>
#include <string>

#include "common/result.h"

namespace ucm {

enum class NumaMode : uint32_t { kNone = 0, kPreferred = 1, kInterleave = 2, kBind = 3 };

struct NumaPolicy {
  NumaMode mode = NumaMode::kNone;
  uint64_t nodes = 0;  // bit n: NUMA node n (nodes past 63 are not placed)
  std::string why;     // how it was chosen
};

// NUMA nodes of the GPUs this process may use (bit n = node n), from
// `sysfs` (normally "/sys"); *gpus counts them, *note says what was read.
uint64_t gpu_numa_nodes(const char* sysfs, uint32_t* gpus, std::string* note);
// Nodes with memory (has_memory, else online), bit n = node n.
uint64_t memory_numa_nodes(const char* sysfs);
// The placement for a data plane read by GPUs on `gpu_nodes` (0: unknown).
NumaPolicy choose_numa_policy(uint64_t gpu_nodes, uint64_t memory_nodes);

// Sets the policy on [base, base + bytes) (page aligned). kNone does nothing.
[[nodiscard]] Result apply_numa_policy(void* base, uint64_t bytes, const NumaPolicy& p);
// The policy the kernel reports for the page at addr: mode and nodes.
[[nodiscard]] Result numa_policy_at(const void* addr, NumaMode* mode, uint64_t* nodes);
// "preferred node 0", "interleave nodes 0-1", "default"...
std::string describe_numa(NumaMode mode, uint64_t nodes);

}  // namespace ucm
