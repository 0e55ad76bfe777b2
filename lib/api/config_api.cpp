// C API: configuration and versions. Nothing throws across this boundary; a
// failure's message is the thread's ucm_last_error(NULL).
#include <string>

#include "api/config.h"
#include "api/guard.h"
#include "common/log.h"
#include "ucmcache/ucm_base.h"

namespace {

ucm_result_t finish(ucm::Result r) noexcept {
  if (r != ucm::Result::kOk) ucm::set_orphan_error(ucm::last_error());
  return static_cast<ucm_result_t>(r);
}

}  // namespace

extern "C" {

UCM_API ucm_result_t ucm_config_init_version(ucm_config_t* config, size_t struct_bytes, uint32_t version) {
  return finish(ucm::guarded("ucm_config_init", [&] { return ucm::config_init(config, struct_bytes, version); }));
}

UCM_API ucm_result_t ucm_config_check(const ucm_config_t* config) {
  return finish(ucm::guarded("ucm_config_check", [&] {
    ucm_config_t whole;
    UCM_CHECK(ucm::config_read(config, &whole));
    return ucm::check_config(whole);
  }));
}

UCM_API const char* ucm_config_error(void) { return ucm::orphan_error(); }

UCM_API ucm_result_t ucm_get_version(int* version) {
  if (!version) return finish(ucm::fail(ucm::Result::kNullPointer, "ucm_get_version: version is NULL"));
  *version = UCM_VERSION_CODE;
  return UCM_OK;
}

}  // extern "C"
