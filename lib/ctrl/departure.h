// Departure: the node's ranks meet at finalize through the control region,
// not through MPI.
//
// An MPI barrier over the node waits forever for a rank that died (the job
// kept alive by `mpirun --enable-recovery`, or a rank stuck in a debugger).
// Here each rank sets its bit in CtrlGlobals.departing (one fetch_or, then a
// wake of every sleeper) and waits, on that futex word, until every other
// local rank has set its bit or is dead (its process gone: rank_alive()).
// The wait is bounded by the caller's deadline and re-checks liveness every
// slice, so a rank that died while others wait is seen within one slice.
// Nothing is reset: a region's ranks depart once, and a region lives as long
// as one of them maps it.
//
// What it does not guarantee: that a live rank which had not arrived by the
// deadline is not still using the region; it only says which ones those are.
#pragma once

#include <cstdint>
#include <vector>

#include "common/result.h"
#include "ctrl/buffer_ctrl.h"

namespace ucm {

struct DepartureReport {
  std::vector<uint32_t> dead;     // local ranks found dead before they arrived
  std::vector<uint32_t> missing;  // live local ranks that had not arrived by the deadline
};

// Sets `me`'s bit and wakes the sleepers: "this rank has entered finalize".
// Finalize announces at its first step, before it waits for its own calls in
// flight, so that ranks whose drains take long still meet at once afterwards.
void announce_departure(const BufferCtrl& c, uint32_t me);

// Local rank `me` of `ranks` departs (announces, if it has not) and waits for
// the others. kOk when all
// arrived; kPeerDead when every rank that did not arrive is dead (naming
// them); kTimeout at the deadline (naming the live ranks still missing, and
// any dead ones). `slice_ns` bounds each sleep between liveness checks.
[[nodiscard]] Result depart_node(const BufferCtrl& c, uint32_t me, uint32_t ranks, uint64_t deadline_ns,
                                 uint64_t slice_ns, DepartureReport* report);

}  // namespace ucm
