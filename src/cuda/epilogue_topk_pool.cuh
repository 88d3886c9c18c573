// The staged GEMV's top-k epilogue: per-CTA pools in shared memory, then each
// column's best k and (max, Σ exp).
#pragma once

#include "args.cuh"
#include "ptx.cuh"

namespace qhead::cuda_detail {

template <int RT>
struct TopkAll {
  uint64_t* pool;
  unsigned* cnt;
  int ncols;
  float lmx[2], lsm[2];

  __device__ __forceinline__ void init(const LogitsArgs& a, void* base) {
    pool = static_cast<uint64_t*>(base);
    cnt = reinterpret_cast<unsigned*>(pool + a.tk_cols * a.tk_cap);
    ncols = a.tk_cols;  // M <= 8: one activation tile
    lmx[0] = lmx[1] = -INFINITY;
    lsm[0] = lsm[1] = 0.0f;
    for (int i = threadIdx.x; i < a.tk_cols; i += blockDim.x) cnt[i] = 0;
  }
  // A finished tile (rows row0 + r·16 + {g, g+8}, columns 2t, 2t+1).
  __device__ __forceinline__ void append(const LogitsArgs& a, const float (&acc)[RT][1][4], int64_t row0, int g,
                                         int t) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int cl = 2 * t + (e & 1);
        const int64_t row = row0 + r * 16 + g + (e < 2 ? 0 : 8);
        if (cl < ncols && row < a.V) {
          const float v = acc[r][0][e];
          lse_add(lmx[e & 1], lsm[e & 1], v);
          pool[cl * a.tk_cap + atomicAdd(&cnt[cl], 1u)] = make_entry(v, row);
        }
      }
  }
  __device__ __forceinline__ void finish(const LogitsArgs& a, unsigned char* scratch, int g, int t);
};

// The best k entries of each column's pool → tk_cand[m, blockIdx.y, :] (0 =
// none), by the whole CTA: two 8-bit radix passes over all pools at once find
// the 16-bit bin of each column's k-th entry; the entries at or above it
// (k plus that bin's ties) are gathered and sorted by one warp per column.
// When a gather would overflow (heavy ties), six more passes make the bin the
// exact k-th entry, and exactly k are gathered.
struct ColumnSelect {
  unsigned* hist;     // [ncols][256]
  uint64_t* gat;      // [ncols][kTopkGather]
  uint64_t* prefix;   // [ncols]
  unsigned* need;     // [ncols]
  unsigned* gcnt;     // [ncols]
  unsigned* flag;     // [1]
};

__device__ __forceinline__ void select_columns(const LogitsArgs& a, const uint64_t* pool, const unsigned* cnt,
                                               int ncols, ColumnSelect& cs) {
  const int T = blockDim.x, lane = threadIdx.x & 31, wic = threadIdx.x >> 5, nw = T >> 5;
  for (int cl = threadIdx.x; cl < ncols; cl += T) {
    cs.prefix[cl] = cnt[cl] <= unsigned(a.k) ? 1ull : 0ull;  // <= k entries: all of them (every entry is >= 1)
    cs.need[cl] = unsigned(a.k);
  }
  auto pass = [&](int shift) {
    for (int i = threadIdx.x; i < ncols * 256; i += T) cs.hist[i] = 0;
    cta_sync();
    const uint64_t hi = shift >= 56 ? 0ull : (~0ull << (shift + 8));
    for (int cl = 0; cl < ncols; ++cl) {
      if (cs.prefix[cl] == 1ull) continue;
      const uint64_t* p = pool + cl * a.tk_cap;
      for (int i = threadIdx.x; i < int(cnt[cl]); i += T) {
        const uint64_t e = p[i];
        if ((e & hi) == cs.prefix[cl]) atomicAdd(&cs.hist[cl * 256 + int((e >> shift) & 0xFF)], 1u);
      }
    }
    cta_sync();
    for (int cl = wic; cl < ncols; cl += nw) {  // one warp per column: the bin of the need-th largest
      if (cs.prefix[cl] == 1ull) continue;
      unsigned c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) { c[j] = cs.hist[cl * 256 + 8 * lane + j]; sum += c[j]; }
      unsigned suf = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_down_sync(0xffffffffu, suf, o);
        if (lane + o < 32) suf += y;
      }
      const unsigned need = cs.need[cl], above = suf - sum;
      __syncwarp();
      if (suf >= need && above < need) {
        unsigned cum = above;
        for (int j = 7; j >= 0; --j) {
          if (cum + c[j] >= need) {
            cs.prefix[cl] |= uint64_t(8 * lane + j) << shift;
            cs.need[cl] = need - cum;
            break;
          }
          cum += c[j];
        }
      }
    }
    cta_sync();
  };
  auto gather = [&]() {
    for (int cl = threadIdx.x; cl < ncols; cl += T) cs.gcnt[cl] = 0;
    if (threadIdx.x == 0) *cs.flag = 0;
    cta_sync();
    for (int cl = 0; cl < ncols; ++cl) {
      const uint64_t* p = pool + cl * a.tk_cap;
      const uint64_t tau = cs.prefix[cl];
      for (int i = threadIdx.x; i < int(cnt[cl]); i += T) {
        const uint64_t e = p[i];
        if (e >= tau) {
          const unsigned pos = atomicAdd(&cs.gcnt[cl], 1u);
          if (pos < unsigned(kTopkGather)) cs.gat[cl * kTopkGather + pos] = e;
          else *cs.flag = 1;
        }
      }
    }
    cta_sync();
  };
  pass(56);
  pass(48);
  gather();
  if (*cs.flag) {  // CTA-uniform: exact k-th entries
    for (int shift = 40; shift >= 0; shift -= 8) pass(shift);
    gather();
  }
}

template <int RT>
__device__ __forceinline__ void TopkAll<RT>::finish(const LogitsArgs& a, unsigned char* scratch, int g, int t) {
  const int lane = threadIdx.x & 31, wic = threadIdx.x >> 5, nw = blockDim.x >> 5;
  cta_sync();  // every append is done
  ColumnSelect cs;
  cs.gat = reinterpret_cast<uint64_t*>(scratch);
  cs.prefix = cs.gat + ncols * kTopkGather;
  float2* lred = reinterpret_cast<float2*>(cs.prefix + ncols);  // [warps][ncols]
  cs.hist = reinterpret_cast<unsigned*>(lred + nw * ncols);
  cs.need = cs.hist + ncols * 256;
  cs.gcnt = cs.need + ncols;
  cs.flag = cs.gcnt + ncols;
  select_columns(a, pool, cnt, ncols, cs);
  for (int cl = wic; cl < ncols; cl += nw) {  // sort each column's gather, keep k
    uint64_t* p = cs.gat + cl * kTopkGather;
    const int c = int(min(cs.gcnt[cl], unsigned(kTopkGather)));
    int n2 = 1;
    while (n2 < c) n2 <<= 1;
    for (int i = c + lane; i < n2; i += 32) p[i] = 0;
    __syncwarp();
    warp_sort_desc(p, n2);
    uint64_t* o = a.tk_cand + (int64_t(cl) * gridDim.y + blockIdx.y) * a.k;
    for (int j = lane; j < a.k; j += 32) o[j] = j < c ? p[j] : 0;
  }
  // Log-sum-exp: lanes of one t hold the same columns (xor over g), then warps.
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    float mx = lmx[c], sm = lsm[c];
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      const float mx2 = __shfl_xor_sync(0xffffffffu, mx, o), sm2 = __shfl_xor_sync(0xffffffffu, sm, o);
      lse_combine(mx, sm, mx2, sm2);
    }
    const int cl = 2 * t + c;
    if (g == 0 && cl < ncols) lred[wic * ncols + cl] = make_float2(mx, sm);
  }
  cta_sync();
  for (int cl = threadIdx.x; cl < ncols; cl += blockDim.x) {
    float mx = -INFINITY, sm = 0.0f;
    for (int w = 0; w < nw; ++w) lse_combine(mx, sm, lred[w * ncols + cl].x, lred[w * ncols + cl].y);
    a.tk_part[int64_t(cl) * gridDim.y + blockIdx.y] = make_float2(mx, sm);
  }
}

}  // namespace qhead::cuda_detail
