// Which tickets of a stream failed. A stream's tickets settle in order (the
// watermark), but a failed flush leaves a range of tickets that must never
// count as landed, even after later copies land: the ledger remembers those
// ranges until the caller has been told (wait() on a ticket past them).
#pragma once

#include <cstdint>
#include <deque>
#include <string>

namespace ucm {

class TicketLedger {
 public:
  void mark_failed(uint64_t first, uint64_t last, std::string why) {
    if (first <= last) failed_.push_back(Range{first, last, std::move(why)});
  }
  // The reason ticket t failed, or null if it did not.
  const std::string* failed(uint64_t t) const {
    for (const Range& r : failed_)
      if (t >= r.first && t <= r.last) return &r.why;
    return nullptr;
  }
  // Forgets ranges wholly before t (the caller has moved past them).
  void forget_before(uint64_t t) {
    while (!failed_.empty() && failed_.front().last < t) failed_.pop_front();
  }
  bool empty() const { return failed_.empty(); }

 private:
  struct Range {
    uint64_t first, last;
    std::string why;
  };
  std::deque<Range> failed_;
};

}  // namespace ucm
