// The ops: embed, logits, topk, rescore, each writing caller-given outputs.
//
// Per call: the arrays are imported through DLPack (no copies), the GIL is
// released, and the op of qhead/ops.h runs, which checks every argument
// (device, dtype, shape, contiguity, id range) and throws qhead::Error.
// Nothing else happens here, so the overhead is that of the imports.
//
// CUDA streams: qhead runs CUDA work on one process-wide stream
// (cuda::set_stream). `stream` (a cudaStream_t as an integer) sets it for the
// one call and restores the previous one after. Without `stream`, a call on
// torch CUDA tensors runs on torch's current stream (asked through the DLPack
// exchange API, no Python call), anything else on qhead's stream. Calls on
// CUDA tables take a lock for this, so no call runs on another call's stream.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <mutex>
#include <optional>

#include "binding.h"
#include "qhead/cuda.h"
#include "qhead/error.h"
#include "qhead/ops.h"
#include "torch_api.h"

namespace qhead::py {

namespace {

std::mutex& stream_mutex() {
  static std::mutex m;
  return m;
}

// Runs f() with the GIL released; on a CUDA table, on `stream`, else on the
// current stream of `first`'s framework when it tells one.
template <class F>
void run(const Table& t, const std::optional<uintptr_t>& stream, const ArrayArg& first, F&& f) {
  if (t.device() != Device::kCUDA) {
    nb::gil_scoped_release nogil;
    f();
    return;
  }
  void* s = stream ? reinterpret_cast<void*>(*stream) : current_stream_of(first);
  const bool set = stream.has_value() || s != nullptr;
  nb::gil_scoped_release nogil;
  const std::lock_guard<std::mutex> lock(stream_mutex());
  if (!set) {
    f();
    return;
  }
  void* prev = cuda::stream();
  cuda::set_stream(s);
  try {
    f();
  } catch (...) {
    cuda::set_stream(prev);
    throw;
  }
  cuda::set_stream(prev);
}

// The torch ops' entry points (torch_api.h): called from a torch kernel, which
// holds no GIL; the same stream handling and lock as run().
template <class F>
void run_torch(const Table& t, void* s, F&& f) {
  if (t.device() != Device::kCUDA) {
    f();
    return;
  }
  const std::lock_guard<std::mutex> lock(stream_mutex());
  void* prev = cuda::stream();
  cuda::set_stream(s);
  try {
    f();
  } catch (...) {
    cuda::set_stream(prev);
    throw;
  }
  cuda::set_stream(prev);
}

const TorchApi g_torch_api = {
    kTorchApiVersion,
    sizeof(TorchApi),
    [](PackedTable p, const std::string& where) { return Table::packed(std::move(p), where); },
    [](Tensor w) { return Table::dense(std::move(w)); },
    [](const std::string& name, DType sd) { return QuantScheme::parse(name, sd); },
    [](const Table& t, const TensorView& ids, const TensorView& out, void* s) {
      run_torch(t, s, [&] { embed(t, ids, out); });
    },
    [](const Table& t, const TensorView& x, const TensorView& out, void* s) {
      run_torch(t, s, [&] { logits(t, x, out); });
    },
    [](const Table& t, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
       const TensorView& lse, void* s) { run_torch(t, s, [&] { topk(t, x, k, values, ids, lse); }); },
    [](const Table& d, const TensorView& x, const TensorView& c, const TensorView& values, const TensorView& ids,
       void* s) { run_torch(d, s, [&] { rescore(d, x, c, values, ids); }); },
    [](const Table& t, const TensorView& x, const SampleParams& p, const TensorView& ids, void* s) {
      run_torch(t, s, [&] { sample(t, x, p, ids); });
    },
};

}  // namespace

const TorchApi& torch_api() { return g_torch_api; }

void register_ops(nb::module_& m) {
  m.def(
      "embed",
      [](const PyTable& table, nb::handle ids, nb::handle out, std::optional<uintptr_t> stream) {
        ArrayArg i, o;
        import_array(ids, "embed", "ids", false, i);
        import_array(out, "embed", "out", true, o);
        run(table.table, stream, i, [&] { embed(table.table, i.view, o.view); });
      },
      nb::arg("table"), nb::arg("ids").none(), nb::arg("out").none(), nb::kw_only(), nb::arg("stream").none() = nb::none(),
      nb::sig("def embed(table: Table, ids: object, out: object, *, stream: int | None = None) -> None"),
      "out[n, :] = row ids[n] of the table, dequantized.\n"
      "  ids  int32/int64 [N], each in [0, V)\n"
      "  out  f32/f16/bf16 [N, H], written\n"
      "All arrays on the table's device, contiguous. stream: a cudaStream_t for CUDA tables (default: torch's current stream for torch tensors, else qhead's).");

  m.def(
      "logits",
      [](const PyTable& table, nb::handle x, nb::handle out, std::optional<uintptr_t> stream) {
        ArrayArg a, o;
        import_array(x, "logits", "x", false, a);
        import_array(out, "logits", "out", true, o);
        run(table.table, stream, a, [&] { logits(table.table, a.view, o.view); });
      },
      nb::arg("table"), nb::arg("x").none(), nb::arg("out").none(), nb::kw_only(), nb::arg("stream").none() = nb::none(),
      nb::sig("def logits(table: Table, x: object, out: object, *, stream: int | None = None) -> None"),
      "out[m, v] = sum_j x[m, j] * w[v, j], accumulated in f32.\n"
      "  x    f32/f16/bf16 [M, H]\n"
      "  out  f32/f16/bf16 [M, V], written (16-bit: the f32 logits rounded to nearest even)\n"
      "All arrays on the table's device, contiguous. stream: a cudaStream_t for CUDA tables (default: torch's current stream for torch tensors, else qhead's).");

  m.def(
      "topk",
      [](const PyTable& table, nb::handle x, int64_t k, nb::handle values, nb::handle ids, nb::handle lse,
         std::optional<uintptr_t> stream) {
        ArrayArg a, v, i, l;
        import_array(x, "topk", "x", false, a);
        import_array(values, "topk", "values", true, v);
        import_array(ids, "topk", "ids", true, i);
        import_array(lse, "topk", "lse", true, l);
        run(table.table, stream, a, [&] { topk(table.table, a.view, k, v.view, i.view, l.view); });
      },
      nb::arg("table"), nb::arg("x").none(), nb::arg("k"), nb::arg("values").none(), nb::arg("ids").none(), nb::arg("lse").none(),
      nb::kw_only(), nb::arg("stream").none() = nb::none(),
      nb::sig("def topk(table: Table, x: object, k: int, values: object, ids: object, lse: object, *, "
              "stream: int | None = None) -> None"),
      "The k largest logits of each row of x, sorted descending (ties: lower id first), and the log-sum-exp "
      "of the whole row, without storing [M, V].\n"
      "  x       f32/f16/bf16 [M, H]\n"
      "  values  f32 [M, k], written\n"
      "  ids     int32 [M, k], written\n"
      "  lse     f32 [M], written\n"
      "1 <= k <= V. All arrays on the table's device, contiguous. stream: a cudaStream_t for CUDA tables (default: torch's current stream for torch tensors, else qhead's).");

  m.def(
      "rescore",
      [](const PyTable& dense, nb::handle x, nb::handle candidates, nb::handle values, nb::handle ids,
         std::optional<uintptr_t> stream) {
        ArrayArg a, c, v, i;
        import_array(x, "rescore", "x", false, a);
        import_array(candidates, "rescore", "candidates", false, c);
        import_array(values, "rescore", "values", true, v);
        import_array(ids, "rescore", "ids", true, i);
        run(dense.table, stream, a, [&] { rescore(dense.table, a.view, c.view, v.view, i.view); });
      },
      nb::arg("dense"), nb::arg("x").none(), nb::arg("candidates").none(), nb::arg("values").none(), nb::arg("ids").none(), nb::kw_only(),
      nb::arg("stream").none() = nb::none(),
      nb::sig("def rescore(dense: Table, x: object, candidates: object, values: object, ids: object, *, "
              "stream: int | None = None) -> None"),
      "Exact logits of candidate ids from a dense (full-precision) table, re-sorted descending (ties: lower "
      "id first).\n"
      "  x           f32/f16/bf16 [M, H]\n"
      "  candidates  int32/int64 [M, k], each in [0, V)\n"
      "  values      f32 [M, k], written\n"
      "  ids         int32 [M, k], written\n"
      "All arrays on the table's device, contiguous. stream: a cudaStream_t for CUDA tables (default: torch's current stream for torch tensors, else qhead's).");

  m.def(
      "sample",
      [](const PyTable& table, nb::handle x, nb::handle ids, float temperature, int64_t top_k, float top_p,
         float min_p, uint64_t seed, uint64_t offset, std::optional<uintptr_t> stream) {
        ArrayArg a, i;
        import_array(x, "sample", "x", false, a);
        import_array(ids, "sample", "ids", true, i);
        SampleParams p;
        p.temperature = temperature;
        p.top_k = top_k;
        p.top_p = top_p;
        p.min_p = min_p;
        p.seed = seed;
        p.offset = offset;
        run(table.table, stream, a, [&] { sample(table.table, a.view, p, i.view); });
      },
      nb::arg("table"), nb::arg("x").none(), nb::arg("ids").none(), nb::kw_only(), nb::arg("temperature") = 1.0f,
      nb::arg("top_k") = 0, nb::arg("top_p") = 1.0f, nb::arg("min_p") = 0.0f, nb::arg("seed") = 0,
      nb::arg("offset") = 0, nb::arg("stream").none() = nb::none(),
      nb::sig("def sample(table: Table, x: object, ids: object, *, temperature: float = 1.0, top_k: int = 0, "
              "top_p: float = 1.0, min_p: float = 0.0, seed: int = 0, offset: int = 0, "
              "stream: int | None = None) -> None"),
      "One token id per row of x, drawn from softmax(logits / temperature) truncated by top_k (0: none), "
      "top_p (1: none) and min_p (0: none), without storing [M, V]; temperature 0: the argmax. The draw "
      "is exact and reproducible: Philox4x32-10 keyed by seed, with (row, offset, column) as counter "
      "(pass the decode step as offset).\n"
      "  x    f32/f16/bf16 [M, H]\n"
      "  ids  int32 [M], written\n"
      "All arrays on the table's device, contiguous. stream: a cudaStream_t for CUDA tables (default: torch's current stream for torch tensors, else qhead's).");

  m.def("_torch_api", [] { return reinterpret_cast<uintptr_t>(&torch_api()); },
        "Address of the function table the torch ops library (qhead/_torch_ops) calls (internal).");

  m.def("set_num_threads", &set_num_threads, nb::arg("n"),
        "Worker threads of the CPU ops (the caller included); n <= 0: the default (hardware threads, or "
        "QHEAD_NUM_THREADS). Call it between ops.");
  m.def("num_threads", &num_threads, "Worker threads of the CPU ops.");
  m.def(
      "set_cpu_activations",
      [](const std::string& mode) {
        if (mode == "exact")
          set_cpu_activations(CpuActivations::kExact);
        else if (mode == "int8")
          set_cpu_activations(CpuActivations::kInt8);
        else
          throw Error(ErrorCode::kInvalidArgument, "set_cpu_activations",
                      "mode '" + mode + "': one of exact, int8");
      },
      nb::arg("mode"),
      "The CPU kernels' activation precision, process-wide: 'exact' (default: x as f32) or 'int8' (x "
      "quantized per block of 32, integer dot products; |dlogit| <= sum_j |w_j| s_b(j) / 2). Call it "
      "between ops.");
  m.def(
      "cpu_activations", [] { return std::string(cpu_activations() == CpuActivations::kInt8 ? "int8" : "exact"); },
      "The CPU kernels' activation precision: 'exact' or 'int8'.");
  m.def("cpu_int8_available", &cpu_int8_available,
        "Whether the int8 activation mode takes effect with the active CPU kernels.");
  m.def("cuda_available", &cuda::available, "True when qhead was built with CUDA and a device is visible.");
  m.def(
      "cuda_synchronize",
      [] {
        if (!cuda::available()) return;  // no device: no work to wait for
        nb::gil_scoped_release nogil;
        cuda::synchronize();
      },
      "Waits for qhead's work on its current CUDA stream; raises on an asynchronous CUDA error. "
      "A no-op without a CUDA device.");
  m.def("cuda_allocated_bytes", &cuda::allocated_bytes,
        "Device memory qhead holds now (tables moved with to_device, its scratch buffers).");
  m.def("cuda_device_name", &cuda::device_name, "The CUDA device's name, \"\" without one.");
}

}  // namespace qhead::py
