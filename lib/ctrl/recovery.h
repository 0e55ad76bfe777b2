// Recovery from dead ranks: a rank may be SIGKILLed at any instruction.
//
// Detection is by whoever waits on something the dead rank held, within one
// liveness slice (default 50 ms): a bucket lock (shared_lock reports the dead
// holder), a slot being loaded (the waiter checks the owner in the futex word),
// a claim that does not go away, or a cache with no victim (pins of the dead).
// That process then calls reap_dead_ranks(), which, under the node-wide
// recovery lock (itself stolen if its holder died):
//   1. marks every registered rank whose process is gone as kReaping;
//   2. steals and releases every bucket lock such a rank held: each chain edit
//      is one store, so chains are well-formed;
//   3. per slot: zeroes the dead ranks' pins and drops a dead owner's hold
//      (layout.h); a slot claimed by a dead rank is
//      either on the chain of its key's bucket (the claim is dropped) or
//      floating (its key is cleared so CLOCK can reuse it); a slot a dead rank
//      was loading (Idle, owner dead) becomes Failed and its sleepers are woken,
//      so no half-loaded slot is ever served as Ready and a waiter takes over;
//      a write-through a dead rank was making (stored word Writing) becomes
//      NotStored and its sleepers are woken, so a waiting dumper writes it;
//   4. frees the dead ranks' records.
// Every step is idempotent: a reaper that dies itself is reaped by the next.
//
// Every wait here ends at the caller's absolute deadline (kTimeout): taking the
// recovery lock, and each bucket lock a reap takes. A reap cut short by its
// deadline leaves dead records kReaping, which the next reap finishes. The
// recovery lock names its holder by pid and start time (shared_lock.h,
// process_lock), so a dead holder whose pid went to a stranger is still dead;
// a live holder that is stopped (a debugger) costs waiters their deadline, not
// a hang. A chain or lock word that shared memory holds garbage in is
// kCorrupt naming the place, never an endless walk or a wild access.
#pragma once

#include <cstdint>

#include "common/result.h"
#include "ctrl/buffer_ctrl.h"
#include "sync/shared_lock.h"

namespace ucm {

// Reaps every dead local rank; `me` is the caller's local rank, joined (or
// being joined by join_rank). *reaped (optional) receives how many were
// reaped. `inherited` adds ranks whose records already name the caller but
// whose leftovers (pins, locks, claims, loads) belong to a dead predecessor.
// kTimeout at the absolute deadline; kCorrupt (after reaping what it could)
// when a chain it had to walk is corrupt.
[[nodiscard]] Result reap_dead_ranks(const BufferCtrl& c, uint32_t me, uint32_t* reaped, uint64_t deadline_ns,
                                     uint32_t inherited = 0);

// Joins rank r; if a dead process still holds its record, adopts the record
// and cleans up after the predecessor first, by the absolute deadline.
[[nodiscard]] Result join_rank(const BufferCtrl& c, uint32_t r, uint64_t deadline_ns);

// The node's recovery lock (layout.h, CtrlGlobals), taken by the calling
// process, stolen from a dead holder; kTimeout at the deadline. Exposed for
// tests and tools; reap_dead_ranks and join_rank take it themselves.
[[nodiscard]] Result lock_recovery(const BufferCtrl& c, uint64_t deadline_ns);
void unlock_recovery(const BufferCtrl& c);
// The pid that holds the recovery lock, 0 when free.
int32_t recovery_lock_holder(const BufferCtrl& c);

// True if some registered rank's process is gone (cheap enough for slow paths).
bool any_rank_dead(const BufferCtrl& c);

// A LockWaitPolicy whose liveness probe asks c.rank_alive(holder id - 1).
LockWaitPolicy lock_policy_for(const BufferCtrl& c, uint64_t slice_ns);

// Locks bucket b for rank `me`, reaping a dead holder and retrying. Deadline
// is absolute (ns); returns kOk, kTimeout, or kCorrupt when the lock word
// names a holder no rank can be.
[[nodiscard]] Result lock_bucket(const BufferCtrl& c, uint32_t me, uint32_t b, uint64_t slice_ns, uint64_t deadline);

}  // namespace ucm
