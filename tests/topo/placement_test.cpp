// Thread placement: distinct cores per role where the machine has them,
// reported sharing where it does not, and a real binding of a real thread.
#include <sched.h>
#include <unistd.h>

#include <thread>

#include <gtest/gtest.h>

#include "topo/node_view.h"
#include "topo/placement.h"
#include "ucm_build_config.h"

#if UCM_HAVE_HWLOC
#include <dlfcn.h>

#include <atomic>

// Every hwloc topology load in this process, whoever makes it: the library's
// calls resolve to this definition (the test binary links its layers
// statically), which counts and hands on to hwloc's own.
namespace {
std::atomic<int> g_hwloc_loads{0};
}  // namespace
struct hwloc_topology;
extern "C" int hwloc_topology_load(struct hwloc_topology* t) {
  g_hwloc_loads.fetch_add(1);
  using Load = int (*)(struct hwloc_topology*);
  static const Load real = reinterpret_cast<Load>(dlsym(RTLD_NEXT, "hwloc_topology_load"));
  return real ? real(t) : -1;
}
#endif

namespace ucm {
namespace {

int cpus_allowed() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  return CPU_COUNT(&set);
}

// Placement and the node view share the process's one topology: a rank's
// init loaded it twice (each kept its own), which on a node with many PCI
// devices costs a good part of a second each time.
TEST(Placement, TheProcessLoadsTheTopologyOnceForPlacementAndTheNodeView) {
#if UCM_HAVE_HWLOC
  Placement p;
  ASSERT_EQ(plan_placement(0, 1, "", true, &p), Result::kOk) << last_error();
  (void)node_view();
  std::string where;
  (void)cpus_near_pci("0000:00:00.0", &where);
  EXPECT_EQ(g_hwloc_loads.load(), 1) << "loads of the hwloc topology in this process";
#else
  GTEST_SKIP() << "built without hwloc: no topology to load";
#endif
}

TEST(Placement, SwitchedOffPinsNothingAndSaysSo) {
  Placement p;
  ASSERT_EQ(plan_placement(0, 4, "", false, &p), Result::kOk);
  EXPECT_FALSE(p.enabled);
  EXPECT_NE(p.summary.find("switched off"), std::string::npos);
  EXPECT_EQ(bind_this_thread(p, ThreadRole::kCopier), Result::kOk);
}

TEST(Placement, RanksGetDistinctCoresWhileTheyLastThenShare) {
  if (!UCM_HAVE_HWLOC) GTEST_SKIP() << "built without hwloc";
  Placement p0, p1;
  ASSERT_EQ(plan_placement(0, 1, "", true, &p0), Result::kOk) << last_error();
  ASSERT_TRUE(p0.enabled) << p0.summary;
  ASSERT_FALSE(p0.cpus[0].empty());
  if (cpus_allowed() >= 2) {
    EXPECT_NE(p0.cpus[0], p0.cpus[1]) << "dispatcher and copier on different cores: " << p0.summary;
    EXPECT_FALSE(p0.shared) << p0.summary;
  }
  // Many ranks on few cores: still a plan, flagged as shared.
  ASSERT_EQ(plan_placement(7, 8, "", true, &p1), Result::kOk);
  EXPECT_TRUE(p1.enabled);
  if (cpus_allowed() < 16) {
    EXPECT_TRUE(p1.shared);
    EXPECT_NE(p1.summary.find("shared"), std::string::npos) << p1.summary;
  }
}

TEST(Placement, AnUnknownGpuFallsBackToAllCoresAndSaysWhy) {
  if (!UCM_HAVE_HWLOC) GTEST_SKIP() << "built without hwloc";
  Placement p;
  ASSERT_EQ(plan_placement(0, 1, "0000:ff:1f.7", true, &p), Result::kOk);
  EXPECT_TRUE(p.enabled);
  EXPECT_NE(p.summary.find("not found by hwloc"), std::string::npos) << p.summary;
}

TEST(Placement, BindingAThreadSetsItsAffinity) {
  if (!UCM_HAVE_HWLOC) GTEST_SKIP() << "built without hwloc";
  Placement p;
  ASSERT_EQ(plan_placement(0, 1, "", true, &p), Result::kOk);
  std::string seen;
  std::thread t([&] {
    ASSERT_EQ(bind_this_thread(p, ThreadRole::kCopier), Result::kOk) << last_error();
    seen = this_thread_affinity();
  });
  t.join();
  std::string want;
  for (int c : p.cpus[1]) want.append(want.empty() ? "" : ",").append(std::to_string(c));
  // Consecutive PUs print as a range; compare as sets via the first and count.
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(std::to_string(p.cpus[1].front()), seen.substr(0, seen.find_first_of(",-"))) << seen << " vs " << want;
  EXPECT_NE(this_thread_affinity(), "") << "the test thread itself is untouched";
}

}  // namespace
}  // namespace ucm
