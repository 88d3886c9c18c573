// qhead.Scheme, qhead.Table, qhead.TokenTables and the quantizer.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <tuple>

#include "binding.h"
#include "qhead/cuda.h"
#include "qhead/error.h"
#include "qhead/quantize.h"

namespace qhead::py {

namespace {

[[noreturn]] void bad(const char* op, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, op, what);
}

QuantScheme make_scheme(const std::string& name, const std::string& scale_dtype) {
  return QuantScheme::parse(name, parse_float_dtype(scale_dtype, "Scheme", "scale_dtype"));
}

// A Scheme or a scheme name (its scale dtype then `scale_dtype`).
QuantScheme scheme_arg(nb::handle s, DType scale_dtype, const char* op) {
  if (nb::isinstance<QuantScheme>(s)) return nb::cast<QuantScheme>(s);
  if (nb::isinstance<nb::str>(s)) return QuantScheme::parse(nb::cast<std::string>(s), scale_dtype);
  bad(op, "scheme must be a qhead.Scheme or a scheme name such as \"w4g64\", got " +
              std::string(nb::type_name(s.type()).c_str()));
}

std::optional<QuantScheme> opt_scheme_arg(nb::handle s, DType scale_dtype, const char* op) {
  if (s.is_none()) return std::nullopt;
  return scheme_arg(s, scale_dtype, op);
}

PyTable from_table(Table t, bool read_only) {
  PyTable p;
  p.table = std::move(t);
  p.read_only = read_only;
  return p;
}

// A Table given as a qhead.Table or as a dense [V, H] array.
Table table_arg(nb::handle obj, const char* op, const char* name) {
  if (nb::isinstance<PyTable>(obj)) return nb::cast<const PyTable&>(obj).table;
  return Table::dense(keep_array(obj, op, name));
}

// The table's storage tensor, as the object it was built from when there is one.
nb::object storage(const PyTable& t, const nb::object& src, const Tensor& tensor) {
  if (src.is_valid()) return src;
  return export_tensor(tensor, t.read_only);
}

PyTable to_host(const PyTable& t) {
  if (t.table.device() == Device::kCPU) return t;
  nb::gil_scoped_release nogil;
  if (!t.table.is_packed()) return from_table(Table::dense(cuda::to_host(t.table.dense().view())), false);
  const PackedTable& d = t.table.packed();
  PackedTable h;
  h.scheme = d.scheme;
  h.vocab = d.vocab;
  h.hidden = d.hidden;
  h.packed = cuda::to_host(d.packed.view());
  h.scale = cuda::to_host(d.scale.view());
  if (d.zero_point.defined()) h.zero_point = cuda::to_host(d.zero_point.view());
  if (d.col_perm.defined()) h.col_perm = cuda::to_host(d.col_perm.view());
  return from_table(Table::packed(std::move(h), "Table.to_device(\"cpu\")"), false);
}

PyTable to_device(const PyTable& t, const std::string& device) {
  if (device == "cpu") return to_host(t);
  if (device != "cuda" && device.rfind("cuda:", 0) != 0)
    bad("Table.to_device", "device must be \"cuda\" or \"cpu\", got \"" + device + "\"");
  if (t.table.device() == Device::kCUDA) return t;
#ifdef QHEAD_HAS_CUDA
  if (!cuda::available())
    throw Error(ErrorCode::kUnsupported, "Table.to_device", "no CUDA device is visible (cuda_available() is False)");
#endif
  nb::gil_scoped_release nogil;
  return from_table(cuda::to_device(t.table), false);
}

}  // namespace

DType parse_float_dtype(const std::string& s, const char* op, const char* name) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "f32" || l == "float32" || l == "float") return DType::kF32;
  if (l == "f16" || l == "float16" || l == "half") return DType::kF16;
  if (l == "bf16" || l == "bfloat16") return DType::kBF16;
  bad(op, std::string(name) + " must be \"f32\", \"f16\" or \"bf16\", got \"" + s + "\"");
}

const char* short_dtype_name(DType t) {
  switch (t) {
    case DType::kF64: return "f64";
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kI64: return "i64";
    case DType::kI32: return "i32";
    case DType::kI16: return "i16";
    case DType::kI8: return "i8";
    case DType::kU64: return "u64";
    case DType::kU32: return "u32";
    case DType::kU16: return "u16";
    case DType::kU8: return "u8";
    case DType::kBool: return "bool";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kF8E5M2: return "f8e5m2";
  }
  return "?";
}

PyTokenTables wrap_tables(const TokenTables& t, bool read_only) {
  PyTokenTables out;
  out.embedding = from_table(t.embedding, read_only);
  out.head = from_table(t.head, read_only);
  return out;
}

void register_tables(nb::module_& m) {
  nb::class_<QuantScheme>(m, "Scheme",
                          "How a table is quantized: bits (2..8), group_size along H (-1: one scale per row), "
                          "symmetric or with zero points, and the dtype of the scales.")
      .def("__init__",
           [](QuantScheme* self, const std::string& name, const std::string& scale_dtype) {
             new (self) QuantScheme(make_scheme(name, scale_dtype));
           },
           nb::arg("name"), nb::arg("scale_dtype") = "f16",
           "Parses a scheme name: \"w4g64\" (4-bit, group 64, symmetric), \"w8\" (8-bit, per row), "
           "\"w4g128a\" (asymmetric). scale_dtype: \"f16\", \"bf16\" or \"f32\".")
      .def_ro("bits", &QuantScheme::bits, "Bits per code (2..8).")
      .def_ro("group_size", &QuantScheme::group_size, "Elements per group along H; -1: one group per row.")
      .def_ro("symmetric", &QuantScheme::symmetric, "False: a zero point per group.")
      .def_prop_ro("scale_dtype", [](const QuantScheme& s) { return short_dtype_name(s.scale_dtype); },
                   "Dtype of the scales: \"f16\", \"bf16\" or \"f32\".")
      .def_prop_ro("name", &QuantScheme::name, "The scheme's name (\"w4g64\"); the scale dtype is not part of it.")
      .def("__eq__", [](const QuantScheme& a, const QuantScheme& b) { return a == b; },
           "Same bits, group size, symmetry and scale dtype.")
      .def("__hash__", [](const QuantScheme& s) {
        return nb::hash(nb::make_tuple(s.bits, s.group_size, s.symmetric, static_cast<int>(s.scale_dtype)));
      })
      .def("__repr__", [](const QuantScheme& s) {
        return "qhead.Scheme(\"" + s.name() + "\", scale_dtype=\"" + short_dtype_name(s.scale_dtype) + "\")";
      });

  nb::class_<PyTable>(m, "Table",
                      "A [V, H] token table on the CPU or a CUDA device: dense (f32/f16/bf16) or packed in the "
                      "compressed-tensors pack-quantized layout. Arrays it was built from are used in place and "
                      "kept alive as long as the table.")
      .def_static(
          "dense",
          [](nb::handle weight) {
            PyTable t = from_table(Table::dense(keep_array(weight, "Table.dense", "weight")), false);
            t.src_dense = nb::borrow(weight);
            return t;
          },
          nb::arg("weight").none(),
          nb::sig("def dense(weight: object) -> Table"),
          "A dense table over weight: f32/f16/bf16 [V, H], contiguous, on the CPU or a CUDA device. "
          "Zero copy: the table reads weight's memory and keeps weight alive.")
      .def_static(
          "packed",
          [](nb::handle weight_packed, nb::handle weight_scale, nb::handle weight_zero_point, nb::handle scheme,
             std::tuple<int64_t, int64_t> shape, nb::handle col_perm) {
            const char* op = "Table.packed";
            PyTable t;
            PackedTable p;
            p.packed = keep_array(weight_packed, op, "weight_packed");
            p.scale = keep_array(weight_scale, op, "weight_scale");
            const DType sd = is_float_dtype(p.scale.dtype()) ? p.scale.dtype() : DType::kF16;
            p.scheme = scheme_arg(scheme, sd, op);
            p.vocab = std::get<0>(shape);
            p.hidden = std::get<1>(shape);
            if (!weight_zero_point.is_none()) p.zero_point = keep_array(weight_zero_point, op, "weight_zero_point");
            if (!col_perm.is_none()) p.col_perm = keep_array(col_perm, op, "col_perm");
            // The pack-quantized readers index rows directly: every tensor must be dense row-major.
            check_contiguous(p.packed.view(), op, "weight_packed");
            check_contiguous(p.scale.view(), op, "weight_scale");
            if (p.zero_point.defined()) check_contiguous(p.zero_point.view(), op, "weight_zero_point");
            if (p.col_perm.defined()) check_contiguous(p.col_perm.view(), op, "col_perm");
            if (!p.scheme.symmetric && !p.zero_point.defined())
              bad(op, "scheme " + p.scheme.name() + " is asymmetric: weight_zero_point is required");
            // The arrays are the caller's arguments: what validation finds wrong with
            // them is an invalid argument (the same checks name a file's tensors
            // kInvalidFile when a loader runs them).
            try {
              nb::gil_scoped_release nogil;  // validation reads every scale
              t.table = Table::packed(std::move(p), op);
            } catch (const Error& e) {
              if (e.code() != ErrorCode::kInvalidFile) throw;
              std::string msg = e.what();
              const std::string prefix = std::string(op) + ": ";
              if (msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
              throw Error(ErrorCode::kInvalidArgument, op, msg);
            }
            t.src_packed = nb::borrow(weight_packed);
            t.src_scale = nb::borrow(weight_scale);
            if (!weight_zero_point.is_none()) t.src_zero_point = nb::borrow(weight_zero_point);
            if (!col_perm.is_none()) t.src_col_perm = nb::borrow(col_perm);
            return t;
          },
          nb::arg("weight_packed").none(), nb::arg("weight_scale").none(), nb::arg("weight_zero_point").none() = nb::none(),
          nb::kw_only(), nb::arg("scheme"), nb::arg("shape"), nb::arg("col_perm").none() = nb::none(),
          nb::sig("def packed(weight_packed: object, weight_scale: object, weight_zero_point: object | None = None, "
                  "*, scheme: Scheme | str, shape: tuple[int, int], col_perm: object | None = None) -> Table"),
          "A packed table over compressed-tensors tensors, used in place (zero copy; kept alive by the table), "
          "all on one device:\n"
          "  weight_packed      int32 [V, ceil(H*bits/32)]   codes + 2^(bits-1), little-endian along H\n"
          "  weight_scale       f16/bf16/f32 [V, G]          G = H / group_size (1 per row)\n"
          "  weight_zero_point  int32 [ceil(V*bits/32), G]   asymmetric schemes only (packed along V)\n"
          "  col_perm           int32 [H]                    stored column j holds hidden index col_perm[j]\n"
          "scheme: a Scheme, or a name whose scale dtype is taken from weight_scale; shape: (V, H). "
          "Shapes, dtypes and (on the CPU) every scale are validated.")
      .def_prop_ro("vocab", [](const PyTable& t) { return t.table.vocab(); }, "V, the number of rows.")
      .def_prop_ro("hidden", [](const PyTable& t) { return t.table.hidden(); }, "H, the row length.")
      .def_prop_ro("shape", [](const PyTable& t) { return std::make_tuple(t.table.vocab(), t.table.hidden()); },
                   "(V, H).")
      .def_prop_ro("is_packed", [](const PyTable& t) { return t.table.is_packed(); },
                   "True for a packed (quantized) table, False for a dense one.")
      .def_prop_ro("device", [](const PyTable& t) { return t.table.device() == Device::kCUDA ? "cuda" : "cpu"; },
                   "\"cpu\" or \"cuda\".")
      .def_prop_ro("nbytes", [](const PyTable& t) { return t.table.nbytes(); }, "Bytes of storage, all tensors.")
      .def_prop_ro("scheme",
                   [](const PyTable& t) -> std::optional<QuantScheme> {
                     if (!t.table.is_packed()) return std::nullopt;
                     return t.table.packed().scheme;
                   },
                   "The Scheme of a packed table; None for a dense one.")
      .def_prop_ro("weight_packed",
                   [](const PyTable& t) {
                     return t.table.is_packed() ? storage(t, t.src_packed, t.table.packed().packed) : nb::none();
                   },
                   nb::sig("def weight_packed(self) -> object | None"),
                   "int32 [V, ceil(H*bits/32)] packed codes (zero-copy view; None for a dense table). CPU: a numpy "
                   "array; CUDA: a DLPack-capable array; the object given to Table.packed when built from one.")
      .def_prop_ro("weight_scale",
                   [](const PyTable& t) {
                     return t.table.is_packed() ? storage(t, t.src_scale, t.table.packed().scale) : nb::none();
                   },
                   nb::sig("def weight_scale(self) -> object | None"),
                   "[V, G] scales (zero-copy view; bf16 scales come as a DLPack-capable array); None when dense.")
      .def_prop_ro("weight_zero_point",
                   [](const PyTable& t) {
                     return t.table.is_packed() ? storage(t, t.src_zero_point, t.table.packed().zero_point)
                                                : nb::none();
                   },
                   nb::sig("def weight_zero_point(self) -> object | None"),
                   "int32 [ceil(V*bits/32), G] zero points (zero-copy view); None when symmetric or dense.")
      .def_prop_ro("col_perm",
                   [](const PyTable& t) {
                     return t.table.is_packed() ? storage(t, t.src_col_perm, t.table.packed().col_perm) : nb::none();
                   },
                   nb::sig("def col_perm(self) -> object | None"),
                   "int32 [H] stored column order (zero-copy view); None when the columns are in hidden order.")
      .def_prop_ro("dense_weight",
                   [](const PyTable& t) {
                     return t.table.is_packed() ? nb::none() : storage(t, t.src_dense, t.table.dense());
                   },
                   nb::sig("def dense_weight(self) -> object | None"),
                   "The [V, H] f32/f16/bf16 weight of a dense table (zero-copy view); None when packed.")
      .def("to_device", &to_device, nb::arg("device") = "cuda",
           "The table on \"cuda\" (one device allocation holding every tensor) or \"cpu\" (host copies); "
           "a table over the same storage when it is there already.")
      .def(
          "dequantize",
          [](const PyTable& t) {
            if (t.table.device() != Device::kCPU)
              bad("Table.dequantize", "the table is on CUDA; call to_device(\"cpu\") first");
            Tensor d;
            {
              nb::gil_scoped_release nogil;
              d = t.table.to_dense_f32();
            }
            return export_tensor(d, false);
          },
          nb::sig("def dequantize(self) -> numpy.ndarray"),
          "The whole table as a new numpy f32 [V, H] array (CPU tables): w = (q - z) * s per group, columns in "
          "hidden order.")
      .def("same_storage", [](const PyTable& a, const PyTable& b) { return a.table.same_storage(b.table); },
           nb::arg("other"), "True when both are the same storage (a tied pair holds one copy).")
      .def("__repr__", [](const PyTable& t) {
        std::string s = "qhead.Table(shape=(" + std::to_string(t.table.vocab()) + ", " +
                        std::to_string(t.table.hidden()) + "), ";
        if (t.table.is_packed()) {
          const QuantScheme& q = t.table.packed().scheme;
          s += "scheme=\"" + q.name() + "\", scale_dtype=\"" + short_dtype_name(q.scale_dtype) + "\"";
        } else {
          s += std::string("dense ") + short_dtype_name(t.table.dense().dtype());
        }
        return s + ", device=\"" + (t.table.device() == Device::kCUDA ? "cuda" : "cpu") + "\")";
      });
  nb::class_<PyTokenTables>(m, "TokenTables",
                            "The two roles of a model's token table. Tied: embedding and head are one table "
                            "(one copy of the storage).")
      .def_ro("embedding", &PyTokenTables::embedding, "The input embedding's Table.")
      .def_ro("head", &PyTokenTables::head, "The output head's (lm_head) Table.")
      .def_prop_ro("tied", &PyTokenTables::tied, "True when embedding and head share one storage.")
      .def("__repr__", [](const PyTokenTables& t) {
        return std::string("qhead.TokenTables(tied=") + (t.tied() ? "True" : "False") + ")";
      });

  m.def(
      "quantize",
      [](nb::handle weight, nb::handle scheme, const std::string& scale_dtype, int threads,
         const std::string& quantizer, nb::handle calibration, double damp, int block, bool refit_scales, int passes) {
        const char* op = "quantize";
        const DType sd = parse_float_dtype(scale_dtype, op, "scale_dtype");
        const QuantScheme s = scheme_arg(scheme, sd, op);
        QuantizeOptions o;
        o.quantizer = parse_quantizer(quantizer);
        o.threads = threads;
        o.name = "weight";
        o.damp = damp;
        o.block = block;
        o.refit_scales = refit_scales;
        o.passes = passes;
        ArrayArg w, c;
        import_array(weight, op, "weight", false, w);
        if (!calibration.is_none()) {
          import_array(calibration, op, "calibration", false, c);
          o.calibration = c.view;
        }
        PackedTable p;
        {
          nb::gil_scoped_release nogil;
          p = qhead::quantize(w.view, s, o);
        }
        return from_table(Table::packed(std::move(p), op), false);
      },
      nb::arg("weight").none(), nb::arg("scheme") = "w4g64", nb::kw_only(), nb::arg("scale_dtype") = "f16",
      nb::arg("threads") = 0, nb::arg("quantizer") = "rtn", nb::arg("calibration").none() = nb::none(),
      nb::arg("damp") = 0.1, nb::arg("block") = 128, nb::arg("refit_scales") = true, nb::arg("passes") = 1,
      nb::sig("def quantize(weight: object, scheme: Scheme | str = 'w4g64', *, scale_dtype: str = 'f16', "
              "threads: int = 0, quantizer: str = 'rtn', calibration: object | None = None, damp: float = 0.1, "
              "block: int = 128, refit_scales: bool = True, passes: int = 1) -> Table"),
      "Quantizes a dense CPU weight f32/f16/bf16 [V, H] into a new packed Table (the compressed-tensors "
      "pack-quantized layout whatever the quantizer). scheme: a Scheme or a name (then scale_dtype applies); "
      "threads <= 0: default. quantizer: 'rtn' (round to nearest, compressed-tensors arithmetic), 'mse' (per-group "
      "scale/clip search minimising the weight error; with calibration, weighted by the activations' per-column "
      "mean square), 'gptq' (GPTQ against calibration's XᵀX), 'gptq-mse' (GPTQ with the searched scales). "
      "calibration: the head's inputs [N, H] (CPU, f32/f16/bf16), required by the GPTQ quantizers. damp: GPTQ's "
      "damping (fraction of mean diag XᵀX/N); block: GPTQ's columns per lazy-update block; refit_scales: GPTQ "
      "(symmetric schemes) refits each row's group scales by least squares on its objective after the codes; passes: GPTQ passes with the refit scales held fixed (each row keeps its best).");

  m.def(
      "quantize_roles",
      [](nb::handle embedding, nb::handle head, nb::handle embedding_scheme, nb::handle head_scheme,
         const std::string& scale_dtype, int threads) {
        const char* op = "quantize_roles";
        const DType sd = parse_float_dtype(scale_dtype, op, "scale_dtype");
        const Table e = table_arg(embedding, op, "embedding");
        std::optional<Table> h;
        if (!head.is_none()) h = table_arg(head, op, "head");
        const auto es = opt_scheme_arg(embedding_scheme, sd, op);
        const auto hs = opt_scheme_arg(head_scheme, sd, op);
        TokenTables t;
        {
          nb::gil_scoped_release nogil;
          t = quantize_roles(e, h ? &*h : nullptr, es, hs, threads);
        }
        return wrap_tables(t, false);
      },
      nb::arg("embedding").none(), nb::arg("head").none() = nb::none(), nb::kw_only(), nb::arg("embedding_scheme").none() = nb::none(),
      nb::arg("head_scheme").none() = nb::none(), nb::arg("scale_dtype") = "f16", nb::arg("threads") = 0,
      nb::sig("def quantize_roles(embedding: Table | object, head: Table | object | None = None, *, "
              "embedding_scheme: Scheme | str | None = None, head_scheme: Scheme | str | None = None, "
              "scale_dtype: str = 'f16', threads: int = 0) -> TokenTables"),
      "Quantizes a model's two roles (Tables or dense [V, H] CPU arrays). head None: tied, one table with one "
      "scheme (embedding_scheme, else head_scheme) serving both roles. A role whose scheme is None stays as given.");
}

}  // namespace qhead::py
