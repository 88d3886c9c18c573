// The warp-specialized GEMM's top-k epilogue: candidate lists above a sampled
// threshold, exp sums below it.
#pragma once

#include "args.cuh"
#include "epilogue.cuh"

namespace qhead::cuda_detail {

// ---- the list epilogue: candidate lists above a sampled threshold ----------------------
//
// A top-k at M > 64 cannot keep per-column pools in shared memory (the ring
// takes it), and a CTA's own best k is a weak filter (k of its ~2300 rows).
// Instead the caller first computes the logits of a sample of the vocab
// (whole 128-row tiles spread over V) and takes a lower bound of their k-th
// largest (list_threshold_kernel, src/ops/cuda/topk_lists.cu): any k logits of the row bound
// the row's k-th largest from below, so every logit below it can be
// dropped. The kernel appends each logit >= the threshold, as an entry, to
// the list of its (column, CTA warp) — positions by ballot, no atomics — and
// sums exp(min(l − threshold, 0)) (each term <= 1: no overflow, no running
// max; the listed logits add exactly 1 each, subtracted by the merge). The
// merge (topk_lists_kernel) selects from the lists and adds the candidates' exps to
// the sums. A list holds at most the 16 rows × units its
// warp computes, so the launcher sizes it and it cannot overflow.

// A threshold lowered by a margin, so that a last-bit difference between the
// sample's run and the main run cannot drop a candidate.
__host__ __device__ __forceinline__ float list_margin(float v) { return v - (fabsf(v) * 0x1p-16f + 0x1p-30f); }

// One warp's 16 rows × NT·8 columns of a finished unit (acc: the m64nNk16
// accumulator layout, rows r0 + g and r0 + g + 8, columns n·8 + 2t + {0, 1}).
// thr_s[col] = the column's threshold; phase 1 multiplies it by log2 e where
// it needs it (loading a stored (threshold, product) pair for the thread's
// 32 columns made the TOPK kernels spill 108–156 bytes). Columns >= M have
// +inf, rows >= V take no part. Two phases, so that the common work has no
// branch between columns and its latencies overlap:
//  1. every column: exp(min(l − thr, 0)) added to sum[col · 8 + g] (one slot
//     per lane row: no shuffles; 32 running sums per thread would take
//     registers the consumer does not have) — a logit >= thr adds exactly 1,
//     and the merge subtracts the list's count, so no compare and select per
//     logit — and a bit per column with a logit >= thr;
//  2. only the columns where some lane of the warp has one: the entries
//     appended to list(col) at cnt[col], positions by ballot.
// (ncu, docs/tuning-notes.md "The list top-k": with a compare, select and accurate exp2f per
// logit the epilogue took ~1270 instructions per warp and unit, +40 % on the
// kernel.)
template <int NT>
__device__ __forceinline__ void topk_lists_tile(const LogitsArgs& a, const float (&acc)[NT][4], int64_t r0, int m0,
                                                int seg, int lane, const float* thr_s, uint32_t* cnt, float* sum) {
  static_assert(NT * 2 <= 32, "one flag bit per column of the thread");
  constexpr float kLog2e = 1.4426950408889634f;
  const int g = lane >> 2, t = lane & 3;
  const int64_t ra = r0 + g, rb = ra + 8;
  const bool va = ra < a.V, vb = rb < a.V;
  unsigned flags = 0;
  auto phase1 = [&](auto partial) {  // partial: the vocab's last tile, rows past V masked
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = n * 8 + 2 * t + c;
        const float thx = thr_s[col], thy = thx * kLog2e;
        float v0 = acc[n][c], v1 = acc[n][c + 2];
        if constexpr (decltype(partial)::value) {
          v0 = va ? v0 : -INFINITY;
          v1 = vb ? v1 : -INFINITY;
        }
        float e0 = ex2_ftz(fminf(fmaf(v0, kLog2e, -thy), 0.0f)), e1 = ex2_ftz(fminf(fmaf(v1, kLog2e, -thy), 0.0f));
        if constexpr (decltype(partial)::value) {  // with thr = −inf, −inf − (−inf) is NaN: no term at all
          e0 = va ? e0 : 0.0f;
          e1 = vb ? e1 : 0.0f;
        }
        sum[col * 8 + g] += e0 + e1;
        flags |= fmaxf(v0, v1) >= thx ? 1u << (2 * n + c) : 0u;
      }
  };
  if (r0 + 16 <= a.V) phase1(std::false_type());  // warp-uniform
  else phase1(std::true_type());
  const unsigned any = __reduce_or_sync(0xffffffffu, flags);
  if (any == 0) return;
  const unsigned same = 0x11111111u << t, below = same & ((1u << lane) - 1u);  // the lanes of my column
  const int64_t col_stride = int64_t(a.tk_out.nseg) * a.tk_out.seg_cap;
  uint64_t* const lists = a.tk_out.list + (int64_t(m0 + 2 * t) * a.tk_out.nseg + seg) * a.tk_out.seg_cap;  // column 2t's list
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      if (!((any >> (2 * n + c)) & 1u)) continue;  // warp-uniform
      const int col = n * 8 + 2 * t + c;
      const float th = thr_s[col], v0 = acc[n][c], v1 = acc[n][c + 2];
      const bool h0 = va && v0 >= th, h1 = vb && v1 >= th;
      const unsigned b0 = __ballot_sync(0xffffffffu, h0), b1 = __ballot_sync(0xffffffffu, h1);
      const unsigned base = cnt[col], n0 = __popc(b0 & same);
      uint64_t* list = lists + (n * 8 + c) * col_stride + base;
      if (h0) list[__popc(b0 & below)] = make_entry(v0, ra);
      if (h1) list[n0 + __popc(b1 & below)] = make_entry(v1, rb);
      __syncwarp();
      if (g == 0) cnt[col] = base + n0 + __popc(b1 & same);
    }
  __syncwarp();
}

}  // namespace qhead::cuda_detail
