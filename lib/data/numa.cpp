#include "data/numa.h"

#include <dirent.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace ucm {
namespace {

// The kernel's modes (linux/mempolicy.h), spelled here to need no header.
constexpr int kMpolDefault = 0;
constexpr int kMpolPreferred = 1;
constexpr int kMpolBind = 2;
constexpr int kMpolInterleave = 3;
constexpr int kMpolLocal = 4;
constexpr int kMpolPreferredMany = 5;
constexpr unsigned long kMpolFAddr = 1ul << 1;
constexpr unsigned long kMaskLongs = 16;  // 1024 nodes: above any nr_node_ids

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

// "0-1,3" -> bits.
uint64_t parse_node_list(const std::string& s) {
  uint64_t m = 0;
  size_t i = 0;
  while (i < s.size()) {
    char* end = nullptr;
    const long a = std::strtol(s.c_str() + i, &end, 10);
    if (end == s.c_str() + i) break;
    long b = a;
    i = static_cast<size_t>(end - s.c_str());
    if (i < s.size() && s[i] == '-') {
      b = std::strtol(s.c_str() + i + 1, &end, 10);
      i = static_cast<size_t>(end - s.c_str());
    }
    for (long n = a; n <= b && n < 64; ++n)
      if (n >= 0) m |= 1ull << n;
    if (i < s.size() && s[i] == ',') ++i;
    else break;
  }
  return m;
}

std::string node_list(uint64_t nodes) {
  std::string s;
  for (int n = 0; n < 64; ++n) {
    if (!((nodes >> n) & 1)) continue;
    int e = n;
    while (e + 1 < 64 && ((nodes >> (e + 1)) & 1)) ++e;
    if (!s.empty()) s += ",";
    s += std::to_string(n);
    if (e > n) s.append("-").append(std::to_string(e));
    n = e;
  }
  return s.empty() ? "none" : s;
}

int kernel_mode(NumaMode m) {
  switch (m) {
    case NumaMode::kPreferred: return kMpolPreferred;
    case NumaMode::kInterleave: return kMpolInterleave;
    case NumaMode::kBind: return kMpolBind;
    case NumaMode::kNone: break;
  }
  return kMpolDefault;
}

}  // namespace

uint64_t gpu_numa_nodes(const char* sysfs, uint32_t* gpus, std::string* note) {
  *gpus = 0;
  const std::string dir = std::string(sysfs) + "/bus/pci/devices";
  std::vector<std::string> devs;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      const std::string p = dir + "/" + e->d_name;
      if (read_line(p + "/vendor") != "0x10de") continue;
      const std::string cls = read_line(p + "/class");  // 0x030000 VGA, 0x030200 3D
      if (cls.rfind("0x0300", 0) != 0 && cls.rfind("0x0302", 0) != 0) continue;
      devs.emplace_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(devs.begin(), devs.end());  // bus order, as CUDA_DEVICE_ORDER=PCI_BUS_ID numbers them
  std::vector<bool> use(devs.size(), true);
  std::string how = std::to_string(devs.size()) + " NVIDIA GPU(s) in " + dir;
  if (const char* vis = std::getenv("CUDA_VISIBLE_DEVICES")) {
    // A list of indexes picks among them (CUDA stops at the first entry it
    // cannot use); anything else (UUIDs, MIG) cannot be matched from /sys.
    std::vector<bool> pick(devs.size(), false);
    bool indexes = true;
    std::string v(vis);
    size_t i = 0;
    while (i < v.size()) {
      const size_t j = std::min(v.find(',', i), v.size());
      const std::string tok = v.substr(i, j - i);
      char* end = nullptr;
      const long idx = std::strtol(tok.c_str(), &end, 10);
      if (tok.empty() || *end != '\0') {
        indexes = false;
        break;
      }
      if (idx < 0 || static_cast<size_t>(idx) >= devs.size()) break;
      pick[static_cast<size_t>(idx)] = true;
      i = j + 1;
    }
    if (indexes) {
      use = pick;
      how += ", CUDA_VISIBLE_DEVICES=\"" + v + "\"";
    } else {
      how += ", CUDA_VISIBLE_DEVICES=\"" + v + "\" names no indexes (all counted)";
    }
  }
  uint64_t nodes = 0;
  bool unknown = false;
  for (size_t i = 0; i < devs.size(); ++i) {
    if (!use[i]) continue;
    ++*gpus;
    const std::string n = read_line(dir + "/" + devs[i] + "/numa_node");
    char* end = nullptr;
    const long node = std::strtol(n.c_str(), &end, 10);
    if (n.empty() || node < 0 || node >= 64) unknown = true;
    else nodes |= 1ull << node;
  }
  if (unknown) how += ", some without a NUMA node";
  if (note) *note = how;
  return nodes;
}

uint64_t memory_numa_nodes(const char* sysfs) {
  const std::string base = std::string(sysfs) + "/devices/system/node/";
  uint64_t m = parse_node_list(read_line(base + "has_memory"));
  if (m == 0) m = parse_node_list(read_line(base + "online"));
  return m;
}

NumaPolicy choose_numa_policy(uint64_t gpu_nodes, uint64_t memory_nodes) {
  NumaPolicy p;
  const uint64_t usable = memory_nodes ? gpu_nodes & memory_nodes : gpu_nodes;
  if (usable != 0) {
    p.nodes = usable;
    p.mode = __builtin_popcountll(usable) == 1 ? NumaMode::kPreferred : NumaMode::kInterleave;
    p.why = p.mode == NumaMode::kPreferred ? "every GPU of the node is on NUMA node " + node_list(usable)
                                           : "the node's GPUs are on NUMA nodes " + node_list(usable);
    return p;
  }
  if (memory_nodes == 0) {
    p.why = "no NUMA node information";
    return p;
  }
  p.nodes = memory_nodes;
  p.mode = __builtin_popcountll(memory_nodes) == 1 ? NumaMode::kPreferred : NumaMode::kInterleave;
  p.why = "no GPU NUMA node known: " + std::string(p.mode == NumaMode::kPreferred ? "the only" : "every") +
          " node with memory";
  return p;
}

Result apply_numa_policy(void* base, uint64_t bytes, const NumaPolicy& p) {
  if (p.mode == NumaMode::kNone || p.nodes == 0) return Result::kOk;
  unsigned long mask[kMaskLongs] = {};
  mask[0] = static_cast<unsigned long>(p.nodes);
  // maxnode counts one past the last bit (the kernel's off-by-one).
  if (syscall(SYS_mbind, base, bytes, kernel_mode(p.mode), mask, 64ul + 1, 0ul) != 0)
    return fail(Result::kSystem, "mbind(%p, %llu bytes, %s): %s", base, static_cast<unsigned long long>(bytes),
                describe_numa(p.mode, p.nodes).c_str(), strerror(errno));
  return Result::kOk;
}

Result numa_policy_at(const void* addr, NumaMode* mode, uint64_t* nodes) {
  int m = 0;
  unsigned long mask[kMaskLongs] = {};
  if (syscall(SYS_get_mempolicy, &m, mask, kMaskLongs * 64, addr, kMpolFAddr) != 0)
    return fail(Result::kSystem, "get_mempolicy(MPOL_F_ADDR, %p): %s", addr, strerror(errno));
  m &= 0xff;  // mode flags live above
  *nodes = mask[0];
  switch (m) {
    case kMpolPreferred:
    case kMpolPreferredMany: *mode = NumaMode::kPreferred; break;
    case kMpolInterleave: *mode = NumaMode::kInterleave; break;
    case kMpolBind: *mode = NumaMode::kBind; break;
    case kMpolDefault:
    case kMpolLocal:
    default: *mode = NumaMode::kNone; break;
  }
  return Result::kOk;
}

std::string describe_numa(NumaMode mode, uint64_t nodes) {
  switch (mode) {
    case NumaMode::kPreferred: return "preferred node " + node_list(nodes);
    case NumaMode::kInterleave: return "interleave nodes " + node_list(nodes);
    case NumaMode::kBind: return "bind nodes " + node_list(nodes);
    case NumaMode::kNone: break;
  }
  return "default (no policy)";
}

}  // namespace ucm
