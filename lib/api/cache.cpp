#include "api/cache.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "api/config.h"
#include "api/handles.h"
#include "boot/fd_exchange.h"
#include "common/latency_histogram.h"
#include "common/log.h"
#include "common/small_buffer.h"
#include "common/time.h"
#include "ctrl/departure.h"
#include "ctrl/recovery.h"
#include "device/host_copy.h"
#include "queue/counters.h"
#include "ucm_build_config.h"

namespace ucm {
namespace {

// Stores whose I/O threads were left in the kernel at finalize: those threads
// return into them, so they live as long as the process.
// What a thread left in the store returns into: the store object, the
// store-call threads' object and the store's node-shared state.
struct KeptForStuckThreads {
  std::unique_ptr<StoreCalls> calls;
  std::unique_ptr<Backend> store;
  NodeState state;
};

void keep_for_stuck_threads(KeptForStuckThreads k) {
  static std::mutex mu;
  static auto* kept = new std::vector<KeptForStuckThreads>();
  std::lock_guard<std::mutex> g(mu);
  kept->push_back(std::move(k));
}

// "node 0 of 2 on host: 4 local rank(s) (ranks 0,1,2,3 of 8), split by ...":
// for UCM_LOG=info. MPI_Group_translate_ranks is local: no collective.
std::string describe_node_split(const NodeContext& n, uint32_t ranks_per_node) {
  std::string ranks;
  MPI_Group world = MPI_GROUP_NULL, node = MPI_GROUP_NULL;
  if (MPI_Comm_group(n.comm, &world) == MPI_SUCCESS && MPI_Comm_group(n.node, &node) == MPI_SUCCESS) {
    std::vector<int> local(static_cast<size_t>(n.local_size)), in_world(local.size());
    for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<int>(i);
    if (MPI_Group_translate_ranks(node, n.local_size, local.data(), world, in_world.data()) == MPI_SUCCESS)
      for (size_t i = 0; i < in_world.size(); ++i) ranks.append(i ? "," : "").append(std::to_string(in_world[i]));
  }
  if (node != MPI_GROUP_NULL) MPI_Group_free(&node);
  if (world != MPI_GROUP_NULL) MPI_Group_free(&world);
  char buf[256];
  std::snprintf(buf, sizeof(buf), "node %d of %d on %s: %d local rank(s) (ranks %s of %d), split by %s", n.node_id,
                n.node_count, n.host.c_str(), n.local_size, ranks.c_str(), n.size,
                ranks_per_node > 0 ? "shared memory, then ranks_per_node" : "shared memory (MPI_COMM_TYPE_SHARED)");
  std::string out = buf;
  if (ranks_per_node > 0) out.append("=").append(std::to_string(ranks_per_node)).append(" (pretend nodes)");
  return out;
}

}  // namespace


Cache::~Cache() { release_local(deadline_after_ms(config_.timeout_ms)); }

void Cache::set_error(const std::string& e) {
  std::lock_guard<std::mutex> g(error_mu_);
  error_ = e;
}

std::string Cache::error() const {
  std::lock_guard<std::mutex> g(error_mu_);
  return error_;
}

Result Cache::init(MPI_Comm comm, const ucm_config_t& config, Result arg_error) {
  const uint64_t init_start = now_ns();
  const std::string arg_message = ok(arg_error) ? std::string() : last_error();
  config_ = config;
  UCM_CHECK(split_node(comm));
  UCM_CHECK(check_config_on_node(arg_error, arg_message));
  CtrlParams cp;
  DataParams dp;
  UCM_CHECK(choose_engine_and_layout(&cp, &dp));

  // 4-5. The planes.
  UCM_CHECK(create_or_fetch_planes(cp, dp));

  // 6. Join, register, place, open the backend; threads that cannot be
  // created (a pids limit) are this rank's status like any other failure.
  const Result r = guarded("ucm_cache_init: joining, opening the backend, starting threads", [&] { return open_rank(); });
  UCM_CHECK(agree(name_init_bound(r)));
  // 7. Fan-out's node communicator (collective: every rank calls it).
  if (config_.fanout != UCM_FANOUT_OFF) UCM_CHECK(agree(open_fanout()));
  MPI_Request barrier = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(node_.node, &barrier) != MPI_SUCCESS) return fail(Result::kSystem, "node barrier at the end of init failed");
  UCM_CHECK(agree(wait_watching(&barrier, &node_.local_ids, "the node barrier at the end of init")));
  init_seconds_ = static_cast<double>(now_ns() - init_start) / 1e9;
  log_device_and_placement();
  return Result::kOk;
}

// A wait of init that timed out says which bound it had (the steps below
// know a deadline, not the tunable that set it).
Result Cache::name_init_bound(Result r) const {
  if (r != Result::kTimeout) return r;
  return fail(r, "%s (timeout_ms %u bounds each step of init)", last_error().c_str(), config_.timeout_ms);
}

// An init step's status over every rank, watching the node's processes: a
// rank that died mid-init (SIGKILL) leaves the others UCM_ERR_PEER_DEAD
// naming it, not a wait in MPI for good. Used once the pids are known.
Result Cache::agree(Result local) { return collective_status(node_.comm, local, &node_.local_ids); }

// 1. The node communicators and the node's pids (boot/node.h).
Result Cache::split_node(MPI_Comm comm) {
  const Result setup = node_setup(comm, config_.ranks_per_node <= kMaxRanks ? config_.ranks_per_node : 0, &node_);
  if (node_.comm == MPI_COMM_NULL) return setup;  // MPI itself failed: nothing collective is possible
  log_set_rank(node_.local_rank);
  // One node's failure (too many ranks, a rank that died) is every node's.
  return collective_status(node_.comm, setup, node_.local_ids.empty() ? nullptr : &node_.local_ids);
}

// 2. The caller's arguments and the config, alone and then against the node's.
Result Cache::check_config_on_node(Result arg_error, const std::string& arg_message) {
  // From here on an exception between two collective steps is this rank's
  // status in the next one (guarded), never a skipped collective.
  const Result mine = ok(arg_error) ? guarded("ucm_cache_init", [&] { return check_config(config_); })
                                    : fail(arg_error, "%s", arg_message.c_str());
  UCM_CHECK(agree(mine));
  UCM_CHECK(agree(agree_on_config(node_, agreement(config_))));
  // The bootstrap's decisions at UCM_LOG=info: once per node (local rank 0),
  // except the device and placement line at the end, one per rank.
  if (node_.local_rank == 0) {
    if (log_enabled(LogLevel::kInfo, Subsys::kBoot))
      UCM_INFO(kBoot, "node split: %s", describe_node_split(node_, config_.ranks_per_node).c_str());
    UCM_INFO(kApi, "effective configuration: %s", describe_config(config_).c_str());
  }
  return Result::kOk;
}

// 3. The device and what it needs of the layout.
Result Cache::choose_engine_and_layout(CtrlParams* cp, DataParams* dp) {
  device_status_ = device_status();
  EngineChoice choice;
  choice.kind = static_cast<EngineKind>(config_.copy_engine);
  choice.auto_device = config_.device_id == UCM_DEVICE_AUTO;
  choice.device_id = config_.device_id;
  choice.local_rank = node_.local_rank;
  EngineTaken taken;
  const Result r = guarded("ucm_cache_init", [&] {
    UCM_CHECK(async_test_delay_from_env(&choice.async.delay_us));
    Result e = make_copy_engine(choice, &engine_, &taken);
    device_id_ = ok(e) ? taken.device_id : (choice.auto_device ? node_.local_rank : config_.device_id);
    device_choice_ = taken.why;
    UCM_CHECK(e);
    if (engine_ && config_.shard_bytes % engine_->alignment() != 0)
      return fail(Result::kInvalidArg, "shard_bytes %" PRIu64 " is not a multiple of %" PRIu64
                  ", the alignment the %s copy engine of device %d needs",
                  config_.shard_bytes, engine_->alignment(), engine_->name(), device_id_);
    if (engine_ && !engine_->checks_app_buffers()) {
      // Copies into host memory: which copy wins between a slot and an
      // app's misaligned buffer depends on the CPU (device/host_copy.h).
      // Said in the per-rank line (log_device_and_placement).
      const CopyCalibration cc = calibrate_host_copy(config_.shard_bytes);
      char buf[160];
      if (cc.bytes != 0)
        std::snprintf(buf, sizeof(buf), "; host copy into a misaligned buffer: %s (vector loop %.1f GB/s, memcpy %.1f GB/s)",
                      cc.vector ? "vector loop" : "memcpy", cc.vector_gbs, cc.memcpy_gbs);
      copy_path_note_ = cc.bytes != 0 ? buf : "; host copy: memcpy";
    }
    return layout_from_config(config_, static_cast<uint32_t>(node_.local_size), cp, dp);
  });
  return agree(r);
}

void Cache::log_device_and_placement() const {
  UCM_INFO(kBoot, "device and placement: local rank %d of %d on %s (node %d of %d, rank %d of %d): device %d, %s (%s); %s; "
           "init %.3f s (data plane populated in %.3f s on %u thread(s)), data plane NUMA %s%s",
           node_.local_rank, node_.local_size, node_.host.c_str(), node_.node_id, node_.node_count, node_.rank,
           node_.size, device_id_, engine_ ? (std::string(engine_->name()) + " engine").c_str() : "scheduler",
           device_choice_.c_str(), placement_.summary.c_str(), init_seconds_, data_.populate_seconds(),
           data_.populate_threads(), data_.valid() ? data_.numa_note().c_str() : "(no data plane: scheduler)",
           copy_path_note_.c_str());
}

// The cache over the planes, and the store's synchronous calls (on threads
// of their own, store_calls.h) behind its touch.
void Cache::open_buffer() {
  CacheOptions o;
  o.rank = static_cast<uint32_t>(node_.local_rank);
  o.wait = config_.wait == UCM_WAIT_POLL ? WaitMode::kPoll : WaitMode::kFutex;
  o.liveness_slice_ms = config_.liveness_ms;
  o.lock_timeout_ms = config_.timeout_ms;
  buffer_ = std::make_unique<CacheBuffer>(&ctrl_, data_.valid() ? &data_ : nullptr, o);
  store_calls_ = std::make_unique<StoreCalls>(backend_.get(), static_cast<uint32_t>(node_.local_rank));
  buffer_->set_touch_hook([](void* ctx, const BlockId* b, size_t n) { static_cast<StoreCalls*>(ctx)->touch(b, n); },
                          store_calls_.get());
}

Result Cache::open_rank() {
  Result r = join_rank(ctrl_, static_cast<uint32_t>(node_.local_rank), deadline_after_ms(config_.timeout_ms));
  joined_ = ok(r);
  std::vector<std::pair<void*, uint64_t>> segs;  // the data plane: the engine's and the store's to register
  for (size_t s = 0; data_.valid() && s < data_.segment_count(); ++s)
    segs.emplace_back(data_.segment_base(s), data_.segment_map_bytes(s));
  if (ok(r) && engine_ && data_.valid()) {
    Registration reg;
    r = register_segments(engine_.get(), segs, kRegisterThreads, &reg);
    registered_ = std::move(reg.registered);
    register_seconds_ = reg.seconds;
    register_threads_ = reg.threads;
    UCM_NODE_INFO(kDevice, "registration: %zu data-plane segment(s) with the %s engine in %.3f s on %u thread(s)",
                  registered_.size(), engine_->name(), reg.seconds, reg.threads);
  }
  if (ok(r))
    r = plan_placement(node_.local_rank, node_.local_size, engine_ ? engine_->pci_bus_id() : std::string(),
                       config_.bind_threads != 0 && !scheduler(), &placement_);
  if (ok(r)) note_own_memory();
  if (ok(r)) {
    BackendContext bctx;
    bctx.shard_bytes = config_.shard_bytes;
    bctx.shards_per_block = config_.shards_per_block;
    bctx.node_state = store_state_.base();
    bctx.node_state_bytes = store_state_.bytes();
    bctx.buffers = std::move(segs);
    bctx.open_deadline_ns = deadline_after_ms(config_.timeout_ms);
    r = make_backend(config_.backend, bctx, &backend_);
  }
  if (ok(r)) open_buffer();
  if (ok(r) && !scheduler()) {
    QueueOptions q;
    q.local_rank = static_cast<uint32_t>(node_.local_rank);
    q.local_size = static_cast<uint32_t>(node_.local_size);
    q.rotate = config_.order == UCM_ORDER_ROTATE;
    q.prealloc = config_.prealloc != 0;
    q.io_depth = config_.io_depth;
    q.load_retries = config_.load_retries;
    q.owner_grace_ns = uint64_t{config_.owner_grace_us} * 1000;
    if (config_.fanout != UCM_FANOUT_OFF) q.owner_grace_ns = 0;  // a rank's fan-out loads are its own alone
    // A wait for a free slot that no release ends (a protection's grace running
    // out) looks again within an eighth of the grace (ctrl/space_bell.h).
    if (config_.protect != 0)
      q.no_space_backoff_max_ns = std::min(q.no_space_backoff_max_ns, std::max(q.no_space_backoff_ns, uint64_t{config_.protect_grace_ms} * 1'000'000 / 8));
    // All-hit loads copied on the calling thread (load_queue.h): never in
    // fan-out (its turns are collective) nor with order=natural (the legacy
    // control group keeps the old code's hand-offs); the queue takes it only
    // over the host engine's memcpy.
    q.inline_hits = config_.fanout == UCM_FANOUT_OFF && q.rotate;
    queue_ = std::make_unique<LoadQueue>(buffer_.get(), backend_.get(), engine_.get(), placement_, q);
    r = queue_->start();
    // From here this rank copies the node's collective loads: peers' loads wait for it (ctrl/protect.h).
    if (ok(r)) ctrl_.set_copier(static_cast<uint32_t>(node_.local_rank), true);
  }
  return r;
}

Result Cache::create_or_fetch_planes(const CtrlParams& cp, const DataParams& layout) {
  const uint64_t deadline = deadline_after_ms(config_.timeout_ms);
  DataParams dp = layout;
  UCM_CHECK(agree(choose_data_numa(&dp)));
  uint64_t nonce = 0;
  FdServer server;
  // Every rank sizes the store's node state from the spec all ranks agreed on.
  uint64_t store_bytes = 0;
  Result r = backend_node_state_bytes(config_.backend, &store_bytes);
  if (node_.local_rank == 0) {
    if (ok(r)) r = create_planes(cp, dp, store_bytes);
    nonce = random_nonce();
    if (ok(r)) r = server.listen_on(nonce);
  }
  // Everybody learns whether rank 0 could build the planes before anyone waits on its socket.
  UCM_CHECK(agree(r));
  UCM_CHECK(agree(bcast_watching(&nonce, sizeof(nonce), node_, "the broadcast of the boot nonce")));
  r = node_.local_rank == 0 ? serve_planes(&server, dp, deadline) : fetch_planes_of_rank0(cp, dp, nonce, store_bytes, deadline);
  return agree(name_init_bound(r));
}

// The data plane's NUMA placement (numa.h) follows the GPUs of every rank of
// the node, not local rank 0's view alone: each rank's visible GPUs' nodes,
// ORed over the node.
Result Cache::choose_data_numa(DataParams* dp) {
  uint32_t gpus = 0;
  std::string note;
  const uint64_t mine = scheduler() ? 0 : gpu_numa_nodes("/sys", &gpus, &note);
  std::vector<char> each;
  UCM_CHECK(allgather_watching(&mine, sizeof(mine), node_, "gathering the GPUs' NUMA nodes over the node", &each));
  uint64_t all = 0;
  for (size_t off = 0; off < each.size(); off += sizeof(mine)) {
    uint64_t theirs = 0;
    std::memcpy(&theirs, each.data() + off, sizeof(theirs));
    all |= theirs;
  }
  dp->numa = choose_numa_policy(all, memory_numa_nodes("/sys"));
  if (node_.local_rank == 0) UCM_INFO(kData, "NUMA: this rank sees %s; data plane policy %s (%s)", note.c_str(),
                                      describe_numa(dp->numa.mode, dp->numa.nodes).c_str(), dp->numa.why.c_str());
  return Result::kOk;
}

Result Cache::create_planes(const CtrlParams& cp, const DataParams& dp, uint64_t store_bytes) {
  // hugepages=off keeps the control region on ordinary pages too.
  Result r = BufferCtrl::create(cp, &ctrl_, config_.hugepages == UCM_HUGEPAGES_OFF ? CtrlPages::kOff : CtrlPages::kAuto);
  // Before any peer attaches: the node's protection (ctrl/protect.h), agreed at init.
  if (ok(r)) ctrl_.set_protect_grace_ms(config_.protect && config_.fanout == UCM_FANOUT_OFF ? config_.protect_grace_ms : 0);
  if (ok(r)) r = BufferData::create(dp, &data_);
  if (ok(r) && store_bytes > 0) r = NodeState::create(store_bytes, &store_state_);
  return r;
}

Result Cache::serve_planes(FdServer* server, const DataParams& dp, uint64_t deadline) {
  std::vector<PeerExpectation> peers;
  for (int i = 1; i < node_.local_size; ++i) peers.push_back({static_cast<uint32_t>(i), node_.local_ids[i]});
  std::vector<int> data_fds;
  for (size_t s = 0; s < data_.segment_count(); ++s) data_fds.push_back(data_.segment_fd(s));
  const Result r = server->serve(peers, describe_planes(ctrl_, dp, data_), ctrl_.fd(), data_fds, deadline, store_state_.fd());
  server->close_socket();
  store_state_.close_fd();  // the mapping keeps it; the peers hold their own
  if (ok(r) && scheduler()) data_ = BufferData();  // the peers hold the segments now
  return r;
}

Result Cache::fetch_planes_of_rank0(const CtrlParams& cp, const DataParams& dp, uint64_t nonce, uint64_t store_bytes,
                                    uint64_t deadline) {
  PlaneDescriptor desc{};
  std::vector<int> fds;
  PlaneExpectation expect;
  expect.ctrl = cp;
  expect.segment_bytes = dp.segment_bytes;
  expect.data_total_slots = dp.total_slots;
  Result r = fetch_planes(nonce, static_cast<uint32_t>(node_.local_rank), !scheduler(), node_.local_ids[0], deadline,
                          &desc, &fds, &expect, &node_.local_ids);
  if (ok(r))
    r = BufferCtrl::attach(fds[0], &cp, &ctrl_, config_.hugepages == UCM_HUGEPAGES_OFF ? CtrlPages::kOff : CtrlPages::kAuto);
  if (ok(r) && !scheduler()) r = BufferData::attach(dp, desc.hugetlb != 0, fds.data() + 1, desc.segment_count, &data_);
  if (ok(r) && (desc.store_fds != 0) != (store_bytes > 0))
    r = fail(Result::kConfigMismatch,
             "local rank 0 sent %u store state fds; this rank's backend \"%s\" needs %" PRIu64 " bytes of it",
             desc.store_fds, config_.backend, store_bytes);
  if (ok(r) && store_bytes > 0) r = NodeState::attach(fds.back(), store_bytes, &store_state_);
  for (int fd : fds) close(fd);  // the mappings keep what they need
  return r;
}

namespace {
std::atomic<uint64_t> g_io_threads_left{0};
}  // namespace

uint64_t Cache::io_threads_left_behind() { return g_io_threads_left.load(std::memory_order_relaxed); }

void Cache::release_local(uint64_t deadline_ns) {
  // Order matters: the queue's threads stop first; the backend then completes
  // every I/O still in flight (its completions touch the queue and the cache);
  // only then do the cache and the planes go.
  fanout_.reset();
  if (queue_) queue_->stop();
  // Bounded by the caller's deadline (finalize's: what is left of timeout_ms
  // after the peers' meeting, never a fresh timeout_ms on top of it): a store
  // stuck in the kernel (a hard-mounted NFS that stopped answering) must not
  // hang finalize. Its stuck threads are
  // detached; they may return into the store object (kept: never freed) and
  // still write into a slot from the kernel, so the data plane is fenced off
  // below before this rank's pins go.
  // The store-call threads first, by the same deadline: one still in the
  // store past it is detached, as a stuck I/O thread is.
  // (A second release, from the destructor, finds neither and adds nothing.)
  calls_left_ = store_calls_ ? store_calls_->shutdown(deadline_ns) : 0;
  io_left_ = backend_ ? backend_->shutdown(deadline_ns) : 0;
  if (io_left_ + calls_left_ > 0) {
    g_io_threads_left.fetch_add(io_left_ + calls_left_, std::memory_order_relaxed);
    // Kept, not freed: the stuck threads return into them. Reachable from a
    // list that lives as long as the process (so not a leak to a checker).
    keep_for_stuck_threads({std::move(store_calls_), std::move(backend_), std::move(store_state_)});
  }
  store_calls_.reset();
  backend_.reset();
  store_state_ = NodeState();
  queue_.reset();
  {
    std::lock_guard<std::mutex> g(tasks_mu_);
    tasks_.clear();
  }
  // Exact now that the queue's threads and the store's are out: a rank that
  // holds nothing leaves without walking the slots (finalize costs what the
  // rank holds, not what the cache holds). Without a buffer, walk.
  const bool holds_references = !buffer_ || buffer_->references_held() != 0;
  buffer_.reset();
  if (engine_)
    for (void* p : registered_) engine_->unregister_host(p);
  registered_.clear();
  engine_.reset();
  // PROT_NONE at the same addresses (buffer_data.h): a late write from a
  // detached thread faults (EFAULT) instead of landing in a slot that another
  // rank may re-key once this rank's pins are gone.
  if (io_left_ > 0) (void)data_.fence_off();
  if (joined_) {
    const uint32_t walked = ctrl_.leave(static_cast<uint32_t>(node_.local_rank), holds_references);
    UCM_DEBUG(kApi, "finalize: local rank %d %s", node_.local_rank,
              walked ? "held references: walked every slot to release them" : "held nothing: no slot walk");
  }
  joined_ = false;
  data_ = BufferData();
  ctrl_ = BufferCtrl();
  node_teardown(&node_);
}

void Cache::stop_tasks() noexcept {
  try {
    // The queue's threads first: once a wait has returned, nothing more is
    // written into its task's destinations. Fan-out's thread before them: it
    // submits to the queue. This rank copies nothing more, so no peer's load
    // waits for it (ctrl/protect.h).
    if (fanout_) fanout_->stop();
    if (queue_ && joined_) ctrl_.set_copier(static_cast<uint32_t>(node_.local_rank), false);
    if (queue_) queue_->stop();
    // Calls waiting for the store (ucm_lookup) return now, not at their deadline.
    if (store_calls_) store_calls_->stop();
  } catch (...) {
    (void)exception_result("ucm_cache_finalize");
    UCM_WARN("stopping the queue at finalize failed: %s", last_error().c_str());
  }
  {
    std::lock_guard<std::mutex> g(tasks_mu_);
    closing_ = true;
    for (auto& [id, t] : tasks_) t->abandon();
  }
  // Tell the peers now, before this rank waits for its calls in flight: they
  // may be draining theirs too, and the meeting must not wait for the slowest
  // drain on top of its own.
  if (ctrl_.valid() && joined_) announce_departure(ctrl_, static_cast<uint32_t>(node_.local_rank));
}

Result Cache::depart(uint64_t deadline_ns) {
  // The ranks of a node leave together, as the collective contract says; but
  // a peer that died or never comes must not hold this rank: the departure
  // is bounded and says which peer it did not see.
  if (!ctrl_.valid()) return Result::kOk;
  DepartureReport report;
  const Result r = depart_node(ctrl_, static_cast<uint32_t>(node_.local_rank), static_cast<uint32_t>(node_.local_size),
                               deadline_ns, uint64_t{config_.liveness_ms} * 1'000'000, &report);
  if (r != Result::kOk) UCM_WARN("%s", last_error().c_str());
  return r;
}

// What finalize leaves in the process: threads still in the store at its
// deadline ("" when none).
std::string Cache::left_behind() const {
  const std::string when = " at finalize's deadline (timeout_ms " + std::to_string(config_.timeout_ms) +
                           " after it began): they are detached, never joined";
  std::string left;
  if (io_left_ > 0)
    left = std::to_string(io_left_) + " of the store's I/O thread(s) were still in the kernel" + when +
           ", and the data plane is fenced off (PROT_NONE) so that a late write cannot land in the cache";
  if (calls_left_ > 0)
    left += (left.empty() ? "" : "; and ") + std::to_string(calls_left_) +
            " thread(s) of the store's synchronous calls (exists for ucm_lookup, touch for ucm_touch) were still in "
            "the store" + when + ", and the store is kept for them";
  return left;
}

Result Cache::finalize(uint64_t deadline_ns) {
  // One deadline for every step: a peer that never comes and then a store
  // stuck in the kernel share timeout_ms, they do not take it twice.
  const Result r = depart(deadline_ns);
  const std::string why = r == Result::kOk ? std::string() : last_error();
  release_local(deadline_ns);
  const std::string left = left_behind();  // whatever else went wrong
  if (r != Result::kOk)
    return fail(r, "%s (this rank released everything it held)%s%s", why.c_str(), left.empty() ? "" : "; also: ",
                left.c_str());
  if (!left.empty()) return fail(Result::kTimeout, "the cache is finalized, but %s", left.c_str());
  return r;
}

void Cache::info(ucm_cache_info_t* caller) const {
  // Filled whole here, then copied as far as the caller's struct goes (an
  // older caller's is smaller: see ucm_base.h).
  ucm_cache_info_t whole;
  ucm_cache_info_t* out = &whole;
  std::memset(out, 0, sizeof(*out));
  out->struct_bytes = caller->struct_bytes;
  out->rank = node_.rank;
  out->size = node_.size;
  out->local_rank = node_.local_rank;
  out->local_size = node_.local_size;
  out->node_id = node_.node_id;
  out->node_count = node_.node_count;
  out->device_id = device_id_;
  out->scheduler = scheduler() ? 1 : 0;
  out->hugetlb = data_.hugetlb() ? 1 : 0;
  out->cuda_built = UCM_HAVE_CUDA;
  out->nccl_built = device_status_.nccl_built ? 1 : 0;
  out->hwloc_built = UCM_HAVE_HWLOC;
  out->visible_devices = device_status_.visible_devices;
  out->threads_bound = placement_.enabled ? 1 : 0;
  const CtrlParams p = ctrl_.params();
  out->regular_slots = p.regular_slots;
  out->reserved_slots = p.reserved_slots;
  out->segments = static_cast<uint32_t>(data_.segment_count());
  out->control_bytes = ctrl_.region_bytes();
  out->data_bytes = data_.mapped_bytes();
  struct stat st;
  if (fstat(ctrl_.fd(), &st) == 0) out->control_inode = st.st_ino;
  std::snprintf(out->host, sizeof(out->host), "%s", node_.host.c_str());
  std::snprintf(out->copy_engine, sizeof(out->copy_engine), "%s", engine_ ? engine_->name() : "");
  std::snprintf(out->binding, sizeof(out->binding), "%s", placement_.summary.c_str());
  out->register_seconds = register_seconds_;
  out->register_threads = register_threads_;
  std::snprintf(out->device_choice, sizeof(out->device_choice), "%s", device_choice_.c_str());
  std::snprintf(out->fanout, sizeof(out->fanout), "%s", fanout_ ? fanout_->describe().c_str() : "off");
  if (data_.valid())
    std::snprintf(out->pages, sizeof(out->pages), "%s, %s", data_.pages_note().c_str(),
                  config_.allow_overcommit ? "not populated (allow_overcommit)" : "populated at init");
  else
    std::snprintf(out->pages, sizeof(out->pages), "no data plane on this rank (scheduler)");
  out->init_seconds = init_seconds_;
  out->populate_seconds = data_.populate_seconds();
  out->populate_threads = data_.populate_threads();
  out->numa_mode = static_cast<uint32_t>(data_.numa_mode());
  out->numa_nodes = data_.numa_nodes();
  std::snprintf(out->numa, sizeof(out->numa), "%s",
                data_.valid() ? data_.numa_note().c_str() : "no data plane on this rank (scheduler)");
  std::snprintf(out->control_pages, sizeof(out->control_pages), "%s", ctrl_.pages_note().c_str());
  std::memcpy(caller, &whole, std::min<size_t>(caller->struct_bytes, sizeof(whole)));
}

}  // namespace ucm

namespace ucm {

Result Cache::submit(TaskKind kind, std::vector<TaskEntry> entries, uint64_t* id) {
  if (!queue_)
    return fail(Result::kBadState, "local rank %d is a scheduler rank (device_id %d): it cannot %s shards",
                node_.local_rank, device_id_, kind == TaskKind::kLoad ? "load" : "dump");
  const uint64_t tid = new_task_id();
  if (engine_) {
    const Result bad = check_app_buffers(kind, entries);
    if (bad != Result::kOk) {
      const std::string why = last_error();
      if (fanout_ && kind == TaskKind::kLoad) fanout_->reject(tid, entries.size(), why);
      return fail(bad, "%s", why.c_str());
    }
  }
  // One clock read for the submit time and the deadline.
  const uint64_t now = now_ns();
  auto t = std::make_shared<Task>(tid, kind, std::move(entries), deadline_after_ms(config_.timeout_ms, now), now);
  size_t unfinished = 0;
  {
    std::lock_guard<std::mutex> g(tasks_mu_);
    if (closing_) return fail(Result::kFinalized, "the cache is being finalized");
    unfinished = tasks_.size();
    if (unfinished < config_.max_unfinished_tasks) tasks_.emplace(tid, t);
  }
  if (unfinished >= config_.max_unfinished_tasks) {
    const Result busy = fail(Result::kBusy,
                             "%zu tasks of this rank were submitted and not finished (max_unfinished_tasks, "
                             "UCM_MAX_UNFINISHED_TASKS): each keeps its entries until ucm_task_wait or "
                             "ucm_task_test returns its result",
                             unfinished);
    // Fan-out: a refused load still takes its turn, or every later task of
    // this rank would pair with its peers' earlier ones.
    if (fanout_ && kind == TaskKind::kLoad) fanout_->reject(tid, t->entries().size(), last_error());
    return busy;
  }
  const Result r = fanout_ && kind == TaskKind::kLoad ? fanout_->submit(t) : queue_->submit(t);
  if (r != Result::kOk) {
    std::lock_guard<std::mutex> g(tasks_mu_);
    tasks_.erase(tid);
    return r;
  }
  *id = tid;
  return Result::kOk;
}

void Cache::note_own_memory() {
  own_.clear();
  if (ctrl_.valid()) own_.add(&ctrl_.header(), ctrl_.region_bytes(), "control region");
  for (size_t s = 0; data_.valid() && s < data_.segment_count(); ++s) {
    char name[48];
    std::snprintf(name, sizeof(name), "data segment %zu", s);
    own_.add(data_.segment_base(s), data_.segment_map_bytes(s), name);
  }
  if (store_state_.valid()) own_.add(store_state_.base(), store_state_.bytes(), "store state");
}

// Every engine: a buffer in the cache's own memory would overwrite slots the
// node's ranks read, or store the cache's bytes under a key (own_memory.h).
Result Cache::check_not_own_memory(TaskKind kind, const std::vector<TaskEntry>& entries) const {
  const bool load = kind == TaskKind::kLoad;
  for (size_t i = 0; i < entries.size(); ++i) {
    const void* p = load ? entries[i].dst : entries[i].src;
    const OwnMemory::Range* m = own_.overlap(p, config_.shard_bytes);
    if (!m) continue;
    return fail(Result::kInvalidArg,
                "entry %zu: %s %p (%" PRIu64 " bytes) overlaps the cache's own %s (%p, %" PRIu64
                " bytes, as this rank maps it): a %s must be the application's memory",
                i, load ? "dst" : "src", p, config_.shard_bytes, m->what.c_str(), reinterpret_cast<void*>(m->begin),
                static_cast<uint64_t>(m->end - m->begin), load ? "destination" : "source");
  }
  return Result::kOk;
}

Result Cache::check_app_buffers(TaskKind kind, const std::vector<TaskEntry>& entries) {
  UCM_CHECK(check_not_own_memory(kind, entries));
  SmallBuffer<const void*, 64> ptrs(entries.size());  // on the stack for small tasks
  for (size_t i = 0; i < entries.size(); ++i) ptrs[i] = kind == TaskKind::kLoad ? entries[i].dst : entries[i].src;
  size_t a = 0, b = 0;
  // A dump's srcs are only read: one buffer may be stored under several keys.
  if (kind == TaskKind::kLoad && overlapping_pair(ptrs.data(), entries.size(), config_.shard_bytes, &a, &b))
    return fail(Result::kInvalidArg,
                "entry %zu: dst %p overlaps entry %zu's dst %p (%" PRIu64 " bytes each): both shards would be "
                "copied into the same bytes",
                b, ptrs[b], a, ptrs[a], config_.shard_bytes);
  if (!engine_->checks_app_buffers()) return Result::kOk;  // host memory: every pointer is good
  size_t bad = 0;
  const Result r = engine_->check_app_buffers(ptrs.data(), entries.size(), config_.shard_bytes, &bad);
  if (r == Result::kInvalidArg) {
    const std::string why = last_error();
    return fail(r, "entry %zu: %s %s", bad, kind == TaskKind::kLoad ? "dst" : "src", why.c_str());
  }
  UCM_CHECK(r);
  return Result::kOk;
}

uint64_t Cache::new_task_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

namespace {

Result unknown_task(uint64_t id) {
  return fail(Result::kUnknownTask, "task %" PRIu64 " is not a task of this cache (or was already waited for)", id);
}

// A retired task's result, with its message.
Result task_result(const Task& t) {
  const Result r = t.result();
  if (r != Result::kOk) return fail(r, "%s", t.error().c_str());
  return Result::kOk;
}

}  // namespace

// A task's result goes to the one call that takes it out of the table (a
// wait or a test: several threads may finish the same task). A task already
// done (the inline path finishes it before ucm_load_task returns) leaves the
// table in the hold that finds it: one lock, no clock.
Result Cache::wait(uint64_t id, int64_t timeout_ms) {
  std::shared_ptr<Task> t;
  bool taken = false;
  {
    std::lock_guard<std::mutex> g(tasks_mu_);
    if (closing_) return fail(Result::kFinalized, "the cache is being finalized");
    auto it = tasks_.find(id);
    if (it == tasks_.end()) return unknown_task(id);
    taken = it->second->done();
    if (taken) {
      t = std::move(it->second);
      tasks_.erase(it);
    } else {
      t = it->second;
    }
  }
  if (!taken) UCM_CHECK(wait_running(*t, id, timeout_ms));
  return task_result(*t);  // the task is freed here, outside the lock
}

// Waits for a task found running, then takes it out of the table, unless
// another thread's wait or test took it first: that call has its result.
Result Cache::wait_running(const Task& t, uint64_t id, int64_t timeout_ms) {
  // Negative, or too large to add to the clock: no bound.
  const uint64_t deadline = timeout_ms < 0 ? kNoDeadline : deadline_after_ms(static_cast<uint64_t>(timeout_ms));
  if (!t.wait_until(deadline)) {
    if (t.abandoned())
      return fail(Result::kFinalized, "the cache is being finalized: task %" PRIu64
                  " did not complete, and nothing more is written to its destinations", id);
    return fail(Result::kTimeout, "task %" PRIu64 " still running after %" PRId64 " ms", id, timeout_ms);
  }
  std::lock_guard<std::mutex> g(tasks_mu_);
  if (tasks_.erase(id) == 0)
    return fail(Result::kUnknownTask, "task %" PRIu64 " was retired by another thread's wait or test", id);
  return Result::kOk;
}

// One hold: a done task is taken out of the table where it is found, so two
// threads testing it never both see it done.
Result Cache::test(uint64_t id, int* done) {
  *done = 0;
  std::shared_ptr<Task> t;
  {
    std::lock_guard<std::mutex> g(tasks_mu_);
    if (closing_) return fail(Result::kFinalized, "the cache is being finalized");
    auto it = tasks_.find(id);
    if (it == tasks_.end()) return unknown_task(id);
    if (!it->second->done()) return Result::kOk;
    t = std::move(it->second);
    tasks_.erase(it);
  }
  *done = 1;
  return task_result(*t);
}

namespace {

void add_counters(const RankRecord& rec, ucm_stats_t* s, uint64_t* hist) {
  auto v = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  const RankCounters& c = rec.counters;
  const QueueCounters& q = queue_counters(rec);
  s->tasks += v(q.tasks);
  s->shards += v(q.shards);
  s->hits += v(c.hits);
  s->owner_loads += v(q.backend_loads);
  s->load_failures += v(q.load_failures);
  s->waits += v(c.waits);
  s->wait_ns += v(q.wait_ns);
  s->takeovers += v(c.takeovers);
  s->evictions += v(c.evictions);
  s->no_space += v(c.no_space);
  s->prealloc_made += v(c.prealloc_made);
  s->prealloc_used += v(c.prealloc_used);
  s->failed_shards += v(q.failed_shards);
  s->bytes_from_backend += v(q.bytes_from_backend);
  s->bytes_to_device += v(q.bytes_to_device);
  s->dumps += v(q.dumps);
  s->bytes_dumped += v(q.bytes_dumped);
  s->direct_fallbacks += v(q.direct_fallbacks);
  s->inline_tasks += v(q.inline_tasks);
  s->protect_overrides += v(q.protect_overrides);
  s->hits += v(q.inline_hits);  // the inline path's hits (queue/counters.h)
  for (uint32_t i = 0; i < kLatencyBuckets; ++i) hist[i] += v(q.latency_us[i]);
  s->latency_max_us = std::max(s->latency_max_us, v(q.latency_max_us));
}

// Log-linear buckets: each percentile is within 1/32 of the exact value
// (common/latency_histogram.h), and no more than the maximum, which is exact.
void percentiles(const uint64_t* hist, ucm_stats_t* s) {
  s->latency_p50_us = std::min(s->latency_max_us, latency_percentile(hist, kLatencyBuckets, 50, 100));
  s->latency_p90_us = std::min(s->latency_max_us, latency_percentile(hist, kLatencyBuckets, 90, 100));
  s->latency_p99_us = std::min(s->latency_max_us, latency_percentile(hist, kLatencyBuckets, 99, 100));
}

}  // namespace

void Cache::stats(ucm_stats_t* rank, ucm_stats_t* node) const {
  // Each is summed whole, then copied as far as the caller's struct goes.
  if (rank) {
    ucm_stats_t s;
    std::memset(&s, 0, sizeof(s));
    s.struct_bytes = rank->struct_bytes;
    s.ranks = 1;
    uint64_t hist[kLatencyBuckets] = {};
    add_counters(ctrl_.rank(static_cast<uint32_t>(node_.local_rank)), &s, hist);
    percentiles(hist, &s);
    fanout_stats(&s);
    std::memcpy(rank, &s, std::min<size_t>(rank->struct_bytes, sizeof(s)));
  }
  if (node) {
    ucm_stats_t s;
    std::memset(&s, 0, sizeof(s));
    s.struct_bytes = node->struct_bytes;
    s.ranks = ctrl_.max_ranks();
    uint64_t hist[kLatencyBuckets] = {};
    for (uint32_t r = 0; r < ctrl_.max_ranks(); ++r) add_counters(ctrl_.rank(r), &s, hist);
    percentiles(hist, &s);
    fanout_stats(&s);
    std::memcpy(node, &s, std::min<size_t>(node->struct_bytes, sizeof(s)));
  }
}

}  // namespace ucm
