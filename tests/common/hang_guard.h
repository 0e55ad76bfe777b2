// The one bound a test puts on "this returns": a hang guard. Tests assert the
// protocol (the result code and message a wait promises, and lower bounds a
// deadline makes deterministic: a wait with timeout T cannot time out before
// T); they never assert how fast a call was, since a loaded machine can delay
// any thread by seconds. What is left to catch is a real hang, and that is
// this file's job, at a bound far past any scheduling delay:
// kHangSeconds scaled by UCM_TEST_TIME_MULTIPLIER (stress.h).
//
//   { HangGuard g("ucm_cache_finalize"); r = ucm_cache_finalize(&c); }
//   ASSERT_TRUE(eventually("the late completions", [&] { return ...; }));
//
// A HangGuard whose call does not return prints "hung: X did not return
// within N s" and ends the process (the call cannot be interrupted, and a
// test that never returns would report nothing); under mpirun that ends the
// job, which names the rank. eventually() polls in the test's own thread, so
// it fails the test normally instead.
#pragma once

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

#include "common/time.h"
#include "stress.h"

namespace ucm::test {

// A hang, not slowness: every bounded call under test is designed to return
// in well under a second here.
constexpr double kHangSeconds = 60;

// The guard's bound in seconds (kHangSeconds, or `base`, times the multiplier).
inline double hang_seconds(double base = kHangSeconds) { return base * test_time_multiplier(); }
inline uint64_t hang_ms(double base = kHangSeconds) { return static_cast<uint64_t>(hang_seconds(base) * 1000); }

class HangGuard {
 public:
  explicit HangGuard(std::string what, double base_seconds = kHangSeconds)
      : what_(std::move(what)), seconds_(hang_seconds(base_seconds)) {
    watcher_ = std::thread([this] {
      std::unique_lock<std::mutex> g(mu_);
      const auto bound = std::chrono::duration<double>(seconds_);
      if (cv_.wait_for(g, bound, [this] { return returned_; })) return;
      std::fprintf(stderr, "hung: %s did not return within %g s (pid %d)\n", what_.c_str(), seconds_,
                   static_cast<int>(getpid()));
      std::fflush(nullptr);
      std::_Exit(124);
    });
  }
  ~HangGuard() {
    {
      std::lock_guard<std::mutex> g(mu_);
      returned_ = true;
    }
    cv_.notify_one();
    watcher_.join();
  }
  HangGuard(const HangGuard&) = delete;
  HangGuard& operator=(const HangGuard&) = delete;

 private:
  std::string what_;
  double seconds_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool returned_ = false;
  std::thread watcher_;
};

// Polls `pred` every millisecond until it holds: true then; false with a test
// failure "hung: `what` did not happen within N s" when it never does.
template <typename Pred>
bool eventually(const std::string& what, Pred pred, double base_seconds = kHangSeconds) {
  const double seconds = hang_seconds(base_seconds);
  const uint64_t until = now_ns() + static_cast<uint64_t>(seconds * 1e9);
  while (!pred()) {
    if (now_ns() >= until) {
      ADD_FAILURE() << "hung: " << what << " did not happen within " << std::setprecision(3) << seconds << " s";
      return false;
    }
    usleep(1000);
  }
  return true;
}

}  // namespace ucm::test
