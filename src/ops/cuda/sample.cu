// sample on the GPU: the draws of src/ops/sample.h with the same random
// numbers as the CPU paths.
//   temperature 0      the top-1 (run_topk, k = 1);
//   untruncated        the logits into the workspace, then Gumbel-max: per
//                      (row, column slice) the best l/T + G, then per row;
//   truncated          the top-K candidates of l/T with the log-sum-exp of
//                      l/T (T = 1: the fused top-k; else the logits, scaled,
//                      then the slice selection), then one warp per row
//                      draws by the inverse CDF.
// What the candidates cannot settle (top_k > 1024, or a cut without top_k
// past the 1024 candidates) is drawn from the whole row, on the GPU: the
// row's l/T sorted by CUB (one device-wide sort per row for a few rows, the
// segmented sort for more), then one block per row draws over it.
#include <algorithm>
#include <limits>
#include <vector>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "cuda/pdl.cuh"
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
                                     uint64_t offset, float* __restrict__ pv, int* __restrict__ pi, bool dependent) {
  const int m = blockIdx.y, P = gridDim.x;
  if (dependent) pdl_wait();  // the logits kernel may still run
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
                                   int* __restrict__ ids, bool dependent) {
  const int m = blockIdx.x;
  if (dependent) pdl_wait();  // gumbel_slices_kernel may still run
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

// Shared-memory slot of candidate i's weight: one double of padding per 32,
// so the lanes' chunks (stride draw_chunk(K)) fall in different banks.
__device__ __forceinline__ int64_t draw_slot(int64_t i) { return i + (i >> 5); }
__host__ __device__ inline size_t draw_slots(int64_t K) { return size_t(K + (K >> 5) + 1); }
constexpr int kDrawWarps = 4;    // rows per block of draw_kernel
constexpr int kPerRowSorts = 8;  // whole rows sorted one device-wide sort each, up to this many

// draw_sorted (sample.h) by one warp, weight(i) giving w_i = exp(z_i - z_0):
// lane c owns chunk c, and every sum is taken in draw_sorted's order (the
// chunks before, added in order, then the chunk's own weights in order), so
// the result is draw_sorted's. total_sum: W is the sum of the K weights (the
// whole top-k set, or a whole sorted row), else exp(lse - z_0).
template <class Weight>
__device__ int draw_sorted_warp(int64_t K, bool total_sum, double lse_minus_z0, bool whole, const sampling::Cut& cut,
                                double u, const Weight& weight) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = int(threadIdx.x & 31);
  const int64_t C = sampling::draw_chunk(K);
  const int64_t b = int64_t(lane) * C, e = b + C < K ? b + C : K;
  double s = 0.0;
  for (int64_t i = b; i < e; ++i) s += weight(i);
  double base = 0.0, run = 0.0;  // base: the chunks before this lane's; run: all of them at the end
  for (int c = 0; c < 32; ++c) {
    const double sc = __shfl_sync(kAll, s, c);
    if (c == lane) base = run;
    run += sc;
  }
  const double total = total_sum ? run : exp(lse_minus_z0);
  const double need = cut.top_p * total;
  int64_t found = -1;
  double acc = base;
  for (int64_t i = b; i < e; ++i) {
    const double wi = weight(i);
    if (i > 0 && wi < cut.min_p) {
      found = i;
      break;
    }
    acc += wi;
    if (cut.top_p < 1.0 && acc >= need) {
      found = i + 1;
      break;
    }
  }
  const unsigned cuts = __ballot_sync(kAll, found >= 0);
  int64_t n;
  if (cuts != 0) {
    n = __shfl_sync(kAll, found, __ffs(cuts) - 1);
  } else {
    if (!whole) return -1;
    n = K;
  }
  const int last = int((n - 1) / C);
  double kept = base;
  for (int64_t i = b; i < e && i < n; ++i) kept += weight(i);
  kept = __shfl_sync(kAll, kept, last);
  const double target = u * kept;
  int64_t j = -1;
  acc = base;
  if (lane <= last)
    for (int64_t i = b; i < e && i < n; ++i) {
      acc += weight(i);
      if (target < acc) {
        j = i;
        break;
      }
    }
  const unsigned hits = __ballot_sync(kAll, j >= 0);
  return hits != 0 ? int(__shfl_sync(kAll, j, __ffs(hits) - 1)) : int(n - 1);
}

// One warp per row: the inverse-CDF draw from the row's K sorted candidates
// (their weights computed once, in parallel, into shared memory); pending[m]
// = 1 where the cut may lie past them.
__global__ void draw_kernel(const float* __restrict__ z, const int* __restrict__ cid, const float* __restrict__ lse,
                            int M, int64_t K, bool whole, sampling::Cut cut, uint64_t seed, uint64_t offset,
                            int* __restrict__ ids, int* __restrict__ pending, bool dependent) {
  extern __shared__ double draw_w[];
  if (dependent) pdl_wait();  // the top-k or selection that wrote z, cid and lse may still run
  const int warp = int(threadIdx.x >> 5), lane = int(threadIdx.x & 31);
  const int m = blockIdx.x * kDrawWarps + warp;
  if (m >= M) return;  // whole warps leave: the draw synchronizes within its warp only
  double* w = draw_w + size_t(warp) * draw_slots(K);
  const float* zr = z + int64_t(m) * K;
  const double z0 = zr[0];
  for (int64_t i = lane; i < K; i += 32) w[draw_slot(i)] = exp(double(zr[i]) - z0);
  __syncwarp();
  const int j = draw_sorted_warp(K, cut.top_k, double(lse[m]) - z0, whole, cut,
                                 sampling::draw_uniform(seed, offset, uint32_t(m)),
                                 [w](int64_t i) { return w[draw_slot(i)]; });
  if (lane == 0) {
    pending[m] = j < 0;
    if (j >= 0) ids[m] = cid[int64_t(m) * K + j];
  }
}

// ids[r, j] = j for the listed rows r = rows[blockIdx.y].
__global__ void row_iota_kernel(int* __restrict__ ids, int64_t V, const int* __restrict__ rows) {
  int* row = ids + int64_t(rows[blockIdx.y]) * V;
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < V; j += int64_t(gridDim.x) * blockDim.x)
    row[j] = int(j);
}

// One block per listed row: the draw from the first K tokens of its sorted
// row zs (l/T descending, ties lower id first; ids in sid), W the sum of
// those K weights (the top-k set, or the whole row). Prefix sums in f64 over
// tiles of kRowThreads · kRowItems weights (a thread's items in order, then a
// block scan): its own fixed order, which differs from draw_sorted's only in
// f64 rounding, far below the logits' own.
constexpr int kRowThreads = 512, kRowItems = 8;
constexpr int64_t kRowTile = int64_t(kRowThreads) * kRowItems;

__global__ void __launch_bounds__(kRowThreads) draw_rows_kernel(
    const float* __restrict__ zs, const int* __restrict__ sid, int64_t V, int64_t K, const int* __restrict__ rows,
    sampling::Cut cut, uint64_t seed, uint64_t offset, int* __restrict__ ids) {
  using Reduce = cub::BlockReduce<double, kRowThreads>;
  using Scan = cub::BlockScan<double, kRowThreads>;
  __shared__ union {
    typename Reduce::TempStorage reduce;
    typename Scan::TempStorage scan;
  } tmp;
  __shared__ double sh_d;
  __shared__ long long sh_i;
  const int m = rows[blockIdx.x];
  const float* z = zs + int64_t(m) * V;
  const double z0 = z[0];
  const int tid = int(threadIdx.x);
  // W, and the min-p cut: the weights descend, so it is the first i > 0 below min_p.
  double part = 0.0;
  long long below = K;
  for (int64_t i = tid; i < K; i += kRowThreads) {
    const double w = exp(double(z[i]) - z0);
    part += w;
    if (i > 0 && w < cut.min_p && i < below) below = i;
  }
  const double total = Reduce(tmp.reduce).Sum(part);
  if (tid == 0) sh_d = total;
  __syncthreads();
  const double need = cut.top_p * sh_d;
  __syncthreads();
  below = Reduce(tmp.reduce).Reduce(below, ::cuda::minimum<>{});  // valid in thread 0
  if (tid == 0) sh_i = below;
  __syncthreads();
  const int64_t n_minp = sh_i;
  __syncthreads();
  // Runs the tiles of prefix sums over i < n until pick(prefix through i)
  // holds for some i; returns the first such i, or -1.
  auto first_where = [&](int64_t n, auto pick) -> int64_t {
    double run = 0.0;
    for (int64_t t0 = 0; t0 < n; t0 += kRowTile) {
      double w[kRowItems], own = 0.0;
#pragma unroll
      for (int j = 0; j < kRowItems; ++j) {
        const int64_t i = t0 + int64_t(tid) * kRowItems + j;
        w[j] = i < n ? exp(double(z[i]) - z0) : 0.0;
        own += w[j];
      }
      double before, tile_total;
      Scan(tmp.scan).ExclusiveSum(own, before, tile_total);
      long long hit = n;
      double acc = run + before;
#pragma unroll
      for (int j = 0; j < kRowItems; ++j) {
        const int64_t i = t0 + int64_t(tid) * kRowItems + j;
        acc += w[j];
        if (i < n && hit == n && pick(acc)) hit = i;
      }
      __syncthreads();
      const long long first = Reduce(tmp.reduce).Reduce(hit, ::cuda::minimum<>{});
      if (tid == 0) sh_i = first;
      __syncthreads();
      const long long found = sh_i;
      __syncthreads();
      if (found < n) return found;
      run += tile_total;
    }
    return -1;
  };
  int64_t n = n_minp;
  if (cut.top_p < 1.0) {
    const int64_t i = first_where(n_minp, [need](double prefix) { return prefix >= need; });
    if (i >= 0) n = i + 1;
  }
  // kept: the weight of the prefix 0 .. n - 1.
  part = 0.0;
  for (int64_t i = tid; i < n; i += kRowThreads) part += exp(double(z[i]) - z0);
  const double kept_sum = Reduce(tmp.reduce).Sum(part);
  if (tid == 0) sh_d = kept_sum;
  __syncthreads();
  const double target = sampling::draw_uniform(seed, offset, uint32_t(m)) * sh_d;
  __syncthreads();
  int64_t j = first_where(n, [target](double prefix) { return target < prefix; });
  if (j < 0) j = n - 1;  // u·kept rounded up to kept
  if (tid == 0) ids[m] = sid[int64_t(m) * V + j];
}

// The logits of the call's plan into the workspace.
float* logits_ws(const Table& table, const TensorView& x, const LogitsProblem& problem, Backend backend,
                 const cuda_plan::LogitsOverrides& ov) {
  float* l = static_cast<float*>(workspace(kWsLogits, size_t(problem.M * problem.V) * sizeof(float)));
  const LogitsPlan plan = cuda_plan::select_logits_kernel(problem, device_info(), ov,
                                                          backend == Backend::kReference ? Backend::kAuto : backend);
  logits_into(table, x, problem, plan, l, problem.V);
  return l;
}

// The rows `rows` (host list) drawn from their whole row on the GPU: l/T of
// each into the workspace, a stable radix sort of each row (descending; CUB
// orders -0 and +0 as equal, so ties keep the lower id first), then
// draw_rows_kernel over the first K tokens of each.
void draw_whole_rows(const Table& table, const TensorView& x, const LogitsProblem& problem, Backend backend,
                     const cuda_plan::LogitsOverrides& ov, float inv_t, int64_t K, const SampleParams& p,
                     const std::vector<int>& rows, int* ids) {
  cudaStream_t s = current_stream();
  const int64_t M = problem.M, V = problem.V;
  float* l = logits_ws(table, x, problem, backend, ov);
  if (inv_t != 1.0f) {
    scale_kernel<<<std::min(blocks_for(M * V, kThreads), 4096), kThreads, 0, s>>>(l, M * V, inv_t);
    QHEAD_CUDA_CHECK_LAUNCH("scale_kernel");
  }
  // CUB counts items and offsets in int: the rows go in groups whose span fits.
  const int64_t group = std::max<int64_t>(1, std::numeric_limits<int>::max() / V);
  const int R = int(rows.size());
  const size_t mv = size_t(M) * size_t(V);
  // A few rows: one device-wide sort each (the segmented sort gives a segment
  // one block, slow on a 150k-token row); more: the segmented sort.
  const bool per_row = R <= kPerRowSorts;
  size_t temp = 0;
  if (per_row) {
    QHEAD_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
        nullptr, temp, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
        static_cast<const int*>(nullptr), static_cast<int*>(nullptr), int(V), 0, 32, s));
  } else {
    const int64_t span = std::min<int64_t>(group, M) * V;
    QHEAD_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        nullptr, temp, static_cast<const float*>(nullptr), static_cast<float*>(nullptr),
        static_cast<const int*>(nullptr), static_cast<int*>(nullptr), int(span), R, static_cast<int*>(nullptr),
        static_cast<int*>(nullptr), 0, 32, s));
  }
  const size_t off_bytes = (size_t(R) * 3 + 1) * sizeof(int);  // rows, begins, ends
  char* ws = static_cast<char*>(workspace(kWsSampleSort, mv * 12 + off_bytes + temp + 256));
  float* zs = reinterpret_cast<float*>(ws);
  int* iin = reinterpret_cast<int*>(ws + mv * 4);
  int* iout = reinterpret_cast<int*>(ws + mv * 8);
  int* drows = reinterpret_cast<int*>(ws + mv * 12);
  int* dbeg = drows + R;
  int* dend = dbeg + R;
  void* dtemp = ws + ((mv * 12 + off_bytes + 255) / 256) * 256;
  // Groups: consecutive listed rows within `group` rows of the group's first
  // (rows ascend); a row's segment offsets are relative to its group's first.
  std::vector<int> offs(size_t(R) * 3);
  std::vector<std::pair<int, int>> groups;
  for (int i0 = 0; i0 < R;) {
    const int64_t first = rows[size_t(i0)];
    int i1 = i0;
    for (; i1 < R && rows[size_t(i1)] - first < group; ++i1) {
      offs[size_t(i1)] = rows[size_t(i1)];
      offs[size_t(R + i1)] = int((rows[size_t(i1)] - first) * V);
      offs[size_t(2 * R + i1)] = offs[size_t(R + i1)] + int(V);
    }
    groups.emplace_back(i0, i1);
    i0 = i1;
  }
  QHEAD_CUDA_CHECK(cudaMemcpyAsync(drows, offs.data(), offs.size() * sizeof(int), cudaMemcpyHostToDevice, s));
  row_iota_kernel<<<dim3(unsigned(std::min<int64_t>(blocks_for(V, kThreads), 64)), unsigned(R)), kThreads, 0, s>>>(
      iin, V, drows);
  QHEAD_CUDA_CHECK_LAUNCH("row_iota_kernel");
  for (int i = 0; per_row && i < R; ++i) {
    const int64_t o = int64_t(rows[size_t(i)]) * V;
    size_t t = temp;
    QHEAD_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(dtemp, t, l + o, zs + o, iin + o, iout + o, int(V), 0,
                                                               32, s));
  }
  for (const auto& [i0, i1] : per_row ? decltype(groups){} : groups) {
    const int64_t first = rows[size_t(i0)];
    const int64_t span = (rows[size_t(i1 - 1)] - first + 1) * V;
    size_t t = temp;
    QHEAD_CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
        dtemp, t, l + first * V, zs + first * V, iin + first * V, iout + first * V, int(span), i1 - i0, dbeg + i0,
        dend + i0, 0, 32, s));
  }
  // offs is pageable: each copy from it has finished when cudaMemcpyAsync returned.
  draw_rows_kernel<<<unsigned(R), kRowThreads, 0, s>>>(zs, iout, V, K, drows, sampling::cut_of(p), p.seed, p.offset,
                                                      ids);
  QHEAD_CUDA_CHECK_LAUNCH("draw_rows_kernel");
}

}  // namespace

void run_sample(const Table& table, const TensorView& x, const SampleParams& p, const TensorView& ids, Backend backend,
                const cuda_plan::LogitsOverrides& ov) {
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
    run_topk(table, x, 1, vals, TensorView(out, DType::kI32, {M, 1}, Device::kCUDA), lse, b, ov);
    return;
  }
  const float inv_t = 1.0f / p.temperature;
  // The kernels after the logits or the top-k as their programmatic dependents (cuda/pdl.cuh).
  const bool dep = cuda_plan::dependent_launch(device_info(), ov);

  if (!sampling::truncated(p)) {
    const float* l = logits_ws(table, x, problem, b, ov);
    const int P = int((V + kSliceCols - 1) / kSliceCols);
    char* ws = static_cast<char*>(workspace(kWsSample, size_t(M) * P * 8));
    float* pv = reinterpret_cast<float*>(ws);
    int* pi = reinterpret_cast<int*>(ws + size_t(M) * P * 4);
    launch_kernel(dep, "gumbel_slices_kernel", gumbel_slices_kernel, dim3(unsigned(P), unsigned(M)), dim3(kThreads), 0,
                  s, l, V, inv_t, p.seed, p.offset, pv, pi, dep);
    launch_kernel(dep, "gumbel_rows_kernel", gumbel_rows_kernel, dim3(unsigned(M)), dim3(kThreads), 0, s,
                  static_cast<const float*>(pv), static_cast<const int*>(pi), P, out, dep);
    return;
  }

  const int64_t K = p.top_k > 0 ? p.top_k : std::min<int64_t>(V, sampling::kFirstCandidates);
  if (K > cuda_plan::kTopkMaxK) {  // more candidates than the GPU top-k takes: every row sorted
    std::vector<int> all(static_cast<size_t>(M));
    for (int64_t i = 0; i < M; ++i) all[static_cast<size_t>(i)] = int(i);
    draw_whole_rows(table, x, problem, b, ov, inv_t, K, p, all, out);
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
    run_topk(table, x, K, zv, iv, lv, b, ov);
  } else {
    float* lw = logits_ws(table, x, problem, b, ov);
    scale_kernel<<<std::min(blocks_for(M * V, kThreads), 4096), kThreads, 0, s>>>(lw, M * V, inv_t);
    QHEAD_CUDA_CHECK_LAUNCH("scale_kernel");
    cuda_plan::LogitsOverrides sel = ov;
    sel.topk_path = TopkPath::kLogitsThenSelect;
    const TopkPlan tp = cuda_plan::select_topk_path(problem, K, device_info(), sel, b);
    select_from_logits(lw, M, V, K, tp.select_blocks, tp.select_small, z, cid, lse, tp.dependent_launch);
  }
  const bool whole = p.top_k > 0 || K == V;
  const size_t draw_bytes = size_t(kDrawWarps) * draw_slots(K) * sizeof(double);  // <= 33 KB: K <= 1024
  launch_kernel(dep, "draw_kernel", draw_kernel, dim3(unsigned(blocks_for(M, kDrawWarps))), dim3(kDrawWarps * 32),
                draw_bytes, s, static_cast<const float*>(z), static_cast<const int*>(cid),
                static_cast<const float*>(lse), int(M), K, whole, sampling::cut_of(p), p.seed, p.offset, out, pending,
                dep);
  if (whole) return;
  // Without top_k, a row's top-p or min-p cut may lie past the candidates.
  std::vector<int> hp(static_cast<size_t>(M)), rows;
  QHEAD_CUDA_CHECK(cudaMemcpyAsync(hp.data(), pending, hp.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
  QHEAD_CUDA_CHECK(cudaStreamSynchronize(s));
  for (int64_t i = 0; i < M; ++i)
    if (hp[static_cast<size_t>(i)] != 0) rows.push_back(int(i));
  if (rows.empty()) return;
  draw_whole_rows(table, x, problem, b, ov, inv_t, V, p, rows, out);
}

void sample(const Table& table, const TensorView& x, const SampleParams& p, const TensorView& ids, Backend backend) {
  run_sample(table, x, p, ids, backend, cuda_plan::env_overrides());
}

}  // namespace qhead::cuda_ops
