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

// UCM_LOG's value as a level: false for a name it does not know.
bool parse_level(const char* v, LogLevel* out) {
  const struct {
    const char* name;
    LogLevel level;
  } levels[] = {{"warn", LogLevel::kWarn}, {"info", LogLevel::kInfo}, {"debug", LogLevel::kDebug}};
  for (const auto& l : levels)
    if (!std::strcmp(v, l.name)) return *out = l.level, true;
  return false;
}

// UCM_LOG_SUBSYS's comma-separated list as a mask (empty items skipped; an
// empty list is every subsystem): false, with *bad the first item it does not
// know.
bool parse_subsys(const std::string& all, uint32_t* mask, std::string* bad) {
  uint32_t m = 0;
  bool any = false;
  for (size_t pos = 0; pos <= all.size();) {
    size_t end = all.find(',', pos);
    if (end == std::string::npos) end = all.size();
    const std::string item = all.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty()) continue;
    any = true;
    uint32_t bits = 0;
    for (const auto& n : kSubsysNames)
      if (item == "all" || item == n.name) bits |= static_cast<uint32_t>(n.subsys);
    if (bits == 0) return *bad = item, false;
    m |= bits;
  }
  *mask = any ? m : ~0u;
  return true;
}

// A bad value leaves the default (warn, every subsystem): ucm_config_init
// reports it (log_check_env).
LogSettings read_settings() {
  LogSettings s;
  if (const char* lvl = std::getenv("UCM_LOG")) (void)parse_level(lvl, &s.level);
  if (const char* list = std::getenv("UCM_LOG_SUBSYS")) {
    uint32_t mask = 0;
    std::string bad;
    if (parse_subsys(list, &mask, &bad)) s.subsys_mask = mask;
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

Result log_check_env() {
  LogLevel level;
  if (const char* v = std::getenv("UCM_LOG"); v && !parse_level(v, &level))
    return fail(Result::kInvalidArg, "UCM_LOG=%s is not one of warn|info|debug", v);
  uint32_t mask = 0;
  std::string bad;
  if (const char* v = std::getenv("UCM_LOG_SUBSYS"); v && !parse_subsys(v, &mask, &bad)) {
    std::string names = "all";
    for (const auto& n : kSubsysNames) names += std::string("|") + n.name;
    return fail(Result::kInvalidArg, "UCM_LOG_SUBSYS=%s: '%s' is not one of %s", v, bad.c_str(), names.c_str());
  }
  return Result::kOk;
}

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
