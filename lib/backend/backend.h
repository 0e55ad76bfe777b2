// The lower layer the cache loads from and writes through to.
//
// A Backend moves whole shards between host memory and a store. It is
// asynchronous: load() and dump() queue an IoRequest and return at once; the
// store calls req->done(req) exactly once, from one of its own threads (or
// inline, for an immediate error), with req->result set. The request memory
// belongs to the caller until done() runs; the buffer must stay valid as long.
// touch() and exists() are synchronous; they may block in the kernel (a
// stuck file system), so the cache makes them on threads of its own, never
// on an app's thread (store_calls.h).
//
// Results of a load: kOk (the bytes are the key's, verified), kNotFound (the
// store never completely wrote this key), kCorrupt (the store holds something
// under this key that fails its checks: wrong key, length or checksum, cut
// short, or not a file of the store's; it will not heal, so a retry is
// pointless; the message names the key and the file), or another error for a
// failure that may be transient (kBackend: I/O error, permission).
//
// Stores are chosen by a spec string, "scheme:args":
//   sim:latency_us=500,gbps=4,max_inflight=64     (sim_backend.cpp)
//   posix:/path/to/dir,depth=8,direct=auto,file_mode=0600  (posix_backend.cpp)
// A new store is one file plus one line in registry.cpp. A store whose state
// must be the node's rather than a process's (the sim store's dumped keys)
// says how many bytes of node-shared memory it needs, and gets them mapped in
// BackendContext (node_state.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/key.h"
#include "common/result.h"

namespace ucm {

struct IoRequest {
  Key key;
  void* buf = nullptr;      // load: destination; dump: source
  uint64_t bytes = 0;       // must equal the store's shard_bytes
  void (*done)(IoRequest* req) = nullptr;
  void* user = nullptr;     // for the caller
  Result result = Result::kOk;
  bool direct_fallback = false;  // the store tried direct I/O, the file system refused it,
                                 // and the bytes moved buffered instead (counted by the caller)
  char error[384] = {};     // on failure: what failed, with the value (key, file, reason)
};

// What every store knows about the cache it serves.
struct BackendContext {
  uint64_t shard_bytes = 0;
  uint32_t shards_per_block = 0;
  // The node's shared state for this store (node_state.h): zeroed memory of
  // backend_node_state_bytes(spec) that every rank of the node maps, or null
  // outside a node (one process), where a store that needs some makes its own.
  void* node_state = nullptr;
  uint64_t node_state_bytes = 0;
  // The memory loads will land in (the cache's data-plane segments: base,
  // bytes), which a store may register with the kernel once instead of
  // having each read pin its pages; a load elsewhere still works. Empty:
  // none known (a store made by a test or a tool).
  std::vector<std::pair<void*, uint64_t>> buffers{};
  // When opening the store must have finished (now_ns() clock; UINT64_MAX:
  // no bound). A store on a hung file system (a dead NFS or Lustre server)
  // blocks its first system call in the kernel: past this, opening is
  // kTimeout, and the call is left on a thread of its own to end (or not).
  uint64_t open_deadline_ns = UINT64_MAX;
};

struct BackendCounters {
  uint64_t loads = 0;           // load requests completed (ok or not, rejected ones too)
  uint64_t load_failures = 0;
  uint64_t dumps = 0;
  uint64_t dump_failures = 0;
  uint64_t touches = 0;         // blocks passed to touch()
  uint64_t bytes_loaded = 0;
  uint64_t bytes_dumped = 0;
  uint64_t inflight_loads = 0;  // now: loads in the store's I/O (not those in their checks after it)
  uint64_t peak_inflight_loads = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual void load(IoRequest* req) = 0;
  virtual void dump(IoRequest* req) = 0;
  virtual void touch(const BlockId* blocks, size_t n) = 0;
  // Whether the store holds a complete copy of k.
  [[nodiscard]] virtual Result exists(const Key& k, bool* out) = 0;
  virtual BackendCounters counters() const = 0;
  // Stops the store's threads, waiting for them until `deadline_ns`, and
  // completes every request still queued (kTimeout). Returns how many threads
  // are still stuck (in the kernel: a hard-mounted NFS that stopped
  // answering): those are detached and will never call a request's done();
  // they may still write into a load's buffer from the kernel, and return
  // into the store object, which the caller must then never destroy. 0: the
  // store is idle and may be destroyed. Stores with no threads of their own
  // that can block keep the default.
  virtual uint32_t shutdown(uint64_t deadline_ns) {
    (void)deadline_ns;
    return 0;
  }
  // The caller counts more of its requests in flight as stuck (held far
  // longer than a request takes: a file on a dead server), `loads` loads and
  // `dumps` dumps, and sends others past them (LoadQueue,
  // QueueOptions::io_stuck_ns). A store that runs its requests in a bounded
  // pool makes room for as many more beside them, up to its own depth more
  // in its life, so that the others do not queue behind the stuck ones.
  // Never blocks. A store with no such bound keeps the default.
  virtual void requests_stuck(uint32_t loads, uint32_t dumps) {
    (void)loads;
    (void)dumps;
  }
  // The caller gives up on req (its deadline passed). A store that has not
  // started it takes it back: true, and done() is never called for it (the
  // caller ends it). false: it runs or ran, and done() comes as always. The
  // caller makes sure req is alive (not yet past its done()); the store never
  // calls done() from here. Never blocks.
  [[nodiscard]] virtual bool cancel(IoRequest* req) {
    (void)req;
    return false;
  }
};

// Builds the store named by `spec`. Errors name the bad part of the spec.
[[nodiscard]] Result make_backend(const std::string& spec, const BackendContext& ctx, std::unique_ptr<Backend>* out);

// Bytes of node-shared state the store named by `spec` needs (0: none). A pure
// function of the spec: every rank of a node computes the same number, and
// local rank 0 creates that much for all of them. Errors as make_backend's.
[[nodiscard]] Result backend_node_state_bytes(const std::string& spec, uint64_t* out);

// Completes a request with an error formatted into req->error.
void complete_with(IoRequest* req, Result r, const char* fmt, ...) __attribute__((format(printf, 3, 4)));

// Counters shared by the stores' implementations.
struct AtomicBackendCounters {
  std::atomic<uint64_t> loads{0}, load_failures{0}, dumps{0}, dump_failures{0}, touches{0};
  std::atomic<uint64_t> bytes_loaded{0}, bytes_dumped{0}, inflight_loads{0}, peak_inflight_loads{0};
  void load_started();
  // A request refused before it started (bad size or shard): completed, failed.
  void rejected(bool is_load);
  void load_finished(const IoRequest& req);  // load_io_ended() and load_counted()
  // A load's I/O is over (in flight no more), its checks may still run.
  void load_io_ended();
  // A load is over: counted by its result.
  void load_counted(const IoRequest& req);
  void dump_finished(const IoRequest& req);
  BackendCounters snapshot() const;
};

// Refuses a request whose size or shard does not fit the store: completes it
// with kInvalidArg (naming `store` and the value), counts it, returns true.
bool reject_malformed(IoRequest* req, const BackendContext& ctx, bool is_load, const char* store,
                      AtomicBackendCounters* counters);

}  // namespace ucm
