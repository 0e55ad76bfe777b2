// How far the eviction protection (protect.h) holds for one miss's sweep.
// Protection saves reloads; it must not fail a task or stall ranks for a
// grace at a time. A get that has waited for a free slot a while relaxes it
// (the load queue decides when, queue/load_queue.cpp get_with_backpressure):
//   kStrict      every rule of protect.h.
//   kLevelLater  also no wait for a copier level with the evictor (the same
//                tasks_passed) on a slot stamped for a task after the
//                evictor's: such a copier cannot take it before it has
//                finished the task it shares with the evictor, which may need
//                this very slot. Waits among level ranks for later tasks were
//                a cycle the order of waits did not break (a rank with tasks
//                queued ahead loaded them, two level ranks behind it each
//                waited for the other: a grace at a time, and tasks failing
//                with UCM_ERR_NO_SPACE; session 20).
//   kNone        no protection at all: the get's task has spent half of the
//                time it had left when it began to wait, so a copier that
//                does not come (paused, or protected by a grace longer than
//                the task timeout) costs a reload, never a failed task.
#pragma once

#include <cstdint>

namespace ucm {

enum class ProtectRelax : uint8_t { kStrict = 0, kLevelLater = 1, kNone = 2 };

}  // namespace ucm
