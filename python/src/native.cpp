// ucmcache._native: the compiled half of the Python package, over the public
// C API only (<ucmcache/ucm.h>). The pure-Python layer (ucmcache/__init__.py)
// wraps it; this file does what must not cost a Python object per key or per
// shard: keys and buffers into ucm_*_entry_t arrays, the GIL released around
// every call that can block, and the one waiter thread that completes the
// asyncio futures of awaited tasks.
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

#include "ucmcache/ucm.h"

#if UCM_PY_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace py = pybind11;

namespace {

// ---- exceptions ---------------------------------------------------------------
// The classes live in ucmcache/errors.py; __init__.py hands them over with
// set_error_classes() before anything can fail.

py::dict& error_classes() {
  static py::dict* d = new py::dict();  // never freed: outlives the interpreter's teardown order
  return *d;
}

[[noreturn]] void raise_class(const char* cls_name, int result, const std::string& message, py::dict extra = {}) {
  py::object cls = error_classes().contains(cls_name) ? py::object(error_classes()[cls_name])
                                                      : py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  py::object exc = cls(py::str(message));
  if (result >= 0) exc.attr("result") = result;
  for (auto item : extra) exc.attr(item.first) = item.second;
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

// The class of a result code (errors.py's table, by value).
[[noreturn]] void raise_result(int result, const std::string& detail, py::dict extra = {}) {
  py::object by_result = error_classes().contains("by_result") ? py::object(error_classes()["by_result"])
                                                               : py::object(py::dict());
  std::string name = "UcmError";
  if (by_result.contains(py::int_(result))) name = py::str(by_result[py::int_(result)].attr("__name__"));
  std::string msg = ucm_result_string(static_cast<ucm_result_t>(result));
  if (!detail.empty()) msg += ": " + detail;
  raise_class(name.c_str(), result, msg, std::move(extra));
}

[[noreturn]] void raise_invalid(const std::string& message, const char* cls = "InvalidArgumentError") {
  raise_class(cls, UCM_ERR_INVALID_ARG, message);
}

std::string type_name(py::handle o) { return py::str(py::type::handle_of(o).attr("__name__")); }

// ---- DLPack (the ABI, from dlpack.h 1.0; no header in Debian) -----------------
struct DLDevice { int32_t device_type, device_id; };
struct DLDataType { uint8_t code, bits; uint16_t lanes; };
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};
struct DLPackVersion { uint32_t major, minor; };
struct DLManagedTensorVersioned {
  DLPackVersion version;
  void* manager_ctx;
  void (*deleter)(DLManagedTensorVersioned*);
  uint64_t flags;
  DLTensor dl_tensor;
};
constexpr uint64_t kDLFlagReadOnly = 1;
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13;

// ---- one buffer an entry points into -------------------------------------------
// Move-only; release() needs the GIL.
class Holder {
 public:
  Holder() = default;
  Holder(const Holder&) = delete;
  Holder& operator=(const Holder&) = delete;
  Holder(Holder&& o) noexcept { *this = std::move(o); }
  Holder& operator=(Holder&& o) noexcept {
    std::swap(view_, o.view_);
    std::swap(has_view_, o.has_view_);
    std::swap(dl_, o.dl_);
    std::swap(dlv_, o.dlv_);
    std::swap(ref_, o.ref_);
    return *this;
  }
  ~Holder() { release(); }

  void set_view(const Py_buffer& v) { view_ = v, has_view_ = true; }
  void set_dl(DLManagedTensor* m) { dl_ = m; }
  void set_dlv(DLManagedTensorVersioned* m) { dlv_ = m; }
  void set_ref(PyObject* o) { Py_XINCREF(o), ref_ = o; }

  void release() {
    if (has_view_) PyBuffer_Release(&view_), has_view_ = false;
    if (dl_ && dl_->deleter) dl_->deleter(dl_);
    if (dlv_ && dlv_->deleter) dlv_->deleter(dlv_);
    dl_ = nullptr, dlv_ = nullptr;
    Py_XDECREF(ref_), ref_ = nullptr;
  }

 private:
  Py_buffer view_{};
  bool has_view_ = false;
  DLManagedTensor* dl_ = nullptr;
  DLManagedTensorVersioned* dlv_ = nullptr;
  PyObject* ref_ = nullptr;
};

struct Region {
  uintptr_t ptr = 0;
  uint64_t bytes = 0;
};

// Names a buffer in messages ("dsts[3]"), built only when a message is.
struct What {
  const char* name;
  long index;  // < 0: the one buffer `name`
  std::string str() const { return index < 0 ? std::string(name) : std::string(name) + "[" + std::to_string(index) + "]"; }
  operator std::string() const { return str(); }
};
std::string operator+(const What& w, const char* s) { return w.str() + s; }

void sync_cuda_stream(uintptr_t stream, const std::string& what) {
#if UCM_PY_HAVE_CUDA
  cudaError_t e;
  {
    py::gil_scoped_release nogil;
    e = cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(stream));
  }
  if (e != cudaSuccess) raise_result(UCM_ERR_DEVICE, what + ": cudaStreamSynchronize: " + cudaGetErrorString(e));
#else
  (void)stream;
  raise_result(UCM_ERR_UNSUPPORTED, what + ": a CUDA stream to wait for, but this module was built without CUDA");
#endif
}

uint64_t typestr_bytes(const std::string& typestr, const std::string& what) {
  // "<f4", "|u1", "<c8": the size is the number after the kind.
  if (typestr.size() < 3) raise_invalid(what + ": __cuda_array_interface__ typestr '" + typestr + "' is not understood");
  return std::stoull(typestr.substr(2));
}

bool c_contiguous(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides, int64_t item) {
  int64_t want = item;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != want) return false;
    want *= shape[i];
  }
  return true;
}

// __cuda_array_interface__ (v3): data (ptr, read-only), shape, typestr,
// strides (None: C order), stream (the consumer synchronizes on it).
Region acquire_cai(py::handle obj, bool writable, const What& what, Holder* h) {
  PyObject* o = obj.ptr();
  py::dict cai = obj.attr("__cuda_array_interface__");
  py::tuple data = cai["data"];
  const uintptr_t p = data[0].cast<uintptr_t>();
  const bool ro = data[1].cast<bool>();
  if (writable && ro)
    raise_invalid(what + " (" + type_name(obj) + ") is read-only (__cuda_array_interface__): a destination must be writable",
                  "ReadOnlyBufferError");
  const uint64_t item = typestr_bytes(cai["typestr"].cast<std::string>(), what);
  std::vector<int64_t> shape;
  for (auto d : py::tuple(cai["shape"])) shape.push_back(d.cast<int64_t>());
  int64_t n = static_cast<int64_t>(item);
  for (int64_t d : shape) n *= d;
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    std::vector<int64_t> st;
    for (auto d : py::tuple(cai["strides"])) st.push_back(d.cast<int64_t>());
    if (!c_contiguous(shape, st, static_cast<int64_t>(item)))
      raise_invalid(what + " (" + type_name(obj) + ") is not C-contiguous", "BufferLayoutError");
  }
  if (cai.contains("stream") && !cai["stream"].is_none()) {
    // The producer's work on the buffer must be done before the library's
    // own stream touches it (CAI v3: the consumer synchronizes).
    sync_cuda_stream(cai["stream"].cast<uintptr_t>(), what);
  }
  h->set_ref(o);
  if (p == 0 && n > 0) raise_class("InvalidArgumentError", UCM_ERR_NULL_POINTER, what + ": a NULL device pointer");
  return Region{p, static_cast<uint64_t>(n)};
}

// The memory of one buffer object: buffer protocol, (ptr, nbytes),
// __cuda_array_interface__, or __dlpack__. `writable`: it is a destination.
Region acquire(py::handle obj, bool writable, const What& what, Holder* h) {
  PyObject* o = obj.ptr();
  if (PyObject_CheckBuffer(o)) {
    Py_buffer v;
    // PyBUF_SIMPLE: the cheapest request (no shape, strides or format), and
    // the exporter refuses it unless the memory is contiguous. On a refusal,
    // ask again in full to say why.
    if (PyObject_GetBuffer(o, &v, PyBUF_SIMPLE) != 0) {
      PyErr_Clear();
      if (PyObject_GetBuffer(o, &v, PyBUF_FULL_RO) != 0) {
        py::error_already_set e;
        raise_invalid(what + ": its buffer cannot be read: " + std::string(py::str(e.value())));
      }
    }
    h->set_view(v);  // released by h from here on
    if (writable && v.readonly)
      raise_invalid(what + " (" + type_name(obj) + ") is read-only: a destination must be writable",
                    "ReadOnlyBufferError");
    if (!PyBuffer_IsContiguous(&v, 'C'))
      raise_invalid(what + " (" + type_name(obj) + ") is not C-contiguous", "BufferLayoutError");
    return Region{reinterpret_cast<uintptr_t>(v.buf), static_cast<uint64_t>(v.len)};
  }
  if (PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 2 && PyLong_Check(PyTuple_GET_ITEM(o, 0)) &&
      PyLong_Check(PyTuple_GET_ITEM(o, 1))) {
    const uintptr_t p = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(o, 0));
    if (PyErr_Occurred()) PyErr_Clear(), raise_invalid(what + ": the pointer of (ptr, nbytes) is not a valid address");
    const long long n = PyLong_AsLongLong(PyTuple_GET_ITEM(o, 1));
    if (PyErr_Occurred() || n < 0) PyErr_Clear(), raise_invalid(what + ": nbytes of (ptr, nbytes) is not a size");
    if (p == 0) raise_class("InvalidArgumentError", UCM_ERR_NULL_POINTER, what + ": (ptr, nbytes) with a NULL ptr");
    return Region{p, static_cast<uint64_t>(n)};
  }
  if (py::hasattr(obj, "__cuda_array_interface__")) {
    try {
      return acquire_cai(obj, writable, what, h);
    } catch (py::cast_error&) {
      raise_invalid(what + ": its __cuda_array_interface__ is malformed (data, shape, typestr, strides, stream)");
    } catch (py::error_already_set& e) {
      if (error_classes().contains("UcmError") && e.matches(error_classes()["UcmError"])) throw;  // ours
      if (e.matches(PyExc_KeyError) || e.matches(PyExc_TypeError) || e.matches(PyExc_ValueError))
        raise_invalid(what + ": its __cuda_array_interface__ is malformed: " + std::string(py::str(e.value())));
      throw;
    }
  }
  if (py::hasattr(obj, "__dlpack__")) {
    int32_t dev_type = kDLCPU;
    if (py::hasattr(obj, "__dlpack_device__")) dev_type = py::tuple(obj.attr("__dlpack_device__")())[0].cast<int32_t>();
    py::object cap;
    py::dict kw;
    if (dev_type == kDLCUDA || dev_type == kDLCUDAManaged) {
#if UCM_PY_HAVE_CUDA
      kw["stream"] = 1;  // the legacy default stream, synchronized below
#else
      raise_result(UCM_ERR_UNSUPPORTED, what + ": a CUDA __dlpack__ buffer, but this module was built without CUDA");
#endif
    }
    try {
      py::dict kw1 = kw;
      kw1["max_version"] = py::make_tuple(1, 0);
      cap = obj.attr("__dlpack__")(**kw1);
    } catch (py::error_already_set& e) {
      if (!e.matches(PyExc_TypeError)) throw;
      cap = obj.attr("__dlpack__")(**kw);  // a producer of DLPack before 1.0
    }
    DLTensor* t = nullptr;
    if (PyCapsule_IsValid(cap.ptr(), "dltensor_versioned")) {
      auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), "dltensor_versioned"));
      PyCapsule_SetName(cap.ptr(), "used_dltensor_versioned");
      h->set_dlv(m);
      if (writable && (m->flags & kDLFlagReadOnly))
        raise_invalid(what + " (" + type_name(obj) + ") is read-only (DLPack): a destination must be writable",
                      "ReadOnlyBufferError");
      t = &m->dl_tensor;
    } else if (PyCapsule_IsValid(cap.ptr(), "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
      PyCapsule_SetName(cap.ptr(), "used_dltensor");
      h->set_dl(m);
      t = &m->dl_tensor;
    } else {
      raise_invalid(what + ": __dlpack__ returned no DLPack capsule");
    }
    if (t->device.device_type == kDLCUDA || t->device.device_type == kDLCUDAManaged) {
#if UCM_PY_HAVE_CUDA
      sync_cuda_stream(reinterpret_cast<uintptr_t>(cudaStreamLegacy), what);
#endif
    } else if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost) {
      raise_result(UCM_ERR_UNSUPPORTED, what + ": DLPack device type " + std::to_string(t->device.device_type) +
                                            " (only CPU and CUDA memory)");
    }
    const int64_t item = (int64_t{t->dtype.bits} * (t->dtype.lanes ? t->dtype.lanes : 1) + 7) / 8;
    std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
    int64_t n = item;
    for (int64_t d : shape) n *= d;
    if (t->strides) {
      std::vector<int64_t> st(t->strides, t->strides + t->ndim);
      for (auto& s : st) s *= item;  // DLPack strides count elements
      if (!c_contiguous(shape, st, item))
        raise_invalid(what + " (" + type_name(obj) + ") is not C-contiguous", "BufferLayoutError");
    }
    h->set_ref(o);
    return Region{reinterpret_cast<uintptr_t>(t->data) + t->byte_offset, static_cast<uint64_t>(n)};
  }
  raise_invalid(what + " is a " + type_name(obj) +
                    ": a buffer must support the buffer protocol, __dlpack__ or __cuda_array_interface__, "
                    "or be (ptr, nbytes)",
                "BufferTypeError");
}

// ---- keys ------------------------------------------------------------------------

py::object& key_dtype() {
  static py::object* d = new py::object();
  return *d;
}

// Fills keys[0..n) from a KEY_DTYPE array (copied as is: no Python object per
// key) or a sequence of (bytes of 16, int) pairs.
std::vector<ucm_key_t> parse_keys(py::handle keys) {
  std::vector<ucm_key_t> out;
  if (py::isinstance<py::array>(keys)) {
    py::array a = py::reinterpret_borrow<py::array>(keys);
    py::object dt = a.attr("dtype");
    if (!dt.is(key_dtype()) && !dt.equal(key_dtype()))
      raise_invalid("keys: a numpy array of dtype " + std::string(py::str(dt)) + "; keys need ucmcache.KEY_DTYPE " +
                        std::string(py::str(key_dtype())) + " (see ucmcache.make_keys)",
                    "KeyTypeError");
    if (a.ndim() != 1) raise_invalid("keys: a " + std::to_string(a.ndim()) + "-d array; keys are 1-d", "KeyTypeError");
    if (!(a.flags() & py::array::c_style)) raise_invalid("keys: the array is not contiguous", "KeyTypeError");
    static_assert(sizeof(ucm_key_t) == 24);
    out.resize(static_cast<size_t>(a.shape(0)));
    if (!out.empty()) std::memcpy(out.data(), a.data(), out.size() * sizeof(ucm_key_t));
    return out;
  }
  if (PyUnicode_Check(keys.ptr()) || PyBytes_Check(keys.ptr()) || !PySequence_Check(keys.ptr()))
    raise_invalid("keys is a " + type_name(keys) + ": keys are a sequence of (bytes of 16, int) or a KEY_DTYPE array",
                  "KeyTypeError");
  py::sequence seq = py::reinterpret_borrow<py::sequence>(keys);
  const size_t n = seq.size();
  out.resize(n);
  for (size_t i = 0; i < n; ++i) {
    py::object k = seq[i];
    PyObject* ko = k.ptr();
    if (!(PyTuple_Check(ko) || PyList_Check(ko)) || PySequence_Size(ko) != 2)
      raise_invalid("keys[" + std::to_string(i) + "] is a " + type_name(k) + ": a key is (block: bytes of 16, shard: int)",
                    "KeyTypeError");
    py::object b = k[py::int_(0)], s = k[py::int_(1)];
    char* bp = nullptr;
    Py_ssize_t bn = 0;
    Py_buffer bv{};
    bool has_bv = false;
    if (PyBytes_Check(b.ptr())) {
      PyBytes_AsStringAndSize(b.ptr(), &bp, &bn);
    } else if (PyByteArray_Check(b.ptr())) {
      bp = PyByteArray_AS_STRING(b.ptr()), bn = PyByteArray_GET_SIZE(b.ptr());
    } else if (!PyUnicode_Check(b.ptr()) && PyObject_CheckBuffer(b.ptr()) &&
               PyObject_GetBuffer(b.ptr(), &bv, PyBUF_SIMPLE) == 0) {  // memoryview, a uint8 array of 16
      has_bv = true, bp = static_cast<char*>(bv.buf), bn = bv.len;
    } else {
      PyErr_Clear();
      raise_invalid("keys[" + std::to_string(i) + "]: the block is a " + type_name(b) + ", not bytes of 16",
                    "KeyTypeError");
    }
    if (bn == 16) std::memcpy(out[i].block.bytes, bp, 16);
    if (has_bv) PyBuffer_Release(&bv);
    if (bn != 16)
      raise_invalid("keys[" + std::to_string(i) + "]: the block is " + std::to_string(bn) + " bytes, not 16",
                    "KeyTypeError");
    // An int, or anything with __index__ (a numpy integer); not a bool or a float.
    if (PyBool_Check(s.ptr()) || !PyIndex_Check(s.ptr()))
      raise_invalid("keys[" + std::to_string(i) + "]: the shard is a " + type_name(s) + ", not an int", "KeyTypeError");
    py::object si = py::reinterpret_steal<py::object>(PyNumber_Index(s.ptr()));
    if (!si) throw py::error_already_set();
    const long long sv = PyLong_AsLongLong(si.ptr());
    if (PyErr_Occurred() || sv < 0 || sv > UINT32_MAX) {
      PyErr_Clear();
      raise_class("InvalidArgumentError", UCM_ERR_OUT_OF_RANGE,
                  "keys[" + std::to_string(i) + "]: shard " + std::string(py::str(s)) + " is not in [0, 2^32)");
    }
    out[i].shard = static_cast<uint32_t>(sv);
    out[i].reserved = 0;
  }
  return out;
}

std::vector<ucm_block_t> parse_blocks(py::handle blocks) {
  std::vector<ucm_block_t> out;
  if (py::isinstance<py::array>(blocks)) {
    py::array a = py::reinterpret_borrow<py::array>(blocks);
    if (!(a.flags() & py::array::c_style)) raise_invalid("blocks: the array is not contiguous", "KeyTypeError");
    const bool u8x16 = a.ndim() == 2 && a.shape(1) == 16 && a.itemsize() == 1;
    const bool v16 = a.ndim() == 1 && a.itemsize() == 16 && py::str(a.attr("dtype").attr("kind")).cast<std::string>() == "V";
    if (!u8x16 && !v16)
      raise_invalid("blocks: an array of dtype " + std::string(py::str(a.attr("dtype"))) +
                        "; blocks are an (n, 16) uint8 array, a 1-d V16 array or a sequence of bytes of 16",
                    "KeyTypeError");
    out.resize(static_cast<size_t>(a.shape(0)));
    if (!out.empty()) std::memcpy(out.data(), a.data(), out.size() * 16);
    return out;
  }
  if (PyUnicode_Check(blocks.ptr()) || PyBytes_Check(blocks.ptr()) || !PySequence_Check(blocks.ptr()))
    raise_invalid("blocks is a " + type_name(blocks) + ": blocks are a sequence of bytes of 16", "KeyTypeError");
  py::sequence seq = py::reinterpret_borrow<py::sequence>(blocks);
  out.resize(seq.size());
  for (size_t i = 0; i < out.size(); ++i) {
    py::object b = seq[i];
    if (!PyBytes_Check(b.ptr()) || PyBytes_GET_SIZE(b.ptr()) != 16)
      raise_invalid("blocks[" + std::to_string(i) + "] is " +
                        (PyBytes_Check(b.ptr()) ? std::to_string(PyBytes_GET_SIZE(b.ptr())) + " bytes" : "a " + type_name(b)) +
                        ", not bytes of 16",
                    "KeyTypeError");
    std::memcpy(out[i].bytes, PyBytes_AS_STRING(b.ptr()), 16);
  }
  return out;
}

// ---- the configuration -------------------------------------------------------------
// One row per field of ucm_config_t (but struct_bytes and version), in its
// order; the keyword is the field's name. tests/python checks this list
// against `ucm_info -f --parsable`, the library's own table.
enum class Kind { kU32, kI32, kSize, kEnum, kDevice, kString };
struct Field {
  const char* name;
  Kind kind;
  size_t offset;
  std::vector<const char*> names;  // kEnum
};

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      {"shard_bytes", Kind::kSize, offsetof(ucm_config_t, shard_bytes), {}},
      {"cache_bytes", Kind::kSize, offsetof(ucm_config_t, cache_bytes), {}},
      {"shards_per_block", Kind::kU32, offsetof(ucm_config_t, shards_per_block), {}},
      {"reserved_slots", Kind::kU32, offsetof(ucm_config_t, reserved_slots), {}},
      {"max_task_entries", Kind::kU32, offsetof(ucm_config_t, max_task_entries), {}},
      {"device_id", Kind::kDevice, offsetof(ucm_config_t, device_id), {}},
      {"ranks_per_node", Kind::kU32, offsetof(ucm_config_t, ranks_per_node), {}},
      {"order", Kind::kEnum, offsetof(ucm_config_t, order), {"rotate", "natural"}},
      {"evict", Kind::kEnum, offsetof(ucm_config_t, evict), {"clock", "ring"}},
      {"wait", Kind::kEnum, offsetof(ucm_config_t, wait), {"futex", "poll"}},
      {"prealloc", Kind::kI32, offsetof(ucm_config_t, prealloc), {}},
      {"hugepages", Kind::kEnum, offsetof(ucm_config_t, hugepages), {"auto", "on", "off"}},
      {"bind_threads", Kind::kI32, offsetof(ucm_config_t, bind_threads), {}},
      {"timeout_ms", Kind::kU32, offsetof(ucm_config_t, timeout_ms), {}},
      {"liveness_ms", Kind::kU32, offsetof(ucm_config_t, liveness_ms), {}},
      {"load_retries", Kind::kU32, offsetof(ucm_config_t, load_retries), {}},
      {"io_depth", Kind::kU32, offsetof(ucm_config_t, io_depth), {}},
      {"owner_grace_us", Kind::kU32, offsetof(ucm_config_t, owner_grace_us), {}},
      {"segment_bytes", Kind::kSize, offsetof(ucm_config_t, segment_bytes), {}},
      {"backend", Kind::kString, offsetof(ucm_config_t, backend), {}},
      {"copy_engine", Kind::kEnum, offsetof(ucm_config_t, copy_engine), {"auto", "cuda", "host", "async-test"}},
      {"allow_overcommit", Kind::kI32, offsetof(ucm_config_t, allow_overcommit), {}},
      {"protect", Kind::kI32, offsetof(ucm_config_t, protect), {}},
      {"protect_grace_ms", Kind::kU32, offsetof(ucm_config_t, protect_grace_ms), {}},
      {"fanout", Kind::kEnum, offsetof(ucm_config_t, fanout), {"off", "nccl", "mpi"}},
  };
  return f;
}

std::string known_fields() {
  std::string s;
  for (const Field& f : fields()) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

// "16K", "1M", "4096": bytes, as ucm_config_init reads a UCM_* size.
bool parse_size(const std::string& s, uint64_t* out) {
  if (s.empty() || !(s[0] >= '0' && s[0] <= '9')) return false;
  size_t i = 0;
  uint64_t v = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
    const uint64_t d = static_cast<uint64_t>(s[i++] - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  if (i < s.size()) {
    const char* suf = "KMGT";
    const char* p = std::strchr(suf, s[i]);
    if (!p || i + 1 != s.size()) return false;
    const int shift = 10 * static_cast<int>(p - suf + 1);
    if (v > (UINT64_MAX >> shift)) return false;
    v <<= shift;
  }
  *out = v;
  return true;
}

class Config {
 public:
  Config() {
    const ucm_result_t r = ucm_config_init(&c_);
    if (r != UCM_OK) raise_result(r, ucm_last_error(nullptr));
  }

  void set(const std::string& name, py::handle v) {
    const Field* f = find(name);
    if (!f)
      raise_invalid("unknown configuration keyword '" + name + "' (the keywords are the fields of ucm_config_t: " +
                        known_fields() + ")",
                    "ConfigError");
    char* p = reinterpret_cast<char*>(&c_) + f->offset;
    const std::string bad = name + "=" + std::string(py::repr(v));
    auto as_int = [&](int64_t lo, int64_t hi) -> int64_t {
      if (!PyLong_Check(v.ptr())) raise_invalid(bad + ": " + name + " is an int", "ConfigError");
      const long long x = PyLong_AsLongLong(v.ptr());
      if (PyErr_Occurred() || x < lo || x > hi)
        PyErr_Clear(), raise_invalid(bad + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
                                     "ConfigError");
      return x;
    };
    switch (f->kind) {
      case Kind::kU32: {
        const uint32_t x = static_cast<uint32_t>(as_int(0, UINT32_MAX));
        std::memcpy(p, &x, 4);
        break;
      }
      case Kind::kI32: {
        const int32_t x = static_cast<int32_t>(as_int(INT32_MIN, INT32_MAX));
        std::memcpy(p, &x, 4);
        break;
      }
      case Kind::kSize: {
        uint64_t x = 0;
        if (PyUnicode_Check(v.ptr())) {
          if (!parse_size(v.cast<std::string>(), &x))
            raise_invalid(bad + " is not a size (digits with an optional K, M, G or T)", "ConfigError");
        } else {
          if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr()))
            raise_invalid(bad + ": " + name + " is an int or a size string like '16K'", "ConfigError");
          const unsigned long long u = PyLong_AsUnsignedLongLong(v.ptr());
          if (PyErr_Occurred()) PyErr_Clear(), raise_invalid(bad + " is not a size", "ConfigError");
          x = u;
        }
        std::memcpy(p, &x, 8);
        break;
      }
      case Kind::kEnum: {
        int32_t x = -1;
        if (PyUnicode_Check(v.ptr())) {
          const std::string s = v.cast<std::string>();
          for (size_t i = 0; i < f->names.size(); ++i)
            if (s == f->names[i]) x = static_cast<int32_t>(i);
        } else if (PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())) {
          const long long i = PyLong_AsLongLong(v.ptr());
          if (!PyErr_Occurred() && i >= 0 && i < static_cast<long long>(f->names.size())) x = static_cast<int32_t>(i);
          PyErr_Clear();
        }
        if (x < 0) {
          std::string names;
          for (const char* n : f->names) names += (names.empty() ? "" : "|") + std::string(n);
          raise_invalid(bad + " is not one of " + names, "ConfigError");
        }
        std::memcpy(p, &x, 4);
        break;
      }
      case Kind::kDevice: {
        int32_t x;
        if (PyUnicode_Check(v.ptr()) && v.cast<std::string>() == "auto") x = UCM_DEVICE_AUTO;
        else if (PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr())) x = static_cast<int32_t>(as_int(-1000000, INT32_MAX));
        else raise_invalid(bad + ": device_id is an int or 'auto'", "ConfigError");
        std::memcpy(p, &x, 4);
        break;
      }
      case Kind::kString: {
        if (!PyUnicode_Check(v.ptr())) raise_invalid(bad + ": " + name + " is a str", "ConfigError");
        const std::string s = v.cast<std::string>();
        if (s.size() >= sizeof(c_.backend) || s.find('\0') != std::string::npos)
          raise_invalid(name + " is " + std::to_string(s.size()) + " characters; at most " +
                            std::to_string(sizeof(c_.backend) - 1),
                        "ConfigError");
        std::memset(p, 0, sizeof(c_.backend));
        std::memcpy(p, s.data(), s.size());
        break;
      }
    }
  }

  py::object get(const std::string& name) const {
    const Field* f = find(name);
    if (!f) raise_invalid("unknown configuration keyword '" + name + "'", "ConfigError");
    const char* p = reinterpret_cast<const char*>(&c_) + f->offset;
    switch (f->kind) {
      case Kind::kU32: { uint32_t x; std::memcpy(&x, p, 4); return py::int_(x); }
      case Kind::kI32: { int32_t x; std::memcpy(&x, p, 4); return py::int_(x); }
      case Kind::kSize: { uint64_t x; std::memcpy(&x, p, 8); return py::int_(x); }
      case Kind::kEnum: {
        int32_t x;
        std::memcpy(&x, p, 4);
        if (x >= 0 && x < static_cast<int32_t>(f->names.size())) return py::str(f->names[x]);
        return py::int_(x);
      }
      case Kind::kDevice: {
        int32_t x;
        std::memcpy(&x, p, 4);
        if (x == UCM_DEVICE_AUTO) return py::str("auto");
        return py::int_(x);
      }
      case Kind::kString: return py::str(std::string(p, strnlen(p, sizeof(c_.backend))));
    }
    return py::none();
  }

  void check() const {
    const ucm_result_t r = ucm_config_check(&c_);
    if (r != UCM_OK) raise_result(r, ucm_last_error(nullptr));
  }

  const ucm_config_t& raw() const { return c_; }

  static std::vector<std::string> names() {
    std::vector<std::string> v;
    for (const Field& f : fields()) v.push_back(f.name);
    return v;
  }

 private:
  static const Field* find(const std::string& name) {
    for (const Field& f : fields())
      if (name == f.name) return &f;
    return nullptr;
  }
  ucm_config_t c_{};
};

// ---- the cache and its tasks ---------------------------------------------------------

int64_t timeout_ms_of(py::handle timeout) {
  if (timeout.is_none()) return -1;
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
    if (r == UCM_ERR_TIMEOUT) return false;
    store(r);
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
    result_ = r;
    if (r != UCM_OK) message_ = ucm_last_error(cache_->handle());  // this thread's, from the call just made
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
    if (r == UCM_ERR_BACKEND) {
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
    F(latency_p90_us); F(latency_p99_us); F(latency_max_us); F(direct_fallbacks); F(inline_tasks);
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
  // into one buffer, entries built per task as a C caller would, each
  // submitted and waited for. Returns seconds.
  double bench_c_loads(py::handle keys_obj, py::handle buf, int iters) {
    c->check_open("bench");
    std::vector<ucm_key_t> keys = parse_keys(keys_obj);
    std::vector<ucm_load_entry_t> probe;
    std::vector<Holder> hs = entries<ucm_load_entry_t>(buf, true, "dsts", &probe, keys);
    const uint64_t sb = c->shard_bytes();
    uint8_t* base = static_cast<uint8_t*>(probe[0].dst);
    ucm_result_t r = UCM_OK;
    double s;
    {
      py::gil_scoped_release nogil;
      const auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < iters && r == UCM_OK; ++it) {
        std::vector<ucm_load_entry_t> es(keys.size());
        for (size_t i = 0; i < keys.size(); ++i) es[i].key = keys[i], es[i].dst = base + i * sb;
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
