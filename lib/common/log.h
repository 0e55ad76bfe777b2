// Logging: one line per event, prefixed `host:pid:tid [rank] SUBSYS`.
//
// UCM_WARN always prints (stderr). UCM_INFO/UCM_DEBUG print when the level from
// UCM_LOG=warn|info|debug allows and the subsystem is listed in
// UCM_LOG_SUBSYS=ctrl,cache,... (default: all). Both variables are read once.
// UCM_NODE_INFO is for a decision every rank of a node makes alike (or one
// that only local rank 0 makes): info on local rank 0 (and before the rank is
// known), debug on the others, so that `info` prints it once per node.
// UCM_CHECK propagates a failing Result upward, logging one debug line per
// level, so a failure with UCM_LOG=debug reads like a backtrace.
#pragma once

#include <cerrno>
#include <cstring>
#include <cstdint>

#include "common/result.h"

namespace ucm {

enum class LogLevel : int { kWarn = 0, kInfo = 1, kDebug = 2 };

enum class Subsys : uint32_t {
  kCommon = 1u << 0,
  kSync = 1u << 1,
  kCtrl = 1u << 2,
  kData = 1u << 3,
  kCache = 1u << 4,
  kBackend = 1u << 5,
  kDevice = 1u << 6,
  kQueue = 1u << 7,
  kTopo = 1u << 8,
  kBoot = 1u << 9,
  kApi = 1u << 10,
};

bool log_enabled(LogLevel level, Subsys subsys);
// UCM_LOG and UCM_LOG_SUBSYS as ucm_config_init checks them: kInvalidArg
// naming a value they do not know (logging itself then keeps its defaults).
[[nodiscard]] Result log_check_env();
void log_line(LogLevel level, Subsys subsys, const char* file, int line, const char* fmt, ...)
    __attribute__((format(printf, 5, 6)));
// The local rank shown in the prefix (-1: none yet). Set once by whoever knows it.
void log_set_rank(int rank);
// kInfo on local rank 0 or before log_set_rank, kDebug on the other ranks.
LogLevel log_node_level();

}  // namespace ucm

#define UCM_WARN(...) ::ucm::log_line(::ucm::LogLevel::kWarn, ::ucm::Subsys::kCommon, __FILE__, __LINE__, __VA_ARGS__)
#define UCM_INFO(SUBSYS, ...)                                                       \
  do {                                                                              \
    if (::ucm::log_enabled(::ucm::LogLevel::kInfo, ::ucm::Subsys::SUBSYS))          \
      ::ucm::log_line(::ucm::LogLevel::kInfo, ::ucm::Subsys::SUBSYS, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
#define UCM_DEBUG(SUBSYS, ...)                                                      \
  do {                                                                              \
    if (::ucm::log_enabled(::ucm::LogLevel::kDebug, ::ucm::Subsys::SUBSYS))         \
      ::ucm::log_line(::ucm::LogLevel::kDebug, ::ucm::Subsys::SUBSYS, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

#define UCM_NODE_INFO(SUBSYS, ...)                                                  \
  do {                                                                              \
    const ::ucm::LogLevel ucm_node_level_ = ::ucm::log_node_level();                \
    if (::ucm::log_enabled(ucm_node_level_, ::ucm::Subsys::SUBSYS))                 \
      ::ucm::log_line(ucm_node_level_, ::ucm::Subsys::SUBSYS, __FILE__, __LINE__, __VA_ARGS__); \
  } while (0)

// Propagates a failure upward, one debug line per level.
#define UCM_CHECK(expr)                                                              \
  do {                                                                               \
    ::ucm::Result ucm_check_r_ = (expr);                                             \
    if (ucm_check_r_ != ::ucm::Result::kOk) {                                        \
      UCM_DEBUG(kCommon, "%s failed: %s", #expr, ::ucm::result_name(ucm_check_r_));  \
      return ucm_check_r_;                                                           \
    }                                                                                \
  } while (0)

// Runs a system call that returns -1 on failure, retrying EINTR; on failure
// records "<what>: <strerror>" and returns Result::kSystem from the caller.
#define UCM_SYSCHECK(call, what)                                                     \
  do {                                                                               \
    long ucm_sys_rc_;                                                                \
    do {                                                                             \
      ucm_sys_rc_ = static_cast<long>(call);                                         \
    } while (ucm_sys_rc_ == -1 && errno == EINTR);                                   \
    if (ucm_sys_rc_ == -1) {                                                         \
      int ucm_sys_errno_ = errno;                                                    \
      return ::ucm::fail(::ucm::Result::kSystem, "%s: %s (errno %d)", what,          \
                         ::strerror(ucm_sys_errno_), ucm_sys_errno_);                \
    }                                                                                \
  } while (0)
