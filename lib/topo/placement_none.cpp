// Placement without hwloc: nothing is pinned, and the summary says why.
#include "topo/placement.h"

namespace ucm {

Result plan_placement(int, int, const std::string&, bool enable, Placement* out) {
  Placement p;
  p.summary = enable ? "not bound (built without hwloc)" : "not bound (binding switched off)";
  *out = p;
  return Result::kOk;
}

}  // namespace ucm
