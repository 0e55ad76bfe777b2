// A load queue's waits for a free cache slot (NoSpace): the sleep on the
// node's space bell (ctrl/space_bell.h) and how far the eviction protection
// relaxes while a task waits (ctrl/protect_relax.h). The loops that wait are
// load_queue.cpp's (get_with_backpressure, prealloc_next); the copier's look
// for a slot (look_for_slot) never waits.
#include <algorithm>
#include <mutex>

#include "common/time.h"
#include "ctrl/space_bell.h"
#include "queue/load_queue.h"
#include "queue/load_queue_impl.h"
#include "sync/futex.h"

namespace ucm {
using load_queue_impl::kLookShare;
using load_queue_impl::kRelaxLevelNs;
using load_queue_impl::kStopCheckNs;
using load_queue_impl::add;
using load_queue_impl::next_relax_ns;
using load_queue_impl::relax_after;

namespace {
// When half of task t's time (from its submission) is gone.
uint64_t half_time_ns(const Task& t) {
  return t.deadline_ns() > t.submit_ns() ? t.submit_ns() + (t.deadline_ns() - t.submit_ns()) / 2 : t.deadline_ns();
}
}  // namespace

namespace load_queue_impl {

// How far the protection holds for a get of task t that has waited for space
// since `since` (ctrl/protect_relax.h): strict at first; no wait for level
// ranks on later tasks (a cycle) once a progressing rank would have taken
// what it was owed; none once half of the task's time is gone (from its
// submission: a bound per wait restarted with every entry and added up to
// the whole timeout), so that protection never fails a task.
ProtectRelax relax_after(const Task& t, uint64_t now, uint64_t since) {
  if (now >= half_time_ns(t)) return ProtectRelax::kNone;
  return now - since >= kRelaxLevelNs ? ProtectRelax::kLevelLater : ProtectRelax::kStrict;
}
// When the relaxing steps up next (a wait for space looks again then).
uint64_t next_relax_ns(const Task& t, uint64_t since, ProtectRelax now_at) {
  if (now_at == ProtectRelax::kNone) return t.deadline_ns();
  if (now_at == ProtectRelax::kStrict) return std::min(since + kRelaxLevelNs, half_time_ns(t));
  return half_time_ns(t);
}

}  // namespace load_queue_impl

LoadQueue::SpaceWait::~SpaceWait() {
  if (!announced) return;
  // The rank's bit stays while any wait of ours is in progress (the
  // dispatcher's): the count and the bit change together.
  std::lock_guard<std::mutex> g(q->space_mu_);
  if (q->space_waiters_.fetch_sub(1, std::memory_order_seq_cst) == 1) space_wait_end(q->cache_->ctrl(), q->opts_.local_rank);
}

void LoadQueue::SpaceWait::before_look() {
  if (!announced) return;
  bell = space_bell_now(q->cache_->ctrl());
  look_cpu0_ns = thread_cpu_ns();
}

void LoadQueue::SpaceWait::sleep(uint64_t until_ns) {
  if (!announced) {
    // From now on a release rings us; what freed before this look is seen by
    // the look the caller makes next, at once.
    {
      std::lock_guard<std::mutex> g(q->space_mu_);
      q->space_waiters_.fetch_add(1, std::memory_order_seq_cst);
      bell = space_wait_announce(q->cache_->ctrl(), q->opts_.local_rank);
    }
    announced = true;
    return;
  }
  std::atomic<uint32_t>& b = q->cache_->ctrl().globals().space_bell;
  const uint64_t now = now_ns();
  // A look that found no space swept the whole pool: on a large cache that is
  // milliseconds. The next look waits kLookShare times as long (by the
  // thread's CPU time, not the wall's: a look descheduled is no dearer),
  // rung or not, so that looking takes at most a tenth of the wait
  // (space_bell.h); never past `until_ns` (the task's deadline, or when the
  // protection relaxes next).
  const uint64_t cpu = thread_cpu_ns();
  const uint64_t look_ns = look_cpu0_ns != 0 && cpu > look_cpu0_ns ? cpu - look_cpu0_ns : 0;
  const uint64_t end = std::min(until_ns, std::max(now + step_ns, now + kLookShare * look_ns));
  const uint64_t gap_end = std::min(end, now + kLookShare * look_ns);
  q->space_sleeps_.fetch_add(1, std::memory_order_relaxed);
  bool rang = false;
  for (;;) {
    if (q->stopping()) break;
    const uint64_t t = now_ns();
    rang = rang || b.load(std::memory_order_seq_cst) != bell;
    if (t >= end || (rang && t >= gap_end)) break;
    if (rang) {
      // Rung within the gap: sleep out the gap; further rings change nothing.
      sleep_for_ns(std::min(gap_end, t + kStopCheckNs) - t);
      continue;
    }
    // Sleep on the value read before the look: a release since then returns at once.
    (void)futex_wait(&b, bell, std::min(end, t + kStopCheckNs));
  }
  if (rang) {
    q->space_wakes_.fetch_add(1, std::memory_order_relaxed);
    step_ns = q->opts_.no_space_backoff_ns;  // something freed: the next wait starts short again
  } else {
    step_ns = q->next_space_step(step_ns);
  }
}

GetFor LoadQueue::relaxed_for(const Task& t, uint64_t since) {
  // Where the task's earlier entries left the relaxing: a task past half of
  // its time with thousands of entries swept strictly for each (3 ms a sweep
  // at 128k slots) and ended seconds past its deadline (an adversarial run).
  GetFor f = get_for(t);
  f.relax = static_cast<ProtectRelax>(t.relax_floor());
  if (since == 0) return f;  // the first look: no clock read (every miss takes it)
  const ProtectRelax relax = relax_after(t, now_ns(), since);
  if (relax > f.relax) {
    if (relax == ProtectRelax::kNone) add(ctr_->protect_overrides, 1);
    f.relax = relax;
    t.raise_relax_floor(static_cast<uint8_t>(relax));
  }
  return f;
}

bool LoadQueue::look_for_slot(Item& it, uint32_t* w, Look* look) {
  const Task& t = *it.task;
  const TaskEntry& e = t.entries()[it.index];
  const uint64_t now = now_ns();
  if (stopping()) {
    fail_slotless(it, Result::kFinalized, key_text(e.key) + ": the cache was finalized while waiting for it");
    *look = Look::kEnded;
    return false;
  }
  *look = Look::kWaiting;
  if (now < it.next_look_ns) return false;  // never past the deadline: the last look is at it
  const GetFor f = relaxed_for(t, it.space_since);
  const uint64_t cpu0 = thread_cpu_ns();
  GetResult g;
  const Result r = cache_->get(e.key, &g, f);
  if (r == Result::kOk) {
    it.slotless = false;
    it.slot = g.slot;
    *w = g.word;
    if (g.kind != GetKind::kOwner) return true;
    if (t.kind() == TaskKind::kDump) {
      dump_as_owner(it);  // the entry completes with its write-through
    } else if (load_as_owner(it, w)) {
      return true;
    }
    *look = Look::kEnded;
    return false;
  }
  if (r != Result::kNoSpace) {
    fail_slotless(it, r, key_text(e.key) + ": " + last_error());
    *look = Look::kEnded;
    return false;
  }
  if (now >= t.deadline_ns()) {  // as the dispatcher's: the look first, then the deadline
    fail_slotless(it, Result::kNoSpace,
                  key_text(e.key) + ": no free cache slot before the task's deadline (its load was abandoned, and " +
                      "every slot stayed pinned or protected since)");
    *look = Look::kEnded;
    return false;
  }
  // No space: look again after a pause that doubles (from the queue's
  // no-space backoff to its bound) and is at least kLookShare times what this
  // look cost, never past the deadline or the relaxing's next step. The copier
  // does not sleep on the space bell (it sleeps on its entries' words).
  if (it.space_since == 0) it.space_since = now;
  it.space_step_ns = next_space_step(it.space_step_ns);
  const uint64_t cpu1 = thread_cpu_ns();
  const uint64_t look_ns = cpu1 > cpu0 ? cpu1 - cpu0 : 0;
  it.next_look_ns = std::min({t.deadline_ns(), next_relax_ns(t, it.space_since, f.relax),
                              now + std::max(it.space_step_ns, kLookShare * look_ns)});
  return false;
}

}  // namespace ucm
