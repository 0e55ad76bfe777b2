// ucmcache._native: the compiled half of the Python package, over the public
// C API only (<ucmcache/ucm.h>). The pure-Python layer (ucmcache/__init__.py)
// wraps it; the module does what must not cost a Python object per key or per
// shard: keys and buffers into ucm_*_entry_t arrays, the GIL released around
// every call that can block, and the one waiter thread that completes the
// asyncio futures of awaited tasks. This file: the cache, its tasks, the
// waiter and the bindings; buffers.cpp reads buffers, args.cpp keys, blocks
// and the configuration, and raises the package's errors (native.h).
//
// Lifetimes. A TaskImpl holds the Python buffers (Py_buffer views, DLPack
// capsules, references) of its entries until its outcome is known; if the
// Python Task goes away first, they move to its cache's graveyard and are
// dropped once the library says the task is done, or after ucm_cache_finalize
// has returned (finalize stops the copies, so nothing writes into them then).
// Every Python object is touched with the GIL held: the waiter thread takes
// the GIL before it runs a callback or drops a reference.
//
// Lock order: CacheImpl::waiter_mu_ and TaskImpl::wait_mu_ are never held
// together with the GIL by a thread that waits for the other (the GIL is
// released before either blocking lock is taken).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <mpi.h>
#include <mpi4py/mpi4py.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "native.h"
#include "ucmcache/ucm.h"

namespace ucm_py {
namespace {

// ---- the cache and its tasks ---------------------------------------------------------

int64_t timeout_ms_of(py::handle timeout) {
  if (timeout.is_none()) return -1;
  // bool is an int to Python, but True is no number of seconds.
  if (PyBool_Check(timeout.ptr())) raise_invalid("timeout is a bool: seconds (a number) or None");
  double s;
  try {
    s = timeout.cast<double>();
  } catch (py::cast_error&) {
    raise_invalid("timeout is a " + type_name(timeout) + ": seconds (a number) or None");
  }
  if (!(s >= 0)) raise_invalid("timeout=" + std::string(py::repr(timeout)) + ": seconds >= 0, or None for no bound");
  if (s > 9e15) return -1;
  return static_cast<int64_t>(std::ceil(s * 1000.0));
}

class TaskImpl;

class CacheImpl : public std::enable_shared_from_this<CacheImpl> {
 public:
  explicit CacheImpl(ucm_cache_t h, const ucm_config_t& c) : h_(h), shard_bytes_(c.shard_bytes) {}
  // An unclosed cache is left to the process's exit (finalize is collective;
  // the Python layer keeps every open cache alive until close or exit). The
  // waiter thread holds a reference while it runs: the last one may be its own.
  ~CacheImpl() {
    if (!waiter_.joinable()) return;
    if (waiter_.get_id() == std::this_thread::get_id()) waiter_.detach();
    else waiter_.join();
  }

  ucm_cache_t handle() const { return h_; }
  uint64_t shard_bytes() const { return shard_bytes_; }
  bool closed() const { return closed_.load(std::memory_order_acquire); }
  bool finalize_returned() const { return finalized_.load(std::memory_order_acquire); }

  // A call on a closed cache: ClosedError naming the call (the library would
  // say UCM_ERR_FINALIZED too; this names what was called).
  void check_open(const char* what) const {
    if (closed()) raise_class("ClosedError", UCM_ERR_FINALIZED, std::string(what) + ": the cache is closed");
  }

  [[noreturn]] void raise_last(ucm_result_t r, const char* what) const {
    raise_result(r, std::string(what) + ": " + ucm_last_error(h_));
  }

  // Holders of a task whose Python object went away before its end.
  void bury(ucm_task_t id, std::vector<Holder>&& hs) {
    std::lock_guard<std::mutex> g(grave_mu_);
    if (finalize_returned()) return;  // hs released by the caller's scope (GIL held)
    grave_.emplace_back(id, std::move(hs));
  }

  // Drops the holders of buried tasks the library says are done. GIL held.
  void reap() {
    std::vector<std::vector<Holder>> dead;
    {
      std::lock_guard<std::mutex> g(grave_mu_);
      if (grave_.empty()) return;
      for (size_t i = 0; i < grave_.size();) {
        int done = 0;
        const ucm_result_t r = ucm_task_test(h_, grave_[i].first, &done);
        if (done || r != UCM_OK) {
          dead.push_back(std::move(grave_[i].second));
          grave_[i] = std::move(grave_.back());
          grave_.pop_back();
        } else {
          ++i;
        }
      }
    }
  }

  void close() {
    if (closed_.exchange(true)) return;
    ucm_result_t r;
    std::string msg;
    {
      py::gil_scoped_release nogil;
      ucm_cache_t h = h_;
      r = ucm_cache_finalize(&h);
      if (r != UCM_OK) msg = ucm_last_error(nullptr);
      finalized_.store(true, std::memory_order_release);
      stop_waiter();
    }
    std::vector<std::pair<ucm_task_t, std::vector<Holder>>> grave;
    {
      std::lock_guard<std::mutex> g(grave_mu_);
      grave.swap(grave_);
    }
    grave.clear();  // GIL held
    if (r != UCM_OK) raise_result(r, "close (ucm_cache_finalize): " + msg);
  }

  // The asyncio side: run `cb` (with the GIL) once `t`'s outcome is known.
  void watch(std::shared_ptr<TaskImpl> t, py::function cb);

 private:
  void waiter_main();
  void stop_waiter() {  // GIL released
    {
      std::lock_guard<std::mutex> g(waiter_mu_);
      stop_ = true;
    }
    waiter_cv_.notify_all();
    if (waiter_.joinable()) waiter_.join();
  }

  ucm_cache_t h_;
  uint64_t shard_bytes_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> finalized_{false};
  std::mutex grave_mu_;
  std::vector<std::pair<ucm_task_t, std::vector<Holder>>> grave_;
  std::mutex waiter_mu_;
  std::condition_variable waiter_cv_;
  std::deque<std::pair<std::shared_ptr<TaskImpl>, py::object>> watched_;  // py::object touched with the GIL only
  bool stop_ = false;
  std::thread waiter_;
};

class TaskImpl {
 public:
  TaskImpl(std::shared_ptr<CacheImpl> c, ucm_task_t id, std::vector<ucm_key_t>&& keys, std::vector<Holder>&& hs,
           const char* kind)
      : cache_(std::move(c)), id_(id), keys_(std::move(keys)), holders_(std::move(hs)), kind_(kind) {}

  ~TaskImpl() {  // GIL held (pybind11 dealloc, or the waiter thread with the GIL)
    if (holders_.empty()) return;
    if (!known_.load(std::memory_order_acquire) || (result_ == UCM_ERR_FINALIZED && !cache_->finalize_returned()))
      cache_->bury(id_, std::move(holders_));
  }

  ucm_task_t id() const { return id_; }
  const char* kind() const { return kind_; }
  bool known() const { return known_.load(std::memory_order_acquire); }

  // Blocks (GIL released by the caller) up to timeout_ms (< 0: no bound)
  // until the outcome is known. Returns false on a timeout.
  bool fetch(int64_t timeout_ms) {
    if (known()) return true;
    std::unique_lock<std::timed_mutex> l(wait_mu_, std::defer_lock);
    const auto t0 = std::chrono::steady_clock::now();
    if (timeout_ms < 0) {
      l.lock();
    } else if (!l.try_lock_for(std::chrono::milliseconds(timeout_ms))) {
      return known();
    }
    if (known()) return true;
    int64_t left = timeout_ms;
    if (timeout_ms >= 0) {
      const int64_t spent =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
      left = std::max<int64_t>(0, timeout_ms - spent);
    }
    const ucm_result_t r = ucm_task_wait(cache_->handle(), id_, left);
    if (r == UCM_ERR_TIMEOUT) return after_timeout();
    store(r);
    return true;
  }

  // UCM_ERR_TIMEOUT is the wait's own bound running out (the task runs on)
  // or the task's result, its deadline (timeout_ms): then the wait retired
  // the handle, and ucm_task_test says it is not a task any more. A task that
  // ended just after the wait gave up is done for the test. wait_mu_ held.
  bool after_timeout() {
    const std::string why = ucm_last_error(cache_->handle());  // before the test's own error
    int done = 0;
    const ucm_result_t t = ucm_task_test(cache_->handle(), id_, &done);
    if (t == UCM_ERR_UNKNOWN_TASK) {
      store(UCM_ERR_TIMEOUT, why);
      return true;
    }
    if (!done) return false;
    store(t);
    return true;
  }

  // Never blocks: whether the outcome is known now.
  bool poll() {
    if (known()) return true;
    std::unique_lock<std::timed_mutex> l(wait_mu_, std::try_to_lock);
    if (!l.owns_lock()) return known();  // another thread is waiting for it
    if (known()) return true;
    int done = 0;
    const ucm_result_t r = ucm_task_test(cache_->handle(), id_, &done);
    if (!done && r == UCM_OK) return false;
    store(r);
    return true;
  }

  // With the GIL: returns None, or raises the task's failure; the second
  // time UnknownTaskError.
  void deliver() {
    if (delivered_.exchange(true))
      raise_class("UnknownTaskError", UCM_ERR_UNKNOWN_TASK,
                  std::string(kind_) + " task " + std::to_string(id_) + " was already waited for");
    release_if_safe();
    if (result_ == UCM_OK) return;
    py::dict extra;
    if (result_ == UCM_ERR_BACKEND) extra = failed_keys();
    raise_result(result_, std::string(kind_) + " task " + std::to_string(id_) + ": " + message_, extra);
  }

  // The holders go once the library can no longer write into them. GIL held.
  void release_if_safe() {
    if (!known()) return;
    if (result_ == UCM_ERR_FINALIZED && !cache_->finalize_returned()) return;  // the destructor buries them
    holders_.clear();
  }

  int result() const { return result_; }

 private:
  void store(ucm_result_t r) {
    store(r, r != UCM_OK ? ucm_last_error(cache_->handle()) : std::string());  // this thread's, from the call just made
  }
  void store(ucm_result_t r, const std::string& message) {
    result_ = r;
    message_ = message;
    known_.store(true, std::memory_order_release);
  }

  // BackendError.keys: the keys the message names ("(failed keys: HI LO:shard, ...)",
  // at most 16), as the (bytes, int) pairs of this task.
  py::dict failed_keys() const {
    py::dict extra;
    py::list keys, idx;
    const auto at = message_.find("failed keys: ");
    if (at != std::string::npos) {
      size_t p = at + 13;
      while (p + 34 <= message_.size()) {
        const std::string hex = message_.substr(p, 32);
        if (message_[p + 32] != ':') break;
        uint64_t hi = 0, lo = 0;
        try {
          hi = std::stoull(hex.substr(0, 16), nullptr, 16), lo = std::stoull(hex.substr(16), nullptr, 16);
        } catch (...) {
          break;
        }
        size_t q = p + 33;
        uint32_t shard = 0;
        while (q < message_.size() && message_[q] >= '0' && message_[q] <= '9') shard = shard * 10 + (message_[q++] - '0');
        for (size_t i = 0; i < keys_.size(); ++i) {
          uint64_t klo, khi;
          std::memcpy(&klo, keys_[i].block.bytes, 8);
          std::memcpy(&khi, keys_[i].block.bytes + 8, 8);
          if (klo == lo && khi == hi && keys_[i].shard == shard) {
            keys.append(py::make_tuple(py::bytes(reinterpret_cast<const char*>(keys_[i].block.bytes), 16), shard));
            idx.append(i);
            break;
          }
        }
        if (message_.compare(q, 2, ", ") != 0) break;
        p = q + 2;
      }
    }
    extra["keys"] = keys;
    extra["indexes"] = idx;
    return extra;
  }

  std::shared_ptr<CacheImpl> cache_;
  ucm_task_t id_;
  std::vector<ucm_key_t> keys_;
  std::vector<Holder> holders_;
  const char* kind_;
  std::timed_mutex wait_mu_;
  std::atomic<bool> known_{false};
  std::atomic<bool> delivered_{false};
  ucm_result_t result_ = UCM_OK;
  std::string message_;
};

void CacheImpl::watch(std::shared_ptr<TaskImpl> t, py::function cb) {
  if (t->known()) {
    cb();
    return;
  }
  {
    std::lock_guard<std::mutex> g(waiter_mu_);
    if (stop_) {
      // Closed: the task's outcome is known (finalize abandoned it).
      py::gil_scoped_release nogil;
      (void)t->fetch(0);
    } else {
      watched_.emplace_back(std::move(t), std::move(cb));
      if (!waiter_.joinable()) waiter_ = std::thread([self = shared_from_this()] { self->waiter_main(); });
      waiter_cv_.notify_one();
      return;
    }
  }
  cb();
}

// One thread per cache, started by the first await. It blocks in
// ucm_task_wait on the oldest watched task (no polling: the library wakes
// it), then tests the others once, and runs the callbacks of every task
// that is done with the GIL. Finalize ends every wait (UCM_ERR_FINALIZED).
void CacheImpl::waiter_main() {
  for (;;) {
    std::shared_ptr<TaskImpl> head;
    {
      std::unique_lock<std::mutex> l(waiter_mu_);
      waiter_cv_.wait(l, [&] { return stop_ || !watched_.empty(); });
      if (watched_.empty()) return;  // stopped, nothing left
      head = watched_.front().first;
    }
    (void)head->fetch(-1);
    std::vector<std::pair<std::shared_ptr<TaskImpl>, py::object>> done;
    {
      std::lock_guard<std::mutex> g(waiter_mu_);
      for (auto it = watched_.begin(); it != watched_.end();) {
        if (it->first->known() || it->first->poll()) {
          done.push_back(std::move(*it));
          it = watched_.erase(it);
        } else {
          ++it;
        }
      }
    }
    head.reset();
    if (done.empty()) continue;
    if (_Py_IsFinalizing()) {  // the interpreter is gone: leak rather than touch it
      for (auto& d : done) (void)new std::pair<std::shared_ptr<TaskImpl>, py::object>(std::move(d));
      return;
    }
    py::gil_scoped_acquire gil;
    for (auto& d : done) {
      try {
        d.second();
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("ucmcache: a task's done callback");
      }
    }
    done.clear();  // the references go with the GIL held
  }
}

// The Python-facing wrappers: thin classes over shared_ptrs.
struct PyTask {
  std::shared_ptr<TaskImpl> t;

  void wait(py::handle timeout) {
    const int64_t ms = timeout_ms_of(timeout);
    bool ok;
    {
      py::gil_scoped_release nogil;
      ok = t->fetch(ms);
    }
    if (!ok)
      raise_class("UcmTimeoutError", UCM_ERR_TIMEOUT,
                  std::string(t->kind()) + " task " + std::to_string(t->id()) + " not done after " +
                      std::string(py::str(timeout)) + " s (still running; wait again)");
    t->deliver();
  }
  bool test() {
    bool k = t->poll();
    if (k) t->release_if_safe();
    return k;
  }
};

struct PyCache {
  std::shared_ptr<CacheImpl> c;

  static PyCache init(py::object comm, const Config& cfg) {
    if (import_mpi4py() < 0) throw py::error_already_set();
    MPI_Comm* pc = PyMPIComm_Get(comm.ptr());
    if (!pc) throw py::error_already_set();  // not an mpi4py communicator: mpi4py's TypeError
    if (*pc == MPI_COMM_NULL) raise_invalid("comm is MPI.COMM_NULL");
    ucm_cache_t h = nullptr;
    ucm_result_t r;
    std::string msg;
    {
      py::gil_scoped_release nogil;
      r = ucm_cache_init(*pc, &cfg.raw(), &h);
      if (r != UCM_OK) msg = ucm_last_error(nullptr);
    }
    if (r != UCM_OK) raise_result(r, "Cache (ucm_cache_init): " + msg);
    return PyCache{std::make_shared<CacheImpl>(h, cfg.raw())};
  }

  // Entries for `n` keys from `bufs`: a list/tuple of one buffer per key, or
  // one buffer of n * shard_bytes cut into n.
  template <typename E>
  std::vector<Holder> entries(py::handle bufs, bool writable, const char* name, std::vector<E>* es,
                              const std::vector<ucm_key_t>& keys) {
    const uint64_t sb = c->shard_bytes();
    const size_t n = keys.size();
    es->resize(n);
    std::vector<Holder> hs;
    if (n == 0) return hs;  // the library names an empty task
    auto set = [&](size_t i, uintptr_t p) {
      (*es)[i].key = keys[i];
      if constexpr (std::is_same_v<E, ucm_load_entry_t>) (*es)[i].dst = reinterpret_cast<void*>(p);
      else (*es)[i].src = reinterpret_cast<const void*>(p);
    };
    if (PyList_Check(bufs.ptr()) || (PyTuple_Check(bufs.ptr()) && !(PyTuple_GET_SIZE(bufs.ptr()) == 2 &&
                                                                   PyLong_Check(PyTuple_GET_ITEM(bufs.ptr(), 0))))) {
      py::sequence seq = py::reinterpret_borrow<py::sequence>(bufs);
      if (seq.size() != n)
        raise_invalid(std::string(name) + " has " + std::to_string(seq.size()) + " buffers for " + std::to_string(n) +
                      " keys");
      hs.resize(n);
      for (size_t i = 0; i < n; ++i) {
        PyObject* item = PySequence_Fast_GET_ITEM(bufs.ptr(), static_cast<Py_ssize_t>(i));
        const What what{name, static_cast<long>(i)};
        const Region rg = acquire(item, writable, what, &hs[i]);
        if (rg.bytes != sb)
          raise_invalid(what + " is " + std::to_string(rg.bytes) + " bytes; shard_bytes is " + std::to_string(sb),
                        "BufferSizeError");
        set(i, rg.ptr);
      }
      return hs;
    }
    hs.resize(1);
    const Region rg = acquire(bufs, writable, What{name, -1}, &hs[0]);
    if (rg.bytes != sb * n)
      raise_invalid(std::string(name) + " is one buffer of " + std::to_string(rg.bytes) + " bytes for " +
                        std::to_string(n) + " keys; it must be " + std::to_string(n) + " x shard_bytes " +
                        std::to_string(sb) + " = " + std::to_string(sb * n) +
                        " bytes (or pass a list of one buffer per key)",
                    "BufferSizeError");
    for (size_t i = 0; i < n; ++i) set(i, rg.ptr + i * sb);
    return hs;
  }

  PyTask load(py::handle keys, py::handle dsts) { return submit<ucm_load_entry_t>(keys, dsts, true); }
  PyTask dump(py::handle keys, py::handle srcs) { return submit<ucm_dump_entry_t>(keys, srcs, false); }

  template <typename E>
  PyTask submit(py::handle keys_obj, py::handle bufs, bool load) {
    const char* what = load ? "load" : "dump";
    c->check_open(what);
    c->reap();
    std::vector<ucm_key_t> keys = parse_keys(keys_obj);
    std::vector<E> es;
    std::vector<Holder> hs = entries<E>(bufs, load, load ? "dsts" : "srcs", &es, keys);
    ucm_task_t id = 0;
    ucm_result_t r;
    {
      py::gil_scoped_release nogil;
      if constexpr (std::is_same_v<E, ucm_load_entry_t>) r = ucm_load_task(c->handle(), es.data(), es.size(), &id);
      else r = ucm_dump_task(c->handle(), es.data(), es.size(), &id);
    }
    if (r != UCM_OK) c->raise_last(r, what);  // hs released (nothing was submitted)
    return PyTask{std::make_shared<TaskImpl>(c, id, std::move(keys), std::move(hs), what)};
  }

  void touch(py::handle blocks) {
    c->check_open("touch");
    std::vector<ucm_block_t> b = parse_blocks(blocks);
    ucm_result_t r;
    {
      py::gil_scoped_release nogil;
      r = ucm_touch(c->handle(), b.data(), b.size());
    }
    if (r != UCM_OK) c->raise_last(r, "touch");
  }

  py::array_t<uint8_t> lookup(py::handle keys_obj) {
    c->check_open("lookup");
    std::vector<ucm_key_t> keys = parse_keys(keys_obj);
    py::array_t<uint8_t> where(static_cast<py::ssize_t>(keys.size()));
    uint8_t* w = where.mutable_data();
    ucm_result_t r;
    {
      py::gil_scoped_release nogil;
      r = ucm_lookup(c->handle(), keys.data(), keys.size(), w);
    }
    // The store failed some keys, or held them past timeout_ms: the
    // exception carries what was answered, and which keys were not.
    if (r == UCM_ERR_BACKEND || r == UCM_ERR_TIMEOUT) {
      py::dict extra;
      py::list ks, idx;
      for (size_t i = 0; i < keys.size(); ++i)
        if (w[i] == UCM_WHERE_ERROR) {
          ks.append(py::make_tuple(py::bytes(reinterpret_cast<const char*>(keys[i].block.bytes), 16), keys[i].shard));
          idx.append(i);
        }
      extra["keys"] = ks;
      extra["indexes"] = idx;
      extra["where"] = where;
      raise_result(r, std::string("lookup: ") + ucm_last_error(c->handle()), extra);
    }
    if (r != UCM_OK) c->raise_last(r, "lookup");
    return where;
  }

  py::tuple stats() {
    c->check_open("stats");
    ucm_stats_t mine{}, node{};
    mine.struct_bytes = node.struct_bytes = sizeof(ucm_stats_t);
    const ucm_result_t r = ucm_cache_stats(c->handle(), &mine, &node);
    if (r != UCM_OK) c->raise_last(r, "stats");
    return py::make_tuple(stats_dict(mine), stats_dict(node));
  }

  static py::dict stats_dict(const ucm_stats_t& s) {
    py::dict d;
#define F(x) d[#x] = s.x
    F(ranks); F(tasks); F(shards); F(hits); F(owner_loads); F(load_failures); F(waits); F(wait_ns);
    F(takeovers); F(evictions); F(no_space); F(prealloc_made); F(prealloc_used); F(failed_shards);
    F(bytes_from_backend); F(bytes_to_device); F(dumps); F(bytes_dumped); F(latency_p50_us);
    F(latency_p90_us); F(latency_p99_us); F(latency_max_us); F(direct_fallbacks); F(inline_tasks); F(protect_overrides);
#undef F
    return d;
  }

  py::dict info() {
    c->check_open("info");
    ucm_cache_info_t i{};
    i.struct_bytes = sizeof(i);
    const ucm_result_t r = ucm_cache_info(c->handle(), &i);
    if (r != UCM_OK) c->raise_last(r, "info");
    py::dict d;
#define F(x) d[#x] = i.x
#define B(x) d[#x] = bool(i.x)
#define S(x) d[#x] = std::string(i.x, strnlen(i.x, sizeof(i.x)))
    F(rank); F(size); F(local_rank); F(local_size); F(node_id); F(node_count); F(device_id);
    B(scheduler); B(hugetlb); B(cuda_built); B(nccl_built); B(hwloc_built); F(visible_devices);
    B(threads_bound); F(regular_slots); F(reserved_slots); F(segments); F(control_bytes); F(data_bytes);
    F(control_inode); S(host); S(copy_engine); S(binding); F(register_seconds); F(register_threads);
    S(device_choice); S(pages);
#undef F
#undef B
#undef S
    d["shard_bytes"] = c->shard_bytes();
    return d;
  }

  // The benchmark's C side, in this process: `iters` load tasks of the keys
  // into dsts (one buffer or a list of one per key), entries built per task as a C caller would, each
  // submitted and waited for. Returns seconds.
  double bench_c_loads(py::handle keys_obj, py::handle buf, int iters) {
    c->check_open("bench");
    std::vector<ucm_key_t> keys = parse_keys(keys_obj);
    if (iters < 0) raise_invalid("iters " + std::to_string(iters) + " < 0");
    // One entry per key, each into its own buffer (a list) or its own part
    // of one buffer, as cache.load(keys, dsts) makes them.
    std::vector<ucm_load_entry_t> probe;
    std::vector<Holder> hs = entries<ucm_load_entry_t>(buf, true, "dsts", &probe, keys);
    ucm_result_t r = UCM_OK;
    double s;
    {
      py::gil_scoped_release nogil;
      const auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < iters && r == UCM_OK; ++it) {
        std::vector<ucm_load_entry_t> es(probe);  // a fresh vector per task, as a caller's loop has
        ucm_task_t t;
        r = ucm_load_task(c->handle(), es.data(), es.size(), &t);
        if (r == UCM_OK) r = ucm_task_wait(c->handle(), t, -1);
      }
      s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (r != UCM_OK) c->raise_last(r, "bench");
    return s;
  }
};

}  // namespace
}  // namespace ucm_py

using namespace ucm_py;  // NOLINT: the module's bindings name the classes above

PYBIND11_MODULE(_native, m) {
  m.doc() = "ucmcache's compiled core over the C API; use the ucmcache package, not this module";
  m.attr("VERSION_CODE") = UCM_VERSION_CODE;  // the header's
  m.attr("WHERE_NONE") = UCM_WHERE_NONE;
  m.attr("WHERE_BACKEND") = UCM_WHERE_BACKEND;
  m.attr("WHERE_CACHE") = UCM_WHERE_CACHE;
  m.attr("WHERE_ERROR") = UCM_WHERE_ERROR;
  m.attr("cuda_built") = bool(UCM_PY_HAVE_CUDA);

  m.def("set_error_classes", [](py::dict d) {
    error_classes().clear();
    for (auto item : d) error_classes()[item.first] = item.second;
  });
  m.def("set_key_dtype", [](py::object d) { key_dtype() = std::move(d); });
  m.def("version", [] { return std::string(ucm_version_string()); });
  m.def("library_version_code", [] {
    int v = 0;
    const ucm_result_t r = ucm_get_version(&v);
    if (r != UCM_OK) raise_result(r, ucm_last_error(nullptr));
    return v;
  });
  m.def("result_string", [](int r) { return std::string(ucm_result_string(static_cast<ucm_result_t>(r))); });

  py::class_<Config>(m, "Config")
      .def(py::init<>())
      .def("set", &Config::set)
      .def("get", &Config::get)
      .def("check", &Config::check)
      .def_static("names", &Config::names);

  py::class_<PyTask>(m, "Task")
      .def("wait", &PyTask::wait, py::arg("timeout") = py::none())
      .def("test", &PyTask::test)
      .def_property_readonly("id", [](const PyTask& t) { return t.t->id(); })
      .def_property_readonly("kind", [](const PyTask& t) { return std::string(t.t->kind()); });

  py::class_<PyCache>(m, "Cache")
      .def_static("init", &PyCache::init)
      .def("load", &PyCache::load)
      .def("dump", &PyCache::dump)
      .def("touch", &PyCache::touch)
      .def("lookup", &PyCache::lookup)
      .def("stats", &PyCache::stats)
      .def("info", &PyCache::info)
      .def("close", [](PyCache& p) { p.c->close(); })
      .def_property_readonly("closed", [](const PyCache& p) { return p.c->closed(); })
      .def_property_readonly("shard_bytes", [](const PyCache& p) { return p.c->shard_bytes(); })
      .def("watch", [](PyCache& p, PyTask& t, py::function cb) { p.c->watch(t.t, std::move(cb)); })
      .def("_bench_c_loads", &PyCache::bench_c_loads);
}
