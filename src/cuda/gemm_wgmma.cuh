// The CTA-barrier wgmma GEMM (LogitsKernel::kGemmWgmma, sm_90a).
#pragma once

#include "gemm_common.cuh"

namespace qhead::cuda_detail {

// ---- the CTA-barrier wgmma GEMM (sm_90a, large M) ----------------------------------------------
//
// Why. The mma.sync GEMM reads every B fragment from shared memory once per
// 32 rows (128 bytes per m16n8k16), which caps it near the SM's shared-memory
// bandwidth long before the tensor cores (ncu, M = 32: tensor pipe 23 %,
// 2 warps per scheduler, half the cycles with no eligible warp). wgmma lets
// a warpgroup multiply its 64 rows by up to 128 columns in one instruction,
// with B read by the tensor cores straight from shared memory.
//
// Same bytes, same exactness. The A operand comes from registers: each warp
// of a warpgroup dequantizes its 16 rows exactly as for mma.sync (the
// m64nNk16 register fragment of warp w is the m16n8k16 fragment of rows
// 16w..16w+15). B is the activations, K-major without swizzle: core matrices
// of 8 columns × 8 k (16 bytes each, 128 contiguous bytes), the two k-halves
// of a k-block BM·16 bytes apart (LBO) and consecutive column groups 128
// bytes apart (SBO). permute_x_wg_kernel writes them in that order with the
// k-slots permuted like the codes, so a stage copies them as it is. Per
// group the warpgroup's wgmmas start from zero (scale-d = 0) into cacc and
// the group's scale is applied once to the f32 result (cacc → acc), after
// wgmma.wait_group: the same arithmetic as the kernels above.
//
// CTA: two warpgroups × 64 rows = 128 rows × BN columns (BN = 64 | 128),
// the stage ring, unit order and persistent grid of the mma.sync GEMM.


// The A fragments of group gi's part of a stage (SEGS 16-byte segments of
// KBS k-blocks each) from the warp's ldmatrix'd codes w[SPS][2], with the
// group's bias: A[sl·KBS + j] = the m16n8k16 fragment of k-block j of
// segment gi·SEGS + sl (both wgmma kernels).
template <int BITS, class T, int SEGS, int KBS, int SPS>
__device__ __forceinline__ void dequant_batch(const uint32_t (&w)[SPS][2], int gi, const uint32_t (&bias)[1][2],
                                              const uint32_t (&bias16)[1][2], const float (&zoff)[1][2],
                                              uint32_t (&A)[SEGS * KBS][4]) {
#pragma unroll
  for (int sl = 0; sl < SEGS; ++sl)
#pragma unroll
    for (int j = 0; j < KBS; ++j) {
      const int sg = gi * SEGS + sl;
      uint32_t* Ak = A[sl * KBS + j];
      Ak[0] = dequant_pair<BITS, T>(w[sg][0], j, 0, bias[0][0], bias16[0][0], zoff[0][0]);
      Ak[1] = dequant_pair<BITS, T>(w[sg][1], j, 0, bias[0][1], bias16[0][1], zoff[0][1]);
      Ak[2] = dequant_pair<BITS, T>(w[sg][0], j, 1, bias[0][0], bias16[0][0], zoff[0][0]);
      Ak[3] = dequant_pair<BITS, T>(w[sg][1], j, 1, bias[0][1], bias16[0][1], zoff[0][1]);
    }
}

// One stage of the CTA-barrier wgmma GEMM: warp wic (0..7) of the
// consumer warpgroups dequantizes its rows wic·16 + {g, g+8} of the stage at
// shared address stu (generic pointer stp), its warpgroup (wic / 4) issues
// the wgmmas of its 64 rows × BN columns per group into cacc (scale-d = 0 at
// a group's start), waits for them, and folds each finished group into acc
// with the group's scales. On return no wgmma of this stage is in flight and
// the warp has read everything of the slot it will read.
template <int BITS, class T, int BN, int GS, bool ASYM, int NS, class Cursor>
__device__ __forceinline__ void wgmma_stage(const LogitsArgs& a, const Cursor& cur, uint64_t desc_hi, uint32_t stu,
                                            const unsigned char* stp, int wic, int lane, float (&acc)[1][BN / 8][4],
                                            float (&cacc)[1][BN / 8][4], uint32_t (&bias)[1][2], uint32_t (&bias16)[1][2],
                                            float (&zoff)[1][2]) {
  constexpr int BV = 128, BM = BN, NT = BN / 8;
  using Gg = GemmGeometry<BITS, BV, BM, ASYM, NS>;
  constexpr int SPS = Gg::SPS, KBS = Gg::KBS, P = Gg::P;
  constexpr int GPS = GS > 0 ? SPS / GS : 1;
  constexpr int SEGS = GS > 0 ? GS : SPS;  // segments of one group inside a stage
  const int g = lane >> 2;
  const uint32_t lane_off = uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 16);
  uint32_t w[SPS][2];
  {
    const uint32_t wb = stu + (wic * 16) * P;
#pragma unroll
    for (int sp = 0; sp < SPS / 2; ++sp)
      ldmatrix_x4(wb + sp * 32 + lane_off, w[2 * sp][0], w[2 * sp][1], w[2 * sp + 1][0], w[2 * sp + 1][1]);
  }
  const uint32_t xb = stu + Gg::W_BYTES;
  const unsigned char* ss = stp + Gg::W_BYTES + Gg::X_BYTES;
  const uint32_t* zs = reinterpret_cast<const uint32_t*>(stp + Gg::W_BYTES + Gg::X_BYTES + Gg::S_BYTES);
  const int64_t row0 = cur.row0, g0 = cur.g0;
#pragma unroll
  for (int gi = 0; gi < GPS; ++gi) {
    const bool gstart = cur.group_starts();
    const bool gend = cur.group_ends();
    if constexpr (ASYM) {
      if (gstart) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          set_bias<BITS, T>(gemm_zero<BITS>(zs, wic * 16 + h * 8 + g, gi), bias[0][h], bias16[0][h], zoff[0][h]);
      }
    }
    uint32_t A[SEGS * KBS][4];
    dequant_batch<BITS, T, SEGS, KBS>(w, gi, bias, bias16, zoff, A);
    fence_regs<NT>(cacc[0]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < SEGS * KBS; ++kk) {
      const int kb = gi * SEGS * KBS + kk;
      const uint64_t desc = desc_hi | uint64_t(((xb + kb * BM * 32) & 0x3FFFF) >> 4);
      const int scale_d = (kk > 0 || !gstart) ? 1 : 0;
      if constexpr (BN == 128) wgmma_n128<T>(cacc[0], A[kk], desc, scale_d);
      else wgmma_n64<T>(cacc[0], A[kk], desc, scale_d);
    }
    wgmma_commit();
    wgmma_wait0();  // A registers and the stage free; cacc final for this stage
    fence_regs<NT>(cacc[0]);
    if (gend) {
      const float s0 = gemm_scale<GPS>(a, ss, wic * 16 + g, gi, row0, g0);
      const float s1 = gemm_scale<GPS>(a, ss, wic * 16 + 8 + g, gi, row0, g0);
      fold_group<NT>(acc[0], cacc[0], s0, s1);
    }
  }
}

template <int BITS, class T, int BN, int GS, bool ASYM, int MINB>
__global__ void __launch_bounds__(kGemmThreads, MINB) logits_gemm_wgmma_kernel(const LogitsArgs a, int Mpad, uint64_t desc_hi) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BV = 128, BM = BN, NT = BN / 8, NS = gemm_stages<MINB>();
  using Gg = GemmGeometry<BITS, BV, BM, ASYM, NS>;
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3, wic = tid >> 5;
  extern __shared__ __align__(128) unsigned char wg_smem[];
  GemmStream<BITS, BV, BM, GS, ASYM, NS> st;
  if (!st.init(a, Mpad, smem_u32(wg_smem))) return;
  const uint32_t smem0 = st.smem0;

  float acc[1][NT][4], cacc[1][NT][4];  // [1]: the one row tile (the shared helpers take [R][NT][4])
  zero_acc(acc);
  uint32_t bias[1][2], bias16[1][2];
  float zoff[1][2];
  init_bias<BITS, T>(bias, bias16, zoff);

  for (int64_t q = 0; q < st.total; ++q) {
    const int slot = st.template begin<true>(a, q);  // every warpgroup's wgmmas on stage q − 1 completed (waited below)
    wgmma_stage<BITS, T, BN, GS, ASYM, NS>(a, st, desc_hi, smem0 + slot * Gg::STAGE, wg_smem + slot * Gg::STAGE, wic, lane,
                                           acc, cacc, bias, bias16, zoff);
    if (st.end_stage()) {  // the unit is done: accumulators → out
      store_tile<1, NT>(a, acc, st.row0 + wic * 16, st.m0, g, t);
      zero_acc(acc);
      st.next_unit();
    }
  }
  cp_async_wait<0>();
#endif
}

}  // namespace qhead::cuda_detail
