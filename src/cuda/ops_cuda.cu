// CUDA ops: the entry points ops.cc dispatches to for tables on the GPU,
// and the small kernels they use (activation permutation, gather, full
// dequantization for the cuBLAS fallback, top-k, rescoring).
#include <cublas_v2.h>

#include <mutex>
#include <string>

#include "common.cuh"
#include "logits.cuh"
#include "ops/ops_cuda.h"
#include "qhead/cuda.h"

namespace qhead {
namespace cuda_detail {
std::shared_ptr<const void> device_alloc(size_t bytes);
}  // namespace cuda_detail

namespace cuda_ops {

using namespace cuda_detail;

namespace {

[[noreturn]] void fail(const char* op, const std::string& what) { throw Error(ErrorCode::kInvalidArgument, op, what); }

// ---- workspace and cuBLAS handle (process-wide, reused across calls) ------------

struct Workspace {
  std::mutex mu;
  std::shared_ptr<const void> block;
  size_t bytes = 0;
};
// One grow-only buffer per use, so buffers of one call never alias.
enum WorkspaceSlot : int {
  kWsActivations = 0,  // B-fragment-ordered activations of the fused kernel
  kWsDenseTable,       // the fallback's dequantized [V, H] table
  kWsLogits,           // [M, V] logits the top-k reads
  kWsTopkCandidates,   // stage-1 top-k candidates and partial sums
  kWsEmbedFlag,        // embed's out-of-range flag
  kWsCount
};
Workspace& workspace_slot(int i) {
  static Workspace w[kWsCount];
  return w[i];
}
// Grow-only scratch buffer `slot` of at least `bytes` (stream-ordered reuse).
void* workspace(int slot, size_t bytes) {
  Workspace& w = workspace_slot(slot);
  std::lock_guard<std::mutex> lock(w.mu);
  if (w.bytes < bytes) {
    QHEAD_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
    w.block.reset();
    w.block = device_alloc(bytes);
    w.bytes = bytes;
  }
  return const_cast<void*>(w.block.get());
}

cublasHandle_t blas() {
  static cublasHandle_t h = [] {
    cublasHandle_t x = nullptr;
    if (cublasCreate(&x) != CUBLAS_STATUS_SUCCESS)
      throw Error(ErrorCode::kInternal, "cuda", "cublasCreate failed");
    return x;
  }();
  cublasSetStream(h, current_stream());
  return h;
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::kInternal, "cuda", std::string(what) + " failed: cuBLAS status " + std::to_string(int(s)));
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

int scale_type(DType t) { return t == DType::kF16 ? kScaleF16 : t == DType::kBF16 ? kScaleBF16 : kScaleF32; }

int blocks_for(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

// ---- kernels ------------------------------------------------------------------------

// Dequantized value of (row, h) in f32 — exact.
__device__ __forceinline__ float dequant_at(const uint32_t* packed, const void* scale, int stype, const uint32_t* zp,
                                            int bits, int64_t row, int h, int words, int group, int groups) {
  const int grp = h / group;
  const int q = int(stored_code(packed + row * words, h, bits, 1)) - (1 << (bits - 1));
  const int z = zp ? zero_point(zp, groups, row, grp, bits) : 0;
  return float(q - z) * load_scale(scale, stype, row * groups + grp);
}

struct TableArgs {
  const uint32_t* packed;
  const void* scale;
  int stype;
  const uint32_t* zp;
  int bits, words, group, groups;
  int64_t V;
  int H;
};

TableArgs table_args(const PackedTable& p) {
  TableArgs t;
  t.packed = static_cast<const uint32_t*>(p.packed.data());
  t.scale = p.scale.data();
  t.stype = scale_type(p.scheme.scale_dtype);
  t.zp = p.scheme.symmetric ? nullptr : static_cast<const uint32_t*>(p.zero_point.data());
  t.bits = p.scheme.bits;
  t.words = static_cast<int>(p.scheme.packed_cols(p.hidden));
  t.group = static_cast<int>(p.scheme.group_len(p.hidden));
  t.groups = static_cast<int>(p.scheme.groups(p.hidden));
  t.V = p.vocab;
  t.H = static_cast<int>(p.hidden);
  return t;
}

template <class OutT>
__device__ __forceinline__ void store_out(OutT* p, int64_t i, float v) {
  if constexpr (std::is_same_v<OutT, float>) p[i] = v;
  else if constexpr (std::is_same_v<OutT, __half>) p[i] = __float2half_rn(v);
  else p[i] = __float2bfloat16_rn(v);
}

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

// ---- top-k over materialized logits (block per row) ---------------------------------

__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);  // larger float → larger key
}

constexpr int kTopkThreads = 1024;
constexpr int kMaxK = 1024;

// Sorts n (≤ 2·kTopkThreads, padded to a power of two) candidates in shared
// memory: value descending, then id ascending.
__device__ void bitonic_sort(float* v, int* id, int n) {
  for (int size = 2; size <= n; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool up = (i & size) == 0;
          // "a before b" = a better than b
          const bool i_better = v[i] > v[j] || (v[i] == v[j] && id[i] < id[j]);
          if (up != i_better) {
            const float tv = v[i]; v[i] = v[j]; v[j] = tv;
            const int ti = id[i]; id[i] = id[j]; id[j] = ti;
          }
        }
      }
      __syncthreads();
    }
  }
}

// Block-wide sums (returns the total to every thread).
template <class V>
__device__ V block_sum(V x, V* scratch) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) scratch[w] = x;
  __syncthreads();
  V t = 0;
  for (int i = 0; i < int(blockDim.x >> 5); ++i) t += scratch[i];
  return t;
}
__device__ float block_max(float x, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) scratch[w] = x;
  __syncthreads();
  float t = -INFINITY;
  for (int i = 0; i < int(blockDim.x >> 5); ++i) t = fmaxf(t, scratch[i]);
  return t;
}

// Top-k of n values of one row by one block: value descending, ties to the
// lower id. Ids are id_base + i, or ids[i] when given (the merge stage; ties
// must then appear in increasing id order in the array, which stage 1's
// output does). Radix select on order-preserving keys finds the k-th largest
// key in four 8-bit passes; then everything above it, and the first ties
// equal to it, are gathered in array order and sorted. Writes k results
// (padded with −inf / INT_MAX when n < k).
struct TopkSmem {
  unsigned hist[256];
  float sv[kMaxK];
  int si[kMaxK];
  unsigned warp_ties[32];
  unsigned prefix, need, count, ties;
};

__device__ void block_topk(const float* __restrict__ vals, const int* __restrict__ ids, int64_t id_base, int64_t n,
                           int k, float* out_v, int* out_i, TopkSmem& sm) {
  const int kk = int(n < int64_t(k) ? n : int64_t(k));
  if (threadIdx.x == 0) { sm.prefix = 0; sm.need = kk; }
  __syncthreads();
  for (int shift = 24; shift >= 0 && kk > 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sm.hist[i] = 0;
    __syncthreads();
    const uint32_t mask_hi = shift == 24 ? 0u : (0xFFFFFFFFu << (shift + 8));
    const uint32_t prefix = sm.prefix;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t key = order_key(vals[i]);
      if ((key & mask_hi) == prefix) atomicAdd(&sm.hist[(key >> shift) & 0xFFu], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned need = sm.need, cum = 0;
      int d = 255;
      for (; d > 0; --d) {
        if (cum + sm.hist[d] >= need) break;
        cum += sm.hist[d];
      }
      sm.need = need - cum;
      sm.prefix = prefix | (uint32_t(d) << shift);
    }
    __syncthreads();
  }
  const uint32_t kth = sm.prefix;
  const unsigned ties_wanted = kk > 0 ? sm.need : 0;
  if (threadIdx.x == 0) { sm.count = 0; sm.ties = 0; }
  __syncthreads();
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  for (int64_t base = 0; base < n && kk > 0; base += blockDim.x) {
    const int64_t i = base + threadIdx.x;
    const float v = i < n ? vals[i] : -INFINITY;
    const uint32_t key = i < n ? order_key(v) : 0u;
    const bool gt = i < n && key > kth;
    const bool eq = i < n && key == kth;
    const int id = i < n ? (ids ? ids[i] : int(id_base + i)) : 0;
    if (gt) {
      const unsigned pos = atomicAdd(&sm.count, 1u);
      sm.sv[pos] = v;
      sm.si[pos] = id;
    }
    const unsigned bal = __ballot_sync(0xffffffffu, eq);
    if (l == 0) sm.warp_ties[w] = __popc(bal);
    __syncthreads();
    unsigned before = sm.ties;
    for (int j = 0; j < w; ++j) before += sm.warp_ties[j];
    before += __popc(bal & ((1u << l) - 1u));
    if (eq && before < ties_wanted) {
      const unsigned pos = atomicAdd(&sm.count, 1u);
      sm.sv[pos] = v;
      sm.si[pos] = id;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned tot = 0;
      for (int j = 0; j < int(blockDim.x >> 5); ++j) tot += sm.warp_ties[j];
      sm.ties += tot;
    }
    __syncthreads();
  }
  int np = 1;
  while (np < k) np <<= 1;
  for (int i = kk + threadIdx.x; i < np; i += blockDim.x) { sm.sv[i] = -INFINITY; sm.si[i] = 0x7fffffff; }
  __syncthreads();
  bitonic_sort(sm.sv, sm.si, np);
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    out_v[i] = sm.sv[i];
    out_i[i] = sm.si[i];
  }
  __syncthreads();
}

constexpr int64_t kTopkSlice = 4096;  // vocab entries per stage-1 block

// Stage 1: block (p, m) takes slice p of row m: its top-k candidates and its
// (max, Σ exp(l − max)) for the log-sum-exp.
__global__ void __launch_bounds__(kTopkThreads) topk_stage1_kernel(const float* __restrict__ logits, int64_t V, int k,
                                                                    int P, float* cand_v, int* cand_i, float* pmax,
                                                                    float* psum) {
  __shared__ TopkSmem sm;
  __shared__ float fscratch[32];
  const int p = blockIdx.x, m = blockIdx.y;
  const int64_t b = int64_t(p) * kTopkSlice, e = (V < b + kTopkSlice) ? V : b + kTopkSlice;
  const float* row = logits + int64_t(m) * V + b;
  float mx = -INFINITY;
  for (int64_t i = threadIdx.x; i < e - b; i += blockDim.x) mx = fmaxf(mx, row[i]);
  mx = block_max(mx, fscratch);
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < e - b; i += blockDim.x) s += __expf(row[i] - mx);
  s = block_sum(s, fscratch);
  if (threadIdx.x == 0) { pmax[int64_t(m) * P + p] = mx; psum[int64_t(m) * P + p] = s; }
  const int64_t o = (int64_t(m) * P + p) * k;
  block_topk(row, nullptr, b, e - b, k, cand_v + o, cand_i + o, sm);
}

// Stage 2: one block per row merges the P·k candidates and the P partial sums.
__global__ void __launch_bounds__(kTopkThreads) topk_stage2_kernel(const float* cand_v, const int* cand_i, const float* pmax,
                                                                    const float* psum, int P, int k, float* values,
                                                                    int* ids, float* lse) {
  __shared__ TopkSmem sm;
  __shared__ double dscratch[32];
  __shared__ float fscratch[32];
  const int m = blockIdx.x;
  float mx = -INFINITY;
  for (int p = threadIdx.x; p < P; p += blockDim.x) mx = fmaxf(mx, pmax[int64_t(m) * P + p]);
  mx = block_max(mx, fscratch);
  double s = 0.0;
  for (int p = threadIdx.x; p < P; p += blockDim.x)
    s += double(psum[int64_t(m) * P + p]) * exp(double(pmax[int64_t(m) * P + p]) - double(mx));
  s = block_sum(s, dscratch);
  if (threadIdx.x == 0) lse[m] = float(double(mx) + log(s));
  const int64_t o = int64_t(m) * P * k;
  block_topk(cand_v + o, cand_i + o, 0, int64_t(P) * k, k, values + int64_t(m) * k, ids + int64_t(m) * k, sm);
}

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

// ---- helpers ---------------------------------------------------------------------------

void check_act(const TensorView& x, const char* op) {
  if (x.dtype != DType::kF16 && x.dtype != DType::kBF16)
    fail(op, std::string("CUDA ops take F16 or BF16 activations, got ") + dtype_name(x.dtype));
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

void gemm_fallback(const Table& table, const TensorView& x, float* out, int64_t ldo) {
  cudaStream_t s = current_stream();
  const DType wt = table.is_packed() ? x.dtype : table.dense().dtype();
  if (!table.is_packed() && wt != x.dtype)
    fail("logits", std::string("dense CUDA table is ") + dtype_name(wt) + " but x is " + dtype_name(x.dtype) +
                       "; they must match");
  const void* w = dense_operand(table, wt, s);
  const int V = static_cast<int>(table.vocab()), H = static_cast<int>(table.hidden()), M = static_cast<int>(x.size(0));
  gemm_xwt(w, cuda_type(wt), x.data, cuda_type(x.dtype), out, V, H, M, ldo);
}

// Fused logits into out (ld ldo); returns false when the table/shape has no fast path.
bool fused_logits(const Table& table, const TensorView& x, float* out, int64_t ldo) {
  if (!table.is_packed()) return false;
  const PackedTable& p = table.packed();
  const int bits = p.scheme.bits;
  if (bits != 4 && bits != 8) return false;
  const int group = static_cast<int>(p.scheme.group_len(p.hidden));
  if (pick_piece_bytes(bits, group) == 0) return false;
  cudaStream_t s = current_stream();
  const int64_t mpad = (x.size(0) + 7) / 8 * 8;
  void* xp = workspace(kWsActivations, size_t(mpad * p.hidden) * 2);
  LogitsArgs a;
  a.packed = static_cast<const uint32_t*>(p.packed.data());
  a.scale = p.scale.data();
  a.scale_type = scale_type(p.scheme.scale_dtype);
  a.zp = p.scheme.symmetric ? nullptr : static_cast<const uint32_t*>(p.zero_point.data());
  a.x = x.data;
  a.x_frag = xp;
  a.out = out;
  a.ldo = ldo;
  a.V = p.vocab;
  a.H = static_cast<int>(p.hidden);
  a.group = group;
  a.groups = static_cast<int>(p.scheme.groups(p.hidden));
  a.M = static_cast<int>(x.size(0));
  if (a.M == 0 || a.V == 0) return true;
  if (bits == 4) return x.dtype == DType::kF16 ? launch_logits_w4_f16(a, s) : launch_logits_w4_bf16(a, s);
  return x.dtype == DType::kF16 ? launch_logits_w8_f16(a, s) : launch_logits_w8_bf16(a, s);
}

}  // namespace

// ---- entry points ---------------------------------------------------------------------

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

// Above this many activation rows the tensor-core path of logits.cuh is
// slower than dequantize + cuBLAS on the H200 (151936x1024 w4g64, M = 256:
// 820 us fused vs ~250 us); until the GEMM path is rewritten, larger batches
// take the fallback. See docs/performance.md.
constexpr int64_t kFusedMaxM = 64;

// Whether `backend` wants the fused kernel for M activation rows.
bool want_fused(Backend backend, int64_t M) {
  if (backend == Backend::kFallbackBlas) return false;
  return backend == Backend::kFused || M <= kFusedMaxM;
}

void logits(const Table& table, const TensorView& x, const TensorView& out, Backend backend) {
  check_act(x, "logits");
  if (want_fused(backend, x.size(0)) && fused_logits(table, x, out.ptr<float>(), table.vocab())) return;
  gemm_fallback(table, x, out.ptr<float>(), table.vocab());
}

void topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
          const TensorView& lse, Backend backend) {
  // The top-k epilogue is not fused into the logits kernel yet: logits into a
  // workspace, then the two-stage top-k.
  check_act(x, "topk");
  if (k > kMaxK) fail("topk", "CUDA top-k takes k <= " + std::to_string(kMaxK) + ", got " + std::to_string(k));
  const int64_t M = x.size(0), V = table.vocab();
  float* l = static_cast<float*>(workspace(kWsLogits, size_t(M * V) * sizeof(float)));
  if (!want_fused(backend, M) || !fused_logits(table, x, l, V)) gemm_fallback(table, x, l, V);
  if (M == 0) return;
  // Two stages: slices of 4096 logits per block in parallel, then a merge.
  const int P = int((V + kTopkSlice - 1) / kTopkSlice);
  char* ws = static_cast<char*>(workspace(kWsTopkCandidates, size_t(M) * P * (2 * size_t(k) + 2) * 4));
  float* cv = reinterpret_cast<float*>(ws);
  int* ci = reinterpret_cast<int*>(cv + M * P * k);
  float* pm = reinterpret_cast<float*>(ci + M * P * k);
  float* ps = pm + M * P;
  cudaStream_t s = current_stream();
  topk_stage1_kernel<<<dim3(unsigned(P), unsigned(M)), 512, 0, s>>>(l, V, int(k), P, cv, ci, pm, ps);
  QHEAD_CUDA_CHECK_LAUNCH("topk_stage1_kernel");
  topk_stage2_kernel<<<unsigned(M), 512, 0, s>>>(cv, ci, pm, ps, P, int(k), values.ptr<float>(), ids.ptr<int>(),
                                                 lse.ptr<float>());
  QHEAD_CUDA_CHECK_LAUNCH("topk_stage2_kernel");
}

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

}  // namespace cuda_ops

namespace cuda_detail {

void gemm_xwt(const void* w, cudaDataType_t wt, const void* x, cudaDataType_t xt, float* out, int V, int H, int M,
              int64_t ldo) {
  const float alpha = 1.0f, beta = 0.0f;
  // out[M, V] (row-major) = (W[V, H] · x[M, H]ᵀ) seen column-major as [V, M].
  cuda_ops::check_blas(cublasGemmEx(cuda_ops::blas(), CUBLAS_OP_T, CUBLAS_OP_N, V, M, H, &alpha, w, wt, H, x, xt, H,
                                    &beta, out, CUDA_R_32F, static_cast<int>(ldo), CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT),
                       "cublasGemmEx");
}

}  // namespace cuda_detail
}  // namespace qhead
