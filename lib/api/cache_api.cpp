// C API: cache lifetime and information. Nothing throws across this boundary;
// every failure leaves its message in the cache's last error (or the thread's,
// when there is no usable handle).
#include <new>

#include "api/config.h"
#include "api/handles.h"
#include "common/log.h"

using ucm::finish_call;

extern "C" {

UCM_API ucm_result_t ucm_cache_init(MPI_Comm comm, const ucm_config_t* config, ucm_cache_t* cache) {
  if (!cache) return finish_call(nullptr, ucm::fail(ucm::Result::kInvalidArg, "cache (the output handle) is NULL"));
  *cache = nullptr;
  try {
    ucm_config_t cfg;
    if (config) {
      cfg = *config;
    } else {
      // A NULL config still joins the collective, so the error is the same everywhere.
      ucm::config_defaults(&cfg);
      cfg.struct_bytes = 0;
    }
    auto impl = std::make_unique<ucm::Cache>();
    ucm::Result r = impl->init(comm, cfg);
    if (r != ucm::Result::kOk) {
      if (!config) r = ucm::fail(ucm::Result::kInvalidArg, "config is NULL (use ucm_config_init)");
      return finish_call(nullptr, r);
    }
    *cache = ucm::register_handle(std::move(impl));
    return UCM_OK;
  } catch (const std::bad_alloc&) {
    return finish_call(nullptr, ucm::fail(ucm::Result::kNoMemory, "out of memory in ucm_cache_init"));
  }
}

UCM_API ucm_result_t ucm_cache_finalize(ucm_cache_t* cache) {
  if (!cache) return finish_call(nullptr, ucm::fail(ucm::Result::kInvalidArg, "cache (the handle's address) is NULL"));
  std::unique_ptr<ucm::Cache> impl;
  ucm::Result r = ucm::retire_handle(*cache, &impl);
  if (r != ucm::Result::kOk) return finish_call(nullptr, r);
  *cache = nullptr;
  r = impl->finalize();
  return finish_call(nullptr, r);
}

UCM_API ucm_result_t ucm_cache_info(ucm_cache_t cache, ucm_cache_info_t* info) {
  ucm::Cache* c = nullptr;
  ucm::Result r = ucm::resolve_handle(cache, &c);
  if (r != ucm::Result::kOk) return finish_call(nullptr, r);
  if (!info) return finish_call(c, ucm::fail(ucm::Result::kInvalidArg, "info is NULL"));
  if (info->struct_bytes != sizeof(ucm_cache_info_t))
    return finish_call(c, ucm::fail(ucm::Result::kInvalidArg, "info->struct_bytes %u != %zu: set it to sizeof(ucm_cache_info_t)",
                               info->struct_bytes, sizeof(ucm_cache_info_t)));
  c->info(info);
  return UCM_OK;
}

UCM_API const char* ucm_last_error(ucm_cache_t cache) {
  if (!cache) return ucm::orphan_error();
  ucm::Cache* c = nullptr;
  if (ucm::resolve_handle(cache, &c) != ucm::Result::kOk) {
    ucm::set_orphan_error(ucm::last_error());
    return ucm::orphan_error();
  }
  // The string lives in thread-local storage so that it stays valid for the caller.
  thread_local std::string copy;
  copy = c->error();
  return copy.c_str();
}

}  // extern "C"
