// Column gather/scatter by a permutation (see src/ops/ops_perm.h): one
// thread per element, perm read through the read-only cache. The activations
// of a decode step are a few KB, so this is a launch, not a bandwidth cost.
#include "common.cuh"
#include "ops/ops_perm.h"

namespace qhead::cuda_ops {
namespace {

// SCATTER = false: dst[m, j] = src[m, perm[j]]; true: dst[m, perm[j]] = src[m, j].
template <class T, bool SCATTER>
__global__ void permute_columns_kernel(const T* __restrict__ src, const int32_t* __restrict__ perm,
                                       T* __restrict__ dst, int64_t m, int64_t h) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * h) return;
  const int64_t r = i / h, j = i % h;
  const int64_t p = __ldg(perm + j);
  if (SCATTER)
    dst[r * h + p] = src[i];
  else
    dst[i] = src[r * h + p];
}

template <bool SCATTER>
void launch(const TensorView& src, const TensorView& perm, const TensorView& dst) {
  const int64_t m = src.size(0), h = src.size(1), n = m * h;
  if (n == 0) return;
  const int threads = 256;
  const unsigned blocks = static_cast<unsigned>((n + threads - 1) / threads);
  cudaStream_t s = cuda_detail::current_stream();
  const int32_t* p = perm.ptr<const int32_t>();
  if (dtype_size(src.dtype) == 4)
    permute_columns_kernel<uint32_t, SCATTER><<<blocks, threads, 0, s>>>(src.ptr<const uint32_t>(), p, dst.ptr<uint32_t>(), m, h);
  else
    permute_columns_kernel<uint16_t, SCATTER><<<blocks, threads, 0, s>>>(src.ptr<const uint16_t>(), p, dst.ptr<uint16_t>(), m, h);
  QHEAD_CUDA_CHECK_LAUNCH("permute_columns_kernel");
}

}  // namespace

void gather_columns(const TensorView& src, const TensorView& perm, const TensorView& dst) {
  launch<false>(src, perm, dst);
}
void scatter_columns(const TensorView& src, const TensorView& perm, const TensorView& dst) {
  launch<true>(src, perm, dst);
}

}  // namespace qhead::cuda_ops
