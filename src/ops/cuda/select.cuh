// Block-wide top-k selection machinery shared by the selection levels
// (topk_select.cu) and the list merge (topk_lists.cu), and the sorting
// networks.
#pragma once

#include "ops/cuda/internal.cuh"

namespace qhead::cuda_ops {

using namespace cuda_detail;

// Internal linkage: each op file that includes this has its own copy.
namespace {

using cuda_plan::kSelPer;
using cuda_plan::kSelThreads;
using cuda_plan::kSlice;
using cuda_plan::kTopkGather;
constexpr int kMaxK = cuda_plan::kTopkMaxK;

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
// busy, where a warp's bitonic network (n <= 128) runs in warp 0 alone
// while the block waits (docs/tuning-notes.md, "Top-k selection": a first-level
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
// A lower bound of the k-th largest entry of the block: the k-th largest of
// the threads' own maxima (each thread's my_max is one of its entries, or 0)
// to 16 bits, by two 8-bit radix passes over the maxima only; 1 (every
// entry) when fewer than k maxima are non-empty.
__device__ __forceinline__ uint64_t maxima_threshold(uint64_t my_max, int k, SelectSmem& sm) {
  uint64_t tau = 0;
  unsigned need = unsigned(k);
  auto maxima = [&](auto&& f) { f(my_max); };
  if (radix_pass(maxima, 56, tau, need, sm)) radix_pass(maxima, 48, tau, need, sm);
  else tau = 1;
  return tau;
}

// The k best entries, given tau <= the k-th best (at least k entries are >=
// it): those >= tau gathered and sorted; emit as block_select's.
template <class ForEach, class Emit>
__device__ __forceinline__ void block_select_above(ForEach&& for_each, uint64_t tau, int k, Emit&& emit,
                                                   SelectSmem& sm) {
  unsigned c = gather(for_each, tau, sm);
  if (c > unsigned(kSelPool)) {
    // 2'. Exact k-th entry, then exactly k entries are >= it.
    tau = 0;
    unsigned need = unsigned(k);
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

template <class ForEach, class Emit>
__device__ __forceinline__ void block_select(ForEach&& for_each, uint64_t my_max, int k, Emit&& emit, SelectSmem& sm) {
  block_select_above(for_each, maxima_threshold(my_max, k, sm), k, emit, sm);
}

// Block-wide (max, Σ exp(l − max)) → every thread: the max first, then each
// thread rescales its sum once and the sums are added — two plain reductions
// (the pairwise log-sum-exp combine per shuffle step cost ~450 instructions
// per warp of cold code; docs/tuning-notes.md, "Top-k selection").
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
  bool dependent = false;  // launched as a programmatic dependent: wait for the grid ahead first
};
}  // namespace

}  // namespace qhead::cuda_ops
