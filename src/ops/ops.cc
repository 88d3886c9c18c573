// Argument checks and the single dispatch point of every op.
#include "qhead/ops.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <utility>

#include "ops/ops_cuda.h"
#include "ops/ops_perm.h"
#include "qhead/cuda.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops_ref.h"
#include "ops/sample_host.h"
#include "qhead/error.h"

namespace qhead {

namespace {

// Runs a cuda_ops call holding the one lock every CUDA op takes turns on:
// their scratch buffers and the cuBLAS handle are process-wide (ops.h,
// "Threads").
std::mutex& cuda_mutex() {
  static std::mutex m;
  return m;
}
template <class... P, class... A>
void cuda_turn(void (*op)(P...), A&&... args) {
  const std::lock_guard<std::mutex> lock(cuda_mutex());  // one mutex for every op, outside the template
  op(std::forward<A>(args)...);
}

[[noreturn]] void fail(const char* op, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, op, what);
}

void check_table(const Table& t, const char* op) {
  if (t.vocab() == 0 && t.hidden() == 0) fail(op, "table is empty (default-constructed)");
  if (t.vocab() > std::numeric_limits<int32_t>::max())
    fail(op, "vocab " + std::to_string(t.vocab()) + " exceeds the I32 id range");
}

// Every tensor of a call lives where the table lives (CPU or CUDA); ops
// never copy between devices behind the caller's back.
void check_on_device(const TensorView& v, Device dev, const char* op, const char* name) {
  if (v.device != dev)
    fail(op, std::string(name) + " is on " + device_name(v.device) + " but the table is on " + device_name(dev));
  check_contiguous(v, op, name);
  if (v.numel() > 0 && v.data == nullptr) fail(op, std::string(name) + " has no data");
}

void check_x(const Table& t, const TensorView& x, const char* op) {
  check_on_device(x, t.device(), op, "x");
  check_dims(x, 2, op, "x");
  if (!is_float_dtype(x.dtype)) fail(op, std::string("x must be F32/F16/BF16, got ") + dtype_name(x.dtype));
  if (x.size(1) != t.hidden())
    fail(op, "x has shape " + shape_str(x.shape) + " but the table is [" + std::to_string(t.vocab()) + ", " +
                 std::to_string(t.hidden()) + "]: x's last dim must equal H");
}

void check_out(const TensorView& out, Device dev, DType dtype, const Shape& shape, const char* op,
               const char* name) {
  check_on_device(out, dev, op, name);
  if (out.dtype != dtype) fail(op, std::string(name) + " must be " + dtype_name(dtype) + ", got " + dtype_name(out.dtype));
  if (out.shape != shape)
    fail(op, std::string(name) + " must have shape " + shape_str(shape) + ", got " + shape_str(out.shape));
}

// An output of any float dtype (F32/F16/BF16) and the given shape.
void check_float_out(const TensorView& out, Device dev, const Shape& shape, const char* op) {
  check_on_device(out, dev, op, "out");
  if (!is_float_dtype(out.dtype)) fail(op, std::string("out must be F32/F16/BF16, got ") + dtype_name(out.dtype));
  if (out.shape != shape) fail(op, "out must have shape " + shape_str(shape) + ", got " + shape_str(out.shape));
}

// Every id in [0, v); throws naming the first bad one.
void check_ids(const TensorView& ids, Device dev, int64_t v, const char* op, const char* name) {
  check_on_device(ids, dev, op, name);
  if (ids.dtype != DType::kI32 && ids.dtype != DType::kI64)
    fail(op, std::string(name) + " must be I32 or I64, got " + dtype_name(ids.dtype));
  if (ids.device != Device::kCPU) return;  // GPU ids: the kernel checks the range and reports
  const int64_t n = ids.numel();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = ref::id_at(ids, i);
    if (id < 0 || id >= v)
      fail(op, std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(id) +
                   " is out of range for a vocab of " + std::to_string(v));
  }
}

// Output tensors of the allocating forms live on the table's device.
Tensor alloc(const Table& t, DType dtype, Shape shape) {
  return t.device() == Device::kCUDA ? cuda::empty(dtype, std::move(shape)) : Tensor::empty(dtype, std::move(shape));
}

// A table stored in permuted column order (GPTQ act-order): the backends run
// on its stored order, x's columns are permuted to match.
Tensor permuted_x(const Table& t, const TensorView& x) {
  Tensor xp = alloc(t, x.dtype, x.shape);
  gather_columns(x, t.packed().col_perm.view(), xp.view());
  return xp;
}

}  // namespace

namespace {
// CPU form of gather_columns (scatter = false) and scatter_columns (true).
void permute_columns_cpu(const TensorView& src, const TensorView& perm, const TensorView& dst, bool scatter) {
  const int64_t m = src.size(0), h = src.size(1);
  const size_t es = dtype_size(src.dtype);
  const int32_t* p = perm.ptr<const int32_t>();
  const char* s = static_cast<const char*>(src.data);
  char* d = static_cast<char*>(dst.data);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t j = 0; j < h; ++j) {
      const int64_t from = r * h + (scatter ? j : p[j]), to = r * h + (scatter ? p[j] : j);
      std::memcpy(d + to * es, s + from * es, es);
    }
}
}  // namespace

void gather_columns(const TensorView& src, const TensorView& perm, const TensorView& dst) {
  if (src.device == Device::kCUDA) return cuda_turn(cuda_ops::gather_columns, src, perm, dst);
  permute_columns_cpu(src, perm, dst, false);
}

void scatter_columns(const TensorView& src, const TensorView& perm, const TensorView& dst) {
  if (src.device == Device::kCUDA) return cuda_turn(cuda_ops::scatter_columns, src, perm, dst);
  permute_columns_cpu(src, perm, dst, true);
}

void embed(const Table& table, const TensorView& ids, const TensorView& out, Backend backend) {
  const char* op = "embed";
  check_table(table, op);
  check_dims(ids, 1, op, "ids");
  check_ids(ids, table.device(), table.vocab(), op, "ids");
  check_float_out(out, table.device(), {ids.size(0), table.hidden()}, op);
  if (table.has_col_perm()) {  // gather in stored order, then put the columns back
    Tensor rows = alloc(table, out.dtype, out.shape);
    embed(table.stored_order(), ids, rows.view(), backend);
    scatter_columns(rows.view(), table.packed().col_perm.view(), out);
    return;
  }
  if (table.device() == Device::kCUDA) return cuda_turn(cuda_ops::embed, table, ids, out);
  switch (backend) {
    case Backend::kAuto:
    case Backend::kFused:
      if (cpu::embed(table, ids, out)) return;
      [[fallthrough]];
    case Backend::kReference:
    case Backend::kFallbackBlas:  // a gather has no BLAS form
      ref::embed(table, ids, out);
      return;
  }
}

Tensor embed(const Table& table, const TensorView& ids, DType out_dtype) {
  check_dims(ids, 1, "embed", "ids");
  Tensor out = alloc(table, out_dtype, {ids.size(0), table.hidden()});
  embed(table, ids, out.view());
  return out;
}

namespace {
// The BLAS and reference logits into a 16-bit out: 64 activation rows at a time in f32, then
// rounded (the fused kernels round each block of vocab rows themselves: cpu::logits).
void logits_rounded(const Table& table, const TensorView& x, const TensorView& out, Backend backend) {
  constexpr int64_t kRows = 64;
  const int64_t M = x.size(0), V = table.vocab(), H = x.size(1);
  Tensor f = Tensor::empty(DType::kF32, {std::min(M, kRows), V});
  const size_t xs = dtype_size(x.dtype);
  for (int64_t r0 = 0; r0 < M; r0 += kRows) {
    const int64_t mc = std::min(kRows, M - r0);
    const TensorView xr(static_cast<char*>(x.data) + size_t(r0 * H) * xs, x.dtype, {mc, H});
    const TensorView fr(f.data(), DType::kF32, {mc, V});
    logits(table, xr, fr, backend);
    const float* src = f.ptr<float>();
    uint16_t* dst = static_cast<uint16_t*>(out.data) + r0 * V;
    cpu::round_to_16bit(src, dst, mc * V, out.dtype);
  }
}
}  // namespace

void logits(const Table& table, const TensorView& x, const TensorView& out, Backend backend) {
  const char* op = "logits";
  check_table(table, op);
  check_x(table, x, op);
  check_float_out(out, table.device(), {x.size(0), table.vocab()}, op);
  if (table.has_col_perm()) return logits(table.stored_order(), permuted_x(table, x).view(), out, backend);
  if (table.device() == Device::kCUDA) return cuda_turn(cuda_ops::logits, table, x, out, backend);
  const bool f32 = out.dtype == DType::kF32;
  switch (backend) {
    case Backend::kFallbackBlas:
      if (!f32) return logits_rounded(table, x, out, backend);
      blas::logits_fallback(table, x, out);
      return;
    case Backend::kAuto:
    case Backend::kFused:
      if (cpu::logits(table, x, out)) return;
      [[fallthrough]];
    case Backend::kReference:
      if (!f32) return logits_rounded(table, x, out, Backend::kReference);
      ref::logits(table, x, out);
      return;
  }
}

Tensor logits(const Table& table, const TensorView& x, DType out_dtype) {
  check_dims(x, 2, "logits", "x");
  if (!is_float_dtype(out_dtype)) fail("logits", std::string("out_dtype must be F32/F16/BF16, got ") + dtype_name(out_dtype));
  Tensor out = alloc(table, out_dtype, {x.size(0), table.vocab()});
  logits(table, x, out.view());
  return out;
}

void logits_fallback(const Table& table, const TensorView& x, const TensorView& out) {
  logits(table, x, out, Backend::kFallbackBlas);
}

void topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values,
          const TensorView& ids, const TensorView& lse, Backend backend) {
  const char* op = "topk";
  check_table(table, op);
  check_x(table, x, op);
  if (k < 1 || k > table.vocab())
    fail(op, "k = " + std::to_string(k) + " must be in [1, V = " + std::to_string(table.vocab()) + "]");
  const int64_t m = x.size(0);
  check_out(values, table.device(), DType::kF32, {m, k}, op, "values");
  check_out(ids, table.device(), DType::kI32, {m, k}, op, "ids");
  check_out(lse, table.device(), DType::kF32, {m}, op, "logsumexp");
  if (table.has_col_perm()) return topk(table.stored_order(), permuted_x(table, x).view(), k, values, ids, lse, backend);
  if (table.device() == Device::kCUDA) return cuda_turn(cuda_ops::topk, table, x, k, values, ids, lse, backend);
  switch (backend) {
    case Backend::kAuto:
    case Backend::kFused:
      if (cpu::topk(table, x, k, values, ids, lse)) return;
      [[fallthrough]];
    case Backend::kReference:
    case Backend::kFallbackBlas:
      ref::topk(table, x, k, values, ids, lse);
      return;
  }
}

TopK topk(const Table& table, const TensorView& x, int64_t k) {
  check_dims(x, 2, "topk", "x");
  const int64_t m = x.size(0);
  if (k < 1 || k > table.vocab())
    fail("topk", "k = " + std::to_string(k) + " must be in [1, V = " + std::to_string(table.vocab()) + "]");
  TopK r{alloc(table, DType::kF32, {m, k}), alloc(table, DType::kI32, {m, k}), alloc(table, DType::kF32, {m})};
  topk(table, x, k, r.values.view(), r.ids.view(), r.logsumexp.view());
  return r;
}

void sample(const Table& table, const TensorView& x, const SampleParams& params, const TensorView& ids,
            Backend backend) {
  const char* op = "sample";
  check_table(table, op);
  check_x(table, x, op);
  sampling::check_params(params, table.vocab());
  check_out(ids, table.device(), DType::kI32, {x.size(0)}, op, "ids");
  if (table.has_col_perm()) return sample(table.stored_order(), permuted_x(table, x).view(), params, ids, backend);
  if (table.device() == Device::kCUDA) return cuda_turn(cuda_ops::sample, table, x, params, ids, backend);
  sampling::run_cpu(table, x, params, ids, backend);
}

Tensor sample(const Table& table, const TensorView& x, const SampleParams& params) {
  check_dims(x, 2, "sample", "x");
  Tensor ids = alloc(table, DType::kI32, {x.size(0)});
  sample(table, x, params, ids.view());
  return ids;
}

void rescore(const Table& dense, const TensorView& x, const TensorView& candidates, const TensorView& values,
             const TensorView& ids) {
  const char* op = "rescore";
  check_table(dense, op);
  if (dense.is_packed()) fail(op, "rescore needs the full-precision (dense) table, got a packed one");
  check_x(dense, x, op);
  check_dims(candidates, 2, op, "candidates");
  if (candidates.size(0) != x.size(0))
    fail(op, "candidates " + shape_str(candidates.shape) + " and x " + shape_str(x.shape) + " disagree on M");
  check_ids(candidates, dense.device(), dense.vocab(), op, "candidates");
  check_out(values, dense.device(), DType::kF32, candidates.shape, op, "values");
  check_out(ids, dense.device(), DType::kI32, candidates.shape, op, "ids");
  if (dense.device() == Device::kCUDA) return cuda_turn(cuda_ops::rescore, dense, x, candidates, values, ids);
  if (cpu::rescore(dense, x, candidates, values, ids)) return;
  ref::rescore(dense, x, candidates, values, ids);
}

Rescored rescore(const Table& dense, const TensorView& x, const TensorView& candidates) {
  check_dims(candidates, 2, "rescore", "candidates");
  Rescored r{alloc(dense, DType::kF32, candidates.shape), alloc(dense, DType::kI32, candidates.shape)};
  rescore(dense, x, candidates, r.values.view(), r.ids.view());
  return r;
}

}  // namespace qhead
