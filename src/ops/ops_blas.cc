// logits_fallback: full dequantization + one OpenBLAS SGEMM. This is what a
// user without fused kernels does; kept as the baseline the fused paths beat.
#include <cblas.h>

#include <vector>

#include "ops/ops_ref.h"

namespace qhead::blas {

void logits_fallback(const Table& table, const TensorView& x, const TensorView& out) {
  const int64_t m = x.size(0), h = x.size(1), v = table.vocab();
  if (m == 0 || v == 0) return;  // nothing to compute (and no empty buffers to copy through)
  const Tensor w = table.to_dense_f32();  // [V, H] f32: the full materialization
  std::vector<float> xf(static_cast<size_t>(m * h));
  convert(x.data, x.dtype, xf.data(), DType::kF32, m * h);
  // out[M, V] = x[M, H] · w[V, H]ᵀ
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(v),
              static_cast<int>(h), 1.0f, xf.data(), static_cast<int>(h), w.ptr<float>(),
              static_cast<int>(h), 0.0f, out.ptr<float>(), static_cast<int>(v));
}

}  // namespace qhead::blas
