// Waiting for a free slot without polling naps (issue 15, goal 8's rule
// applied to NoSpace).
//
// A get() that finds no victim (every slot pinned, claimed or protected,
// design.md 5.4 step 4) answers NoSpace, and the load queue waits until the
// task's deadline for a slot to free. It used to nap 200 us and look again:
// each look is a whole sweep (two laps of the pool, design.md 5.5), so a
// rank that waited for a peer paused within the protection grace swept the
// whole cache 5,000 times a second (about a core per waiting rank on a
// large cache, and the bucket locks of every chain it passed).
//
// Now a waiter sets its rank's bit in CtrlGlobals.space_waiting, then reads
// space_bell before each look and, when the look finds nothing, futex-waits
// on the value it read. What frees a slot rings: every release of a pin or
// hold (cache_buffer.cpp), a dump's finish, a rank leaving (its references
// dropped, its protections owed to nobody) and the reaper. Bell read before
// the look, look's loads after it: a release the look missed bumps the bell
// after the read, so the futex_wait returns at once.
//
// The release side reads space_waiting after its unpin with no fence of its
// own (a fence per released entry would be on the hit path): a waiter that
// announced itself just as the last release before a quiet spell read the
// mask may sleep through that release. What ends such a sleep, and every
// freeing that rings nobody (a protection whose grace runs out, an idle
// rank's lapse, an evictor's claim dropped), is the sleep's bound: it
// starts at QueueOptions::no_space_backoff_ns and doubles, while no ring
// comes, up to no_space_backoff_max_ns (which the cache keeps well under the
// protection grace). And a look that found no space swept the whole pool
// (milliseconds on a large cache): the next one waits at least 9 times the
// thread CPU time it took (kLookShare), rung or not, so that looking takes at
// most a tenth of a waiting rank's time. No sleep outlasts the task's
// deadline or the moment the protection relaxes (ctrl/protect_relax.h),
// when the queue looks again.
#pragma once

#include <atomic>
#include <cstdint>

#include "ctrl/buffer_ctrl.h"
#include "sync/futex.h"

namespace ucm {

// Rank `me` waits for space: announce, then read the bell (the caller looks
// again after this, so nothing freed before the read is missed).
inline uint32_t space_wait_announce(const BufferCtrl& c, uint32_t me) {
  CtrlGlobals& g = c.globals();
  g.space_waiting.fetch_or(1u << me, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return g.space_bell.load(std::memory_order_seq_cst);
}

// The bell's value before the next look (the waiter is announced).
inline uint32_t space_bell_now(const BufferCtrl& c) {
  return c.globals().space_bell.load(std::memory_order_seq_cst);
}

inline void space_wait_end(const BufferCtrl& c, uint32_t me) {
  c.globals().space_waiting.fetch_and(~(1u << me), std::memory_order_seq_cst);
}

// Rings when anyone waits for space; otherwise one load of a read-mostly line.
inline void ring_space(const BufferCtrl& c) {
  CtrlGlobals& g = c.globals();
  g.space_bell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&g.space_bell, kWakeAll);
}

inline void note_space_freed(const BufferCtrl& c) {
  if (c.globals().space_waiting.load(std::memory_order_seq_cst) == 0) return;
  ring_space(c);
}

}  // namespace ucm
