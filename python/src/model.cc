// Files and model directories: load_packed, inspect_model, load_model_tables,
// GgufFile, load_gguf_tables.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "binding.h"
#include "qhead/error.h"
#include "qhead/gguf.h"
#include "qhead/model.h"
#include "qhead/safetensors.h"

namespace qhead::py {

namespace {

const char* format_name(ModelInfo::Format f) {
  switch (f) {
    case ModelInfo::Format::kDense: return "dense";
    case ModelInfo::Format::kPackQuantized: return "pack-quantized";
    case ModelInfo::Format::kGptq: return "gptq";
  }
  return "dense";
}

std::optional<QuantScheme> opt_scheme(nb::handle s, const char* op) {
  if (s.is_none()) return std::nullopt;
  if (nb::isinstance<QuantScheme>(s)) return nb::cast<QuantScheme>(s);
  if (nb::isinstance<nb::str>(s)) return QuantScheme::parse(nb::cast<std::string>(s));
  throw Error(ErrorCode::kInvalidArgument, op,
              "scheme must be a qhead.Scheme, a scheme name or None, got " +
                  std::string(nb::type_name(s.type()).c_str()));
}

ModelOverrides overrides(const std::optional<std::string>& e, const std::optional<std::string>& h) {
  ModelOverrides o;
  if (e) o.embedding_tensor = *e;
  if (h) o.head_tensor = *h;
  return o;
}

nb::object py_str(std::string_view s) {
  return nb::steal(PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "replace"));
}

// A GGUF metadata value as a Python value: int, float, bool, str, or a list.
nb::object to_python(const GgufValue& v) {
  switch (v.type) {
    case GgufValueType::kBool: return nb::bool_(v.u != 0);
    case GgufValueType::kF32:
    case GgufValueType::kF64: return nb::float_(v.f);
    case GgufValueType::kString: return py_str(v.str);
    case GgufValueType::kArray: {
      nb::list out;
      if (v.elem_type == GgufValueType::kString) {
        for (const auto& s : v.strings) out.append(py_str(s));
      } else if (v.elem_type == GgufValueType::kArray) {
        for (const auto& it : v.items) out.append(to_python(it));
      } else {
        for (uint64_t i = 0; i < v.count; ++i) out.append(to_python(v.at(i)));
      }
      return out;
    }
    default:  // integers
      if (v.fits_i64) return nb::int_(v.i);
      return nb::steal(PyLong_FromUnsignedLongLong(v.u));
  }
}

}  // namespace

void register_model(nb::module_& m) {
  m.def(
      "load_packed",
      [](const std::string& path, const std::string& prefix, nb::handle scheme) {
        auto s = opt_scheme(scheme, "load_packed");
        const bool by_name = nb::isinstance<nb::str>(scheme);
        Table t;
        {
          nb::gil_scoped_release nogil;
          const SafetensorsFile f = SafetensorsFile::open(path);
          // A scheme given by name takes its scale dtype from the file's scales.
          const std::string scale = prefix + ".weight_scale";
          if (s && by_name && f.contains(scale) && is_float_dtype(f.get(scale).dtype()))
            s->scale_dtype = f.get(scale).dtype();
          t = load_packed(f, prefix, s);
        }
        PyTable p;
        p.table = std::move(t);
        p.read_only = true;
        return p;
      },
      nb::arg("path"), nb::arg("prefix"), nb::arg("scheme").none() = nb::none(),
      nb::sig("def load_packed(path: str, prefix: str, scheme: Scheme | str | None = None) -> Table"),
      "The packed table `<prefix>.weight_packed`, `_scale`, [`_zero_point`] of a safetensors file, used in "
      "place (mmap, zero copy; the arrays the table exposes are read-only). scheme (a Scheme, or a name whose "
      "scale dtype is the file's) overrides what the tensors' shapes and the file's metadata say.");

  nb::class_<ModelInfo::Role>(m, "Role", "How one role (embedding or head) of a model is stored.")
      .def_ro("tensor", &ModelInfo::Role::tensor, "Weight name, e.g. \"lm_head.weight\".")
      .def_ro("file", &ModelInfo::Role::file, "The safetensors file holding it.")
      .def_ro("stored", &ModelInfo::Role::stored, "False: a tied head that is not stored.")
      .def_ro("packed", &ModelInfo::Role::packed, "Quantized.")
      .def_prop_ro("format", [](const ModelInfo::Role& r) { return format_name(r.format); },
                   "\"dense\", \"pack-quantized\" or \"gptq\".")
      .def_ro("scheme", &ModelInfo::Role::scheme, "The Scheme when packed, else None.")
      .def_prop_ro("dtype", [](const ModelInfo::Role& r) { return short_dtype_name(r.dtype); },
                   "Dense dtype, or the scale dtype when packed (\"f32\", \"f16\", \"bf16\").")
      .def_ro("bytes", &ModelInfo::Role::bytes, "Bytes of its stored tensors (0 when not stored).")
      .def_ro("act_order", &ModelInfo::Role::act_order, "GPTQ act-order (loaded with a col_perm).")
      .def("__repr__", [](const ModelInfo::Role& r) {
        return "qhead.Role(tensor=\"" + r.tensor + "\", format=\"" + format_name(r.format) + "\"" +
               (r.scheme ? ", scheme=\"" + r.scheme->name() + "\"" : std::string()) + ")";
      });

  nb::class_<ModelInfo>(m, "ModelInfo", "What inspect_model found in a Hugging Face model directory.")
      .def_ro("dir", &ModelInfo::dir, "The model directory.")
      .def_ro("architecture", &ModelInfo::architecture, "config architectures[0] (or model_type).")
      .def_ro("model_type", &ModelInfo::model_type, "config model_type (\"\" when absent).")
      .def_ro("vocab", &ModelInfo::vocab, "V: rows of the table (config vocab_size).")
      .def_ro("hidden", &ModelInfo::hidden, "H: the hidden size.")
      .def_ro("tied", &ModelInfo::tied, "One table serves the embedding and the head.")
      .def_ro("compressed_tensors", &ModelInfo::compressed_tensors,
               "config.json carries a compressed-tensors quantization_config.")
      .def_ro("quant_method", &ModelInfo::quant_method, "\"compressed-tensors\", \"gptq\" or \"\".")
      .def_ro("embedding", &ModelInfo::embedding, "The input embedding's Role.")
      .def_ro("head", &ModelInfo::head, "The output head's (lm_head) Role.")
      .def_prop_ro("table_bytes", &ModelInfo::table_bytes, "Bytes of the token table (a tied table once).")
      .def("__repr__", [](const ModelInfo& i) {
        return "qhead.ModelInfo(architecture=\"" + i.architecture + "\", vocab=" + std::to_string(i.vocab) +
               ", hidden=" + std::to_string(i.hidden) + ", tied=" + (i.tied ? "True" : "False") + ")";
      });

  m.def(
      "inspect_model",
      [](const std::string& dir, const std::optional<std::string>& e, const std::optional<std::string>& h) {
        nb::gil_scoped_release nogil;
        return inspect_model(dir, overrides(e, h));
      },
      nb::arg("model_dir"), nb::arg("embedding_tensor").none() = nb::none(), nb::arg("head_tensor").none() = nb::none(),
      "Reads config.json and the safetensors headers of a model directory and resolves its embedding and "
      "head (tensor names by architecture unless given), their storage and whether they are tied.");

  m.def(
      "load_model_tables",
      [](const std::string& dir, const std::optional<std::string>& e, const std::optional<std::string>& h) {
        TokenTables t;
        {
          nb::gil_scoped_release nogil;
          t = load_model_tables(dir, overrides(e, h));
        }
        return wrap_tables(t, true);
      },
      nb::arg("model_dir"), nb::arg("embedding_tensor").none() = nb::none(), nb::arg("head_tensor").none() = nb::none(),
      "The model's two roles as Tables: packed and dense roles are views into the files' mappings (zero "
      "copy, read-only), GPTQ roles converted to the pack-quantized layout. Tied: one Table for both.");

  nb::class_<GgufFile>(m, "GgufFile", "A validated, memory-mapped GGUF file (llama.cpp's format).")
      .def("__init__",
           [](GgufFile* self, const std::string& path) {
             GgufFile f;
             {
               nb::gil_scoped_release nogil;
               f = GgufFile::open(path);
             }
             new (self) GgufFile(std::move(f));
           },
           nb::arg("path"), "Maps and validates path (every count, length, type and offset checked).")
      .def_prop_ro("path", &GgufFile::path, "The file's path.")
      .def_prop_ro("version", &GgufFile::version, "GGUF version (2 or 3).")
      .def_prop_ro("names", &GgufFile::names, "Tensor names in file order.")
      .def_prop_ro("keys", &GgufFile::keys, "Metadata keys in file order.")
      .def(
          "info",
          [](const GgufFile& f, const std::string& name) {
            const GgufFile::Info& i = f.info(name);
            nb::dict d;
            d["name"] = i.name;
            d["type"] = ggml_type_name(i.type);
            d["type_id"] = i.type;
            d["shape"] = nb::tuple(nb::cast(i.dims));
            d["offset"] = i.offset;
            d["nbytes"] = i.nbytes;
            return d;
          },
          nb::arg("name"),
          nb::sig("def info(self, name: str) -> dict[str, object]"),
          "A tensor's description: name, type (\"Q4_K\"), type_id, shape (outermost first: a [V, H] table is "
          "(V, H)), offset (in the data section), nbytes.")
      .def(
          "get",
          [](const GgufFile& f, const std::string& key) -> nb::object {
            const GgufValue* v = f.find(key);
            return v ? to_python(*v) : nb::none();
          },
          nb::arg("key"),
          nb::sig("def get(self, key: str) -> object"),
          "A metadata value (int, float, bool, str or list), None when the key is absent.")
      .def("__contains__", [](const GgufFile& f, const std::string& name) { return f.contains(name); },
           nb::arg("name"), "True when the file holds a tensor of that name.")
      .def("__repr__", [](const GgufFile& f) {
        return "qhead.GgufFile(\"" + f.path() + "\", version=" + std::to_string(f.version()) +
               ", tensors=" + std::to_string(f.names().size()) + ")";
      });

  m.def(
      "load_gguf_tables",
      [](const std::string& path, nb::handle scheme, int threads) {
        const auto s = opt_scheme(scheme, "load_gguf_tables");
        TokenTables t;
        {
          nb::gil_scoped_release nogil;
          const GgufFile f = GgufFile::open(path);
          t = gguf_load_tables(f, s, threads);
        }
        return wrap_tables(t, true);  // an F32 role may be a view of the mapping
      },
      nb::arg("path"), nb::arg("scheme").none() = nb::none(), nb::arg("threads") = 0,
      nb::sig("def load_gguf_tables(path: str, scheme: Scheme | str | None = None, threads: int = 0) -> TokenTables"),
      "A GGUF model's token tables: each role dequantized to f32 (ggml's block formats are not the "
      "pack-quantized layout), then RTN-quantized to scheme when given. No output.weight: tied, one Table.");
}

}  // namespace qhead::py
