#include "common/log.h"
#include "common/log_sink.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

namespace ucm {
namespace {

struct LogSettings {
  LogLevel level = LogLevel::kWarn;
  uint32_t subsys_mask = ~0u;
  char host[64] = "?";
};

struct SubsysName {
  const char* name;
  Subsys subsys;
};

constexpr SubsysName kSubsysNames[] = {
    {"common", Subsys::kCommon}, {"sync", Subsys::kSync},       {"ctrl", Subsys::kCtrl},
    {"data", Subsys::kData},     {"cache", Subsys::kCache},     {"backend", Subsys::kBackend},
    {"device", Subsys::kDevice}, {"queue", Subsys::kQueue},     {"topo", Subsys::kTopo},
    {"boot", Subsys::kBoot},     {"api", Subsys::kApi},
};

const char* subsys_name(Subsys s) {
  for (const auto& n : kSubsysNames)
    if (n.subsys == s) return n.name;
  return "?";
}

LogSettings read_settings() {
  LogSettings s;
  if (const char* lvl = std::getenv("UCM_LOG")) {
    if (!std::strcmp(lvl, "info")) s.level = LogLevel::kInfo;
    else if (!std::strcmp(lvl, "debug")) s.level = LogLevel::kDebug;
  }
  if (const char* list = std::getenv("UCM_LOG_SUBSYS"); list && *list) {
    s.subsys_mask = 0;
    std::string all(list);
    size_t pos = 0;
    while (pos <= all.size()) {
      size_t end = all.find(',', pos);
      if (end == std::string::npos) end = all.size();
      std::string item = all.substr(pos, end - pos);
      for (const auto& n : kSubsysNames)
        if (item == n.name || item == "all") s.subsys_mask |= static_cast<uint32_t>(n.subsys);
      pos = end + 1;
    }
  }
  gethostname(s.host, sizeof(s.host) - 1);
  return s;
}

const LogSettings& settings() {
  static const LogSettings s = read_settings();
  return s;
}

std::atomic<int> g_rank{-1};
std::atomic<LogSink> g_sink{nullptr};
std::atomic<void*> g_sink_user{nullptr};

}  // namespace

bool log_enabled(LogLevel level, Subsys subsys) {
  const LogSettings& s = settings();
  return static_cast<int>(level) <= static_cast<int>(s.level) &&
         (s.subsys_mask & static_cast<uint32_t>(subsys)) != 0;
}

void log_set_rank(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

LogLevel log_node_level() { return g_rank.load(std::memory_order_relaxed) <= 0 ? LogLevel::kInfo : LogLevel::kDebug; }
void log_set_sink(LogSink sink, void* user) {
  g_sink_user.store(user, std::memory_order_relaxed);
  g_sink.store(sink, std::memory_order_release);
}

void log_line(LogLevel level, Subsys subsys, const char* file, int line, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (const LogSink sink = g_sink.load(std::memory_order_acquire)) {
    sink(g_sink_user.load(std::memory_order_relaxed), level, msg);
    return;
  }
  const char* base = std::strrchr(file, '/');
  base = base ? base + 1 : file;
  const char* lvl = level == LogLevel::kWarn ? "WARN" : level == LogLevel::kInfo ? "INFO" : "DEBUG";
  // One fprintf per line so concurrent ranks do not interleave within a line.
  std::fprintf(stderr, "%s:%d:%ld [%d] %s %s %s:%d %s\n", settings().host, static_cast<int>(getpid()),
               static_cast<long>(syscall(SYS_gettid)), g_rank.load(std::memory_order_relaxed),
               subsys_name(subsys), lvl, base, line, msg);
}

}  // namespace ucm
