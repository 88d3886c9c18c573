// rescore on the GPU: exact dot products of each row's candidates with the
// dense rows, then each row sorted.
#include <type_traits>

#include "ops/cuda/internal.cuh"
#include "ops/cuda/select.cuh"
#include "ops/ops_cuda.h"

namespace qhead::cuda_ops {

using namespace cuda_detail;

namespace {

// rescore: one warp per (row, candidate) dot product in f32; then per row a sort.
template <class XT, class WT>
__global__ void rescore_dots_kernel(const WT* __restrict__ w, const XT* __restrict__ x, const void* cand, bool cand64,
                                    int H, int M, int k, float* __restrict__ vals, int* __restrict__ out_ids) {
  const int64_t gw = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (gw >= int64_t(M) * k) return;
  const int m = int(gw / k);
  const int64_t id = cand64 ? static_cast<const int64_t*>(cand)[gw] : static_cast<const int32_t*>(cand)[gw];
  float acc = 0.0f;
  for (int h = lane; h < H; h += 32) {
    float xv, wv;
    if constexpr (std::is_same_v<XT, float>) xv = x[int64_t(m) * H + h]; else xv = Act<XT>::to_float(x[int64_t(m) * H + h]);
    if constexpr (std::is_same_v<WT, float>) wv = w[id * H + h]; else wv = Act<WT>::to_float(w[id * H + h]);
    acc = fmaf(xv, wv, acc);
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) { vals[gw] = acc; out_ids[gw] = int(id); }
}

__global__ void sort_rows_kernel(float* vals, int* ids, int k) {
  __shared__ float sv[kMaxK];
  __shared__ int si[kMaxK];
  const int m = blockIdx.x;
  int n = 1;
  while (n < k) n <<= 1;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    sv[i] = i < k ? vals[int64_t(m) * k + i] : -INFINITY;
    si[i] = i < k ? ids[int64_t(m) * k + i] : 0x7fffffff;
  }
  __syncthreads();
  bitonic_sort(sv, si, n);
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    vals[int64_t(m) * k + i] = sv[i];
    ids[int64_t(m) * k + i] = si[i];
  }
}

}  // namespace

void rescore(const Table& dense, const TensorView& x, const TensorView& candidates, const TensorView& values,
             const TensorView& ids) {
  const int64_t M = x.size(0), k = candidates.size(1);
  if (k > kMaxK) fail("rescore", "CUDA rescore takes k <= " + std::to_string(kMaxK));
  if (M * k == 0) return;
  cudaStream_t s = current_stream();
  const Tensor& w = dense.dense();
  const int H = static_cast<int>(dense.hidden());
  const bool c64 = candidates.dtype == DType::kI64;
  const unsigned blocks = unsigned((M * k * 32 + 255) / 256);
  auto go_w = [&](auto* xp) {
    using XT = std::remove_cv_t<std::remove_pointer_t<decltype(xp)>>;
    switch (w.dtype()) {
      case DType::kF32: rescore_dots_kernel<XT, float><<<blocks, 256, 0, s>>>(w.ptr<const float>(), xp, candidates.data, c64, H, int(M), int(k), values.ptr<float>(), ids.ptr<int>()); break;
      case DType::kF16: rescore_dots_kernel<XT, __half><<<blocks, 256, 0, s>>>(w.ptr<const __half>(), xp, candidates.data, c64, H, int(M), int(k), values.ptr<float>(), ids.ptr<int>()); break;
      default: rescore_dots_kernel<XT, __nv_bfloat16><<<blocks, 256, 0, s>>>(w.ptr<const __nv_bfloat16>(), xp, candidates.data, c64, H, int(M), int(k), values.ptr<float>(), ids.ptr<int>()); break;
    }
  };
  if (x.dtype == DType::kF32) go_w(x.ptr<const float>());
  else if (x.dtype == DType::kF16) go_w(x.ptr<const __half>());
  else go_w(x.ptr<const __nv_bfloat16>());
  QHEAD_CUDA_CHECK_LAUNCH("rescore_dots_kernel");
  sort_rows_kernel<<<unsigned(M), 256, 0, s>>>(values.ptr<float>(), ids.ptr<int>(), int(k));
  QHEAD_CUDA_CHECK_LAUNCH("sort_rows_kernel");
}

}  // namespace qhead::cuda_ops
