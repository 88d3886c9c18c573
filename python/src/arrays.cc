// DLPack arrays in and out of qhead._C, without copies.
#include <cstring>
#include <string>
#include <vector>

#include "binding.h"
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
    bad(op, std::string(name) + " is on DLPack device type " + std::to_string(dev) +
                "; qhead takes CPU and CUDA arrays");
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
  if (!dense) {  // passed through: the ops' contiguity checks report it
    v.strides.resize(nd_dims);
    for (size_t i = 0; i < nd_dims; ++i) v.strides[i] = nd.stride(i);
  }
}

[[noreturn]] void not_an_array(nb::handle obj, const char* op, const char* name, bool writable) {
  if (obj.is_none()) bad(op, std::string(name) + " is None; expected an array (numpy, torch, anything with __dlpack__)");
  if (nb::hasattr(obj, "__dlpack__") || PyObject_CheckBuffer(obj.ptr())) {
    if (writable)
      bad(op, std::string(name) + " (" + type_of(obj) +
                  ") cannot be written: qhead writes outputs in place and takes writable arrays only");
    bad(op, std::string(name) + " (" + type_of(obj) + ") could not be taken as an array through DLPack");
  }
  bad(op, std::string(name) + " must be an array (numpy, torch, anything with __dlpack__), got " + type_of(obj));
}

// What a Table keeps of a Python array: the object and its DLPack export.
struct Kept {
  nb::object obj;
  nb::ndarray<nb::ro> nd;
};

bool interpreter_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// torch tensors: torch's __dlpack__ is Python code (argument checks, stream
// handling) costing ~5 us a call, most of the per-call overhead of an op.
// For plain torch.Tensor / nn.Parameter objects the C function behind it,
// torch._C._to_dlpack (~0.6 us), gives the same DLPack capsule. The op runs
// on the stream the caller names (torch's current stream in the wrappers),
// so __dlpack__'s stream synchronization is not needed. The types are looked
// up the first time an object of a type named "Tensor" is seen (torch is
// then imported already), never by importing torch.
struct TorchFast {
  PyTypeObject* tensor = nullptr;
  PyTypeObject* parameter = nullptr;
  nb::object to_dlpack;
  bool looked = false;
};

TorchFast& torch_fast() {
  static TorchFast* t = new TorchFast();  // never destroyed: no Python calls at exit
  return *t;
}

// A DLPack capsule for a plain torch tensor, or an invalid object.
nb::object torch_capsule(nb::handle obj) {
  TorchFast& t = torch_fast();
  PyTypeObject* tp = Py_TYPE(obj.ptr());
  if (!t.looked) {
    if (std::strcmp(tp->tp_name, "Tensor") != 0 && std::strcmp(tp->tp_name, "Parameter") != 0) return {};
    t.looked = true;
    try {
      nb::module_ torch = nb::module_::import_("torch");
      t.tensor = reinterpret_cast<PyTypeObject*>(nb::handle(torch.attr("Tensor")).inc_ref().ptr());
      t.parameter = reinterpret_cast<PyTypeObject*>(nb::handle(torch.attr("nn").attr("Parameter")).inc_ref().ptr());
      t.to_dlpack = torch.attr("_C").attr("_to_dlpack");
    } catch (const nb::python_error&) {
      t.tensor = t.parameter = nullptr;
      return {};
    }
  }
  if (tp != t.tensor && tp != t.parameter) return {};
  PyObject* cap = PyObject_CallOneArg(t.to_dlpack.ptr(), obj.ptr());
  if (!cap) {
    PyErr_Clear();  // the generic path reports what is wrong
    return {};
  }
  return nb::steal(cap);
}

}  // namespace

void import_array(nb::handle obj, const char* op, const char* name, bool writable, ArrayArg& arg) {
  // No conversion flag: an array is taken as it is or not at all (never copied).
  const nb::object cap = torch_capsule(obj);
  const nb::handle src = cap.is_valid() ? nb::handle(cap) : obj;
  if (writable) {
    nb::detail::make_caster<nb::ndarray<>> c;
    if (!c.from_python(src, 0, nullptr)) {
      PyErr_Clear();
      not_an_array(obj, op, name, true);
    }
    arg.out = std::move(c.value);
    fill_view(arg.out, op, name, arg.view);
  } else {
    nb::detail::make_caster<nb::ndarray<nb::ro>> c;
    if (!c.from_python(src, 0, nullptr)) {
      PyErr_Clear();
      not_an_array(obj, op, name, false);
    }
    arg.in = std::move(c.value);
    fill_view(arg.in, op, name, arg.view);
  }
}

Tensor keep_array(nb::handle obj, const char* op, const char* name) {
  ArrayArg a;
  import_array(obj, op, name, false, a);
  auto* k = new Kept{nb::borrow<nb::object>(obj), std::move(a.in)};
  // The last reference may be dropped on a thread without the GIL (an op
  // running with the GIL released); at interpreter shutdown nothing is
  // released (the process is ending and the GIL cannot be taken).
  std::shared_ptr<const void> owner(k, [](const Kept* p) {
    if (!interpreter_alive()) return;
    nb::gil_scoped_acquire gil;
    delete p;
  });
  return Tensor::borrow(std::move(owner), a.view);
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
