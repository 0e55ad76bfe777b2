// C API: configuration. Nothing throws across this boundary.
#include <string>

#include "api/config.h"
#include "api/guard.h"
#include "common/log.h"
#include "ucmcache/ucm.h"

namespace {
thread_local std::string t_config_error;

ucm_result_t finish(ucm::Result r) noexcept {
  try {
    t_config_error = r == ucm::Result::kOk ? std::string() : ucm::last_error();
  } catch (...) {
    t_config_error.clear();  // no memory for the message: the result still says what failed
  }
  return static_cast<ucm_result_t>(r);
}
}  // namespace

extern "C" {

UCM_API ucm_result_t ucm_config_init(ucm_config_t* config) {
  return finish(ucm::guarded("ucm_config_init", [&] {
    if (!config) return ucm::fail(ucm::Result::kNullPointer, "config is NULL");
    ucm::config_defaults(config);
    ucm_config_t with_env = *config;
    UCM_CHECK(ucm::config_from_env(&with_env));
    *config = with_env;
    return ucm::Result::kOk;
  }));
}

UCM_API ucm_result_t ucm_config_check(const ucm_config_t* config) {
  return finish(ucm::guarded("ucm_config_check", [&] {
    if (!config) return ucm::fail(ucm::Result::kNullPointer, "config is NULL");
    return ucm::check_config(*config);
  }));
}

UCM_API const char* ucm_config_error(void) { return t_config_error.c_str(); }

}  // extern "C"
