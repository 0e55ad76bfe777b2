// C API: cache lifetime and information. Nothing throws across this boundary;
// every failure leaves its message in the cache's last error (or the thread's,
// when there is no usable handle).
#include <new>

#include "api/config.h"
#include "api/handles.h"
#include "boot/node.h"
#include "common/log.h"
#include "common/trace.h"
#include "common/time.h"

using ucm::finish_call;
using ucm::guarded;

extern "C" {

UCM_API ucm_result_t ucm_cache_init(MPI_Comm comm, const ucm_config_t* config, ucm_cache_t* cache) {
  UCM_TRACE(ucm::TraceRange::kInit);
  if (cache) *cache = nullptr;
  return finish_call(nullptr, guarded("ucm_cache_init", [&] {
    UCM_CHECK(ucm::check_mpi_usable(comm));
    // A bad argument on this rank still joins every collective step, so that
    // its peers return the same error instead of waiting for it.
    ucm::Result arg = ucm::Result::kOk;
    if (!cache) arg = ucm::fail(ucm::Result::kNullPointer, "cache (the output handle) is NULL");
    // The caller's config as a whole one (an older caller's is smaller); on
    // failure cfg holds the defaults, and the failure is this rank's status.
    ucm_config_t cfg;
    const ucm::Result read = ucm::config_read(config, &cfg);
    if (ucm::ok(arg)) arg = read;
    auto impl = std::make_unique<ucm::Cache>();
    UCM_CHECK(impl->init(comm, cfg, arg));
    *cache = ucm::register_handle(std::move(impl));
    return ucm::Result::kOk;
  }));
}

UCM_API ucm_result_t ucm_cache_finalize(ucm_cache_t* cache) {
  UCM_TRACE(ucm::TraceRange::kFinalize);
  if (!cache) return finish_call(nullptr, ucm::fail(ucm::Result::kNullPointer, "cache (the handle's address) is NULL"));
  const uint64_t start = ucm::now_ns();
  return finish_call(nullptr, guarded("ucm_cache_finalize", [&] {
    ucm::Retired gone;
    UCM_CHECK(ucm::retire_handle(*cache, [](ucm::Cache* c) { c->stop_tasks(); }, &gone));
    *cache = nullptr;
    // One bound for the whole call: the calls in flight and the peers share it.
    const ucm::Cache* c = gone.cache ? gone.cache.get() : gone.still_used;
    const uint32_t timeout_ms = c->config().timeout_ms;
    const uint64_t deadline = start + uint64_t{timeout_ms} * 1'000'000;
    if (gone.cache) return gone.cache->finalize(deadline);
    // Calls on other threads still use the cache: keep it as it is, but meet
    // the peers, who must not wait for this rank.
    // The calls left running are this rank's news; a peer that did not come
    // is added to it, not put in its place.
    std::string peers;
    if (gone.still_used->depart(deadline) != ucm::Result::kOk) peers = "; also: " + ucm::last_error();
    return ucm::fail(ucm::Result::kTimeout,
                     "%u call(s) on other threads were still running %u ms (timeout_ms) after finalize began: the "
                     "handle is finalized, but the cache's memory and threads are left in place, not freed under them%s",
                     gone.calls, timeout_ms, peers.c_str());
  }));
}

UCM_API ucm_result_t ucm_cache_info(ucm_cache_t cache, ucm_cache_info_t* info) {
  return ucm::cache_call(cache, "ucm_cache_info", [&](ucm::Cache& c) {
    if (!info) return ucm::fail(ucm::Result::kNullPointer, "info is NULL");
    UCM_CHECK(ucm::check_struct_bytes("info->struct_bytes", "ucm_cache_info_t", info->struct_bytes,
                                      ucm::kCacheInfoFirstBytes, sizeof(ucm_cache_info_t)));
    c.info(info);
    return ucm::Result::kOk;
  });
}

UCM_API const char* ucm_last_error(ucm_cache_t cache) {
  if (!cache) return ucm::orphan_error();
  // The string lives in thread-local storage so that it stays valid for the caller.
  thread_local std::string copy;
  ucm::CacheRef ref;
  const ucm::Result r = guarded("ucm_last_error", [&] {
    UCM_CHECK(ref.acquire(cache));
    copy = ucm::cache_error(cache, *ref.get());
    return ucm::Result::kOk;
  });
  if (r != ucm::Result::kOk) {
    ucm::set_orphan_error(ucm::last_error());
    return ucm::orphan_error();
  }
  return copy.c_str();
}

}  // extern "C"
