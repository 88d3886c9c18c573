// logits_fallback: full dequantization + one OpenBLAS SGEMM. This is what a
// user without fused kernels does; kept as the baseline the fused paths beat.
#include <cblas.h>

#include <numeric>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/ops_ref.h"

namespace qhead::blas {

void logits_fallback(const Table& table, const TensorView& x, const TensorView& out) {
  const int64_t m = x.size(0), h = x.size(1), v = table.vocab();
  if (m == 0 || v == 0) return;  // nothing to compute (and no empty buffers to copy through)
  // [V, H] f32: the full materialization, by the vectorized multithreaded
  // gather of every row where the CPU fast path takes the table (so the
  // baseline is a fair one), else row by row.
  // The [V, H] buffer is kept between calls (as a framework's caching
  // allocator would): first-touch page faults of a fresh 600 MB buffer cost
  // more than the dequantization itself (300 ms vs 41 ms on two CPU cores,
  // 151936 x 1024).
  thread_local std::vector<float> dense_ws;
  thread_local std::vector<int32_t> all_ids;
  const float* wp = nullptr;
  Tensor w_slow;
  if (table.is_packed()) {
    if (dense_ws.size() < static_cast<size_t>(v * h)) dense_ws.resize(static_cast<size_t>(v * h));
    if (all_ids.size() < static_cast<size_t>(v)) {
      all_ids.resize(static_cast<size_t>(v));
      std::iota(all_ids.begin(), all_ids.end(), 0);
    }
    TensorView ids(all_ids.data(), DType::kI32, {v});
    TensorView wv(dense_ws.data(), DType::kF32, {v, h});
    if (cpu::embed(table, ids, wv)) wp = dense_ws.data();
  }
  if (!wp) {
    w_slow = table.to_dense_f32();
    wp = w_slow.ptr<float>();
  }
  std::vector<float> xf(static_cast<size_t>(m * h));
  convert(x.data, x.dtype, xf.data(), DType::kF32, m * h);
  // out[M, V] = x[M, H] · w[V, H]ᵀ
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(v),
              static_cast<int>(h), 1.0f, xf.data(), static_cast<int>(h), wp,
              static_cast<int>(h), 0.0f, out.ptr<float>(), static_cast<int>(v));
}

}  // namespace qhead::blas
