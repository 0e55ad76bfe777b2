// Captures the library's log lines for a scope, so a test that expects
// warnings counts them instead of printing them (a stress loop may expect one
// per round). Lines are counted by a substring the test names; the first few
// are kept verbatim for failure messages. One capture at a time, made and
// ended while no other thread logs (before the test's threads start, after
// they are joined).
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

#include "common/log_sink.h"

namespace ucm::test {

class LogCapture {
 public:
  LogCapture() { log_set_sink(&LogCapture::sink, this); }
  ~LogCapture() { log_set_sink(nullptr, nullptr); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Lines captured at `level`.
  size_t count(LogLevel level) const {
    std::lock_guard<std::mutex> g(mu_);
    return level == LogLevel::kWarn ? warnings_ : level == LogLevel::kInfo ? infos_ : debugs_;
  }
  size_t warnings() const { return count(LogLevel::kWarn); }
  // Warnings whose message contains `needle`.
  size_t warnings_with(const std::string& needle) const {
    std::lock_guard<std::mutex> g(mu_);
    size_t n = 0;
    for (const auto& [text, times] : distinct_)
      if (text.find(needle) != std::string::npos) n += times;
    return n + overflow_matches(needle);
  }
  // The first lines captured, for a failure message.
  std::string first_lines() const {
    std::lock_guard<std::mutex> g(mu_);
    std::string out;
    for (const std::string& l : first_) out += l + "\n";
    return out;
  }

 private:
  static constexpr size_t kKeep = 8;          // lines kept verbatim
  static constexpr size_t kDistinct = 4096;   // distinct warning texts kept for counting

  static void sink(void* user, LogLevel level, const char* message) {
    auto* self = static_cast<LogCapture*>(user);
    std::lock_guard<std::mutex> g(self->mu_);
    if (self->first_.size() < kKeep) self->first_.emplace_back(message);
    if (level == LogLevel::kInfo) ++self->infos_;
    if (level == LogLevel::kDebug) ++self->debugs_;
    if (level != LogLevel::kWarn) return;
    ++self->warnings_;
    for (auto& [text, times] : self->distinct_)
      if (text == message) {
        ++times;
        return;
      }
    if (self->distinct_.size() < kDistinct) self->distinct_.emplace_back(message, 1);
    else self->overflow_.emplace_back(message);
  }
  size_t overflow_matches(const std::string& needle) const {
    size_t n = 0;
    for (const std::string& l : overflow_) n += l.find(needle) != std::string::npos;
    return n;
  }

  mutable std::mutex mu_;
  size_t warnings_ = 0, infos_ = 0, debugs_ = 0;
  std::vector<std::string> first_;
  std::vector<std::pair<std::string, size_t>> distinct_;
  std::vector<std::string> overflow_;
};

}  // namespace ucm::test
