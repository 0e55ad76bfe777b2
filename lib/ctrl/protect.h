// Eviction protection: a shard loaded for a task stays until every local rank
// that will copy it has taken it, or a bounded grace has passed.
//
// ucm_load_task is node-collective: every local rank asks for the same keys,
// each at its own time. When ranks drift apart, CLOCK would evict a shard the
// fast rank loaded before a slow rank copied it, and the slow rank would load
// it again. So a loaded slot carries a guard word (guard[slot], layout.h):
//
//   bits 0-15   taken: ranks that have taken the slot (hit or waiter) for its task
//   bit 16      armed: a load (not a dump) made this residency Ready, or a load task took it
//   bit 17      hinted: a prealloc's stamp (below)
//   bits 18-31  task: the ordinal (mod 2^14) of the load task the residency serves: the
//               owner's that made it, or the latest that took it (guard_take)
//   bits 32-63  arm time, CLOCK_MONOTONIC milliseconds (low 32 bits; compared modulo 2^32)
//
// Who writes it:
//   - the claimer, when it installs a key (install_claimed_slot): 0;
//   - every rank that takes the slot for the stamped task: fetch_or of its
//     bit, only when the bit is not yet set (the hit path pays one load; the
//     first take one RMW); the first rank that takes it for a later task: a
//     CAS that starts that task's round (guard_take). A take holds a pin, so
//     an evictor that claims the slot later has synchronized with the unpin
//     and sees the take;
//   - the load's owner, just before the CAS that makes the slot Ready
//     (mark_ready, never mark_ready_for_write): a CAS that keeps the taken
//     bits, adds its own, sets armed and the time. The owner still holds its
//     hold then, so no evictor can take the slot between arm and Ready, and
//     an evictor that finds the hold gone has synchronized with the release
//     that dropped it and sees the arm.
//
// The evictor (clock.cpp) asks slot_protected() after it has claimed a
// candidate (so it has read the hold and the pins: seq_cst). A slot is
// protected when it is armed, holds a key, some rank in the node's copier
// mask (CtrlGlobals.copiers: ranks with a queue) has not taken it, and the
// grace (CtrlGlobals.protect_grace_ms) has not passed since it was armed.
// A protected candidate is unclaimed and skipped like a pinned one; a sweep
// that finds only pinned or protected slots answers NoSpace, and the queue
// backs off and retries (the fast rank waits for the slow one); before each
// back-off its dispatcher takes the task's keys other ranks serve
// (LoadQueue::take_served), since those may be the slots protected for its
// own take while their loaders wait for its slots. No round holds a shard
// longer than the grace (a later task's take starts a round of its own, with
// its own grace: guard_take), and no rank holds anything once it is
// out of the copier mask: leave() and the reaper of a dead rank clear its
// bit, and get() reaps dead ranks before it answers NoSpace.
//
// Which copiers it waits for: ucm_load_task is node-collective, so every
// rank's n-th load task asks for the same keys. Each rank's queue numbers its
// load tasks in submission order and publishes in its RankRecord how many it
// has finished dispatching (tasks_passed: every entry taken as a hit or a
// waiter, loaded, or failed). The owner stamps the residency with the ordinal
// k of the task it serves (guard_stamp_task, when the get answers Owner), and
// a copier whose tasks_passed is past k has asked for every key of task k
// already: it took an earlier residency of this key, or loaded its own, and
// will never take this one. So a slot waits only for copiers not past its
// task. Without that, a shard the lagging rank had to load again (its peers
// copied an earlier residency long ago) waited the whole grace for peers that
// never come back, and such reloads pinned the cache into a no-space storm
// (issue 15, goal 1: the drift bench at a lag equal to the cache). Ordinals
// compare modulo 2^14 (task_passed); a rank more than 2^13 tasks behind or
// ahead of a stamp counts as not past it, which only waits longer (at most the
// grace). Direct CacheBuffer users (no queue) stamp 0 and publish nothing:
// every copier is waited for, as before ordinals.
//
// The order of waits: an evictor waits for an owed copier only when that
// copier is not ahead of it (its tasks_passed is not larger), and for itself
// only when the slot's task is the one it dispatches now (its dispatcher's
// out-of-order takes, take_served, free those). So a wait goes from a rank
// to one behind it or level with it, never forward: a rank waiting for
// itself at a later task could be freed only by the grace (its dispatcher
// takes nothing of a later task before this one is done), and ranks that
// owe each other (numbered out of step: a rank may skip a task or submit its
// own) would each back off for the grace. The rank furthest behind waits
// only at its own task, so the node moves. What the order gives up: a rank
// behind that misses (the cache lost its shard) may evict a shard loaded for
// it for a later task, and will load that one again.
//
// An idle rank that let a protection lapse holds nothing: a rank whose queue
// has passed every load task it took publishes since when
// (RankRecord.idle_since_ms; 0 while a load task is in its queue). An
// evictor that finds a slot whose grace ran out while still owed to an idle
// rank marks that rank (RankRecord.lapsed_ms, the time); a rank marked during
// its current idle period is not waited for until it asks again. Without
// that, a live rank that stopped asking (its job's last task done, a barrier
// before finalize, a rank that only dumps) held every shard loaded after it
// stopped for a grace each, and its peers backed off a grace per cache-full
// (an adversarial run: 7.0 s where a grace is 1 s); now one grace. Idle time
// alone is not the test: a rank that computes for longer than the grace
// between bursts of loads, a few ms behind its peers, takes each shard well
// within the grace of its load, and must keep it (session 19: "idle for a
// whole grace" made such a loop load 40-75% more). A rank that comes back
// after a lapse loads again what it lost. Direct CacheBuffer users publish
// nothing (idle 0): never marked.
//
// Dumps do not arm, and a dump's get takes nothing: a dumped key may be one
// no peer ever asks for (a load task that takes a dumped residency starts
// its round, guard_take: its peers will ask for it). A grace of
// 0 turns protection off (nothing arms, the hit path sets no bits).
//
// Hints (bit 17): prealloc stamps the Idle, unowned residency it installs
// with the hinted bit and the time (guard_hint), before it drops the bucket
// lock. The reserved CLOCK (the only sweep prealloc runs, clock.cpp) keeps a
// hint that is still unused and younger than the grace (hint_kept): a
// prealloc never trades another still-unused prealloc for its own, which
// gains no slot for the next task and made a pass that found the pool full
// of loads in flight evict its own hints (issue 15 goal 1; design.md 9.1
// step 6). A takeover makes the word owned, and the arm in mark_ready
// replaces the whole stamp, so a used hint is an ordinary residency again.
// A regular-pool miss ignores hints (a hint in the regular pool is a free
// slot prealloc found, nothing more). An evictor that claimed the slot
// between install and stamp cannot detach it (the bucket is still locked)
// and drops its claim; one that read the guard before the stamp became
// visible may still take it: that costs one hint, never data.
//
// Peer deferral (queue/load_queue.cpp, owner grace): a dispatcher that waits
// for a peer to start serving its share sets its bit in
// CtrlGlobals.deferring, reads defer_bell, looks at its entries and
// futex-waits on defer_bell (bounded). A rank that starts serving a key (a
// miss installing it, a takeover of a preallocated slot) issues a seq_cst
// fence after the key is published and, if any other rank defers, bumps
// defer_bell and wakes its sleepers (note_serving). Fence against fence: the
// sleeper sees the key, or the server sees the bit and its bump makes the
// futex_wait return at once. Nobody deferring: the miss pays a fence and a load.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/time.h"
#include "ctrl/buffer_ctrl.h"
#include "ctrl/protect_relax.h"
#include "ctrl/slot_word.h"
#include "sync/futex.h"

namespace ucm {

constexpr uint64_t kGuardTakenMask = 0xffffull;
constexpr uint64_t kGuardArmed = 1ull << 16;
constexpr uint64_t kGuardHinted = 1ull << 17;
constexpr uint32_t kGuardTaskShift = 18;
constexpr uint64_t kGuardTaskMask = 0x3fffull << kGuardTaskShift;
constexpr uint32_t kGuardTaskModulo = 1u << 14;
constexpr uint32_t kGuardTimeShift = 32;

inline uint32_t guard_taken(uint64_t g) { return static_cast<uint32_t>(g & kGuardTakenMask); }
inline bool guard_armed(uint64_t g) { return (g & kGuardArmed) != 0; }
inline uint32_t guard_time_ms(uint64_t g) { return static_cast<uint32_t>(g >> kGuardTimeShift); }
inline uint32_t guard_task(uint64_t g) { return static_cast<uint32_t>((g & kGuardTaskMask) >> kGuardTaskShift); }

// Whether a rank that has finished dispatching `passed` load tasks is past
// task ordinal `task` (a 14-bit stamp): passed - task in [1, 2^13) mod 2^14.
inline bool task_passed(uint32_t passed, uint32_t task) {
  const uint32_t d = (passed - task) & (kGuardTaskModulo - 1);
  return d != 0 && d < kGuardTaskModulo / 2;
}

// The clock of the arm time and the grace: CLOCK_MONOTONIC in ms, truncated.
inline uint32_t protect_now_ms() { return static_cast<uint32_t>(now_ns() / 1000000ull); }

// Milliseconds from `then` to `now` (both protect_now_ms(), modulo 2^32); 0
// when `then` is later: an evictor reads the clock once per sweep, and a
// stamp written after that read (an arm, a round, an idle mark a ms later)
// is new, not 2^32 ms old.
inline uint32_t elapsed_ms(uint32_t now, uint32_t then) {
  const int32_t d = static_cast<int32_t>(now - then);
  return d < 0 ? 0 : static_cast<uint32_t>(d);
}

// How far ahead of a taker's task a stamp may be and still read as "the
// taker lags" (it records nothing and is owed the shard until it takes it for
// that task or passes it). Farther is not drift but a rank whose load tasks
// are numbered out of step with the node's (a rank that joined late, or that
// submitted load tasks its peers did not): its take counts whatever the stamp,
// as before ordinals, or it would be owed every shard for the whole grace.
constexpr uint32_t kGuardLagWindow = 64;

// Rank r takes slot i for its load task `ordinal`: a hit on a Ready slot
// (`ready`), or a waiter that will copy it once Ready. By the residency's
// task stamp:
//   - this task: r's bit (one load on the hit path, one RMW for the first take);
//   - a later task, at most kGuardLagWindow ahead (r lags: a peer ahead
//     loaded or took it for that task): nothing; r is owed it until it takes
//     it for that task or passes it. Farther ahead: r's bit, as above;
//   - an earlier task (or the stamp of a dump's residency), on a Ready hit by
//     a rank that has taken this round already: a new round for this task,
//     armed now, taken by r alone. The shard is asked for again, so every
//     copier not past this task will copy it again: a resident shard the fast
//     rank hits stays for the slow ones as a loaded one does. A rank that has
//     not taken the round (r's first take of an armed residency) records
//     nothing: its load tasks are numbered ahead of the peers' that made the
//     round (it submitted tasks of its own), it is past the round's task so
//     nobody waits for it there, and a new round would wipe the peers' takes
//     and hold the slot for them for tasks they never ask it in: level peers
//     then waited on each other a grace at a time (session 19). A waiter
//     starts no round (the load in flight is its owner's round, which the
//     owner arms when it lands; r is past its task) and records nothing.
// The bit goes in with a CAS on the word it judged, so it never lands in a
// round another rank started meanwhile (a CAS that fails judges again).
// `now_ms` (optional): the round's time, read once for a batch of takes (0: not
// read yet; the first round started reads it).
inline void guard_take(const BufferCtrl& c, uint32_t r, uint32_t i, uint32_t ordinal, bool ready,
                       uint64_t* now_ms = nullptr) {
  std::atomic<uint64_t>& g = c.guard(i);
  const uint64_t bit = 1ull << r;
  const uint32_t task = ordinal & (kGuardTaskModulo - 1);
  uint64_t v = g.load(std::memory_order_relaxed);
  for (;;) {
    const uint32_t stamp = guard_task(v);
    const uint32_t ahead = (stamp - task) & (kGuardTaskModulo - 1);  // how far the stamp is past our task
    uint64_t next;
    if (stamp == task || (task_passed(stamp, task) && ahead > kGuardLagWindow)) {
      if (v & bit) return;
      next = v | bit;
    } else if (task_passed(stamp, task) || !ready || (guard_armed(v) && !(v & bit))) {
      return;
    } else {
      uint64_t own = 0;
      uint64_t& t = now_ms ? *now_ms : own;
      if (t == 0) t = uint64_t{protect_now_ms()} | (1ull << 32);  // bit 32: read (a clock of 0 ms is a time too)
      next = ((t & 0xffffffffull) << kGuardTimeShift) | kGuardArmed | (uint64_t{task} << kGuardTaskShift) | bit;
    }
    if (g.compare_exchange_weak(v, next, std::memory_order_relaxed)) return;
  }
}

// The new owner of slot i (a miss that installed it, a takeover) serves load
// task `ordinal`: its stamp replaces the task bits and keeps the rest (waiters
// may be adding their taken bits).
inline void guard_stamp_task(const BufferCtrl& c, uint32_t i, uint32_t ordinal) {
  std::atomic<uint64_t>& g = c.guard(i);
  const uint64_t task = (uint64_t{ordinal} << kGuardTaskShift) & kGuardTaskMask;
  uint64_t v = g.load(std::memory_order_relaxed);
  while (!g.compare_exchange_weak(v, (v & ~kGuardTaskMask) | task, std::memory_order_relaxed)) {
  }
}

// The owner r of a load arms slot i just before making it Ready (the task
// stamp and the taken bits stay).
inline void guard_arm(const BufferCtrl& c, uint32_t r, uint32_t i) {
  std::atomic<uint64_t>& g = c.guard(i);
  const uint64_t stamp = (uint64_t{protect_now_ms()} << kGuardTimeShift) | kGuardArmed | (1ull << r);
  uint64_t v = g.load(std::memory_order_relaxed);
  while (!g.compare_exchange_weak(v, stamp | (v & (kGuardTakenMask | kGuardTaskMask)), std::memory_order_relaxed)) {
  }
}

// What an evictor reads once per sweep; the clock only when it needs it.
struct ProtectView {
  uint32_t grace_ms = 0;  // 0: nothing is protected
  uint32_t copiers = 0;
  uint32_t now_ms = 0;
  bool have_now = false;
  uint32_t me = kMaxRanks;             // the evictor's rank (kMaxRanks: none, every owed copier is waited for)
  bool have_task = false;              // my_task is the load task the evictor's get serves
  uint32_t my_task = 0;                // (else its tasks_passed stands in)
  bool wait_self = true;               // false: it waits for none of its own takes
  ProtectRelax relax = ProtectRelax::kStrict;  // protect_relax.h
  uint32_t have_passed = 0;            // bit r: passed[r] and idle[r] were read
  uint32_t passed[kMaxRanks];          // RankRecord.tasks_passed, read once per sweep (valid where have_passed says)
  uint32_t idle[kMaxRanks];            // RankRecord.idle_since_ms, read with passed[r]
  uint32_t lapsed[kMaxRanks];          // RankRecord.lapsed_ms, read with passed[r]
};

// The view of the evictor whose claims carry `holder` (holder_id(rank)),
// serving load task `task` when `have_task`, waiting for its own takes there
// unless !wait_self.
inline ProtectView protect_view(const BufferCtrl& c, uint32_t holder, bool have_task = false, uint32_t task = 0,
                                bool wait_self = true, ProtectRelax relax = ProtectRelax::kStrict) {
  ProtectView v;
  v.grace_ms = relax == ProtectRelax::kNone ? 0 : c.protect_grace_ms();  // kNone: nothing is protected
  if (v.grace_ms != 0) v.copiers = c.globals().copiers.load(std::memory_order_seq_cst);
  if (holder >= 1 && holder <= kMaxRanks) v.me = holder - 1;
  v.have_task = have_task;
  v.my_task = task;
  v.wait_self = wait_self;
  v.relax = relax;
  return v;
}

inline uint32_t passed_of(const BufferCtrl& c, uint32_t r, ProtectView* v) {
  if (!(v->have_passed & (1u << r))) {
    v->passed[r] = c.rank(r).tasks_passed.load(std::memory_order_acquire);
    v->idle[r] = c.rank(r).idle_since_ms.load(std::memory_order_acquire);
    v->lapsed[r] = c.rank(r).lapsed_ms.load(std::memory_order_relaxed);
    v->have_passed |= 1u << r;
  }
  return v->passed[r];
}

// Whether rank r is idle and let a protection lapse since it went idle
// (above). Its passed[r] was read (passed_of).
inline bool gone_idle(uint32_t r, const ProtectView* v) {
  return v->idle[r] != 0 && v->lapsed[r] != 0 && static_cast<int32_t>(v->lapsed[r] - v->idle[r]) >= 0;
}

// The value a queue publishes in idle_since_ms when it has passed every load
// task: now, never 0 (0 means busy).
inline uint32_t idle_stamp_now() {
  const uint32_t t = protect_now_ms();
  return t == 0 ? 1 : t;
}

// Whether guard word g's time is less than the grace ago (the view reads the
// clock once, at its first use).
inline bool within_grace(uint64_t g, ProtectView* v) {
  if (!v->have_now) {
    v->now_ms = protect_now_ms();
    v->have_now = true;
  }
  return elapsed_ms(v->now_ms, guard_time_ms(g)) < v->grace_ms;
}

// The copiers the evictor waits for: those that have not taken the residency
// of guard word g, are not past its task (a stale tasks_passed is smaller: it
// only waits longer) and are not idle past a lapse, in the order of waits: not a copier ahead of the
// evictor, and the evictor itself only at the task it dispatches.
inline uint32_t copiers_owed(const BufferCtrl& c, uint64_t g, ProtectView* v) {
  uint32_t owed = v->copiers & ~guard_taken(g);
  const uint32_t task = guard_task(g);
  for (uint32_t m = owed; m != 0; m &= m - 1) {
    const uint32_t r = static_cast<uint32_t>(__builtin_ctz(m));
    if (r >= kMaxRanks) break;
    if (task_passed(passed_of(c, r, v), task) || gone_idle(r, v)) owed &= ~(1u << r);
  }
  if (owed == 0 || v->me >= kMaxRanks) return owed;
  const uint32_t mine = passed_of(c, v->me, v);
  const uint32_t current = v->have_task ? v->my_task : mine;
  if ((owed & (1u << v->me)) && (!v->wait_self || ((current ^ task) & (kGuardTaskModulo - 1)) != 0))
    owed &= ~(1u << v->me);
  // kLevelLater (protect_relax.h): nor a copier level with the evictor on a
  // slot stamped for a task after the one the evictor serves.
  const bool later = v->relax == ProtectRelax::kLevelLater && task_passed(task, current);
  for (uint32_t m = owed & ~(1u << v->me); m != 0; m &= m - 1) {
    const uint32_t r = static_cast<uint32_t>(__builtin_ctz(m));
    if (r >= kMaxRanks) break;
    const int32_t lead = static_cast<int32_t>(v->passed[r] - mine);
    if (lead > 0 || (later && lead == 0)) owed &= ~(1u << r);  // ahead of the evictor, or level for a later task
  }
  return owed;
}

// Whether claimed slot i must stay: armed, keyed, a copier not past its task
// has not taken it, and its grace is still running. Called after claim_slot().
// Slot i's grace ran out (guard word g, armed): marks the idle copiers it
// was still owed to as lapsed (above), once per idle period.
inline void note_lapses(const BufferCtrl& c, uint64_t g, ProtectView* v) {
  const uint32_t task = guard_task(g);
  for (uint32_t m = v->copiers & ~guard_taken(g); m != 0; m &= m - 1) {
    const uint32_t r = static_cast<uint32_t>(__builtin_ctz(m));
    if (r >= kMaxRanks) break;
    if (task_passed(passed_of(c, r, v), task) || v->idle[r] == 0 || gone_idle(r, v)) continue;
    const uint32_t now = v->now_ms == 0 ? 1 : v->now_ms;  // within_grace read the clock
    c.rank(r).lapsed_ms.store(now, std::memory_order_relaxed);
    v->lapsed[r] = now;
  }
}

inline bool slot_protected(const BufferCtrl& c, uint32_t i, ProtectView* v) {
  if (v->grace_ms == 0 || v->copiers == 0) return false;
  const uint64_t g = c.guard(i).load(std::memory_order_acquire);
  if (!guard_armed(g) || (v->copiers & ~guard_taken(g)) == 0) return false;
  if (c.slot(i).shard.load(std::memory_order_relaxed) == kEmptyShard) return false;
  if (!within_grace(g, v)) {
    note_lapses(c, g, v);
    return false;
  }
  return copiers_owed(c, g, v) != 0;
}

// Prealloc installed slot i (Idle, unowned) and still holds its bucket's lock.
inline void guard_hint(const BufferCtrl& c, uint32_t i) {
  c.guard(i).store((uint64_t{protect_now_ms()} << kGuardTimeShift) | kGuardHinted, std::memory_order_relaxed);
}

// Whether claimed slot i is a still-unused prealloc younger than the grace,
// which a prealloc's sweep leaves alone. Called after claim_slot(): nobody
// can take the slot over while the claim stands, so its word is stable.
inline bool hint_kept(const BufferCtrl& c, uint32_t i, ProtectView* v) {
  if (v->grace_ms == 0) return false;
  const uint64_t g = c.guard(i).load(std::memory_order_acquire);
  if ((g & kGuardHinted) == 0 || guard_armed(g)) return false;
  const uint32_t w = c.slot(i).word.load(std::memory_order_acquire);
  if (word_state(w) != State::kIdle || word_owner(w) != kNoOwner) return false;
  if (c.slot(i).shard.load(std::memory_order_relaxed) == kEmptyShard) return false;
  return within_grace(g, v);
}

// A rank started serving a key (protocol above): wake the peers that defer.
inline void note_serving(const BufferCtrl& c, uint32_t me) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  CtrlGlobals& g = c.globals();
  if ((g.deferring.load(std::memory_order_relaxed) & ~(1u << me)) == 0) return;
  g.defer_bell.fetch_add(1, std::memory_order_seq_cst);
  futex_wake(&g.defer_bell, kWakeAll);
}

}  // namespace ucm
