// The async-test copy engine: for tests only (selected by EngineKind::kAsyncTest,
// config copy_engine=async-test). It behaves like a device stream seen from
// the CPU: flush() hands copies to a worker thread that performs each memcpy
// `delay_us` after the flush (in a shuffled order with `reorder`), and tickets
// settle only when the worker has passed them. A flush can be made to fail
// after putting some of its copies in flight, as a device batch call can.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/log.h"
#include "device/copy_engine.h"
#include "device/host_engine.h"
#include "device/ticket_ledger.h"

namespace ucm {
namespace {

using Clock = std::chrono::steady_clock;

// Longest a wait() blocks: far beyond any delay a test sets.
constexpr auto kWaitBound = std::chrono::seconds(60);

class AsyncTestStream final : public CopyStream {
 public:
  explicit AsyncTestStream(const AsyncTestOptions& o) : opts_(o), rng_(o.seed) {
    worker_ = std::thread([this] { run(); });
  }
  ~AsyncTestStream() override {
    {
      std::unique_lock<std::mutex> lk(mu_);
      // Every copy in flight lands before the stream goes, as a device stream
      // is synchronized before it is destroyed.
      settled_cv_.wait_for(lk, kWaitBound, [&] { return flight_.empty(); });
      stop_ = true;
    }
    work_cv_.notify_all();
    worker_.join();
  }

  Result copy(void* dst, const void* src, uint64_t bytes, uint64_t* ticket) override {
    queued_.push_back(Copy{dst, src, bytes, ++issued_, {}, true});
    *ticket = issued_;
    if (opts_.stats) opts_.stats->copies.fetch_add(1);
    return Result::kOk;
  }

  Result flush() override {
    if (queued_.empty()) return Result::kOk;
    ++flushes_;
    if (opts_.stats) {
      opts_.stats->flushes.fetch_add(1);
      uint64_t m = opts_.stats->max_batch.load();
      while (m < queued_.size() && !opts_.stats->max_batch.compare_exchange_weak(m, queued_.size())) {
      }
    }
    const bool fails = opts_.fail_flush != 0 && flushes_ == opts_.fail_flush;
    const uint64_t first = queued_.front().ticket, last = queued_.back().ticket;
    std::vector<Copy> batch(queued_.begin(), queued_.end());
    queued_.clear();
    const auto at = Clock::now() + std::chrono::microseconds(opts_.delay_us);
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i].at = at;
      // Past the fault, nothing is in flight: the copy only settles (as the
      // event that covers a failed batch completes), it writes nothing.
      batch[i].write = !fails || i < opts_.fail_after;
    }
    if (opts_.reorder) {
      std::vector<uint64_t> jitter(batch.size());
      for (auto& j : jitter) j = rng_() % (opts_.delay_us + 1);
      for (size_t i = 0; i < batch.size(); ++i) batch[i].at += std::chrono::microseconds(jitter[i]);
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      for (Copy& c : batch) flight_.push_back(c);
      if (fails) {
        char why[160];
        std::snprintf(why, sizeof(why), "async-test flush %lu failed after %lu of its %zu copies were in flight",
                      static_cast<unsigned long>(flushes_), static_cast<unsigned long>(opts_.fail_after), batch.size());
        ledger_.mark_failed(first, last, why);
      }
    }
    work_cv_.notify_all();
    if (fails)
      return fail(Result::kDevice, "async-test flush %lu of tickets %lu..%lu failed (injected)",
                  static_cast<unsigned long>(flushes_), static_cast<unsigned long>(first),
                  static_cast<unsigned long>(last));
    return Result::kOk;
  }

  bool done(uint64_t ticket) override {
    std::lock_guard<std::mutex> g(mu_);
    return ticket <= watermark_ && ledger_.failed(ticket) == nullptr;
  }

  Result wait(uint64_t ticket) override {
    // A failing flush still leaves its copies to settle: wait for them, then
    // report the failure the ledger recorded.
    (void)flush();
    std::unique_lock<std::mutex> lk(mu_);
    if (ticket > issued_) return fail(Result::kInvalidArg, "ticket %lu was never issued", static_cast<unsigned long>(ticket));
    if (opts_.stats) opts_.stats->waiting.fetch_add(1);
    const bool settled = settled_cv_.wait_for(lk, kWaitBound, [&] { return watermark_ >= ticket; });
    if (opts_.stats) opts_.stats->waiting.fetch_sub(1);
    if (!settled)
      return fail(Result::kTimeout, "async-test copy %lu not settled within the wait bound",
                  static_cast<unsigned long>(ticket));
    ledger_.forget_before(ticket);
    if (const std::string* why = ledger_.failed(ticket)) return fail(Result::kDevice, "%s", why->c_str());
    return Result::kOk;
  }

 private:
  struct Copy {
    void* dst;
    const void* src;
    uint64_t bytes;
    uint64_t ticket;
    Clock::time_point at;
    bool write;
  };

  void run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (stop_) return;  // the destructor waited for the flight to land (bounded)
      if (flight_.empty()) {
        work_cv_.wait(lk);
        continue;
      }
      auto next = std::min_element(flight_.begin(), flight_.end(),
                                   [](const Copy& a, const Copy& b) { return a.at < b.at; });
      if (Clock::now() < next->at) {
        work_cv_.wait_until(lk, next->at);
        continue;
      }
      if (opts_.gate) {
        lk.unlock();
        const bool permit = opts_.gate->take(10);
        lk.lock();
        if (!permit) continue;  // look again: stop_, or an earlier copy that came due
        next = std::min_element(flight_.begin(), flight_.end(),
                                [](const Copy& a, const Copy& b) { return a.at < b.at; });
      }
      const Copy c = *next;
      flight_.erase(next);
      lk.unlock();
      if (c.write) std::memcpy(c.dst, c.src, c.bytes);
      lk.lock();
      landed_.push_back(c.ticket);
      std::sort(landed_.begin(), landed_.end());
      while (!landed_.empty() && landed_.front() == watermark_ + 1) {
        ++watermark_;
        landed_.pop_front();
      }
      settled_cv_.notify_all();
    }
  }

  const AsyncTestOptions opts_;
  std::mt19937_64 rng_;
  // The caller's thread only.
  std::vector<Copy> queued_;
  uint64_t issued_ = 0;
  uint64_t flushes_ = 0;
  // Shared with the worker, under mu_.
  std::mutex mu_;
  std::condition_variable work_cv_, settled_cv_;
  std::deque<Copy> flight_;
  std::deque<uint64_t> landed_;  // landed above the watermark, sorted
  uint64_t watermark_ = 0;       // every ticket <= this has settled
  TicketLedger ledger_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace

void AsyncTestGate::allow(uint64_t n) {
  {
    std::lock_guard<std::mutex> g(mu_);
    permits_ += n;
  }
  cv_.notify_all();
}

void AsyncTestGate::open() {
  {
    std::lock_guard<std::mutex> g(mu_);
    open_ = true;
  }
  cv_.notify_all();
}

bool AsyncTestGate::take(uint32_t slice_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_for(lk, std::chrono::milliseconds(slice_ms), [&] { return open_ || permits_ > 0; })) return false;
  if (!open_) --permits_;
  return true;
}

std::unique_ptr<CopyEngine> make_async_test_engine(int device_id, const AsyncTestOptions& o) {
  return make_memory_engine("async-test", device_id, [o] { return std::make_unique<AsyncTestStream>(o); });
}

}  // namespace ucm
