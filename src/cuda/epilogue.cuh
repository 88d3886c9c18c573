// Tile epilogues the kernels share: folding a finished group into the
// accumulators and storing a finished tile.
#pragma once

#include "args.cuh"
#include "codes.cuh"

namespace qhead::cuda_detail {

// 2^x by the special-function unit (ex2.approx.ftz: relative error ~2^-22; the list and
// tile-summary epilogues' exps).
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

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

// One logit into out[i] as a.out_type: f32, or rounded to nearest even to f16 / bf16 (the
// choice is uniform over the grid; both 16-bit conversions are computed and one selected).
__device__ __forceinline__ void put_logit(const LogitsArgs& a, int64_t i, float v) {
  if (a.out_type == kOutF32) {
    static_cast<float*>(a.out)[i] = v;
  } else {
    const __half h = __float2half_rn(v);
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    static_cast<unsigned short*>(a.out)[i] =
        a.out_type == kOutF16 ? __half_as_ushort(h) : __bfloat16_as_ushort(b);
  }
}

// Two 16-bit logits as one 32-bit word, `lo` in the low half (each rounded to nearest even).
template <bool kBf16>
__device__ __forceinline__ uint32_t pack_logits(float lo, float hi) {
  if constexpr (kBf16) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&p);
  } else {
    const __half2 p = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&p);
  }
}

// A whole tile of 16-bit logits (ldo even, out 4-byte aligned). A lane holds
// rows g and g + 8 of a column; lanes g and g ^ 1 (lane ^ 4) trade one of
// them, so that each lane holds two adjacent rows — g, g + 1 on even g;
// g + 7, g + 8 on odd g — and stores them as one 32-bit word. A column's 16
// rows are then one 32-byte sector written by one instruction, where 2-byte
// stores split it over two, and the tile takes half the store instructions.
// Called by whole warps (the shuffles).
template <bool kBf16, int RT, int NT>
__device__ __forceinline__ void store_tile_pairs(const LogitsArgs& a, const float (&acc)[RT][NT][4], int64_t row0,
                                                 int m0, int g, int t) {
  const bool odd = (g & 1) != 0;
  unsigned short* const o = static_cast<unsigned short*>(a.out);
  int64_t p = int64_t(m0 + 2 * t) * a.ldo + row0 + (odd ? g + 7 : g);  // even: a word boundary
#pragma unroll
  for (int n = 0; n < NT; ++n, p += 8 * a.ldo) {
    const int64_t p1 = p + a.ldo;
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      // Sent: row g on odd lanes, row g + 8 on even lanes; received: the partner's.
      const float r0 = __shfl_xor_sync(0xffffffffu, odd ? acc[r][n][0] : acc[r][n][2], 4);
      const float r1 = __shfl_xor_sync(0xffffffffu, odd ? acc[r][n][1] : acc[r][n][3], 4);
      const uint32_t w0 = odd ? pack_logits<kBf16>(r0, acc[r][n][2]) : pack_logits<kBf16>(acc[r][n][0], r0);
      const uint32_t w1 = odd ? pack_logits<kBf16>(r1, acc[r][n][3]) : pack_logits<kBf16>(acc[r][n][1], r1);
      *reinterpret_cast<uint32_t*>(o + p + r * 16) = w0;
      *reinterpret_cast<uint32_t*>(o + p1 + r * 16) = w1;
    }
  }
}

// Plain logits: the C fragments → out. kPairs16: a whole tile of 16-bit
// logits by store_tile_pairs (the warp-specialized GEMM, whose consumers have
// the registers; in the kernels that run two CTAs an SM its code made ptxas
// spill: 968 → 3858 spilled bytes over one instance file's kernels).
template <int RT, int NT, bool kPairs16 = false>
__device__ __forceinline__ void store_tile(const LogitsArgs& a, const float (&acc)[RT][NT][4], int64_t row0, int m0,
                                           int g, int t) {
  if (row0 + RT * 16 <= a.V && m0 + NT * 8 <= a.M) {  // a whole tile: no bounds, one offset per column pair
    int64_t p = int64_t(m0 + 2 * t) * a.ldo + row0 + g;
    if (a.out_type == kOutF32) {
      float* o = static_cast<float*>(a.out);
#pragma unroll
      for (int n = 0; n < NT; ++n, p += 8 * a.ldo) {
        const int64_t p1 = p + a.ldo;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          o[p + r * 16] = acc[r][n][0];
          o[p1 + r * 16] = acc[r][n][1];
          o[p + r * 16 + 8] = acc[r][n][2];
          o[p1 + r * 16 + 8] = acc[r][n][3];
        }
      }
    } else if (kPairs16 && (a.ldo & 1) == 0 && (reinterpret_cast<uintptr_t>(a.out) & 3) == 0) {
      if constexpr (kPairs16) {
        if (a.out_type == kOutF16)
          store_tile_pairs<false>(a, acc, row0, m0, g, t);
        else
          store_tile_pairs<true>(a, acc, row0, m0, g, t);
      }
    } else {
#pragma unroll
      for (int n = 0; n < NT; ++n, p += 8 * a.ldo) {
        const int64_t p1 = p + a.ldo;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          put_logit(a, p + r * 16, acc[r][n][0]);
          put_logit(a, p1 + r * 16, acc[r][n][1]);
          put_logit(a, p + r * 16 + 8, acc[r][n][2]);
          put_logit(a, p1 + r * 16 + 8, acc[r][n][3]);
        }
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
        if (m < a.M) put_logit(a, int64_t(m) * a.ldo + ra, acc[r][n][0]);
        if (m + 1 < a.M) put_logit(a, int64_t(m + 1) * a.ldo + ra, acc[r][n][1]);
      }
      if (rb < a.V) {
        if (m < a.M) put_logit(a, int64_t(m) * a.ldo + rb, acc[r][n][2]);
        if (m + 1 < a.M) put_logit(a, int64_t(m + 1) * a.ldo + rb, acc[r][n][3]);
      }
    }
  }
}

// A finished tile's summary per activation column (kStoreTiles): the max of
// its rows' logits and Σ exp(l − max), for the tile-select block
// (src/ops/cuda/topk_select.cu) that finds the tiles a top-k entry can lie
// in. Rows g, g + 8 of each 16-row tile sit in lanes 4g .. 4g + 3: three
// xor-shuffles over g combine a column. exp by ex2.approx of (l − max)·log2 e:
// near the max, where the terms matter, l − max is exact and the product's
// rounding is an ulp of a small number.
template <int RT, int NT>
__device__ __forceinline__ void store_tile_summary(const LogitsArgs& a, const float (&acc)[RT][NT][4], int64_t row0,
                                                   int g, int t) {
  const bool whole = row0 + RT * 16 <= a.V;
  const int64_t tile = row0 / (RT * 16);
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (n * 8 + e >= a.M) continue;  // no lane holds a column < M here (warp-uniform): M = 1 skips e = 1
      float mx = -INFINITY;
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (whole || row0 + r * 16 + h * 8 + g < a.V) mx = fmaxf(mx, acc[r][n][e + 2 * h]);
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      float s = 0.0f;
      if (mx != -INFINITY) {
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            if (whole || row0 + r * 16 + h * 8 + g < a.V)
              s += ex2_ftz((acc[r][n][e + 2 * h] - mx) * 1.4426950408889634f);
      }
#pragma unroll
      for (int o = 4; o < 32; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      const int m = n * 8 + 2 * t + e;
      if (g == 0 && m < a.M) a.tile_part[int64_t(m) * a.tile_ld + tile] = make_float2(mx, s);
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
