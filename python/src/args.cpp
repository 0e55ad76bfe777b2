// What the module is given, as the library wants it (native.h): the errors
// it raises, keys and blocks, and ucm_config_t by keyword.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "native.h"

namespace ucm_py {

// ---- exceptions ---------------------------------------------------------------

py::dict& error_classes() {
  static py::dict* d = new py::dict();  // never freed: outlives the interpreter's teardown order
  return *d;
}

[[noreturn]] void raise_class(const char* cls_name, int result, const std::string& message, py::dict extra) {
  py::object cls = error_classes().contains(cls_name) ? py::object(error_classes()[cls_name])
                                                      : py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  py::object exc = cls(py::str(message));
  if (result >= 0) exc.attr("result") = result;
  for (auto item : extra) exc.attr(item.first) = item.second;
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

[[noreturn]] void raise_result(int result, const std::string& detail, py::dict extra) {
  py::object by_result = error_classes().contains("by_result") ? py::object(error_classes()["by_result"])
                                                               : py::object(py::dict());
  std::string name = "UcmError";
  if (by_result.contains(py::int_(result))) name = py::str(by_result[py::int_(result)].attr("__name__"));
  std::string msg = ucm_result_string(static_cast<ucm_result_t>(result));
  if (!detail.empty()) msg += ": " + detail;
  raise_class(name.c_str(), result, msg, std::move(extra));
}

[[noreturn]] void raise_invalid(const std::string& message, const char* cls) {
  raise_class(cls, UCM_ERR_INVALID_ARG, message);
}

std::string type_name(py::handle o) { return py::str(py::type::handle_of(o).attr("__name__")); }

// ---- keys ------------------------------------------------------------------------

py::object& key_dtype() {
  static py::object* d = new py::object();
  return *d;
}

static std::vector<ucm_key_t> parse_key_array(py::handle keys) {
  py::array a = py::reinterpret_borrow<py::array>(keys);
  py::object dt = a.attr("dtype");
  if (!dt.is(key_dtype()) && !dt.equal(key_dtype()))
    raise_invalid("keys: a numpy array of dtype " + std::string(py::str(dt)) + "; keys need ucmcache.KEY_DTYPE " +
                      std::string(py::str(key_dtype())) + " (see ucmcache.make_keys)",
                  "KeyTypeError");
  if (a.ndim() != 1) raise_invalid("keys: a " + std::to_string(a.ndim()) + "-d array; keys are 1-d", "KeyTypeError");
  if (!(a.flags() & py::array::c_style)) raise_invalid("keys: the array is not contiguous", "KeyTypeError");
  static_assert(sizeof(ucm_key_t) == 24);
  std::vector<ucm_key_t> out(static_cast<size_t>(a.shape(0)));
  if (!out.empty()) std::memcpy(out.data(), a.data(), out.size() * sizeof(ucm_key_t));
  return out;
}

// keys[i]'s block: bytes, a bytearray or any buffer (a memoryview, a uint8
// array) of exactly 16 bytes; not a str.
static void parse_key_block(py::handle b, size_t i, uint8_t out[16]) {
  char* bp = nullptr;
  Py_ssize_t bn = 0;
  Py_buffer bv{};
  bool has_bv = false;
  if (PyBytes_Check(b.ptr())) {
    PyBytes_AsStringAndSize(b.ptr(), &bp, &bn);
  } else if (PyByteArray_Check(b.ptr())) {
    bp = PyByteArray_AS_STRING(b.ptr()), bn = PyByteArray_GET_SIZE(b.ptr());
  } else if (!PyUnicode_Check(b.ptr()) && PyObject_CheckBuffer(b.ptr()) &&
             PyObject_GetBuffer(b.ptr(), &bv, PyBUF_SIMPLE) == 0) {
    has_bv = true, bp = static_cast<char*>(bv.buf), bn = bv.len;
  } else {
    PyErr_Clear();
    raise_invalid("keys[" + std::to_string(i) + "]: the block is a " + type_name(b) + ", not bytes of 16",
                  "KeyTypeError");
  }
  if (bn == 16) std::memcpy(out, bp, 16);
  if (has_bv) PyBuffer_Release(&bv);
  if (bn != 16)
    raise_invalid("keys[" + std::to_string(i) + "]: the block is " + std::to_string(bn) + " bytes, not 16",
                  "KeyTypeError");
}

// keys[i]'s shard: an int, or anything with __index__ (a numpy integer); not
// a bool or a float; in [0, 2^32).
static uint32_t parse_key_shard(py::handle s, size_t i) {
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
  return static_cast<uint32_t>(sv);
}

std::vector<ucm_key_t> parse_keys(py::handle keys) {
  if (py::isinstance<py::array>(keys)) return parse_key_array(keys);
  if (PyUnicode_Check(keys.ptr()) || PyBytes_Check(keys.ptr()) || !PySequence_Check(keys.ptr()))
    raise_invalid("keys is a " + type_name(keys) + ": keys are a sequence of (bytes of 16, int) or a KEY_DTYPE array",
                  "KeyTypeError");
  py::sequence seq = py::reinterpret_borrow<py::sequence>(keys);
  std::vector<ucm_key_t> out(seq.size());
  for (size_t i = 0; i < out.size(); ++i) {
    py::object k = seq[i];
    PyObject* ko = k.ptr();
    if (!(PyTuple_Check(ko) || PyList_Check(ko)) || PySequence_Size(ko) != 2)
      raise_invalid("keys[" + std::to_string(i) + "] is a " + type_name(k) + ": a key is (block: bytes of 16, shard: int)",
                    "KeyTypeError");
    parse_key_block(k[py::int_(0)], i, out[i].block.bytes);
    out[i].shard = parse_key_shard(k[py::int_(1)], i);
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

namespace {

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
      {"max_unfinished_tasks", Kind::kU32, offsetof(ucm_config_t, max_unfinished_tasks), {}},
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

const Field* find(const std::string& name) {
  for (const Field& f : fields())
    if (name == f.name) return &f;
  return nullptr;
}

// A keyword's value being set: its name, the Python value, and "name=repr"
// for the messages.
struct Setting {
  const std::string& name;
  py::handle v;
  std::string bad;
};

int64_t as_int(const Setting& st, int64_t lo, int64_t hi) {
  if (!PyLong_Check(st.v.ptr())) raise_invalid(st.bad + ": " + st.name + " is an int", "ConfigError");
  const long long x = PyLong_AsLongLong(st.v.ptr());
  if (PyErr_Occurred() || x < lo || x > hi)
    PyErr_Clear(), raise_invalid(st.bad + " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]",
                                 "ConfigError");
  return x;
}

// An int, or a size string like "16K" (as ucm_config_init reads a UCM_* size).
uint64_t as_size(const Setting& st) {
  uint64_t x = 0;
  if (PyUnicode_Check(st.v.ptr())) {
    if (!parse_size(st.v.cast<std::string>(), &x))
      raise_invalid(st.bad + " is not a size (digits with an optional K, M, G or T)", "ConfigError");
    return x;
  }
  if (!PyLong_Check(st.v.ptr()) || PyBool_Check(st.v.ptr()))
    raise_invalid(st.bad + ": " + st.name + " is an int or a size string like '16K'", "ConfigError");
  const unsigned long long u = PyLong_AsUnsignedLongLong(st.v.ptr());
  if (PyErr_Occurred()) PyErr_Clear(), raise_invalid(st.bad + " is not a size", "ConfigError");
  return u;
}

// One of the field's names, or its index.
int32_t as_enum(const Setting& st, const Field& f) {
  int32_t x = -1;
  if (PyUnicode_Check(st.v.ptr())) {
    const std::string s = st.v.cast<std::string>();
    for (size_t i = 0; i < f.names.size(); ++i)
      if (s == f.names[i]) x = static_cast<int32_t>(i);
  } else if (PyLong_Check(st.v.ptr()) && !PyBool_Check(st.v.ptr())) {
    const long long i = PyLong_AsLongLong(st.v.ptr());
    if (!PyErr_Occurred() && i >= 0 && i < static_cast<long long>(f.names.size())) x = static_cast<int32_t>(i);
    PyErr_Clear();
  }
  if (x < 0) {
    std::string names;
    for (const char* n : f.names) {
      if (!names.empty()) names += '|';
      names += n;
    }
    raise_invalid(st.bad + " is not one of " + names, "ConfigError");
  }
  return x;
}

int32_t as_device(const Setting& st) {
  if (PyUnicode_Check(st.v.ptr()) && st.v.cast<std::string>() == "auto") return UCM_DEVICE_AUTO;
  if (PyLong_Check(st.v.ptr()) && !PyBool_Check(st.v.ptr()))
    return static_cast<int32_t>(as_int(st, -1000000, INT32_MAX));
  raise_invalid(st.bad + ": device_id is an int or 'auto'", "ConfigError");
}

// x, already checked for T's range, into the field at p.
template <typename T, typename V>
void store_as(char* p, V x) {
  const T v = static_cast<T>(x);
  std::memcpy(p, &v, sizeof(T));
}

void store_string(const Setting& st, char* p, size_t cap) {
  if (!PyUnicode_Check(st.v.ptr())) raise_invalid(st.bad + ": " + st.name + " is a str", "ConfigError");
  const std::string s = st.v.cast<std::string>();
  if (s.size() >= cap || s.find('\0') != std::string::npos)
    raise_invalid(st.name + " is " + std::to_string(s.size()) + " characters; at most " + std::to_string(cap - 1),
                  "ConfigError");
  std::memset(p, 0, cap);
  std::memcpy(p, s.data(), s.size());
}

}  // namespace

Config::Config() {
  const ucm_result_t r = ucm_config_init(&c_);
  if (r != UCM_OK) raise_result(r, ucm_last_error(nullptr));
}

void Config::set(const std::string& name, py::handle v) {
  const Field* f = find(name);
  if (!f)
    raise_invalid("unknown configuration keyword '" + name + "' (the keywords are the fields of ucm_config_t: " +
                      known_fields() + ")",
                  "ConfigError");
  char* p = reinterpret_cast<char*>(&c_) + f->offset;
  const Setting st{name, v, name + "=" + std::string(py::repr(v))};
  switch (f->kind) {
    case Kind::kU32: store_as<uint32_t>(p, as_int(st, 0, UINT32_MAX)); break;
    case Kind::kI32: store_as<int32_t>(p, as_int(st, INT32_MIN, INT32_MAX)); break;
    case Kind::kSize: store_as<uint64_t>(p, as_size(st)); break;
    case Kind::kEnum: store_as<int32_t>(p, as_enum(st, *f)); break;
    case Kind::kDevice: store_as<int32_t>(p, as_device(st)); break;
    case Kind::kString: store_string(st, p, sizeof(c_.backend)); break;
  }
}

py::object Config::get(const std::string& name) const {
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

void Config::check() const {
  const ucm_result_t r = ucm_config_check(&c_);
  if (r != UCM_OK) raise_result(r, ucm_last_error(nullptr));
}

std::vector<std::string> Config::names() {
  std::vector<std::string> v;
  for (const Field& f : fields()) v.push_back(f.name);
  return v;
}

}  // namespace ucm_py
