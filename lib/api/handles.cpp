#include "api/handles.h"

#include <mutex>
#include <unordered_set>

namespace ucm {
namespace {

std::mutex g_mu;
std::unordered_set<ucm_cache_s*>& live() {
  static auto* s = new std::unordered_set<ucm_cache_s*>();
  return *s;
}
std::unordered_set<ucm_cache_s*>& tombstones() {
  static auto* s = new std::unordered_set<ucm_cache_s*>();
  return *s;
}
thread_local std::string t_orphan_error;

}  // namespace

ucm_cache_s* register_handle(std::unique_ptr<Cache> impl) {
  auto* h = new ucm_cache_s{std::move(impl)};
  std::lock_guard<std::mutex> g(g_mu);
  live().insert(h);
  return h;
}

Result resolve_handle(ucm_cache_t h, Cache** out) {
  if (!h) return fail(Result::kBadHandle, "cache handle is NULL");
  std::lock_guard<std::mutex> g(g_mu);
  if (live().count(h)) {
    *out = h->impl.get();
    return Result::kOk;
  }
  if (tombstones().count(h)) return fail(Result::kFinalized, "cache handle %p was finalized", static_cast<void*>(h));
  return fail(Result::kBadHandle, "%p is not a cache handle", static_cast<void*>(h));
}

Result retire_handle(ucm_cache_t h, std::unique_ptr<Cache>* out) {
  Cache* c = nullptr;
  {
    Result r = resolve_handle(h, &c);
    if (r != Result::kOk) return r;
  }
  std::lock_guard<std::mutex> g(g_mu);
  if (!live().erase(h)) return fail(Result::kFinalized, "cache handle %p was finalized", static_cast<void*>(h));
  tombstones().insert(h);
  *out = std::move(h->impl);
  return Result::kOk;
}

ucm_result_t finish_call(Cache* c, Result r) {
  if (r != Result::kOk) {
    if (c) c->set_error(last_error());
    else set_orphan_error(last_error());
  }
  return static_cast<ucm_result_t>(r);
}

void set_orphan_error(const std::string& e) { t_orphan_error = e; }
const char* orphan_error() { return t_orphan_error.c_str(); }

}  // namespace ucm
