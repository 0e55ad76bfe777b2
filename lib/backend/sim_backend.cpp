#include "backend/sim_backend.h"

#include <algorithm>
#include <cinttypes>
#include <cstdlib>

#include "backend/sim_content.h"
#include "common/log.h"
#include "common/thread_name.h"
#include "common/trace.h"
#include "common/time.h"

namespace ucm {
namespace {

constexpr size_t kTouchLogLimit = 1u << 20;

// "12.3+15.0" -> keys (block lo 12 shard 3, block lo 15 shard 0).
Result parse_key_list(const std::string& name, const std::string& value, std::vector<Key>* out) {
  size_t pos = 0;
  while (pos < value.size()) {
    size_t end = value.find('+', pos);
    if (end == std::string::npos) end = value.size();
    const std::string item = value.substr(pos, end - pos);
    pos = end + 1;
    if (item.empty() || (pos == value.size() && value.back() == '+'))
      return fail(Result::kInvalidArg, "backend option %s=%s has an empty item (a '+' too many)", name.c_str(),
                  value.c_str());
    const size_t dot = item.find('.');
    if (dot == std::string::npos)
      return fail(Result::kInvalidArg, "backend option %s: \"%s\" is not LO.SHARD", name.c_str(), item.c_str());
    const std::string lo_text = item.substr(0, dot);
    const std::string shard_text = item.substr(dot + 1);
    uint64_t lo = 0, shard = 0;
    if (spec_u64(name, lo_text, 0, UINT64_MAX, &lo) != Result::kOk ||
        spec_u64(name, shard_text, 0, UINT32_MAX - 1, &shard) != Result::kOk)
      return fail(Result::kInvalidArg, "backend option %s: \"%s\" is not LO.SHARD", name.c_str(), item.c_str());
    Key k;
    k.block.lo = lo;
    k.shard = static_cast<uint32_t>(shard);
    out->push_back(k);
  }
  return Result::kOk;
}

// Faults named in a spec match on the block id's low half and the shard only.
Key fault_key(const Key& k) {
  Key f = k;
  f.block.hi = 0;
  return f;
}

}  // namespace

Result make_sim_backend(const Spec& spec, const BackendContext& ctx, std::unique_ptr<Backend>* out) {
  SimOptions o;
  std::vector<Key> fails, hangs;
  UCM_CHECK(SimBackend::parse_options(spec, &o, &fails, &hangs));
  std::unique_ptr<SimBackend> b;
  UCM_CHECK(SimBackend::create(o, ctx, &b));
  for (const Key& k : fails) b->fail_key(k);
  for (const Key& k : hangs) b->hang_key(k);
  *out = std::move(b);
  return Result::kOk;
}

Result sim_node_state_bytes(const Spec& spec, uint64_t* out) {
  SimOptions o;
  std::vector<Key> fails, hangs;
  UCM_CHECK(SimBackend::parse_options(spec, &o, &fails, &hangs));
  *out = SimBackend::node_state_bytes(o);
  return Result::kOk;
}

uint64_t SimBackend::node_state_bytes(const SimOptions& o) {
  return o.populated_all ? 0 : SharedKeySet::region_bytes(o.dumped_capacity);
}

Result SimBackend::parse_options(const Spec& spec, SimOptions* o, std::vector<Key>* fails, std::vector<Key>* hangs) {
  if (!spec.positional.empty())
    return fail(Result::kInvalidArg, "sim backend: unexpected \"%s\" (options are key=value)", spec.positional.c_str());
  for (const auto& [k, v] : spec.options) {
    uint64_t u = 0;
    if (k == "latency_us") {
      UCM_CHECK(spec_u64(k, v, 0, 60'000'000, &o->latency_us));
    } else if (k == "gbps") {
      UCM_CHECK(spec_double(k, v, 0, 1e6, &o->gbps));
    } else if (k == "max_inflight") {
      UCM_CHECK(spec_u64(k, v, 1, 1 << 20, &u));
      o->max_inflight = static_cast<uint32_t>(u);
    } else if (k == "workers") {
      UCM_CHECK(spec_u64(k, v, 1, 256, &u));
      o->workers = static_cast<uint32_t>(u);
    } else if (k == "fail_fraction") {
      UCM_CHECK(spec_double(k, v, 0, 1, &o->fail_fraction));
    } else if (k == "seed") {
      UCM_CHECK(spec_u64(k, v, 0, UINT64_MAX, &o->seed));
    } else if (k == "populated") {
      if (v != "all" && v != "dumped")
        return fail(Result::kInvalidArg, "backend option populated=%s is neither all nor dumped", v.c_str());
      o->populated_all = v == "all";
    } else if (k == "dumped_capacity") {
      UCM_CHECK(spec_u64(k, v, 1, kKeySetMaxCapacity, &o->dumped_capacity));
    } else if (k == "hang_ms") {
      UCM_CHECK(spec_u64(k, v, 0, 3'600'000, &o->hang_ms));
    } else if (k == "hang_dumps") {
      UCM_CHECK(spec_u64(k, v, 0, 1, &u));
      o->hang_dumps = u != 0;
    } else if (k == "hang_sync") {
      UCM_CHECK(spec_u64(k, v, 0, 1, &u));
      o->hang_sync = u != 0;
    } else if (k == "fail_keys") {
      UCM_CHECK(parse_key_list(k, v, fails));
    } else if (k == "hang_keys") {
      UCM_CHECK(parse_key_list(k, v, hangs));
    } else {
      return fail(Result::kInvalidArg, "sim backend: unknown option \"%s\"", k.c_str());
    }
  }
  return Result::kOk;
}

SimBackend::SimBackend(const SimOptions& o, const BackendContext& ctx) : opts_(o), ctx_(ctx) {}

Result SimBackend::create(const SimOptions& o, const BackendContext& ctx, std::unique_ptr<SimBackend>* out) {
  if (o.max_inflight == 0) return fail(Result::kInvalidArg, "sim backend: max_inflight is 0");
  if (o.workers == 0) return fail(Result::kInvalidArg, "sim backend: workers is 0");
  std::unique_ptr<SimBackend> b(new SimBackend(o, ctx));
  if (!o.populated_all) {
    const uint64_t need = node_state_bytes(o);
    void* base = ctx.node_state;
    uint64_t bytes = ctx.node_state_bytes;
    if (!base) {
      UCM_CHECK(NodeState::make_private(need, &b->private_state_));
      base = b->private_state_.base();
      bytes = b->private_state_.bytes();
    }
    if (bytes < need)
      return fail(Result::kInvalidArg, "sim backend: dumped_capacity=%" PRIu64 " needs %" PRIu64
                  " bytes of node state; the cache gave %" PRIu64, o.dumped_capacity, need, bytes);
    UCM_CHECK(SharedKeySet::attach(base, bytes, o.dumped_capacity, &b->dumped_));
  }
  for (uint32_t i = 0; i < o.workers; ++i) b->threads_.emplace_back([p = b.get()] { p->worker(); });
  UCM_NODE_INFO(kBackend, "store: sim, latency %" PRIu64 " us, %.2f GB/s per request, %u in flight, %u workers",
                o.latency_us, o.gbps, o.max_inflight, o.workers);
  *out = std::move(b);
  return Result::kOk;
}

SimBackend::~SimBackend() {
  (void)shutdown(kNoDeadline);
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return sync_held_ == 0; });  // they return at once on stopping_
}

uint32_t SimBackend::shutdown(uint64_t deadline_ns) {
  (void)deadline_ns;  // nothing of the sim store's blocks in the kernel
  std::vector<IoRequest*> abandoned;
  {
    std::lock_guard<std::mutex> g(mu_);
    stopping_ = true;
    abandoned.swap(hung_);
    for (auto& [req, is_load] : waiting_) abandoned.push_back(req);
    waiting_.clear();
    while (!timed_.empty()) {
      abandoned.push_back(timed_.top().req);
      timed_.pop();
    }
  }
  cv_.notify_all();
  // A worker in a completion finishes it first: after the joins nothing of
  // the store calls a done() but this thread, below.
  for (auto& t : threads_) t.join();
  threads_.clear();
  // Every request gets its one completion, even those held by a hang fault.
  for (IoRequest* r : abandoned) complete_with(r, Result::kTimeout, "sim store shut down with the request pending");
  return 0;
}

void SimBackend::fail_key(const Key& k) {
  std::lock_guard<std::mutex> g(mu_);
  fail_.insert(fault_key(k));
}

void SimBackend::hang_key(const Key& k) {
  std::lock_guard<std::mutex> g(mu_);
  hang_.insert(fault_key(k));
}

void SimBackend::clear_faults() {
  {
    std::lock_guard<std::mutex> g(mu_);
    fail_.clear();
    hang_.clear();
  }
  cv_.notify_all();  // releases the calls held by hang_sync
}

template <typename Pred>
void SimBackend::hold_sync(Pred hung) {
  if (!opts_.hang_sync) return;
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t until = opts_.hang_ms > 0 ? now_ns() + opts_.hang_ms * 1000000ull : kNoDeadline;
  ++sync_held_;
  while (!stopping_ && hung()) {
    const uint64_t now = now_ns();
    if (now >= until) break;
    if (until == kNoDeadline) cv_.wait(lk);
    else cv_.wait_for(lk, std::chrono::nanoseconds(until - now));
  }
  if (--sync_held_ == 0 && stopping_) cv_.notify_all();
}

std::vector<BlockId> SimBackend::touched_blocks() const {
  std::lock_guard<std::mutex> g(mu_);
  return touched_;
}

void SimBackend::load(IoRequest* req) { submit(req, true); }
void SimBackend::dump(IoRequest* req) { submit(req, false); }

void SimBackend::submit(IoRequest* req, bool is_load) {
  if (reject_malformed(req, ctx_, is_load, "sim", &counters_)) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!stopping_) {
      if (admitted_ < opts_.max_inflight + room_) admit_locked(req, is_load, now_ns());
      else waiting_.emplace_back(req, is_load);
      return;
    }
  }
  complete_with(req, Result::kTimeout, "sim store shut down before the request was queued");
}

void SimBackend::admit_locked(IoRequest* req, bool is_load, uint64_t now) {
  ++admitted_;
  if (is_load) counters_.load_started();  // in flight = admitted, not queued
  if ((is_load || opts_.hang_dumps) && hang_.count(fault_key(req->key))) {
    if (opts_.hang_ms > 0) {  // completes late, with the key's bytes
      timed_.push(Pending{now + opts_.hang_ms * 1000000ull, req, is_load});
      cv_.notify_one();
    } else {
      hung_.push_back(req);  // occupies its in-flight place until shutdown
    }
    return;
  }
  uint64_t transfer_ns = 0;
  if (opts_.gbps > 0) transfer_ns = static_cast<uint64_t>(static_cast<double>(req->bytes) / opts_.gbps);
  timed_.push(Pending{now + opts_.latency_us * 1000 + transfer_ns, req, is_load});
  cv_.notify_one();
}

bool SimBackend::should_fail(const Key& k) {
  if (fail_.count(fault_key(k))) return true;
  if (opts_.fail_fraction <= 0) return false;
  // A function of (seed, key, attempt at that key): the same failures whatever
  // order concurrent requests complete in.
  const uint64_t attempt = ++attempts_[k];
  uint64_t z = opts_.seed ^ (attempt * 0x9E3779B97F4A7C15ull) ^ (k.block.lo * 0xC2B2AE3D27D4EB4Full) ^ k.block.hi ^
               (uint64_t{k.shard} << 32);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * 0x1.0p-53 < opts_.fail_fraction;
}

void SimBackend::worker() {
  name_this_thread("sim");
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (stopping_) return;
    if (timed_.empty()) {
      cv_.wait(lk);
      continue;
    }
    const uint64_t now = now_ns();
    const Pending top = timed_.top();
    if (top.due_ns > now) {
      cv_.wait_for(lk, std::chrono::nanoseconds(top.due_ns - now));
      continue;
    }
    timed_.pop();
    const bool failing = should_fail(top.req->key);
    lk.unlock();
    UCM_TRACE(top.is_load ? TraceRange::kBackendLoad : TraceRange::kBackendDump);
    IoRequest* req = top.req;
    // The table is lock-free and the node's: no process lock around it. A dump
    // enters it only now, when its latency has passed.
    const bool missing = top.is_load && !opts_.populated_all && !dumped_.contains(req->key);
    Result recorded = Result::kOk;
    if (!top.is_load && !failing && !opts_.populated_all) recorded = dumped_.insert(req->key);
    if (top.is_load) {
      if (failing) {
        req->result = Result::kBackend;
        snprintf(req->error, sizeof(req->error), "sim store: injected failure loading block %" PRIu64 " shard %u",
                 req->key.block.lo, req->key.shard);
      } else if (missing) {
        req->result = Result::kNotFound;
        snprintf(req->error, sizeof(req->error), "sim store: block %" PRIu64 " shard %u was never dumped",
                 req->key.block.lo, req->key.shard);
      } else {
        sim_fill(req->key, req->buf, req->bytes);
        req->result = Result::kOk;
      }
    } else if (failing) {
      req->result = Result::kBackend;
      snprintf(req->error, sizeof(req->error), "sim store: injected failure dumping block %" PRIu64 " shard %u",
               req->key.block.lo, req->key.shard);
    } else if (recorded != Result::kOk) {
      req->result = recorded;
      snprintf(req->error, sizeof(req->error),
               "sim store: dumped-key table full (dumped_capacity=%" PRIu64 "): block %" PRIu64 " shard %u not stored",
               opts_.dumped_capacity, req->key.block.lo, req->key.shard);
    } else {
      req->result = Result::kOk;
    }
    finish(req, top.is_load);
    lk.lock();
  }
}

void SimBackend::requests_stuck(uint32_t loads, uint32_t dumps) {
  std::lock_guard<std::mutex> g(mu_);
  room_ = std::min(opts_.max_inflight, room_ + loads + dumps);
  const uint64_t now = now_ns();
  while (!stopping_ && !waiting_.empty() && admitted_ < opts_.max_inflight + room_) {
    auto [next, next_is_load] = waiting_.front();
    waiting_.pop_front();
    admit_locked(next, next_is_load, now);
  }
}

bool SimBackend::cancel(IoRequest* req) {
  std::lock_guard<std::mutex> g(mu_);
  const auto at = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w.first == req; });
  if (at == waiting_.end()) return false;
  waiting_.erase(at);
  return true;
}

void SimBackend::finish(IoRequest* req, bool is_load) {
  if (is_load) counters_.load_finished(*req);
  else counters_.dump_finished(*req);
  req->done(req);
  std::lock_guard<std::mutex> g(mu_);
  --admitted_;
  if (!waiting_.empty() && !stopping_ && admitted_ < opts_.max_inflight + room_) {
    auto [next, next_is_load] = waiting_.front();
    waiting_.pop_front();
    admit_locked(next, next_is_load, now_ns());
  }
}

void SimBackend::touch(const BlockId* blocks, size_t n) {
  hold_sync([&] {
    for (size_t i = 0; i < n; ++i)
      for (const Key& h : hang_)
        if (h.block.lo == blocks[i].lo) return true;
    return false;
  });
  counters_.touches.fetch_add(n, std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(mu_);
  for (size_t i = 0; i < n && touched_.size() < kTouchLogLimit; ++i) touched_.push_back(blocks[i]);
}

Result SimBackend::exists(const Key& k, bool* out) {
  hold_sync([&] { return hang_.count(fault_key(k)) != 0; });
  if (k.shard >= ctx_.shards_per_block) {
    *out = false;
    return Result::kOk;
  }
  if (opts_.populated_all) {
    *out = true;
    return Result::kOk;
  }
  *out = dumped_.contains(k);
  return Result::kOk;
}

}  // namespace ucm
