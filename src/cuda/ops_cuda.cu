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
  kWsTopkCandidates,   // level-0 top-k candidates and partial sums
  kWsTopkLevels,       // the merge levels' candidates (two buffers)
  kWsTopkSample,       // the list top-k's threshold sample: its logits [M, 8192], the thresholds [M]
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

// ---- top-k selection (block per row or slice) ---------------------------------------
//
// Candidates are 64-bit entries (common.cuh): entry order is the reference's
// top-k order, and entries are distinct (distinct ids), so "the k largest
// entries" is exactly the top-k. block_select finds them for one row in a
// few passes over the row's entries, never sorting the row:
//   1. a threshold: the k-th largest of the threads' own maxima bounds the
//      row's k-th entry from below (k distinct entries reach it), found to 16
//      bits by two 8-bit radix passes over the T maxima only — so entries
//      >= it are usually k to a few k;
//   2. those entries are gathered into shared memory and sorted there.
// When the gather would overflow (heavy ties, k close to T), an exact radix
// select of the k-th entry over all entries (8 passes) replaces step 1.

constexpr int kMaxK = 1024;
constexpr int kSelThreads = 256;
constexpr int kSelPer = 32;                        // items per thread (in shared memory)
constexpr int64_t kSlice = kSelThreads * kSelPer;  // items per selection block
constexpr int kSelPool = 2048;                     // > kMaxK: the exact path always fits

// Sorts n (a power of two ≤ kMaxK) candidates in shared memory: value
// descending, then id ascending (rescore's per-row sort).
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

// Block-wide bitonic sort of p[0, n) descending (n a power of two ≤ kSelPool;
// pools of at most blockDim.x entries take block_rank_sort_desc).
__device__ void block_sort_desc(uint64_t* p, int n) {
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < (n >> 1); i += blockDim.x) {
        const int lo = ((i & ~(stride - 1)) << 1) | (i & (stride - 1)), hi = lo + stride;
        const uint64_t x = p[lo], y = p[hi];
        if ((x < y) == ((lo & size) == 0)) { p[lo] = y; p[hi] = x; }
      }
      __syncthreads();
    }
}

// Sorts p[0, n) descending in place, n <= blockDim.x, the entries distinct
// (an entry carries its id; a row's ids are distinct): thread i ranks p[i] by
// counting the larger entries — the same address for the whole block at each
// step, a broadcast — and stores it at its rank. Two barriers, every thread
// busy; the warp's bitonic network it replaces (n <= 128) ran in warp 0 alone
// while the block waited (docs/performance.md, session 11: a first-level
// block 8.0 -> 6.9 us on the H200, with the final level's sizing below).
__device__ void block_rank_sort_desc(uint64_t* p, int n) {
  const int i = threadIdx.x;
  uint64_t e = 0;
  int r = 0;
  if (i < n) {
    e = p[i];
#pragma unroll 8
    for (int j = 0; j < n; ++j) r += p[j] > e ? 1 : 0;
  }
  __syncthreads();
  if (i < n) p[r] = e;
  __syncthreads();
}

struct SelectSmem {
  unsigned hist[256];
  uint64_t pool[kSelPool];
  unsigned wsum[32];
  unsigned bin, need;
  float fred[32], sred[32];
};

// One radix pass: among the keys that for_each yields whose digits above
// `shift` equal `prefix`, the 8-bit digit at `shift` of the need-th largest;
// prefix and need are updated. Returns false (prefix unchanged) when fewer
// than `need` keys match. Keys of 0 (empty entries) are never counted.
template <class ForEach>
__device__ __forceinline__ bool radix_pass(ForEach&& for_each, int shift, uint64_t& prefix, unsigned& need, SelectSmem& sm) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) sm.hist[i] = 0;
  __syncthreads();
  const uint64_t hi_mask = shift >= 56 ? 0ull : (~0ull << (shift + 8));
  for_each([&](uint64_t key) {
    if (key && (key & hi_mask) == prefix) atomicAdd(&sm.hist[(key >> shift) & 0xFFu], 1u);
  });
  __syncthreads();
  if (threadIdx.x < 32) {  // warp 0: lane l holds bins 8l .. 8l+7; suffix sums from the top
    const int l = threadIdx.x;
    unsigned c[8], sum = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) { c[j] = sm.hist[8 * l + j]; sum += c[j]; }
    unsigned suf = sum;  // Σ of lanes >= l
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned y = __shfl_down_sync(0xffffffffu, suf, o);
      if (l + o < 32) suf += y;
    }
    const unsigned above = suf - sum;  // Σ of lanes > l
    if (l == 0) sm.bin = 0xFFFFFFFFu;
    __syncwarp();
    if (suf >= need && above < need) {
      unsigned cum = above;
      for (int j = 7; j >= 0; --j) {
        if (cum + c[j] >= need) { sm.bin = unsigned(8 * l + j); sm.need = need - cum; break; }
        cum += c[j];
      }
    }
  }
  __syncthreads();
  const unsigned bin = sm.bin, nneed = sm.need;
  __syncthreads();
  if (bin == 0xFFFFFFFFu) return false;
  prefix |= uint64_t(bin) << shift;
  need = nneed;
  return true;
}

// Block-wide exclusive scan of one count per thread: the sum of the counts of
// the threads before this one; `total` gets the block's sum. Ends with the
// block synchronized (sm.wsum is free again after the caller's next barrier).
__device__ __forceinline__ unsigned block_exclusive_scan(unsigned c, unsigned& total, SelectSmem& sm) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
  unsigned incl = c;  // inclusive scan within the warp
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const unsigned y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  if (lane == 31) sm.wsum[w] = incl;
  __syncthreads();
  unsigned before = incl - c;
  total = 0;
  for (int i = 0; i < nw; ++i) {
    const unsigned t = sm.wsum[i];
    before += i < w ? t : 0u;
    total += t;
  }
  return before;
}

// Gathers the entries >= tau into sm.pool; returns the count (may exceed
// kSelPool: then only kSelPool were stored). Each thread counts its own
// takers, a block-wide exclusive scan of the counts gives each thread its
// first slot: no per-entry atomics or votes.
template <class ForEach>
__device__ __forceinline__ unsigned gather(ForEach&& for_each, uint64_t tau, SelectSmem& sm) {
  unsigned c = 0;
  for_each([&](uint64_t e) { c += (e && e >= tau) ? 1u : 0u; });
  unsigned total;
  unsigned base = block_exclusive_scan(c, total, sm);
  for_each([&](uint64_t e) {
    if (e && e >= tau) {
      if (base < unsigned(kSelPool)) sm.pool[base] = e;
      ++base;
    }
  });
  __syncthreads();
  return total;
}

// The k best entries of one row, sorted: emit(j, entry) for j in [0, k)
// (entry 0 = none, when the row has fewer than k). for_each(f) calls
// f(entry) for the calling thread's entries, the same number of times in
// every thread of the block (0 = no entry); my_max is the thread's largest.
template <class ForEach, class Emit>
__device__ __forceinline__ void block_select(ForEach&& for_each, uint64_t my_max, int k, Emit&& emit, SelectSmem& sm) {
  // 1. Threshold from the thread maxima (16 bits).
  uint64_t tau = 0;
  unsigned need = unsigned(k);
  auto maxima = [&](auto&& f) { f(my_max); };
  if (radix_pass(maxima, 56, tau, need, sm)) radix_pass(maxima, 48, tau, need, sm);
  else tau = 1;  // fewer than k non-empty maxima: take every entry
  unsigned c = gather(for_each, tau, sm);
  if (c > unsigned(kSelPool)) {
    // 2'. Exact k-th entry, then exactly k entries are >= it.
    tau = 0;
    need = unsigned(k);
    for (int shift = 56; shift >= 0; shift -= 8) radix_pass(for_each, shift, tau, need, sm);
    c = gather(for_each, tau, sm);
  }
  if (c <= blockDim.x) {
    block_rank_sort_desc(sm.pool, int(c));
  } else {
    int n2 = 1;
    while (n2 < int(c)) n2 <<= 1;
    for (int i = int(c) + threadIdx.x; i < n2; i += blockDim.x) sm.pool[i] = 0;
    __syncthreads();
    block_sort_desc(sm.pool, n2);
  }
  for (int j = threadIdx.x; j < k; j += blockDim.x) emit(j, j < int(c) ? sm.pool[j] : 0ull);
  __syncthreads();
}

// Block-wide (max, Σ exp(l − max)) → every thread: the max first, then each
// thread rescales its sum once and the sums are added — two plain reductions
// (the pairwise log-sum-exp combine per shuffle step cost ~450 instructions
// per warp of cold code; docs/performance.md).
__device__ float2 block_lse(float mx, float s, SelectSmem& sm) {
  const int w = threadIdx.x >> 5, nw = int(blockDim.x >> 5);
  float bm = mx;
  for (int o = 16; o > 0; o >>= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, o));
  if ((threadIdx.x & 31) == 0) sm.fred[w] = bm;
  __syncthreads();
  bm = -INFINITY;
  for (int i = 0; i < nw; ++i) bm = fmaxf(bm, sm.fred[i]);
  float t = mx == -INFINITY ? 0.0f : s * expf(mx - bm);
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  if ((threadIdx.x & 31) == 0) sm.sred[w] = t;
  __syncthreads();
  t = 0.0f;
  for (int i = 0; i < nw; ++i) t += sm.sred[i];
  __syncthreads();
  return make_float2(bm, t);
}

// One selection level. Block (p, m) takes items [p·S, (p+1)·S) of row m of
// `in` (n items per row; S = kSelThreads·PER): logits (In = float, id =
// index) or entries (In = uint64_t) — PER per thread, loaded once into
// shared memory — and
//   level: writes its best k entries → cand[m, p, :] and, for logits, the
//          slice's (max, Σ exp) → part[m, p];
//   final (values != nullptr, one block per row): writes the row's top-k
//          values and ids, and lse[m] from the P0 partial sums part_in[m, :]
//          (combined in double).
struct SelectArgs {
  const void* in;
  int64_t n;  // items per row
  int k;
  uint64_t* cand = nullptr;
  float2* part = nullptr;
  float* values = nullptr;
  int* ids = nullptr;
  float* lse = nullptr;
  const float2* part_in = nullptr;
  int P0 = 0;
};

// The block's items live in shared memory (dynamic, select_smem_bytes), not
// registers, and every pass over them is a rolled loop: a selection block
// runs its code once, so with the items in registers (fully unrolled passes,
// ~6400 SASS instructions) it was bound by instruction fetch — ~9 us per block
// whatever its size, most of it i-cache misses (ncu, docs/performance.md).
template <class In, int PER>
constexpr int select_smem_bytes() { return kSelThreads * PER * int(sizeof(In)); }

template <class In, int PER = kSelPer>
__global__ void __launch_bounds__(kSelThreads) topk_select_kernel(const SelectArgs a) {
  constexpr int64_t SLICE = int64_t(kSelThreads) * PER;
  __shared__ SelectSmem sm;
  __shared__ double dred[kSelThreads / 32];
  extern __shared__ __align__(16) unsigned char sel_items[];
  In* items = reinterpret_cast<In*>(sel_items);  // item i = j·T + thread
  const int p = blockIdx.x, m = blockIdx.y, P = gridDim.x;
  const int64_t b = int64_t(p) * SLICE;
  const int cnt = int(a.n - b < SLICE ? a.n - b : SLICE);
  const In* in = static_cast<const In*>(a.in) + int64_t(m) * a.n + b;
  // Load (entries past cnt: 0 = empty; logits past cnt are never read), the
  // thread's max; unrolled so that all PER loads are in flight at once.
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = j * kSelThreads + int(threadIdx.x);
    if constexpr (std::is_same_v<In, float>) {
      if (i < cnt) {
        const float v = in[i];
        items[i] = v;
        mx = fmaxf(mx, v);
      }
    } else {
      items[i] = i < cnt ? in[i] : 0ull;
    }
  }
  // Each thread reads back only its own items: no barrier needed before the passes.
  // Four items per iteration: their shared-memory loads overlap, and the
  // loop stays small (a block runs each pass once: its code is cold).
  auto for_each = [&](auto&& f) {
#pragma unroll 4
    for (int j = 0; j < PER; ++j) {
      const int i = j * kSelThreads + int(threadIdx.x);
      if constexpr (std::is_same_v<In, float>) f(i < cnt ? make_entry(items[i], b + i) : 0ull);
      else f(items[i]);
    }
  };
  if constexpr (std::is_same_v<In, float>) {
    // The slice's (max, Σ exp(l − max)): independent exps, not the online update's chain.
    float s = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll 4
      for (int j = 0; j < PER; ++j) {
        const int i = j * kSelThreads + int(threadIdx.x);
        if (i < cnt) s += expf(items[i] - mx);
      }
    }
    const float2 l = block_lse(mx, s, sm);
    if (threadIdx.x == 0) a.part[int64_t(m) * P + p] = l;
  }
  uint64_t my_max = 0;
  for_each([&](uint64_t e) { my_max = e > my_max ? e : my_max; });
  if (a.lse) {  // final level: the row's log-sum-exp from the level-0 partial sums
    const float2* pr = a.part_in + int64_t(m) * a.P0;
    float mx = -INFINITY;
    for (int q = threadIdx.x; q < a.P0; q += blockDim.x) mx = fmaxf(mx, pr[q].x);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) sm.fred[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) mx = fmaxf(mx, sm.fred[w]);
    double s = 0.0;
    for (int q = threadIdx.x; q < a.P0; q += blockDim.x)
      if (pr[q].x != -INFINITY) s += double(pr[q].y) * exp(double(pr[q].x) - double(mx));
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) dred[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      double t = 0.0;
      for (int w = 0; w < int(blockDim.x >> 5); ++w) t += dred[w];
      a.lse[m] = float(double(mx) + log(t));
    }
  }
  if (a.values) {
    block_select(for_each, my_max, a.k, [&](int j, uint64_t e) {
      a.values[int64_t(m) * a.k + j] = entry_value(e);
      a.ids[int64_t(m) * a.k + j] = entry_id(e);
    }, sm);
  } else {
    uint64_t* out = a.cand + (int64_t(m) * P + p) * a.k;
    block_select(for_each, my_max, a.k, [&](int j, uint64_t e) { out[j] = e; }, sm);
  }
}

template <class In, int PER = kSelPer>
void launch_select(dim3 grid, const SelectArgs& a, cudaStream_t s) {
  constexpr auto kernel = topk_select_kernel<In, PER>;
  constexpr int bytes = select_smem_bytes<In, PER>();
  cuda_detail::allow_dynamic_smem<kernel>(bytes);
  kernel<<<grid, kSelThreads, bytes, s>>>(a);
  QHEAD_CUDA_CHECK_LAUNCH("topk_select_kernel");
}

// ---- the list top-k (v14 epilogue, logits.cuh) -------------------------------------------

// The list top-k's threshold of each row from its sample's logits [M, n]
// (n <= kSlice, one block per row): thr[m] = a lower bound of the row's k-th
// largest logit — the k-th largest of the block's sub-maxima (kThrSub per
// thread, each the largest of kSelPer / kThrSub logits), to 24 bits, lowered
// by list_margin; −inf when that is not a number. k distinct logits reach
// it, so it is <= the sample's k-th logit, and the caller has n >= k logits,
// so with k <= kSelThreads at least k sub-maxima exist. With 1024 sub-maxima
// for 8192 logits it lets through ~1.02× (k = 50) to ~1.1× (k = 256) the
// candidates of the exact k-th, for three radix passes over four keys per
// thread instead of a selection (which also summed exps the threshold does
// not need).
constexpr int kThrSub = 4;
__global__ void __launch_bounds__(kSelThreads) list_threshold_kernel(const float* __restrict__ logits, int n, int k,
                                                                     float* __restrict__ thr) {
  __shared__ SelectSmem sm;
  constexpr int kPerSub = kSelPer / kThrSub;
  const float* row = logits + int64_t(blockIdx.x) * n;
  const int tid = threadIdx.x;
  float v[kSelPer];
#pragma unroll
  for (int j = 0; j < kSelPer; ++j) {  // all loads in flight at once
    const int i = j * kSelThreads + tid;
    v[j] = i < n ? row[i] : -INFINITY;
  }
  uint64_t key[kThrSub];  // 0 = no logit
#pragma unroll
  for (int r = 0; r < kThrSub; ++r) {
    float mx = v[r * kPerSub];
#pragma unroll
    for (int j = 1; j < kPerSub; ++j) mx = fmaxf(mx, v[r * kPerSub + j]);
    key[r] = r * kPerSub * kSelThreads + tid < n ? uint64_t(order_key(mx)) << 32 : 0ull;
  }
  auto keys = [&](auto&& f) {
#pragma unroll
    for (int r = 0; r < kThrSub; ++r) f(key[r]);
  };
  uint64_t tau = 0;
  unsigned need = unsigned(k);
  float t = -INFINITY;
  if (radix_pass(keys, 56, tau, need, sm)) {  // then the next two passes find their digit too
    radix_pass(keys, 48, tau, need, sm);
    radix_pass(keys, 40, tau, need, sm);
    t = list_margin(key_value(uint32_t(tau >> 32)));
    if (!(t > -INFINITY && t < INFINITY)) t = -INFINITY;
  }
  if (tid == 0) thr[blockIdx.x] = t;
}

struct ListsArgs {
  TopkLists in;      // the main kernel's lists and sums
  const float* thr;  // [M] the thresholds they were made with, or nullptr (none)
  int k;
  float* values;  // [M, k]
  int* ids;       // [M, k]
  float* lse;     // [M]
};
constexpr int64_t kListChunk = kSlice - kTopkGather;  // new entries per selection round

// Entry i (< the row's total) of block m's row of lists; base[s] = list s's
// first position in the row (shared memory, nseg + 1 entries, non-decreasing).
__device__ __forceinline__ uint64_t list_entry(const TopkLists& in, const unsigned* base, int64_t i) {
  int lo = 0, hi = in.nseg;  // base[lo] <= i < base[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (base[mid] <= i) lo = mid;
    else hi = mid;
  }
  return in.list[(int64_t(blockIdx.x) * in.nseg + lo) * in.seg_cap + (i - base[lo])];
}

// One block per row m: the exact top-k of the row's candidate lists — in
// rounds of up to kListChunk entries plus the best k so far, so that any
// total fits (all logits tied: every logit is a candidate) — and the lse:
// the candidates' exps plus the kernel's sums below the threshold.
// Each thread loads entries spread over the whole row (list_entry), so that
// its loads are independent of each other and all in flight at once.
__global__ void __launch_bounds__(kSelThreads) topk_lists_kernel(const ListsArgs a) {
  __shared__ SelectSmem sm;
  __shared__ uint64_t keep[kTopkGather];
  __shared__ double dred[kSelThreads / 32];
  extern __shared__ __align__(16) unsigned char sel_items[];
  uint64_t* items = reinterpret_cast<uint64_t*>(sel_items);     // [kSlice], item i = j·T + thread
  unsigned* base = reinterpret_cast<unsigned*>(items + kSlice);  // [nseg + 1] each list's first position in the row
  const TopkLists& in = a.in;
  const int m = blockIdx.x, tid = threadIdx.x, lane = tid & 31, w = tid >> 5, nw = kSelThreads / 32;
  // Every global read that does not depend on another one is issued here, at the start: the
  // threshold, and with the list lengths the sums below the threshold (step 3).
  const float thr = a.thr ? a.thr[m] : -INFINITY;
  // 1. The lists' positions: thread tid takes the contiguous segments [s0, s1); a block-wide exclusive scan.
  const uint32_t* cnt = in.count + int64_t(m) * in.nseg;
  const float* ssum = in.sum + int64_t(m) * in.nseg;
  const int per = (in.nseg + kSelThreads - 1) / kSelThreads;
  const int s0 = min(in.nseg, tid * per), s1 = min(in.nseg, s0 + per);
  unsigned c = 0;
  double below = 0.0;  // Σ (sum − count) over the thread's segments: each listed logit added exactly 1
  for (int s = s0; s < s1; ++s) {
    const uint32_t n = cnt[s];
    c += n;
    below += fmax(double(ssum[s]) - double(n), 0.0);
  }
  unsigned total;
  unsigned off = block_exclusive_scan(c, total, sm);
  for (int s = s0; s < s1; ++s) {
    base[s] = off;
    off += cnt[s];
  }
  if (tid == kSelThreads - 1) base[in.nseg] = total;
  __syncthreads();
  // 2. Selection rounds: items = the best k so far, then this round's entries, then empty.
  const int k = a.k;
  int nkeep = 0, per_round = 1;
  bool one_round = true;
  for (int64_t lo = 0;; lo += kListChunk) {
    const int64_t hi = min(int64_t(total), lo + kListChunk);
    const int fill = nkeep + int(hi - lo);
    per_round = max(1, (fill + kSelThreads - 1) / kSelThreads);  // items per thread this round
#pragma unroll 4
    for (int i = tid; i < per_round * kSelThreads; i += kSelThreads)
      items[i] = i < nkeep ? keep[i] : i < fill ? list_entry(in, base, lo + (i - nkeep)) : 0ull;
    __syncthreads();
    const int pr = per_round;
    auto for_each = [&](auto&& f) {
#pragma unroll 4
      for (int j = 0; j < pr; ++j) f(items[j * kSelThreads + tid]);
    };
    uint64_t my_max = 0;
    for_each([&](uint64_t e) { my_max = e > my_max ? e : my_max; });
    block_select(for_each, my_max, k, [&](int j, uint64_t e) { keep[j] = e; }, sm);  // ends with a barrier
    nkeep = k;
    if (hi >= int64_t(total)) break;
    one_round = false;
  }
  for (int j = tid; j < k; j += kSelThreads) {
    a.values[int64_t(m) * k + j] = entry_value(keep[j]);
    a.ids[int64_t(m) * k + j] = entry_id(keep[j]);
  }
  // 3. lse = mx + log(Σ_candidates exp(l − mx) + exp(thr − mx) · Σ_lists (sum − count)),
  // mx = max(best, thr): the candidates' exps in f32 per thread (what the selection path's
  // partial sums do), the block's sum in double.
  const float mx = fmaxf(entry_value(keep[0]), thr);  // an empty keep[0] reads −inf
  float tc = 0.0f;
  auto add = [&](uint64_t e) {
    if (e) tc += expf(entry_value(e) - mx);
  };
  if (one_round) {  // every candidate is still in items
    for (int j = 0; j < per_round; ++j) add(items[j * kSelThreads + tid]);
  } else {
#pragma unroll 4
    for (int64_t i = tid; i < int64_t(total); i += kSelThreads) add(list_entry(in, base, i));
  }
  double t = tc;
  if (thr != -INFINITY) t += below * exp(double(thr) - double(mx));
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
  if (lane == 0) dred[w] = t;
  __syncthreads();
  if (tid == 0) {
    double u = 0.0;
    for (int i = 0; i < nw; ++i) u += dred[i];
    a.lse[m] = float(double(mx) + log(u));
  }
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

// The fused kernel's arguments for table × x, or false when the table/shape
// has no fused kernel.
bool fused_args(const Table& table, const TensorView& x, LogitsArgs& a) {
  if (!table.is_packed()) return false;
  const PackedTable& p = table.packed();
  const int bits = p.scheme.bits;
  if (bits != 4 && bits != 8) return false;
  const int group = static_cast<int>(p.scheme.group_len(p.hidden));
  if (pick_piece_bytes(bits, group) == 0) return false;
  const int64_t mpad = (x.size(0) + kGemmMaxBM - 1) / kGemmMaxBM * kGemmMaxBM;  // the GEMM pads columns to its tile
  a.packed = static_cast<const uint32_t*>(p.packed.data());
  a.scale = p.scale.data();
  a.scale_type = scale_type(p.scheme.scale_dtype);
  a.zp = p.scheme.symmetric ? nullptr : static_cast<const uint32_t*>(p.zero_point.data());
  a.x = x.data;
  a.x_frag = workspace(kWsActivations, size_t(mpad * p.hidden) * 2 + size_t(staged_x_extra(mpad)));
  a.out = nullptr;
  a.ldo = 0;
  a.V = p.vocab;
  a.H = static_cast<int>(p.hidden);
  a.group = group;
  a.groups = static_cast<int>(p.scheme.groups(p.hidden));
  a.M = static_cast<int>(x.size(0));
  return true;
}

void* topk_workspace(size_t bytes) { return workspace(kWsTopkCandidates, bytes); }

// The launchers of logits.cuh for the table's bits and x's dtype (one .cu each).
bool launch_fused_logits(const Table& table, const TensorView& x, const LogitsArgs& a, cudaStream_t s) {
  const bool f16 = x.dtype == DType::kF16;
  if (table.packed().scheme.bits == 4) return f16 ? launch_logits_w4_f16(a, s) : launch_logits_w4_bf16(a, s);
  return f16 ? launch_logits_w8_f16(a, s) : launch_logits_w8_bf16(a, s);
}
int launch_fused_topk(const Table& table, const TensorView& x, LogitsArgs& a, cudaStream_t s) {
  const bool f16 = x.dtype == DType::kF16;
  if (table.packed().scheme.bits == 4)
    return f16 ? launch_logits_topk_w4_f16(a, s, topk_workspace) : launch_logits_topk_w4_bf16(a, s, topk_workspace);
  return f16 ? launch_logits_topk_w8_f16(a, s, topk_workspace) : launch_logits_topk_w8_bf16(a, s, topk_workspace);
}

// Fused logits into out (ld ldo); returns false when the table/shape has no fast path.
bool fused_logits(const Table& table, const TensorView& x, float* out, int64_t ldo, bool gemm_only) {
  LogitsArgs a;
  if (!fused_args(table, x, a)) return false;
  a.out = out;
  a.ldo = ldo;
  a.gemm_only = gemm_only;
  if (a.M == 0 || a.V == 0) return true;
  return launch_fused_logits(table, x, a, current_stream());
}

// The fused kernel with the top-k epilogue: fills a.tk_cand / a.tk_part and
// returns their partial count per row, or 0 when it launched nothing.
int fused_topk(const Table& table, const TensorView& x, int64_t k, LogitsArgs& a) {
  if (!fused_args(table, x, a)) return 0;
  a.k = static_cast<int>(k);
  return launch_fused_topk(table, x, a, current_stream());
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

// Above this many activation rows the GEMV kernels of logits.cuh are slower
// than dequantize + cuBLAS on the H200 (151936x1024 w4g64, M = 256: 820 us vs
// ~250 us), so kAuto takes the fused path there only when the GEMM kernel
// takes the shape. See docs/performance.md.
constexpr int64_t kGemvMaxM = 64;

// Fused logits for `backend` (kAuto: no GEMV above kGemvMaxM), or false.
bool try_fused(const Table& table, const TensorView& x, float* out, int64_t ldo, Backend backend) {
  if (backend == Backend::kFallbackBlas) return false;
  return fused_logits(table, x, out, ldo, backend == Backend::kAuto && x.size(0) > kGemvMaxM);
}

void logits(const Table& table, const TensorView& x, const TensorView& out, Backend backend) {
  check_act(x, "logits");
  if (try_fused(table, x, out.ptr<float>(), table.vocab(), backend)) return;
  gemm_fallback(table, x, out.ptr<float>(), table.vocab());
}

// Above this k the fused top-k is not taken (its per-CTA gather holds
// kTopkGather candidates per row).
constexpr int64_t kFusedTopkMaxK = kTopkGather;

namespace {
// Level-0 candidates cand[M, P0, k] and partial sums part[M, P0] → the top-k
// and lse: selection levels of kSlice entries per block until one block per
// row holds them all, then the final level.
void merge_topk(const uint64_t* cand, const float2* part, int P0, int64_t M, int64_t k, float* values, int* ids,
                float* lse) {
  cudaStream_t s = current_stream();
  int64_t n = int64_t(P0) * k;  // entries per row
  uint64_t* buf[2] = {nullptr, nullptr};
  if (n > kSlice) {
    const int64_t P1 = (n + kSlice - 1) / kSlice;
    char* w = static_cast<char*>(workspace(kWsTopkLevels, size_t(2 * M * P1 * k) * 8));
    buf[0] = reinterpret_cast<uint64_t*>(w);
    buf[1] = buf[0] + M * P1 * k;
  }
  SelectArgs a;
  a.in = cand;
  a.k = int(k);
  for (int level = 0; n > kSlice; ++level) {
    const int64_t P = (n + kSlice - 1) / kSlice;
    a.n = n;
    a.cand = buf[level & 1];
    launch_select<uint64_t>(dim3(unsigned(P), unsigned(M)), a, s);
    a.in = a.cand;
    n = P * k;
  }
  a.n = n;
  a.cand = nullptr;
  a.values = values;
  a.ids = ids;
  a.lse = lse;
  a.part_in = part;
  a.P0 = P0;
  // The final block's items per thread sized to its entries: every pass of a block runs over all
  // its slots (empty ones too), so 3750 entries (M = 1 on a 152k vocab: 75 slices × 50) in 8192
  // slots made each pass twice as long as needed (final block 9.0 -> 7.1 us on the H200 with
  // the rank sort); 25 fits the 6400 of a 262144 vocab.
  const dim3 one(1u, unsigned(M));
  if (n <= kSelThreads * 16) launch_select<uint64_t, 16>(one, a, s);
  else if (n <= kSelThreads * 25) launch_select<uint64_t, 25>(one, a, s);
  else launch_select<uint64_t>(one, a, s);
}

// The threshold sample of the list top-k: kListSampleTiles whole 128-row tiles
// spread evenly over the vocab (kSlice rows: one list_threshold_kernel block per row).
constexpr int64_t kListSampleTiles = kSlice / 128;
// kAuto takes the list top-k from this vocab up (a sample of at most a quarter
// of the rows) and from this many rows: on the H200 (w4g128, docs/performance.md,
// session 9) it was faster than logits + selection from M = 128 on every shape
// (151936x1024 166 vs 199 us, 262144x2560 439 vs 491, 128256x4096 352 vs 355),
// and at M = 96 slower on 128256x4096 (358 vs 344 us).
constexpr int64_t kListMinVocab = 4 * kSlice;
constexpr int64_t kListMinRowsAuto = 128;

// The list top-k (v14 epilogue, M > 64 on sm_90): the sample's logits give
// each row's threshold (list_threshold_kernel); the main pass writes the candidate
// lists and the sums below the thresholds; one block per row merges. False
// when it does not apply (the caller computes logits, then selects).
bool topk_lists(const Table& table, const TensorView& x, int64_t k, float* values, int* ids, float* lse) {
  LogitsArgs a;
  if (!fused_args(table, x, a)) return false;
  cudaStream_t s = current_stream();
  const int64_t M = a.M, full = a.V / 128, ns = std::min(kListSampleTiles, full);
  a.k = static_cast<int>(k);
  if (ns * 128 >= k) {  // else no threshold: every logit is a candidate
    // The sample's logits straight from the table (its tiles tile_stride apart), then the thresholds.
    const int64_t Vs = ns * 128;
    char* w = static_cast<char*>(workspace(kWsTopkSample, size_t(M * Vs * 4 + M * 4)));
    LogitsArgs b = a;
    b.tile_stride = full / ns;
    b.V = Vs;
    b.ldo = Vs;
    b.out = reinterpret_cast<float*>(w);
    if (launch_fused_logits(table, x, b, s)) {
      float* thr = b.out + M * Vs;
      list_threshold_kernel<<<unsigned(M), kSelThreads, 0, s>>>(b.out, int(Vs), int(k), thr);  // Vs <= kSlice
      QHEAD_CUDA_CHECK_LAUNCH("list_threshold_kernel");
      a.tk_thr = thr;
      a.x_frag_ready = true;  // the same kernel layout as the main pass (v14, 128 columns)
    }
  }
  a.tk_lists = true;
  if (launch_fused_topk(table, x, a, s) == 0) return false;
  ListsArgs la;
  la.in = a.tk_out;
  la.thr = a.tk_thr;
  la.k = int(k);
  la.values = values;
  la.ids = ids;
  la.lse = lse;
  // Dynamic shared memory: the items and the list positions (sized once for the most segments).
  const int smem = int(kSlice * 8) + (8 * sm_count() + 1) * 4;
  allow_dynamic_smem<topk_lists_kernel>(smem);
  topk_lists_kernel<<<unsigned(M), kSelThreads, smem, s>>>(la);
  QHEAD_CUDA_CHECK_LAUNCH("topk_lists_kernel");
  return true;
}

void topk_impl(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
               const TensorView& lse, Backend backend, bool allow_epilogue) {
  check_act(x, "topk");
  if (k > kMaxK) fail("topk", "CUDA top-k takes k <= " + std::to_string(kMaxK) + ", got " + std::to_string(k));
  const int64_t M = x.size(0), V = table.vocab();
  if (M == 0) return;
  cudaStream_t s = current_stream();
  float* ov = values.ptr<float>();
  int* oi = ids.ptr<int>();
  float* ol = lse.ptr<float>();
  // kFused, M <= 8: the staged kernel keeps per (row, CTA) its best k and
  // (max, Σ exp); the [M, V] logits never reach memory. Then the merge levels.
  // kAuto does not take it: on the H200 logits + selection is faster (67 vs
  // 78 us at M = 1, 151936x1024 w4g64; docs/performance.md).
  if (allow_epilogue && backend == Backend::kFused && k <= kFusedTopkMaxK) {
    LogitsArgs a;
    if (const int nblk = fused_topk(table, x, k, a)) return merge_topk(a.tk_cand, a.tk_part, nblk, M, k, ov, oi, ol);
  }
  // Above 64 rows on sm_90 (kFused; kAuto from kListMinRowsAuto rows on large vocabs) the v14 GEMM's list epilogue.
  if (allow_epilogue && k <= kFusedTopkMaxK && topk_lists_apply(int(M)) &&
      (backend == Backend::kFused || (backend == Backend::kAuto && V >= kListMinVocab && M >= kListMinRowsAuto)) &&
      topk_lists(table, x, k, ov, oi, ol))
    return;
  // Otherwise logits into a workspace; slices of logits per block select
  // their best k, then the same merge. The first level takes slices of a
  // quarter of kSlice while that grid is at most two waves (8 blocks resident
  // per SM) and its candidates still fit one final block: on the H200 a
  // 2048-logit block takes ~8 us, an 8192-logit one ~23 us at 4 per SM (ncu,
  // docs/performance.md), and at M = 1 on a 152k vocab kSlice slices would
  // be 19 blocks.
  float* l = static_cast<float*>(workspace(kWsLogits, size_t(M * V) * sizeof(float)));
  if (!try_fused(table, x, l, V, backend)) gemm_fallback(table, x, l, V);
  constexpr int kSmallPer = kSelPer / 4;
  constexpr int64_t kSmallSlice = int64_t(kSelThreads) * kSmallPer;
  const int64_t P_small = (V + kSmallSlice - 1) / kSmallSlice;
  const bool small = M * P_small <= 16 * int64_t(sm_count()) && P_small * k <= kSlice;
  const int P = int(small ? P_small : (V + kSlice - 1) / kSlice);
  char* ws = static_cast<char*>(workspace(kWsTopkCandidates, size_t(M) * P * (size_t(k) + 1) * 8));
  SelectArgs sa;
  sa.in = l;
  sa.n = V;
  sa.k = int(k);
  sa.cand = reinterpret_cast<uint64_t*>(ws);
  sa.part = reinterpret_cast<float2*>(sa.cand + M * P * k);
  if (small) launch_select<float, kSmallPer>(dim3(unsigned(P), unsigned(M)), sa, s);
  else launch_select<float>(dim3(unsigned(P), unsigned(M)), sa, s);
  merge_topk(sa.cand, sa.part, P, M, k, ov, oi, ol);
}
}  // namespace

void topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
          const TensorView& lse, Backend backend) {
  topk_impl(table, x, k, values, ids, lse, backend, true);
}

void topk_separate(const Table& table, const TensorView& x, int64_t k, const TensorView& values,
                   const TensorView& ids, const TensorView& lse, Backend backend) {
  topk_impl(table, x, k, values, ids, lse, backend, false);
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
