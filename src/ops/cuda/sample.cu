// sample on the GPU: the draws of src/ops/sample.h with the same random
// numbers as the CPU paths.
//   temperature 0      the top-1 (run_topk, k = 1);
//   untruncated        the logits into the workspace, then Gumbel-max: per
//                      (row, column slice) the best l/T + G, then per row;
//   truncated          the top-K candidates of l/T with the log-sum-exp of
//                      l/T (T = 1: the fused top-k; else the logits, scaled,
//                      then the slice selection), then one thread per row
//                      draws by the inverse CDF.
// What the GPU draw cannot settle (top_k > 1024, or a cut without top_k past
// the 1024 candidates) is drawn on the host from the logits (from_logits),
// exactly and with the same random numbers.
#include <algorithm>
#include <vector>

#include "ops/cuda/internal.cuh"
#include "ops/ops_cuda.h"
#include "ops/sample.h"
#include "ops/sample_host.h"

namespace qhead::cuda_ops {

using namespace cuda_detail;
using cuda_plan::LogitsPlan;
using cuda_plan::LogitsProblem;
using cuda_plan::TopkPath;
using cuda_plan::TopkPlan;

namespace {

constexpr int kThreads = 256;
constexpr int64_t kSliceCols = 8192;  // columns per Gumbel block (a multiple of 4)

__global__ void scale_kernel(float* l, int64_t n, float s) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    l[i] *= s;
}

// Larger value first, then lower id; id < 0 is "none yet".
__device__ __forceinline__ bool wins(float v, int i, float bv, int bi) {
  return bi < 0 || (i >= 0 && (v > bv || (v == bv && i < bi)));
}

// Block-wide best (value, id) of each thread's (v, i); the result in thread 0.
__device__ __forceinline__ void block_best(float& v, int& i) {
  __shared__ float sv[kThreads / 32];
  __shared__ int si[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (wins(ov, oi, v, i)) { v = ov; i = oi; }
  }
  const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) { sv[w] = v; si[w] = i; }
  __syncthreads();
  if (w == 0) {
    v = lane < kThreads / 32 ? sv[lane] : -INFINITY;
    i = lane < kThreads / 32 ? si[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, v, o);
      const int oi = __shfl_xor_sync(0xffffffffu, i, o);
      if (wins(ov, oi, v, i)) { v = ov; i = oi; }
    }
  }
}

// Block (b, m): the best l[m, c]·inv_t + G(m, c) over columns
// [b·kSliceCols, (b+1)·kSliceCols) ∩ [0, V), four columns per thread step
// (one Philox call).
__global__ void gumbel_slices_kernel(const float* __restrict__ l, int64_t V, float inv_t, uint64_t seed,
                                     uint64_t offset, float* __restrict__ pv, int* __restrict__ pi) {
  const int m = blockIdx.y, P = gridDim.x;
  const int64_t c0 = int64_t(blockIdx.x) * kSliceCols, c1 = min(V, c0 + kSliceCols);
  const float* row = l + int64_t(m) * V;
  float bv = -INFINITY;
  int bi = -1;
  for (int64_t g = c0 / 4 + threadIdx.x; g * 4 < c1; g += kThreads) {
    const sampling::Philox4 w = sampling::gumbel_words(seed, offset, uint32_t(m), uint32_t(g));
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t c = g * 4 + e;
      if (c >= c1) break;
      const float val = row[c] * inv_t + sampling::gumbel(w.v[e]);
      if (wins(val, int(c), bv, bi)) { bv = val; bi = int(c); }
    }
  }
  block_best(bv, bi);
  if (threadIdx.x == 0) {
    pv[int64_t(m) * P + blockIdx.x] = bv;
    pi[int64_t(m) * P + blockIdx.x] = bi;
  }
}

__global__ void gumbel_rows_kernel(const float* __restrict__ pv, const int* __restrict__ pi, int P,
                                   int* __restrict__ ids) {
  const int m = blockIdx.x;
  float bv = -INFINITY;
  int bi = -1;
  for (int b = threadIdx.x; b < P; b += kThreads)
    if (wins(pv[int64_t(m) * P + b], pi[int64_t(m) * P + b], bv, bi)) {
      bv = pv[int64_t(m) * P + b];
      bi = pi[int64_t(m) * P + b];
    }
  block_best(bv, bi);
  if (threadIdx.x == 0) ids[m] = bi;
}

// One thread per row: the inverse-CDF draw from the row's K sorted
// candidates; pending[m] = 1 where the cut may lie past them.
__global__ void draw_kernel(const float* __restrict__ z, const int* __restrict__ cid, const float* __restrict__ lse,
                            int M, int64_t K, bool whole, sampling::Cut cut, uint64_t seed, uint64_t offset,
                            int* __restrict__ ids, int* __restrict__ pending) {
  const int m = blockIdx.x * blockDim.x + threadIdx.x;
  if (m >= M) return;
  const int j = sampling::draw_sorted(z + int64_t(m) * K, K, double(lse[m]), whole, cut,
                                      sampling::draw_uniform(seed, offset, uint32_t(m)));
  pending[m] = j < 0;
  if (j >= 0) ids[m] = cid[int64_t(m) * K + j];
}

// The logits of the call's plan into the workspace.
float* logits_ws(const Table& table, const TensorView& x, const LogitsProblem& problem, Backend backend) {
  float* l = static_cast<float*>(workspace(kWsLogits, size_t(problem.M * problem.V) * sizeof(float)));
  const LogitsPlan plan = cuda_plan::select_logits_kernel(problem, device_info(), cuda_plan::env_overrides(),
                                                          backend == Backend::kReference ? Backend::kAuto : backend);
  logits_into(table, x, problem, plan, l, problem.V);
  return l;
}

// The exact host draw from the logits (the cases the GPU draw leaves).
void draw_on_host(const float* l, const LogitsProblem& problem, const SampleParams& p, int* ids) {
  cudaStream_t s = current_stream();
  std::vector<float> hl(static_cast<size_t>(problem.M * problem.V));
  std::vector<int32_t> hi(static_cast<size_t>(problem.M));
  QHEAD_CUDA_CHECK(cudaMemcpyAsync(hl.data(), l, hl.size() * sizeof(float), cudaMemcpyDeviceToHost, s));
  QHEAD_CUDA_CHECK(cudaStreamSynchronize(s));
  sampling::from_logits(hl.data(), problem.M, problem.V, p, hi.data());
  QHEAD_CUDA_CHECK(cudaMemcpyAsync(ids, hi.data(), hi.size() * sizeof(int32_t), cudaMemcpyHostToDevice, s));
  QHEAD_CUDA_CHECK(cudaStreamSynchronize(s));  // hi is freed on return
}

}  // namespace

void sample(const Table& table, const TensorView& x, const SampleParams& p, const TensorView& ids, Backend backend) {
  check_act(x, "sample");
  const LogitsProblem problem = logits_problem(table, x);
  const int64_t M = problem.M, V = problem.V;
  if (M == 0) return;
  cudaStream_t s = current_stream();
  int* out = ids.ptr<int>();
  const Backend b = backend == Backend::kReference ? Backend::kAuto : backend;

  if (p.temperature == 0.0f) {
    char* ws = static_cast<char*>(workspace(kWsSample, size_t(M) * 8));
    const TensorView vals(ws, DType::kF32, {M, 1}, Device::kCUDA), lse(ws + M * 4, DType::kF32, {M}, Device::kCUDA);
    run_topk(table, x, 1, vals, TensorView(out, DType::kI32, {M, 1}, Device::kCUDA), lse, b,
             cuda_plan::env_overrides());
    return;
  }
  const float inv_t = 1.0f / p.temperature;

  if (!sampling::truncated(p)) {
    const float* l = logits_ws(table, x, problem, b);
    const int P = int((V + kSliceCols - 1) / kSliceCols);
    char* ws = static_cast<char*>(workspace(kWsSample, size_t(M) * P * 8));
    float* pv = reinterpret_cast<float*>(ws);
    int* pi = reinterpret_cast<int*>(ws + size_t(M) * P * 4);
    gumbel_slices_kernel<<<dim3(unsigned(P), unsigned(M)), kThreads, 0, s>>>(l, V, inv_t, p.seed, p.offset, pv, pi);
    QHEAD_CUDA_CHECK_LAUNCH("gumbel_slices_kernel");
    gumbel_rows_kernel<<<unsigned(M), kThreads, 0, s>>>(pv, pi, P, out);
    QHEAD_CUDA_CHECK_LAUNCH("gumbel_rows_kernel");
    return;
  }

  const int64_t K = p.top_k > 0 ? p.top_k : std::min<int64_t>(V, sampling::kFirstCandidates);
  if (K > cuda_plan::kTopkMaxK) {  // more candidates than the GPU top-k takes
    draw_on_host(logits_ws(table, x, problem, b), problem, p, out);
    return;
  }
  const size_t nk = size_t(M) * size_t(K);
  char* ws = static_cast<char*>(workspace(kWsSample, nk * 8 + size_t(M) * 8));
  float* z = reinterpret_cast<float*>(ws);
  int* cid = reinterpret_cast<int*>(ws + nk * 4);
  float* lse = reinterpret_cast<float*>(ws + nk * 8);
  int* pending = reinterpret_cast<int*>(ws + nk * 8 + size_t(M) * 4);
  const TensorView zv(z, DType::kF32, {M, K}, Device::kCUDA), iv(cid, DType::kI32, {M, K}, Device::kCUDA),
      lv(lse, DType::kF32, {M}, Device::kCUDA);
  if (inv_t == 1.0f) {
    run_topk(table, x, K, zv, iv, lv, b, cuda_plan::env_overrides());
  } else {
    float* lw = logits_ws(table, x, problem, b);
    scale_kernel<<<std::min(blocks_for(M * V, kThreads), 4096), kThreads, 0, s>>>(lw, M * V, inv_t);
    QHEAD_CUDA_CHECK_LAUNCH("scale_kernel");
    cuda_plan::LogitsOverrides ov = cuda_plan::env_overrides();
    ov.topk_path = TopkPath::kLogitsThenSelect;
    const TopkPlan tp = cuda_plan::select_topk_path(problem, K, device_info(), ov, b);
    select_from_logits(lw, M, V, K, tp.select_blocks, tp.select_small, z, cid, lse);
  }
  const bool whole = p.top_k > 0 || K == V;
  draw_kernel<<<blocks_for(M, 128), 128, 0, s>>>(z, cid, lse, int(M), K, whole, sampling::cut_of(p), p.seed,
                                                  p.offset, out, pending);
  QHEAD_CUDA_CHECK_LAUNCH("draw_kernel");
  if (whole) return;
  // Without top_k, a row's top-p or min-p cut may lie past the candidates.
  std::vector<int> hp(static_cast<size_t>(M));
  QHEAD_CUDA_CHECK(cudaMemcpyAsync(hp.data(), pending, hp.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
  QHEAD_CUDA_CHECK(cudaStreamSynchronize(s));
  bool any = false;
  for (int f : hp) any = any || f != 0;
  if (!any) return;
  draw_on_host(logits_ws(table, x, problem, b), problem, p, out);
}

}  // namespace qhead::cuda_ops
