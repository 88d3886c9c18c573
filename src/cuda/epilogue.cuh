// Tile epilogues the kernels share: folding a finished group into the
// accumulators and storing a finished tile.
#pragma once

#include "args.cuh"
#include "codes.cuh"

namespace qhead::cuda_detail {

// ---- tile epilogues (shared by the kernels below) ----------------------------------
//
// A finished tile: acc[r][n] is the m16n8 C fragment of rows
// row0 + r·16 + {g, g+8} × activation columns m0 + n·8 + {2t, 2t+1}.

// The end of a group: acc += s · cacc for one 16-row tile, s0 the scale of
// the lane's row g, s1 of row g + 8 (the MMA accumulator layout: c0, c1 in
// row g, c2, c3 in row g + 8).
template <int NT>
__device__ __forceinline__ void fold_group(float (&acc)[NT][4], const float (&cacc)[NT][4], float s0, float s1) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    acc[n][0] = fmaf(s0, cacc[n][0], acc[n][0]);
    acc[n][1] = fmaf(s0, cacc[n][1], acc[n][1]);
    acc[n][2] = fmaf(s1, cacc[n][2], acc[n][2]);
    acc[n][3] = fmaf(s1, cacc[n][3], acc[n][3]);
  }
}

template <int NT>
__device__ __forceinline__ void fold_first(float (&acc)[NT][4], const float (&cacc)[NT][4], float s0, float s1) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    acc[n][0] = s0 * cacc[n][0];
    acc[n][1] = s0 * cacc[n][1];
    acc[n][2] = s1 * cacc[n][2];
    acc[n][3] = s1 * cacc[n][3];
  }
}

// Plain logits: the C fragments → out.
template <int RT, int NT>
__device__ __forceinline__ void store_tile(const LogitsArgs& a, const float (&acc)[RT][NT][4], int64_t row0, int m0,
                                           int g, int t) {
  if (row0 + RT * 16 <= a.V && m0 + NT * 8 <= a.M) {  // a whole tile: no bounds, one pointer per column pair
    float* p = a.out + int64_t(m0 + 2 * t) * a.ldo + row0 + g;
#pragma unroll
    for (int n = 0; n < NT; ++n, p += 8 * a.ldo) {
      float* p1 = p + a.ldo;
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        p[r * 16] = acc[r][n][0];
        p1[r * 16] = acc[r][n][1];
        p[r * 16 + 8] = acc[r][n][2];
        p1[r * 16 + 8] = acc[r][n][3];
      }
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    const int64_t ra = row0 + r * 16 + g, rb = ra + 8;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const int m = m0 + n * 8 + 2 * t;
      if (ra < a.V) {
        if (m < a.M) a.out[int64_t(m) * a.ldo + ra] = acc[r][n][0];
        if (m + 1 < a.M) a.out[int64_t(m + 1) * a.ldo + ra] = acc[r][n][1];
      }
      if (rb < a.V) {
        if (m < a.M) a.out[int64_t(m) * a.ldo + rb] = acc[r][n][2];
        if (m + 1 < a.M) a.out[int64_t(m + 1) * a.ldo + rb] = acc[r][n][3];
      }
    }
  }
}

// Fused top-k epilogue (staged kernel, M <= 8). Each CTA appends every logit
// it computes, as an entry (common.cuh), to its column's pool in shared
// memory — the launcher sizes the pools for every row the CTA can see, so
// the streaming loop needs no barrier and no compaction — and keeps per-lane
// online log-sum-exps. At the end the whole CTA selects each column's best k
// at once (select_columns) and writes them with the (max, Σ exp) partials.
// Shared memory (dynamic): pool[tk_cols][tk_cap] entries, cnt[tk_cols];
// `scratch` (the kernel's stage ring, free by then) holds the selection's
// histograms, gathers and the lse reduction.

}  // namespace qhead::cuda_detail
