// StoreCalls (store_calls.h): the store's synchronous calls off the caller's
// thread, each wait bounded by the caller's deadline.
#include "backend/store_calls.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <system_error>

#include "common/log.h"
#include "common/thread_name.h"
#include "common/time.h"

namespace ucm {
namespace {

// cv.wait until pred() or the monotonic deadline (kNoDeadline: none); returns
// pred(). The slices are the clock's own: steady_clock is CLOCK_MONOTONIC.
template <typename Pred>
bool wait_until_ns(std::condition_variable& cv, std::unique_lock<std::mutex>& lk, uint64_t deadline_ns, Pred pred) {
  while (!pred()) {
    const uint64_t now = now_ns();
    if (deadline_ns == kNoDeadline) {
      cv.wait(lk);
    } else {
      if (now >= deadline_ns) return false;
      cv.wait_for(lk, std::chrono::nanoseconds(deadline_ns - now));
    }
  }
  return true;
}

}  // namespace

// One ask(): its keys and answers belong to the job (shared with the caller),
// so the caller may return at its deadline while an asker still writes here.
struct StoreCalls::Job {
  std::vector<Key> keys;
  std::vector<StoreAnswer> answers;  // under mu_ once published
  size_t answered = 0;               // under mu_: answers[0, answered) are final
  size_t first_error = SIZE_MAX;     // under mu_
  std::string first_error_text;      // under mu_
  bool done = false;                 // under mu_
};

StoreCalls::StoreCalls(Backend* store, uint32_t local_rank) : store_(store), rank_(local_rank) {}

StoreCalls::~StoreCalls() {
  if (!shut_down_) (void)shutdown(kNoDeadline);
}

Result StoreCalls::start_worker(bool toucher) {
  auto w = std::make_unique<Worker>();
  Worker* self = w.get();
  try {
    w->th = toucher ? std::thread([this, self] { toucher_main(self); }) : std::thread([this, self] { asker_main(self); });
  } catch (const std::system_error& e) {
    return fail(Result::kSystem, "starting a store-call thread: %s", e.what());
  }
  workers_.push_back(std::move(w));
  if (toucher) toucher_started_ = true;
  else ++askers_, ++idle_askers_;
  return Result::kOk;
}

Result StoreCalls::ask(const Key* keys, size_t n, uint64_t deadline_ns, StoreAnswers* out) {
  auto job = std::make_shared<Job>();
  job->keys.assign(keys, keys + n);
  job->answers.assign(n, StoreAnswer::kUnasked);
  std::unique_lock<std::mutex> lk(mu_);
  if (stopping_) return fail(Result::kFinalized, "the cache is being finalized");
  // Each idle asker takes one queued job: start one for this job if none is left.
  if (idle_askers_ <= asks_.size() && askers_ < kMaxAskers) UCM_CHECK(start_worker(false));
  asks_.push_back(job);
  ask_cv_.notify_one();
  (void)wait_until_ns(done_cv_, lk, deadline_ns, [&] { return job->done || stopping_; });
  out->per_key.assign(job->answers.begin(), job->answers.begin() + static_cast<std::ptrdiff_t>(job->answered));
  out->per_key.resize(n, StoreAnswer::kUnasked);
  out->first_error = job->first_error;
  out->first_error_text = job->first_error_text;
  if (job->done) return Result::kOk;
  // Not begun by any asker (all held in the store): nobody will want it.
  if (auto it = std::find(asks_.begin(), asks_.end(), job); it != asks_.end()) asks_.erase(it);
  if (stopping_) return fail(Result::kFinalized, "the cache is being finalized");
  return fail(Result::kTimeout, "the store answered %zu of %zu keys by the deadline", job->answered, n);
}

void StoreCalls::answer(Job& job) {
  for (size_t i = 0; i < job.keys.size(); ++i) {
    bool held = false;
    const Result r = store_->exists(job.keys[i], &held);
    const std::string why = r == Result::kOk ? std::string() : last_error();
    std::lock_guard<std::mutex> g(mu_);
    job.answers[i] = r != Result::kOk ? StoreAnswer::kError : held ? StoreAnswer::kHeld : StoreAnswer::kNotHeld;
    job.answered = i + 1;
    if (r != Result::kOk && job.first_error == SIZE_MAX) {
      job.first_error = i;
      job.first_error_text = why;
    }
    if (stopping_) return;  // finalize: the rest of the keys are nobody's now
  }
}

void StoreCalls::asker_main(Worker* self) {
  name_this_thread("ask", rank_);
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    ask_cv_.wait(lk, [&] { return stopping_ || !asks_.empty(); });
    if (stopping_) break;
    std::shared_ptr<Job> job = std::move(asks_.front());
    asks_.pop_front();
    --idle_askers_;
    lk.unlock();
    answer(*job);
    lk.lock();
    job->done = job->answered == job->keys.size();  // not when stop() cut it short
    ++idle_askers_;
    done_cv_.notify_all();
  }
  self->exited = true;
  done_cv_.notify_all();
}

void StoreCalls::touch(const BlockId* blocks, size_t n) {
  if (n == 0) return;
  std::lock_guard<std::mutex> g(mu_);
  if (stopping_) return;
  if (n > kMaxQueuedTouchBlocks - queued_touch_blocks_ ||
      (!toucher_started_ && start_worker(true) != Result::kOk)) {
    touches_dropped_ += n;
    if (!warned_drop_)
      UCM_WARN("local rank %u: the store's touch is behind (%zu blocks queued, or no thread for it): a batch of %zu "
               "blocks is not forwarded to it (touch is a hint; later drops are counted, not printed)",
               rank_, queued_touch_blocks_, n);
    warned_drop_ = true;
    return;
  }
  touches_.emplace_back(blocks, blocks + n);
  queued_touch_blocks_ += n;
  touch_cv_.notify_one();
}

void StoreCalls::toucher_main(Worker* self) {
  name_this_thread("touch", rank_);
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    touch_cv_.wait(lk, [&] { return stopping_ || !touches_.empty(); });
    if (stopping_) break;  // queued hints die with the cache
    std::vector<BlockId> batch = std::move(touches_.front());
    touches_.pop_front();
    lk.unlock();
    store_->touch(batch.data(), batch.size());
    lk.lock();
    queued_touch_blocks_ -= batch.size();
  }
  self->exited = true;
  done_cv_.notify_all();
}

void StoreCalls::stop() {
  std::lock_guard<std::mutex> g(mu_);
  stopping_ = true;
  ask_cv_.notify_all();
  touch_cv_.notify_all();
  done_cv_.notify_all();
}

uint32_t StoreCalls::shutdown(uint64_t deadline_ns) {
  stop();
  std::unique_lock<std::mutex> lk(mu_);
  auto all_exited = [&] {
    for (const auto& w : workers_)
      if (!w->exited) return false;
    return true;
  };
  (void)wait_until_ns(done_cv_, lk, deadline_ns, all_exited);
  uint32_t left = 0;
  for (auto& w : workers_) {
    if (!w->th.joinable()) continue;
    if (w->exited) {
      w->th.join();  // it has left its loop: only its return is left
    } else {
      w->th.detach();  // still in the store: it returns into this object
      ++left;
    }
  }
  shut_down_ = true;
  return left;
}

size_t StoreCalls::queued_asks() const {
  std::lock_guard<std::mutex> g(mu_);
  return asks_.size();
}

uint64_t StoreCalls::touches_dropped() const {
  std::lock_guard<std::mutex> g(mu_);
  return touches_dropped_;
}

}  // namespace ucm
