// embed on the GPU: the rows of `ids`, dequantized on the fly.
#include <type_traits>

#include "ops/cuda/internal.cuh"
#include "ops/ops_cuda.h"

namespace qhead::cuda_ops {

using namespace cuda_detail;

namespace {

// embed: one block per id; an id out of range raises *bad and writes nothing.
template <class IdT, class OutT>
__global__ void embed_kernel(TableArgs t, const IdT* __restrict__ ids, OutT* __restrict__ out, int* bad) {
  const int64_t n = blockIdx.x;
  const int64_t id = static_cast<int64_t>(ids[n]);
  if (id < 0 || id >= t.V) {
    if (threadIdx.x == 0) atomicExch(bad, 1);
    return;
  }
  for (int h = threadIdx.x; h < t.H; h += blockDim.x)
    store_out(out, n * t.H + h, dequant_at(t.packed, t.scale, t.stype, t.zp, t.bits, id, h, t.words, t.group, t.groups));
}

}  // namespace

void embed(const Table& table, const TensorView& ids, const TensorView& out) {
  cudaStream_t s = current_stream();
  const int64_t n = ids.size(0);
  if (n == 0) return;
  int* bad = static_cast<int*>(workspace(kWsEmbedFlag, sizeof(int)));
  QHEAD_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(int), s));
  if (!table.is_packed()) fail("embed", "CUDA embed takes a packed table");
  const TableArgs t = table_args(table.packed());
  const bool i64 = ids.dtype == DType::kI64;
  auto go = [&](auto* o) {
    using OutT = std::remove_pointer_t<decltype(o)>;
    if (i64) embed_kernel<int64_t, OutT><<<unsigned(n), 256, 0, s>>>(t, ids.ptr<const int64_t>(), o, bad);
    else embed_kernel<int32_t, OutT><<<unsigned(n), 256, 0, s>>>(t, ids.ptr<const int32_t>(), o, bad);
  };
  if (out.dtype == DType::kF32) go(out.ptr<float>());
  else if (out.dtype == DType::kF16) go(out.ptr<__half>());
  else go(out.ptr<__nv_bfloat16>());
  QHEAD_CUDA_CHECK_LAUNCH("embed_kernel");
  int flag = 0;
  QHEAD_CUDA_CHECK(cudaMemcpyAsync(&flag, bad, sizeof(int), cudaMemcpyDeviceToHost, s));
  QHEAD_CUDA_CHECK(cudaStreamSynchronize(s));
  if (flag) fail("embed", "an id is out of range for a vocab of " + std::to_string(table.vocab()) + " (ids on the GPU)");
}
}  // namespace qhead::cuda_ops
