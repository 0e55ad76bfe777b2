#include "ctrl/departure.h"

#include <algorithm>
#include <string>

#include "common/log.h"
#include "common/time.h"
#include "sync/futex.h"

namespace ucm {
namespace {

std::string rank_list(const std::vector<uint32_t>& rs) {
  std::string s;
  for (uint32_t r : rs) {
    if (!s.empty()) s += ", ";
    s += std::to_string(r);
  }
  return s;
}

}  // namespace

void announce_departure(const BufferCtrl& c, uint32_t me) {
  if (me >= 32) return;
  std::atomic<uint32_t>& word = c.globals().departing;
  // Release: what this rank did in the region happens-before a peer that sees
  // the bit and goes on to unmap.
  word.fetch_or(1u << me, std::memory_order_acq_rel);
  futex_wake(&word, kWakeAll);
}

Result depart_node(const BufferCtrl& c, uint32_t me, uint32_t ranks, uint64_t deadline_ns, uint64_t slice_ns,
                   DepartureReport* report) {
  *report = DepartureReport();
  if (ranks == 0 || ranks > c.max_ranks() || ranks > 32 || me >= ranks)
    return fail(Result::kInvalidArg, "depart_node: local rank %u of %u ranks (max_ranks %u)", me, ranks, c.max_ranks());
  std::atomic<uint32_t>& word = c.globals().departing;
  announce_departure(c, me);
  slice_ns = std::max<uint64_t>(slice_ns, 1'000'000);
  for (;;) {
    const uint32_t seen = word.load(std::memory_order_acquire);
    std::vector<uint32_t> dead, missing;
    for (uint32_t r = 0; r < ranks; ++r) {
      if (seen & (1u << r)) continue;
      (c.rank_alive(r) ? missing : dead).push_back(r);
    }
    // A rank may set its bit between our load and the liveness check and then
    // leave (its record freed): look at the word again before calling it dead.
    if (!dead.empty()) {
      const uint32_t again = word.load(std::memory_order_acquire);
      dead.erase(std::remove_if(dead.begin(), dead.end(), [&](uint32_t r) { return (again & (1u << r)) != 0; }),
                 dead.end());
    }
    if (missing.empty()) {
      report->dead = dead;
      if (dead.empty()) return Result::kOk;
      return fail(Result::kPeerDead, "finalize: local rank(s) %s died before finalize; %u of %u ranks departed",
                  rank_list(dead).c_str(), ranks - static_cast<uint32_t>(dead.size()), ranks);
    }
    const uint64_t now = now_ns();
    if (now >= deadline_ns) {
      report->dead = dead;
      report->missing = missing;
      return fail(Result::kTimeout,
                  "finalize: local rank(s) %s (alive) had not called ucm_cache_finalize by the deadline%s%s",
                  rank_list(missing).c_str(), dead.empty() ? "" : "; dead: ", rank_list(dead).c_str());
    }
    (void)futex_wait(&word, seen, std::min(deadline_ns, now + slice_ns));
  }
}

}  // namespace ucm
