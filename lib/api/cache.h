// The object behind a ucm_cache_t: one rank's view of its node's cache, and
// the collective init/finalize that builds and tears it down.
//
// Init, in order, each step ending in a collective status so that a failure on
// any rank is the same error on all ranks and nobody waits in a collective:
//   1. split the communicator into nodes; gather the node's pids
//   2. check the config locally, then agree on every layout field in the node
//   3. pick the copy engine and its device (device/copy_engine.h says how; a
//      configured GPU that does not answer is an error, never memcpy) and
//      check the shard alignment it needs
//   4. local rank 0 creates the control and data memfds (and the store's
//      node-shared state, when its spec asks for some) and listens on an
//      abstract socket; the nonce goes out over MPI
//   5. peers fetch the fds (SO_PEERCRED-checked) and map them, checking the
//      header against their own layout
//   6. everyone joins its rank, registers the segments with its device (in
//      parallel threads, timed: ucm_cache_info.register_seconds), plans
//      its thread placement and opens its backend
//   7. with fan-out, the node's fan-out communicator; then the node barriers.
// Nothing is created in any file system.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "api/own_memory.h"
#include "backend/backend.h"
#include "backend/node_state.h"
#include "backend/store_calls.h"
#include "boot/node.h"
#include "cache/cache_buffer.h"
#include "ctrl/buffer_ctrl.h"
#include "data/buffer_data.h"
#include "device/copy_engine.h"
#include "queue/fanout.h"
#include "queue/load_queue.h"
#include "queue/task.h"
#include "topo/placement.h"
#include "ucmcache/ucm.h"

namespace ucm {

class FdServer;

class Cache {
 public:
  Cache() = default;
  ~Cache();
  Cache(const Cache&) = delete;
  Cache& operator=(const Cache&) = delete;

  // `arg_error`: a bad argument of ucm_cache_init on this rank (kOk if none).
  // The rank still joins every collective step, so that every rank returns
  // that error instead of waiting for this one.
  [[nodiscard]] Result init(MPI_Comm comm, const ucm_config_t& config, Result arg_error = Result::kOk);
  // Finalize, in steps: stop_tasks() (no new task; the queue's threads stop, so
  // nothing more is written into any task's destinations; every blocked wait
  // returns kFinalized), then, once the calls in flight are out, finalize()
  // (the node's departure, then teardown). depart() alone, when calls are
  // still running and the cache must stay as it is. Both are bounded by the
  // absolute deadline: the departure meets the peers through the control
  // region (ctrl/departure.h), never in an MPI barrier that a dead or absent
  // peer would hold forever; a dead peer is kPeerDead naming it, a live one
  // that never came kTimeout naming it, and teardown happens either way.
  void stop_tasks() noexcept;
  [[nodiscard]] Result finalize(uint64_t deadline_ns);
  [[nodiscard]] Result depart(uint64_t deadline_ns);
  std::string left_behind() const;
  void info(ucm_cache_info_t* out) const;

  const ucm_config_t& config() const { return config_; }
  const NodeContext& node() const { return node_; }
  CacheBuffer* buffer() const { return buffer_.get(); }
  Backend* backend() const { return backend_.get(); }
  // The store's exists() and touch(), on threads of their own (store_calls.h).
  StoreCalls* store_calls() const { return store_calls_.get(); }
  CopyEngine* engine() const { return engine_.get(); }
  LoadQueue* queue() const { return queue_.get(); }
  const Placement& placement() const { return placement_; }
  bool scheduler() const { return device_id_ < 0; }

  // Tasks: validated by the C API, run by this rank's LoadQueue.
  [[nodiscard]] Result submit(TaskKind kind, std::vector<TaskEntry> entries, uint64_t* id);
  // A load of n entries this rank refused (bad input): in fan-out mode it
  // still takes its turn (queue/fanout.h); a no-op otherwise.
  void reject_load(uint64_t n, const std::string& why);
  [[nodiscard]] Result wait(uint64_t id, int64_t timeout_ms);
  [[nodiscard]] Result test(uint64_t id, int* done);
  void stats(ucm_stats_t* rank, ucm_stats_t* node) const;
  void fanout_stats(ucm_stats_t* s) const;  // this rank's fan-out fields
  // Store I/O threads that finalize left in the kernel in this process (all
  // caches): detached, never joined (release_local()).
  static uint64_t io_threads_left_behind();

  // The per-cache last-error string (thread-safe).
  void set_error(const std::string& e);
  std::string error() const;

 private:
  // Init's steps (the list above), each ending in a collective status.
  Result split_node(MPI_Comm comm);                                            // 1
  Result check_config_on_node(Result arg_error, const std::string& arg_message);  // 2
  Result choose_engine_and_layout(CtrlParams* cp, DataParams* dp);             // 3
  Result create_or_fetch_planes(const CtrlParams& cp, const DataParams& dp);  // 4-5
  Result name_init_bound(Result r) const;  // a kTimeout's message gains timeout_ms
  Result agree(Result local);              // collective_status watching the node's processes
  void log_device_and_placement() const;  // init's last line, one per rank
  Result choose_data_numa(DataParams* dp);
  // Local rank 0 builds the planes (and the store's node state: store_bytes)
  // and serves them; every other rank fetches and maps them.
  Result create_planes(const CtrlParams& cp, const DataParams& dp, uint64_t store_bytes);
  Result serve_planes(FdServer* server, const DataParams& dp, uint64_t deadline);
  Result fetch_planes_of_rank0(const CtrlParams& cp, const DataParams& dp, uint64_t nonce, uint64_t store_bytes,
                               uint64_t deadline);
  Result check_app_buffers(TaskKind kind, const std::vector<TaskEntry>& entries);
  Result check_not_own_memory(TaskKind kind, const std::vector<TaskEntry>& entries) const;
  void note_own_memory();  // fills own_ once the planes are mapped
  // wait()'s part for a task not done when it looked: sleeps until done,
  // then takes it out of the table.
  Result wait_running(const Task& t, uint64_t id, int64_t timeout_ms);
  // A task's handle: unique in the process, so that no cache ever holds a
  // task under another cache's handle.
  static uint64_t new_task_id();
  Result open_rank();
  void open_buffer();
  Result open_fanout();  // init step 7 (api/cache_fanout.cpp)
  // Tears down what this rank holds; the store's I/O threads get until
  // deadline_ns (finalize's one deadline: what is left of timeout_ms).
  void release_local(uint64_t deadline_ns);
  uint32_t io_left_ = 0;     // this cache's store threads left in the kernel at finalize
  uint32_t calls_left_ = 0;  // its store-call threads (store_calls.h) left in the store then

  ucm_config_t config_{};
  NodeContext node_;
  int device_id_ = 0;
  bool joined_ = false;
  BufferCtrl ctrl_;
  BufferData data_;
  std::vector<void*> registered_;
  static constexpr uint32_t kRegisterThreads = 8;  // segments registered at once
  double register_seconds_ = 0;
  uint32_t register_threads_ = 0;
  double init_seconds_ = 0;  // wall time of init() on this rank
  std::string device_choice_;
  std::string copy_path_note_;  // the host copy's calibration (host-memory engines), for the per-rank init line
  std::unique_ptr<CopyEngine> engine_;
  NodeState store_state_;  // the store's node-shared state; outlives backend_
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StoreCalls> store_calls_;  // over backend_; destroyed before it
  std::unique_ptr<CacheBuffer> buffer_;
  Placement placement_;
  DeviceStatus device_status_;
  std::unique_ptr<LoadQueue> queue_;
  std::unique_ptr<Fanout> fanout_;  // UCM_FANOUT=nccl|mpi only
  OwnMemory own_;  // what no task's dst or src may overlap (api/own_memory.h)
  std::mutex tasks_mu_;
  // Submitted and not finished (running, or done and not yet waited for):
  // at most config_.max_unfinished_tasks, then a submit is kBusy (ucm_base.h).
  std::unordered_map<uint64_t, std::shared_ptr<Task>> tasks_;
  bool closing_ = false;  // under tasks_mu_: set by close(), never cleared
  mutable std::mutex error_mu_;
  std::string error_;
};

}  // namespace ucm
