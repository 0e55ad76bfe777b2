// The buffers an entry points into (native.h): Python's buffer protocol,
// (ptr, nbytes), __cuda_array_interface__ and DLPack, each held (Holder)
// until the library is done with it.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "native.h"

#if UCM_PY_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace ucm_py {

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

void Holder::release() {
  if (has_view_) PyBuffer_Release(&view_), has_view_ = false;
  if (dl_ && dl_->deleter) dl_->deleter(dl_);
  if (dlv_ && dlv_->deleter) dlv_->deleter(dlv_);
  dl_ = nullptr, dlv_ = nullptr;
  Py_XDECREF(ref_), ref_ = nullptr;
}

namespace {

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
  // "<f4", "|u1", "<c8": the size is the number after the kind, 1 to 64 bytes
  // (std::stoull would take "4x", and throw its own "stoull" for "X").
  uint64_t n = 0;
  bool ok = typestr.size() >= 3 && typestr.size() <= 4;
  for (size_t i = 2; ok && i < typestr.size(); ++i) {
    ok = typestr[i] >= '0' && typestr[i] <= '9';
    n = n * 10 + static_cast<uint64_t>(typestr[i] - '0');
  }
  if (!ok || n == 0 || n > 64)
    raise_invalid(what + ": __cuda_array_interface__ typestr '" + typestr + "' is not understood (an item of 1 to 64 bytes)");
  return n;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

// item x the product of the dimensions: a negative dimension, or a product
// past 2^63, is the exporter's error, named (a wrapped product could equal
// shard_bytes and pass the size check).
uint64_t extent_bytes(const std::vector<int64_t>& shape, int64_t item, const std::string& what, const char* iface) {
  int64_t n = item;
  for (int64_t d : shape)
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      raise_invalid(what + ": " + iface + " shape " + shape_string(shape) + " of " + std::to_string(item) +
                    "-byte items is not a size", "BufferSizeError");
  return static_cast<uint64_t>(n);
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
  const uint64_t n = extent_bytes(shape, static_cast<int64_t>(item), what, "__cuda_array_interface__");
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    std::vector<int64_t> st;
    for (auto d : py::tuple(cai["strides"])) st.push_back(d.cast<int64_t>());
    if (st.size() != shape.size())
      raise_invalid(what + ": __cuda_array_interface__ has " + std::to_string(st.size()) + " strides for the " +
                        std::to_string(shape.size()) + " dimensions of shape " + shape_string(shape),
                    "BufferLayoutError");
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
  return Region{p, n};
}

// The buffer protocol: PyBUF_SIMPLE is the cheapest request (no shape,
// strides or format), and the exporter refuses it unless the memory is
// contiguous. On a refusal, ask again in full to say why.
Region acquire_view(py::handle obj, bool writable, const What& what, Holder* h) {
  PyObject* o = obj.ptr();
  Py_buffer v;
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

bool is_ptr_pair(PyObject* o) {
  return PyTuple_Check(o) && PyTuple_GET_SIZE(o) == 2 && PyLong_Check(PyTuple_GET_ITEM(o, 0)) &&
         PyLong_Check(PyTuple_GET_ITEM(o, 1));
}

Region acquire_ptr_pair(PyObject* o, const What& what) {
  const uintptr_t p = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(o, 0));
  if (PyErr_Occurred()) PyErr_Clear(), raise_invalid(what + ": the pointer of (ptr, nbytes) is not a valid address");
  const long long n = PyLong_AsLongLong(PyTuple_GET_ITEM(o, 1));
  if (PyErr_Occurred() || n < 0) PyErr_Clear(), raise_invalid(what + ": nbytes of (ptr, nbytes) is not a size");
  if (p == 0) raise_class("InvalidArgumentError", UCM_ERR_NULL_POINTER, what + ": (ptr, nbytes) with a NULL ptr");
  return Region{p, static_cast<uint64_t>(n)};
}

// __cuda_array_interface__, with a malformed one an InvalidArgumentError.
Region acquire_cai_checked(py::handle obj, bool writable, const What& what, Holder* h) {
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

// Calls obj.__dlpack__: a CUDA producer is asked for the legacy default
// stream (synchronized once the tensor is known), DLPack 1.0 first, then a
// producer from before 1.0.
py::object dlpack_capsule(py::handle obj, [[maybe_unused]] const What& what) {
  int32_t dev_type = kDLCPU;
  if (py::hasattr(obj, "__dlpack_device__")) dev_type = py::tuple(obj.attr("__dlpack_device__")())[0].cast<int32_t>();
  py::dict kw;
  if (dev_type == kDLCUDA || dev_type == kDLCUDAManaged) {
#if UCM_PY_HAVE_CUDA
    kw["stream"] = 1;
#else
    raise_result(UCM_ERR_UNSUPPORTED, what + ": a CUDA __dlpack__ buffer, but this module was built without CUDA");
#endif
  }
  try {
    py::dict kw1 = kw;
    kw1["max_version"] = py::make_tuple(1, 0);
    return obj.attr("__dlpack__")(**kw1);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_TypeError)) throw;
    return obj.attr("__dlpack__")(**kw);
  }
}

// The tensor in a DLPack capsule, which from here on the holder owns.
DLTensor* dlpack_tensor(py::handle obj, py::object& cap, bool writable, const What& what, Holder* h) {
  if (PyCapsule_IsValid(cap.ptr(), "dltensor_versioned")) {
    auto* m = static_cast<DLManagedTensorVersioned*>(PyCapsule_GetPointer(cap.ptr(), "dltensor_versioned"));
    PyCapsule_SetName(cap.ptr(), "used_dltensor_versioned");
    h->set_dlv(m);
    if (writable && (m->flags & kDLFlagReadOnly))
      raise_invalid(what + " (" + type_name(obj) + ") is read-only (DLPack): a destination must be writable",
                    "ReadOnlyBufferError");
    return &m->dl_tensor;
  }
  if (PyCapsule_IsValid(cap.ptr(), "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
    PyCapsule_SetName(cap.ptr(), "used_dltensor");
    h->set_dl(m);
    return &m->dl_tensor;
  }
  raise_invalid(what + ": __dlpack__ returned no DLPack capsule");
}

Region acquire_dlpack(py::handle obj, bool writable, const What& what, Holder* h) {
  py::object cap = dlpack_capsule(obj, what);
  DLTensor* t = dlpack_tensor(obj, cap, writable, what, h);
  if (t->device.device_type == kDLCUDA || t->device.device_type == kDLCUDAManaged) {
#if UCM_PY_HAVE_CUDA
    sync_cuda_stream(reinterpret_cast<uintptr_t>(cudaStreamLegacy), what);
#endif
  } else if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost) {
    raise_result(UCM_ERR_UNSUPPORTED, what + ": DLPack device type " + std::to_string(t->device.device_type) +
                                          " (only CPU and CUDA memory)");
  }
  const int64_t item = (int64_t{t->dtype.bits} * (t->dtype.lanes ? t->dtype.lanes : 1) + 7) / 8;
  if (t->ndim < 0 || (t->ndim > 0 && !t->shape))
    raise_invalid(what + " (" + type_name(obj) + "): DLPack ndim " + std::to_string(t->ndim) + " without a shape");
  std::vector<int64_t> shape(t->shape, t->shape + t->ndim);
  const uint64_t n = extent_bytes(shape, item, what, "DLPack");
  if (t->strides) {
    std::vector<int64_t> st(t->strides, t->strides + t->ndim);
    for (auto& s : st) s *= item;  // DLPack strides count elements
    if (!c_contiguous(shape, st, item))
      raise_invalid(what + " (" + type_name(obj) + ") is not C-contiguous", "BufferLayoutError");
  }
  h->set_ref(obj.ptr());
  return Region{reinterpret_cast<uintptr_t>(t->data) + t->byte_offset, n};
}

}  // namespace

Region acquire(py::handle obj, bool writable, const What& what, Holder* h) {
  PyObject* o = obj.ptr();
  if (PyObject_CheckBuffer(o)) return acquire_view(obj, writable, what, h);
  if (is_ptr_pair(o)) return acquire_ptr_pair(o, what);
  if (py::hasattr(obj, "__cuda_array_interface__")) return acquire_cai_checked(obj, writable, what, h);
  if (py::hasattr(obj, "__dlpack__")) return acquire_dlpack(obj, writable, what, h);
  raise_invalid(what + " is a " + type_name(obj) +
                    ": a buffer must support the buffer protocol, __dlpack__ or __cuda_array_interface__, "
                    "or be (ptr, nbytes)",
                "BufferTypeError");
}

}  // namespace ucm_py
