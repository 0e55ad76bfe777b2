// Cache's side of fan-out (queue/fanout.h): init step 7, the turn of a
// refused load, and the stats. The collectives live in boot/coll_mpi.cpp and
// device/cuda/coll_nccl.cpp.
#include <cinttypes>
#include <cstdlib>
#include <cstring>

#include "api/cache.h"
#include "api/config.h"
#include "boot/coll_mpi.h"
#include "common/log.h"
#include "common/time.h"
#include "ucm_build_config.h"
#if UCM_HAVE_NCCL
#include "device/cuda/coll_nccl.h"
#endif

namespace ucm {

Result Cache::open_fanout() {
  const bool nccl = config_.fanout == UCM_FANOUT_NCCL;
  const char* engine = engine_ ? engine_->name() : "none (a scheduler rank)";
  Result local = Result::kOk;
  if (!queue_)
    local = fail(Result::kUnsupported, "UCM_FANOUT=%s needs every local rank to load; local rank %d is a scheduler rank",
                 nccl ? "nccl" : "mpi", node_.local_rank);
  else if (nccl && std::strcmp(engine, "cuda") != 0)
    local = fail(Result::kUnsupported,
                 "UCM_FANOUT=nccl broadcasts device buffers: it needs the cuda copy engine, and local rank %d's is %s "
                 "(UCM_FANOUT=mpi serves host destinations)",
                 node_.local_rank, engine);
  else if (!nccl && std::strcmp(engine, "cuda") == 0)
    local = fail(Result::kUnsupported,
                 "UCM_FANOUT=mpi broadcasts host buffers (this MPI is not CUDA-aware), and local rank %d copies with "
                 "the cuda engine: use UCM_FANOUT=nccl for device destinations",
                 node_.local_rank);
  int64_t stall_rank = -1;
  uint64_t stall_turn = 0;
  if (ok(local)) local = fanout_test_stall_from_env(&stall_rank, &stall_turn);
  UCM_CHECK(collective_status(node_.node, local, &node_.local_ids));

  FanoutOptions o;
  o.mode = static_cast<uint32_t>(config_.fanout);
  o.shard_bytes = config_.shard_bytes;
  o.step_timeout_ns = uint64_t{config_.timeout_ms} * 1'000'000;
  o.task_timeout_ns = o.step_timeout_ns;
  o.stall_rank = stall_rank;
  o.stall_turn = stall_turn;
  std::unique_ptr<Collective> coll;
  if (nccl) {
#if UCM_HAVE_NCCL
    auto share = [this](void* id, size_t bytes) {
      return bcast_watching(id, bytes, node_, "broadcasting the NCCL unique id");
    };
    auto agree = [this](Result r) { return collective_status(node_.node, r, &node_.local_ids); };
    UCM_CHECK(make_nccl_collective(static_cast<uint32_t>(node_.local_rank), static_cast<uint32_t>(node_.local_size),
                                   device_id_, share, agree, deadline_after_ms(config_.timeout_ms), &coll));
#else
    return fail(Result::kUnsupported, "UCM_FANOUT=nccl: this library was built without NCCL (meson -Dnccl)");
#endif
  } else {
    UCM_CHECK(collective_status(node_.node, make_mpi_collective(node_.node, &node_.local_ids, &coll), &node_.local_ids));
  }
  fanout_ = std::make_unique<Fanout>(queue_.get(), std::move(coll), o);
  UCM_CHECK(fanout_->start());
  UCM_INFO(kBoot, "fan-out: %s", fanout_->describe().c_str());
  return Result::kOk;
}

void Cache::reject_load(uint64_t n, const std::string& why) {
  if (!fanout_) return;
  fanout_->reject(new_task_id(), n, why);
}

void Cache::fanout_stats(ucm_stats_t* s) const {
  s->fanout_mode = static_cast<uint64_t>(config_.fanout);
  if (!fanout_) return;
  const FanoutCounters& c = fanout_->counters();
  s->fanout_host_bytes = c.host_bytes.load(std::memory_order_relaxed);
  s->fanout_bcast_bytes = c.bcast_bytes.load(std::memory_order_relaxed);
  s->fanout_fallbacks = c.fallbacks.load(std::memory_order_relaxed);
  s->fanout_mismatches = c.mismatches.load(std::memory_order_relaxed);
}

}  // namespace ucm
