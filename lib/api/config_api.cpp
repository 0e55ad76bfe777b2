// C API: configuration. Nothing throws across this boundary.
#include <new>
#include <string>

#include "api/config.h"
#include "ucmcache/ucm.h"

namespace {
thread_local std::string t_config_error;

ucm_result_t finish(ucm::Result r) {
  t_config_error = r == ucm::Result::kOk ? std::string() : ucm::last_error();
  return static_cast<ucm_result_t>(r);
}
}  // namespace

extern "C" {

UCM_API ucm_result_t ucm_config_init(ucm_config_t* config) {
  if (!config) {
    t_config_error = "config is NULL";
    return UCM_ERR_INVALID_ARG;
  }
  try {
    ucm::config_defaults(config);
    ucm_config_t with_env = *config;
    const ucm::Result r = ucm::config_from_env(&with_env);
    if (r == ucm::Result::kOk) *config = with_env;
    return finish(r);
  } catch (const std::bad_alloc&) {
    return UCM_ERR_NO_MEMORY;
  }
}

UCM_API ucm_result_t ucm_config_check(const ucm_config_t* config) {
  if (!config) {
    t_config_error = "config is NULL";
    return UCM_ERR_INVALID_ARG;
  }
  try {
    return finish(ucm::check_config(*config));
  } catch (const std::bad_alloc&) {
    return UCM_ERR_NO_MEMORY;
  }
}

UCM_API const char* ucm_config_error(void) { return t_config_error.c_str(); }

}  // extern "C"
