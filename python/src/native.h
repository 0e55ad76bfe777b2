// What the sources of ucmcache._native share (python/src/): the errors it
// raises (args.cpp), the buffers an entry points into (buffers.cpp), keys,
// blocks and the configuration as Python gives them (args.cpp). native.cpp
// holds the cache, its tasks and the module itself. All of it is inside the
// one extension module (built -fvisibility=hidden): nothing here is API.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ucmcache/ucm.h"

namespace ucm_py {

namespace py = pybind11;

// ---- exceptions (args.cpp) ---------------------------------------------------------
// The classes live in ucmcache/errors.py; __init__.py hands them over with
// set_error_classes() before anything can fail.
py::dict& error_classes();
[[noreturn]] void raise_class(const char* cls_name, int result, const std::string& message, py::dict extra = {});
// The class of a result code (errors.py's table, by value).
[[noreturn]] void raise_result(int result, const std::string& detail, py::dict extra = {});
[[noreturn]] void raise_invalid(const std::string& message, const char* cls = "InvalidArgumentError");
std::string type_name(py::handle o);

// ---- one buffer an entry points into (buffers.cpp) ----------------------------------
struct DLManagedTensor;  // DLPack's, defined in buffers.cpp
struct DLManagedTensorVersioned;

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

  void release();

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
inline std::string operator+(const What& w, const char* s) { return w.str() + s; }

// The memory of one buffer object: buffer protocol, (ptr, nbytes),
// __cuda_array_interface__, or __dlpack__. `writable`: it is a destination.
Region acquire(py::handle obj, bool writable, const What& what, Holder* h);

// ---- keys, blocks and the configuration (args.cpp) ------------------------------------
py::object& key_dtype();
// Fills keys[0..n) from a KEY_DTYPE array (copied as is: no Python object per
// key) or a sequence of (bytes of 16, int) pairs.
std::vector<ucm_key_t> parse_keys(py::handle keys);
std::vector<ucm_block_t> parse_blocks(py::handle blocks);

// ucm_config_t by keyword: one per field (args.cpp's table, checked by
// tests/python against `ucm_info -f --parsable`).
class Config {
 public:
  Config();
  void set(const std::string& name, py::handle v);
  py::object get(const std::string& name) const;
  void check() const;
  const ucm_config_t& raw() const { return c_; }
  static std::vector<std::string> names();

 private:
  ucm_config_t c_{};
};

}  // namespace ucm_py
