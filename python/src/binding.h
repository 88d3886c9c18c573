// The pieces of the qhead._C extension shared by its source files.
//
//   arrays.cc   DLPack arrays in (zero copy, any framework) and out
//   errors.cc   qhead::Error → qhead.Error and its subclasses
//   table.cc    Scheme, Table, TokenTables, quantize
//   ops.cc      embed, logits, topk, rescore (GIL released, stream keyword)
//   model.cc    load_packed, inspect_model, load_model_tables, GGUF
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dlpack_exchange.h"
#include "qhead/quantize.h"
#include "qhead/table.h"
#include "qhead/tensor.h"

namespace qhead::py {

namespace nb = nanobind;

// ---- arrays in -------------------------------------------------------------------------------
//
// Any object with __dlpack__ (numpy arrays, torch tensors on CPU or CUDA, the
// arrays this module returns) or the buffer protocol is taken without a copy
// (torch tensors through the DLPack C exchange API, dlpack_exchange.h):
// the view points at the caller's memory, with its shape, dtype, device and
// strides (in elements). Strides are passed through as given, so a
// non-contiguous array reaches the op and fails there with the op's own error.
// A None or an object that is not an array throws kInvalidArgument naming
// `op` and `name`.

// An array borrowed for the duration of one call: `in` (read-only import)
// or `out` (writable import) keeps the export alive.
struct ArrayArg {
  std::optional<nb::ndarray<nb::ro>> in;  // set only on the __dlpack__ path (nothing to release otherwise)
  std::optional<nb::ndarray<>> out;
  TensorView view;
  const dlx::ExchangeApi* api = nullptr;  // the producer's DLPack exchange API, when its type has one
  int32_t device_id = 0;
};
// Fills `arg` from `obj`. `writable`: the op writes the array (an output); a
// read-only array (a file mapping, a read-only numpy array) is then refused.
void import_array(nb::handle obj, const char* op, const char* name, bool writable, ArrayArg& arg);
// The producer's current CUDA stream for a CUDA array whose framework has the
// DLPack exchange API (torch.cuda.current_stream()), else nullptr.
void* current_stream_of(const ArrayArg& a);

// An array kept by a C++ object (a Table): a Tensor whose owner holds a
// reference to the Python object and its export, released with the GIL held,
// whichever thread drops the last reference.
Tensor keep_array(nb::handle obj, const char* op, const char* name);

// ---- arrays out ------------------------------------------------------------------------------

// A zero-copy array over `t` that keeps the storage alive: a numpy array for
// a CPU tensor whose dtype numpy has, otherwise a DLPack-capable nanobind
// ndarray (CUDA tensors; bf16), which torch.from_dlpack / numpy.from_dlpack
// take. `read_only`: the storage must not be written (a file mapping).
nb::object export_tensor(const Tensor& t, bool read_only);

// ---- tables ----------------------------------------------------------------------------------

// A qhead::Table as Python sees it. `read_only`: its storage is a read-only
// file mapping (arrays exported from it are read-only). `sources`: the
// Python objects a Table.dense / Table.packed was built from, returned as
// they are by the storage properties (same object, same framework).
struct PyTable {
  Table table;
  bool read_only = false;
  nb::object src_packed, src_scale, src_zero_point, src_col_perm, src_dense;
};

struct PyTokenTables {
  PyTable embedding, head;
  bool tied() const { return embedding.table.same_storage(head.table); }
};

PyTokenTables wrap_tables(const TokenTables& t, bool read_only);

// "f16" / "float16" / "F16" (any case) → DType; throws kInvalidArgument naming `op`.
DType parse_float_dtype(const std::string& s, const char* op, const char* name);
// "f32", "f16", "bf16", "i32", ...
const char* short_dtype_name(DType t);

// ---- registration ------------------------------------------------------------------------------
void register_errors(nb::module_& m);
void register_tables(nb::module_& m);
void register_ops(nb::module_& m);
void register_model(nb::module_& m);

}  // namespace qhead::py
