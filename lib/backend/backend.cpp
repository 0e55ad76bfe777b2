#include "backend/backend.h"

#include <cinttypes>
#include <cstdarg>
#include <cstdio>

namespace ucm {

void complete_with(IoRequest* req, Result r, const char* fmt, ...) {
  req->result = r;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(req->error, sizeof(req->error), fmt, ap);
  va_end(ap);
  req->done(req);
}

bool reject_malformed(IoRequest* req, const BackendContext& ctx, bool is_load, const char* store,
                      AtomicBackendCounters* counters) {
  if (req->bytes != ctx.shard_bytes) {
    counters->rejected(is_load);
    complete_with(req, Result::kInvalidArg, "%s store: request of %" PRIu64 " bytes, shards are %" PRIu64, store,
                  req->bytes, ctx.shard_bytes);
    return true;
  }
  if (req->key.shard >= ctx.shards_per_block) {
    counters->rejected(is_load);
    complete_with(req, Result::kInvalidArg, "%s store: shard %u >= shards_per_block %u", store, req->key.shard,
                  ctx.shards_per_block);
    return true;
  }
  return false;
}

void AtomicBackendCounters::load_started() {
  const uint64_t now = inflight_loads.fetch_add(1, std::memory_order_relaxed) + 1;
  uint64_t peak = peak_inflight_loads.load(std::memory_order_relaxed);
  while (now > peak && !peak_inflight_loads.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void AtomicBackendCounters::rejected(bool is_load) {
  if (is_load) {
    loads.fetch_add(1, std::memory_order_relaxed);
    load_failures.fetch_add(1, std::memory_order_relaxed);
  } else {
    dumps.fetch_add(1, std::memory_order_relaxed);
    dump_failures.fetch_add(1, std::memory_order_relaxed);
  }
}

void AtomicBackendCounters::load_finished(const IoRequest& req) {
  load_io_ended();
  load_counted(req);
}

void AtomicBackendCounters::load_io_ended() { inflight_loads.fetch_sub(1, std::memory_order_relaxed); }

void AtomicBackendCounters::load_counted(const IoRequest& req) {
  loads.fetch_add(1, std::memory_order_relaxed);
  if (req.result == Result::kOk) bytes_loaded.fetch_add(req.bytes, std::memory_order_relaxed);
  else load_failures.fetch_add(1, std::memory_order_relaxed);
}

void AtomicBackendCounters::dump_finished(const IoRequest& req) {
  dumps.fetch_add(1, std::memory_order_relaxed);
  if (req.result == Result::kOk) bytes_dumped.fetch_add(req.bytes, std::memory_order_relaxed);
  else dump_failures.fetch_add(1, std::memory_order_relaxed);
}

BackendCounters AtomicBackendCounters::snapshot() const {
  BackendCounters c;
  c.loads = loads.load(std::memory_order_relaxed);
  c.load_failures = load_failures.load(std::memory_order_relaxed);
  c.dumps = dumps.load(std::memory_order_relaxed);
  c.dump_failures = dump_failures.load(std::memory_order_relaxed);
  c.touches = touches.load(std::memory_order_relaxed);
  c.bytes_loaded = bytes_loaded.load(std::memory_order_relaxed);
  c.bytes_dumped = bytes_dumped.load(std::memory_order_relaxed);
  c.inflight_loads = inflight_loads.load(std::memory_order_relaxed);
  c.peak_inflight_loads = peak_inflight_loads.load(std::memory_order_relaxed);
  return c;
}

}  // namespace ucm
