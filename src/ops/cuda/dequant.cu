// The cuBLAS fallback: the packed table dequantized in full (when packed),
// then one cuBLAS GEMM; the same GEMM is the benchmark's dense baseline.
#include <type_traits>

#include "ops/cuda/internal.cuh"

namespace qhead::cuda_ops {

using namespace cuda_detail;

namespace {

// Full dequantization into a dense [V, H] table of OutT (the fallback path).
// Generic: one thread per element (any bit width).
template <class OutT>
__global__ void dequant_kernel(TableArgs t, OutT* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= t.V * t.H) return;
  const int64_t row = i / t.H;
  const int h = static_cast<int>(i % t.H);
  store_out(out, i, dequant_at(t.packed, t.scale, t.stype, t.zp, t.bits, row, h, t.words, t.group, t.groups));
}

// 4- and 8-bit: one thread per code word (8 or 4 values, one group), so the
// packed table is read with coalesced 4-byte loads and the output written in
// 16- or 8-byte stores.
template <int BITS, class OutT>
__global__ void dequant_words_kernel(TableArgs t, OutT* __restrict__ out) {
  constexpr int PER = 32 / BITS;
  const int64_t wi = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // word index
  if (wi >= t.V * t.words) return;
  const int64_t row = wi / t.words;
  const int h0 = int(wi % t.words) * PER;
  const int grp = h0 / t.group;
  const uint32_t w = t.packed[wi];
  const float s = load_scale(t.scale, t.stype, row * t.groups + grp);
  const int z = t.zp ? zero_point(t.zp, t.groups, row, grp, BITS) : 0;
  OutT v[PER];
#pragma unroll
  for (int e = 0; e < PER; ++e) {
    const int q = int((w >> (e * BITS)) & ((1u << BITS) - 1u)) - (1 << (BITS - 1));
    const float f = float(q - z) * s;
    if constexpr (std::is_same_v<OutT, float>) v[e] = f;
    else if constexpr (std::is_same_v<OutT, __half>) v[e] = __float2half_rn(f);
    else v[e] = __float2bfloat16_rn(f);
  }
  OutT* o = out + row * t.H + h0;
  if constexpr (sizeof(v) == 16) *reinterpret_cast<uint4*>(o) = *reinterpret_cast<const uint4*>(v);
  else if constexpr (sizeof(v) == 8) *reinterpret_cast<uint2*>(o) = *reinterpret_cast<const uint2*>(v);
  else {
#pragma unroll
    for (int e = 0; e < PER; ++e) o[e] = v[e];
  }
}

// The dense [V, H] table a GEMM reads: the table itself, or its full
// dequantization into a workspace (the fallback the fused kernels replace).
const void* dense_operand(const Table& table, DType want, cudaStream_t s) {
  if (!table.is_packed()) return table.dense().data();
  const TableArgs t = table_args(table.packed());
  const int64_t n = t.V * t.H;
  void* w = workspace(kWsDenseTable, size_t(n) * dtype_size(want));
  const int threads = 256;
  // Word-parallel kernel when a word holds whole codes of one group (4/8-bit, group >= 32/bits).
  const bool words_ok = (t.bits == 4 || t.bits == 8) && t.group % (32 / t.bits) == 0;
  const int64_t nw = t.V * t.words;
  if (words_ok) {
    auto go = [&](auto* o) {
      using OutT = std::remove_pointer_t<decltype(o)>;
      if (t.bits == 4) dequant_words_kernel<4, OutT><<<blocks_for(nw, threads), threads, 0, s>>>(t, o);
      else dequant_words_kernel<8, OutT><<<blocks_for(nw, threads), threads, 0, s>>>(t, o);
    };
    if (want == DType::kF16) go(static_cast<__half*>(w));
    else if (want == DType::kBF16) go(static_cast<__nv_bfloat16*>(w));
    else go(static_cast<float*>(w));
    QHEAD_CUDA_CHECK_LAUNCH("dequant_words_kernel");
    return w;
  }
  if (want == DType::kF16)
    dequant_kernel<__half><<<blocks_for(n, threads), threads, 0, s>>>(t, static_cast<__half*>(w));
  else if (want == DType::kBF16)
    dequant_kernel<__nv_bfloat16><<<blocks_for(n, threads), threads, 0, s>>>(t, static_cast<__nv_bfloat16*>(w));
  else
    dequant_kernel<float><<<blocks_for(n, threads), threads, 0, s>>>(t, static_cast<float*>(w));
  QHEAD_CUDA_CHECK_LAUNCH("dequant_kernel");
  return w;
}

// out[m·ldo + v] = f[m·V + v] rounded to nearest (even) in OutT.
template <class OutT>
__global__ void round_logits_kernel(const float* __restrict__ f, OutT* __restrict__ out, int64_t V, int64_t n,
                                    int64_t ldo) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  store_out(out, (i / V) * ldo + i % V, f[i]);
}

}  // namespace

void gemm_fallback(const Table& table, const TensorView& x, void* out, DType out_dtype, int64_t ldo) {
  cudaStream_t s = current_stream();
  const DType wt = table.is_packed() ? x.dtype : table.dense().dtype();
  if (!table.is_packed() && wt != x.dtype)
    fail("logits", std::string("dense CUDA table is ") + dtype_name(wt) + " but x is " + dtype_name(x.dtype) +
                       "; they must match");
  const void* w = dense_operand(table, wt, s);
  const int V = static_cast<int>(table.vocab()), H = static_cast<int>(table.hidden()), M = static_cast<int>(x.size(0));
  // cuBLAS stores a 16-bit C only of its operands' dtype (f16 in, f16 out;
  // bf16 in, bf16 out): any other 16-bit out goes through f32 logits and one
  // rounding, so the logits are the same as in f32 to half an ulp.
  if (out_dtype == DType::kF32 || out_dtype == wt) {
    gemm_xwt(w, cuda_type(wt), x.data, cuda_type(x.dtype), out, cuda_type(out_dtype), V, H, M, ldo);
    return;
  }
  const int64_t n = int64_t(M) * V;
  float* f = static_cast<float*>(workspace(kWsFallbackF32, size_t(n) * sizeof(float)));
  gemm_xwt(w, cuda_type(wt), x.data, cuda_type(x.dtype), f, CUDA_R_32F, V, H, M, V);
  constexpr int threads = 256;
  if (out_dtype == DType::kF16)
    round_logits_kernel<__half><<<blocks_for(n, threads), threads, 0, s>>>(f, static_cast<__half*>(out), V, n, ldo);
  else
    round_logits_kernel<__nv_bfloat16>
        <<<blocks_for(n, threads), threads, 0, s>>>(f, static_cast<__nv_bfloat16*>(out), V, n, ldo);
  QHEAD_CUDA_CHECK_LAUNCH("round_logits_kernel");
}

}  // namespace qhead::cuda_ops

namespace qhead::cuda_detail {


void gemm_xwt(const void* w, cudaDataType_t wt, const void* x, cudaDataType_t xt, void* out, cudaDataType_t ot, int V,
              int H, int M, int64_t ldo) {
  const float alpha = 1.0f, beta = 0.0f;
  // out[M, V] (row-major) = (W[V, H] · x[M, H]ᵀ) seen column-major as [V, M].
  cuda_ops::check_blas(cublasGemmEx(cuda_ops::blas(), CUBLAS_OP_T, CUBLAS_OP_N, V, M, H, &alpha, w, wt, H, x, xt, H,
                                    &beta, out, ot, static_cast<int>(ldo), CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx");
}

}  // namespace qhead::cuda_detail
