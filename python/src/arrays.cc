// DLPack arrays in and out of qhead._C, without copies.
#include <cstring>
#include <string>
#include <vector>

#include "binding.h"
#include "dlpack_exchange.h"
#include "qhead/error.h"

namespace qhead::py {

namespace {

namespace dl = nb::dlpack;

[[noreturn]] void bad(const char* op, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, op, what);
}

std::string type_of(nb::handle obj) {
  return nb::type_name(obj.type()).c_str();
}

// DLPack dtype → qhead DType; throws naming the array for types qhead has no
// equivalent of (complex, float8 variants other than e4m3fn / e5m2, lanes > 1).
DType from_dl(dl::dtype t, const char* op, const char* name) {
  if (t.lanes == 1) {
    switch (static_cast<dl::dtype_code>(t.code)) {
      case dl::dtype_code::Float:
        if (t.bits == 32) return DType::kF32;
        if (t.bits == 16) return DType::kF16;
        if (t.bits == 64) return DType::kF64;
        break;
      case dl::dtype_code::Bfloat:
        if (t.bits == 16) return DType::kBF16;
        break;
      case dl::dtype_code::Int:
        if (t.bits == 32) return DType::kI32;
        if (t.bits == 64) return DType::kI64;
        if (t.bits == 16) return DType::kI16;
        if (t.bits == 8) return DType::kI8;
        break;
      case dl::dtype_code::UInt:
        if (t.bits == 8) return DType::kU8;
        if (t.bits == 16) return DType::kU16;
        if (t.bits == 32) return DType::kU32;
        if (t.bits == 64) return DType::kU64;
        break;
      case dl::dtype_code::Bool:
        if (t.bits == 8) return DType::kBool;
        break;
      case dl::dtype_code::Float8_E4M3FN:
        if (t.bits == 8) return DType::kF8E4M3;
        break;
      case dl::dtype_code::Float8_E5M2:
        if (t.bits == 8) return DType::kF8E5M2;
        break;
      default:
        break;
    }
  }
  bad(op, std::string(name) + " has DLPack dtype (code " + std::to_string(t.code) + ", " +
              std::to_string(t.bits) + " bits, " + std::to_string(t.lanes) +
              " lanes), which qhead does not take (f32/f16/bf16, integer and bool arrays)");
}

dl::dtype to_dl(DType t) {
  dl::dtype d;
  d.lanes = 1;
  d.bits = static_cast<uint8_t>(dtype_size(t) * 8);
  switch (t) {
    case DType::kF64: case DType::kF32: case DType::kF16:
      d.code = static_cast<uint8_t>(dl::dtype_code::Float); break;
    case DType::kBF16: d.code = static_cast<uint8_t>(dl::dtype_code::Bfloat); break;
    case DType::kI64: case DType::kI32: case DType::kI16: case DType::kI8:
      d.code = static_cast<uint8_t>(dl::dtype_code::Int); break;
    case DType::kU64: case DType::kU32: case DType::kU16: case DType::kU8:
      d.code = static_cast<uint8_t>(dl::dtype_code::UInt); break;
    case DType::kBool: d.code = static_cast<uint8_t>(dl::dtype_code::Bool); break;
    case DType::kF8E4M3: d.code = static_cast<uint8_t>(dl::dtype_code::Float8_E4M3FN); break;
    case DType::kF8E5M2: d.code = static_cast<uint8_t>(dl::dtype_code::Float8_E5M2); break;
  }
  return d;
}

template <class ND>
void fill_view(const ND& nd, const char* op, const char* name, TensorView& v) {
  const int dev = nd.device_type();
  if (dev == nb::device::cpu::value) {
    v.device = Device::kCPU;
  } else if (dev == nb::device::cuda::value) {
    v.device = Device::kCUDA;
  } else {
    const char* dn = dev == 3 ? "cuda_host" : dev == 13 ? "cuda_managed" : dev == 10 ? "rocm" : dev == 8 ? "metal"
                   : dev == 14 ? "oneapi" : dev == 7 ? "vulkan" : "another device";
    bad(op, std::string(name) + " is on DLPack device type " + std::to_string(dev) + " (" + dn +
                "); qhead takes CPU and CUDA arrays");
  }
  v.dtype = from_dl(nd.dtype(), op, name);
  v.data = const_cast<void*>(static_cast<const void*>(nd.data()));
  const size_t nd_dims = nd.ndim();
  v.shape.resize(nd_dims);
  bool dense = true;
  int64_t expect = 1;
  for (size_t i = nd_dims; i-- > 0;) {
    const int64_t n = static_cast<int64_t>(nd.shape(i));
    v.shape[i] = n;
    if (n != 1 && nd.stride(i) != expect) dense = false;
    expect *= n;
  }
  v.strides.clear();
  if (expect == 0) dense = true;  // no elements: any strides (numpy gives 0s) address nothing
  if (!dense) {  // passed through: the ops' contiguity checks report it
    v.strides.resize(nd_dims);
    for (size_t i = 0; i < nd_dims; ++i) v.strides[i] = nd.stride(i);
  }
}

// What the array's own DLPack export says is wrong (its exception's message), or "".
std::string dlpack_complaint(nb::handle obj) {
  try {
    obj.attr("__dlpack__")();
  } catch (nb::python_error& e) {
    return std::string(": ") + nb::type_name(e.type()).c_str() + ": " + nb::str(e.value()).c_str();
  }
  return "";
}

[[noreturn]] void not_an_array(nb::handle obj, const char* op, const char* name, bool writable) {
  if (obj.is_none()) bad(op, std::string(name) + " is None; expected an array (numpy, torch, anything with __dlpack__)");
  if (nb::hasattr(obj, "__dlpack__") || PyObject_CheckBuffer(obj.ptr())) {
    if (writable) {
      nb::detail::make_caster<nb::ndarray<nb::ro>> c;
      if (c.from_python(obj, 0, nullptr))
        bad(op, std::string(name) + " (" + type_of(obj) +
                    ") is read-only: qhead writes outputs in place and takes writable arrays only");
      PyErr_Clear();
    }
    bad(op, std::string(name) + " (" + type_of(obj) + ") could not be taken as an array through DLPack" +
                (nb::hasattr(obj, "__dlpack__") ? dlpack_complaint(obj) : std::string()));
  }
  bad(op, std::string(name) + " must be an array (numpy, torch, anything with __dlpack__), got " + type_of(obj));
}

// ---- the DLPack C exchange API, per type -----------------------------------------------------

struct TypeEntry {
  PyTypeObject* type;               // a strong reference (the cache outlives any instance)
  const dlx::ExchangeApi* api;      // nullptr: the type has none (numpy), use __dlpack__
  bool writable;                    // the type has no read-only arrays (torch): outputs may take the fast path
};
constexpr int kCacheSize = 16;
TypeEntry g_types[kCacheSize];
int g_ntypes = 0;

const dlx::ExchangeApi* lookup_api(PyTypeObject* tp, bool* writable) {
  static PyObject* attr = PyUnicode_InternFromString("__dlpack_c_exchange_api__");
  *writable = false;
  PyObject* cap = _PyType_Lookup(tp, attr);  // borrowed; never raises
  if (!cap || !PyCapsule_CheckExact(cap)) return nullptr;
  auto* api = static_cast<const dlx::ExchangeApi*>(PyCapsule_GetPointer(cap, "dlpack_exchange_api"));
  if (!api) {
    PyErr_Clear();
    return nullptr;
  }
  if (api->header.version.major != 1 || !api->managed_tensor_from_py_object_no_sync) return nullptr;
  // torch has no read-only tensors, so its non-owning export (which has no
  // read-only flag) is safe for outputs; other producers' arrays may be read-only.
  nb::object mod = nb::handle(reinterpret_cast<PyObject*>(tp)).attr("__module__");
  const char* m = PyUnicode_Check(mod.ptr()) ? PyUnicode_AsUTF8(mod.ptr()) : nullptr;
  if (!m) PyErr_Clear();
  *writable = m && (std::strncmp(m, "torch", 5) == 0 && (m[5] == '\0' || m[5] == '.'));
  return api;
}

// The exchange API of obj's type (cached per type), or nullptr.
const dlx::ExchangeApi* exchange_api(nb::handle obj, bool* writable) {
  PyTypeObject* tp = Py_TYPE(obj.ptr());
  for (int i = 0; i < g_ntypes; ++i)
    if (g_types[i].type == tp) {
      *writable = g_types[i].writable;
      return g_types[i].api;
    }
  const dlx::ExchangeApi* api = nullptr;
  try {
    api = lookup_api(tp, writable);
  } catch (const nb::python_error&) {
    api = nullptr;
    *writable = false;
  }
  if (g_ntypes < kCacheSize) {
    Py_INCREF(reinterpret_cast<PyObject*>(tp));
    g_types[g_ntypes++] = TypeEntry{tp, api, *writable};
  }
  return api;
}

// TensorView from a producer's DLTensor (non-owning export).
void fill_view_dl(const nb::dlpack::dltensor& t, const char* op, const char* name, TensorView& v) {
  struct Src {
    const nb::dlpack::dltensor& t;
    int device_type() const { return t.device.device_type; }
    dl::dtype dtype() const { return t.dtype; }
    const void* data() const { return static_cast<const char*>(t.data) + t.byte_offset; }
    size_t ndim() const { return static_cast<size_t>(t.ndim); }
    size_t shape(size_t i) const { return static_cast<size_t>(t.shape[i]); }
    int64_t stride(size_t i) const {
      if (t.strides) return t.strides[i];
      int64_t s = 1;  // NULL strides: compact row-major
      for (size_t j = i + 1; j < ndim(); ++j) s *= t.shape[j];
      return s;
    }
  };
  fill_view(Src{t}, op, name, v);
}

// What a Table keeps of a Python array: the object and its export (an owning
// DLPack export through the exchange API, or nanobind's import of __dlpack__).
struct Kept {
  nb::object obj;
  nb::ndarray<nb::ro> nd;
  dlx::ManagedVersioned* managed = nullptr;
  ~Kept() {
    if (managed && managed->deleter) managed->deleter(managed);
  }
};

bool interpreter_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

}  // namespace

void import_array(nb::handle obj, const char* op, const char* name, bool writable, ArrayArg& arg) {
  arg.api = nullptr;
  bool api_writable = false;
  const dlx::ExchangeApi* api = exchange_api(obj, &api_writable);
  if (api && api->dltensor_from_py_object_no_sync && (!writable || api_writable)) {
    nb::dlpack::dltensor t;
    if (api->dltensor_from_py_object_no_sync(obj.ptr(), &t) == 0) {
      fill_view_dl(t, op, name, arg.view);
      arg.api = api;
      arg.device_id = t.device.device_id;
      return;
    }
    PyErr_Clear();  // the __dlpack__ path below reports what is wrong
  }
  // No conversion flag: an array is taken as it is or not at all (never copied).
  if (writable) {
    nb::detail::make_caster<nb::ndarray<>> c;
    if (!c.from_python(obj, 0, nullptr)) {
      PyErr_Clear();
      not_an_array(obj, op, name, true);
    }
    arg.out.emplace(std::move(c.value));
    fill_view(*arg.out, op, name, arg.view);
    arg.device_id = arg.out->device_id();
  } else {
    nb::detail::make_caster<nb::ndarray<nb::ro>> c;
    if (!c.from_python(obj, 0, nullptr)) {
      PyErr_Clear();
      not_an_array(obj, op, name, false);
    }
    arg.in.emplace(std::move(c.value));
    fill_view(*arg.in, op, name, arg.view);
    arg.device_id = arg.in->device_id();
  }
  if (api) arg.api = api;
}

void* current_stream_of(const ArrayArg& a) {
  if (!a.api || !a.api->current_work_stream || a.view.device != Device::kCUDA) return nullptr;
  void* s = nullptr;
  if (a.api->current_work_stream(nb::device::cuda::value, a.device_id, &s) != 0) {
    PyErr_Clear();
    return nullptr;
  }
  return s;
}

Tensor keep_array(nb::handle obj, const char* op, const char* name) {
  auto k = std::make_unique<Kept>();
  k->obj = nb::borrow<nb::object>(obj);
  TensorView view;
  bool api_writable = false;
  const dlx::ExchangeApi* api = exchange_api(obj, &api_writable);
  dlx::ManagedVersioned* mt = nullptr;
  if (api && api->managed_tensor_from_py_object_no_sync(obj.ptr(), &mt) == 0 && mt) {
    k->managed = mt;
    fill_view_dl(mt->dl_tensor, op, name, view);
  } else {
    if (api) PyErr_Clear();
    ArrayArg a;
    import_array(obj, op, name, false, a);
    k->nd = std::move(*a.in);
    view = a.view;
  }
  // The last reference may be dropped on a thread without the GIL (an op
  // running with the GIL released); at interpreter shutdown nothing is
  // released (the process is ending and the GIL cannot be taken).
  std::shared_ptr<const void> owner(k.release(), [](const Kept* p) {
    if (!interpreter_alive()) return;
    nb::gil_scoped_acquire gil;
    delete p;
  });
  return Tensor::borrow(std::move(owner), view);
}

nb::object export_tensor(const Tensor& t, bool read_only) {
  if (!t.defined()) return nb::none();
  const TensorView& v = t.view();
  // The capsule owns a Tensor sharing the storage: the array keeps it alive.
  nb::capsule owner(new Tensor(t), [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(v.shape.begin(), v.shape.end());
  const int64_t* strides = v.strides.empty() ? nullptr : v.strides.data();
  const int dev = v.device == Device::kCUDA ? nb::device::cuda::value : nb::device::cpu::value;
  const dl::dtype dt = to_dl(v.dtype);
  const bool numpy_has = v.dtype != DType::kBF16 && v.dtype != DType::kF8E4M3 && v.dtype != DType::kF8E5M2;
  if (v.device == Device::kCPU && numpy_has) {
    if (read_only)
      return nb::ndarray<nb::numpy, nb::ro>(v.data, shape.size(), shape.data(), owner, strides, dt, dev).cast();
    return nb::ndarray<nb::numpy>(v.data, shape.size(), shape.data(), owner, strides, dt, dev).cast();
  }
  if (read_only)
    return nb::ndarray<nb::ro>(v.data, shape.size(), shape.data(), owner, strides, dt, dev).cast();
  return nb::ndarray<>(v.data, shape.size(), shape.data(), owner, strides, dt, dev).cast();
}

}  // namespace qhead::py
