// The functions of qhead._C that the torch ops (python/src/torch_ops.cc, the
// library qhead/_torch_ops) call.
//
// Both extensions link the qhead library statically, so each holds its own
// copy of qhead's process-wide state: the CPU worker pool and its settings
// (set_num_threads, set_cpu_isa, set_cpu_activations), the CUDA stream, the
// CUDA scratch buffers and allocation counters. The torch ops therefore build
// tables and run every op through _C's copy, reached through this table of
// function pointers (qhead.torch hands its address to _torch_ops once, at
// import): qhead.set_num_threads and the other settings apply to the torch ops
// too, and a CUDA call from either extension takes the same stream lock.
#pragma once

#include <cstdint>
#include <string>

#include "qhead/ops.h"
#include "qhead/scheme.h"
#include "qhead/table.h"
#include "qhead/tensor.h"

namespace qhead::py {

// Bumped whenever the struct changes; _torch_ops refuses another version.
inline constexpr uint32_t kTorchApiVersion = 2;

struct TorchApi {
  uint32_t version;
  uint32_t size;  // sizeof(TorchApi)
  // Table::packed / Table::dense of _C's copy (validation included).
  Table (*make_packed)(PackedTable p, const std::string& where);
  Table (*make_dense)(Tensor weight);
  QuantScheme (*parse_scheme)(const std::string& name, DType scale_dtype);
  // The ops. On a CUDA table they run on `stream` (a cudaStream_t; the
  // previous stream is restored after), under the lock _C's own calls take.
  void (*embed)(const Table& t, const TensorView& ids, const TensorView& out, void* stream);
  void (*logits)(const Table& t, const TensorView& x, const TensorView& out, void* stream);
  void (*topk)(const Table& t, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
               const TensorView& lse, void* stream);
  void (*rescore)(const Table& dense, const TensorView& x, const TensorView& candidates, const TensorView& values,
                  const TensorView& ids, void* stream);
  void (*sample)(const Table& t, const TensorView& x, const SampleParams& params, const TensorView& ids,
                 void* stream);
};

// _C's table (python/src/ops.cc).
const TorchApi& torch_api();

}  // namespace qhead::py
