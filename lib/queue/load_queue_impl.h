// What LoadQueue's sources share (load_queue.cpp: the dispatcher, loads and
// the store's completions; copier.cpp: the copier; dump_path.cpp: dumps and
// their write-throughs; space_wait.cpp: the waits for a free slot). Internal
// to queue/: nothing outside the layer includes it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "queue/load_queue.h"

namespace ucm {
namespace load_queue_impl {

constexpr uint64_t kStopCheckNs = 20'000'000;  // how often blocked threads look at stopping_
// A get that has waited this long for space no longer waits for level ranks
// on slots of later tasks (ctrl/protect_relax.h): a rank that progresses takes
// what it is owed well within it.
constexpr uint64_t kRelaxLevelNs = 5'000'000;
constexpr uint64_t kLookShare = 9;
// The least time an I/O is in flight before it counts as stuck (stuck_at).
constexpr uint64_t kStuckFloorNs = 250'000'000;  // a wait for space sleeps 9x as long as its last look took (space_bell.h)

inline void add(std::atomic<uint64_t>& c, uint64_t v) { c.fetch_add(v, std::memory_order_relaxed); }

// How far the eviction protection holds for a get of task t that has waited
// for space since `since`, and when that steps up next (space_wait.cpp).
ProtectRelax relax_after(const Task& t, uint64_t now, uint64_t since);
uint64_t next_relax_ns(const Task& t, uint64_t since, ProtectRelax now_at);

}  // namespace load_queue_impl

// One backend I/O into a slot. Holds its own pin on the slot until done.
struct LoadQueue::Io {
  IoRequest req;
  LoadQueue* queue;
  std::shared_ptr<Task> task;  // dumps: the entry completes with the write
  uint32_t index;
  uint32_t slot;
  bool is_load;
  uint64_t deadline_ns = kNoDeadline;  // the task's
  uint64_t stuck_at_ns = kNoDeadline;  // when it counts as stuck (stuck_at)
  uint32_t word = 0;                   // the slot's word when the load began (abandon_load's check)
  bool expired = false;                // under io_mu_: the completion is late, and only drops the pin
  bool stuck = false;                  // under io_mu_: counted in io_stuck_, not io_inflight_
};

}  // namespace ucm
