// The sim store: a backend for tests and studies whose content is a pure
// function of (block, shard, offset) (sim_content.h), with a configurable
// latency, per-request bandwidth and concurrency limit, fault injection, and
// counters.
//
// Timing model: a request admitted at time t completes at
//   t + latency_us + bytes / (gbps * 1e9 B/s)
// and at most max_inflight requests are admitted at once; the rest wait in
// FIFO order. Beside requests its caller counts as stuck (requests_stuck: a
// hung key's), it admits as many more, up to max_inflight more in its life. `workers` threads fill buffers and run completions.
//
// Spec: sim:latency_us=500,gbps=4,max_inflight=64,workers=4,
//           fail_keys=LO.SHARD+LO.SHARD,hang_keys=LO.SHARD,fail_fraction=0.01,seed=1,
//           populated=all|dumped,dumped_capacity=1048576
//           hang_ms=0,hang_sync=0,hang_dumps=0
// (LO: the low 64 bits of the block id, in decimal.) fail_keys fail loads and
// dumps; hang_keys hang loads only: until the store is destroyed, or with
// hang_ms > 0 for that long, after which the load completes with the key's
// bytes (a late completion). hang_dumps=1 hangs their dumps the same way.
// hang_sync=1 makes exists() of a hung key, and
// touch() of a block with a hung key, block the same way (a store stuck in a
// synchronous call); clear_faults() releases them. With populated=dumped only
// shards that were dumped exist and load; by default every key exists.
//
// populated=dumped is the node's truth, not a process's: the dumped keys live
// in a SharedKeySet (shared_key_set.h) in the node-shared state the cache maps
// for its store (BackendContext.node_state), so a key one rank dumped loads on
// every rank of the node. Outside a node the store makes a private table. The
// table holds dumped_capacity keys; a dump past that fails with kNoSpace,
// naming the capacity and the key. A key counts as dumped once its dump
// completed (its latency passed), so a load racing the dump finds either no
// key (never dumped) or the key (and then the whole shard). Faults, attempts
// and the touch log stay the process's own.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <queue>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "backend/backend.h"
#include "backend/node_state.h"
#include "backend/shared_key_set.h"
#include "backend/spec.h"

namespace ucm {

struct SimOptions {
  uint64_t latency_us = 500;
  double gbps = 4.0;  // GB/s per request; 0 = unlimited
  uint32_t max_inflight = 64;
  uint32_t workers = 4;
  double fail_fraction = 0.0;
  uint64_t seed = 1;
  bool populated_all = true;
  uint64_t dumped_capacity = uint64_t{1} << 20;  // keys the populated=dumped table holds
  uint64_t hang_ms = 0;    // a hung load completes after this long; 0: at destruction
  bool hang_sync = false;  // exists()/touch() of hung keys block too
  bool hang_dumps = false; // dumps of hung keys hang too
};

class SimBackend final : public Backend {
 public:
  [[nodiscard]] static Result create(const SimOptions& o, const BackendContext& ctx, std::unique_ptr<SimBackend>* out);
  [[nodiscard]] static Result parse_options(const Spec& spec, SimOptions* out, std::vector<Key>* fail_keys,
                                            std::vector<Key>* hang_keys);
  // Bytes of node-shared state the options need (0 with populated=all).
  static uint64_t node_state_bytes(const SimOptions& o);
  ~SimBackend() override;

  const char* name() const override { return "sim"; }
  void load(IoRequest* req) override;
  void dump(IoRequest* req) override;
  void touch(const BlockId* blocks, size_t n) override;
  [[nodiscard]] Result exists(const Key& k, bool* out) override;
  BackendCounters counters() const override { return counters_.snapshot(); }
  // Stops the workers and completes every request it still holds (queued,
  // in its latency, hung: kTimeout) before it returns 0: its completions
  // touch the caller, which may free what they touch once this returns
  // (Cache::release_local keeps a store whose synchronous call is stuck,
  // but frees the queue and the data plane). Calls held by hang_sync return
  // at once from here on; the destructor waits them out.
  uint32_t shutdown(uint64_t deadline_ns) override;
  void requests_stuck(uint32_t loads, uint32_t dumps) override;
  // Takes back a request waiting for admission (over max_inflight).
  [[nodiscard]] bool cancel(IoRequest* req) override;
  // Requests waiting for admission now.
  size_t waiting() const {
    std::lock_guard<std::mutex> g(mu_);
    return waiting_.size();
  }
  // Requests that may be admitted at once now (max_inflight, and the room
  // made beside stuck ones).
  uint32_t inflight_limit() const {
    std::lock_guard<std::mutex> g(mu_);
    return opts_.max_inflight + room_;
  }

  // Fault injection, at run time.
  void fail_key(const Key& k);
  void hang_key(const Key& k);
  void clear_faults();
  // Calls held in exists()/touch() by hang_sync right now.
  uint32_t sync_calls_held() const {
    std::lock_guard<std::mutex> g(mu_);
    return sync_held_;
  }
  // Every block passed to touch(), in call order (the first million).
  std::vector<BlockId> touched_blocks() const;
  const SimOptions& options() const { return opts_; }
  // Whether the dumped-key table is the node's (false: this process's own).
  bool node_shared() const { return !opts_.populated_all && !private_state_.valid(); }

 private:
  SimBackend(const SimOptions& o, const BackendContext& ctx);
  struct Pending {
    uint64_t due_ns;
    IoRequest* req;
    bool is_load;
    bool operator>(const Pending& o) const { return due_ns > o.due_ns; }
  };
  void submit(IoRequest* req, bool is_load);
  void admit_locked(IoRequest* req, bool is_load, uint64_t now);
  void worker();
  void finish(IoRequest* req, bool is_load);
  bool should_fail(const Key& k);
  // hang_sync: blocks while `hung` holds (under mu_), until destruction,
  // clear_faults(), or hang_ms.
  template <typename Pred>
  void hold_sync(Pred hung);

  const SimOptions opts_;
  const BackendContext ctx_;
  AtomicBackendCounters counters_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Pending, std::vector<Pending>, std::greater<Pending>> timed_;
  std::deque<std::pair<IoRequest*, bool>> waiting_;  // over the in-flight limit
  std::vector<IoRequest*> hung_;
  uint32_t admitted_ = 0;
  uint32_t room_ = 0;  // admitted beside stuck requests (requests_stuck), at most max_inflight
  uint32_t sync_held_ = 0;  // calls inside hold_sync(); the destructor waits them out
  bool stopping_ = false;  // shutdown() began: no request is admitted, held or completed by a worker
  std::unordered_set<Key, KeyHash> fail_, hang_;
  NodeState private_state_;  // the table's memory when the context gave none
  SharedKeySet dumped_;      // populated=dumped only; lock-free, not under mu_
  std::unordered_map<Key, uint64_t, KeyHash> attempts_;
  std::vector<BlockId> touched_;
  std::vector<std::thread> threads_;
};

}  // namespace ucm
