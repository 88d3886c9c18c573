// The mma.sync GEMM (LogitsKernel::kGemmMmaSync).
#pragma once

#include "gemm_common.cuh"

namespace qhead::cuda_detail {

template <int MINB> constexpr int gemm_stages() { return MINB == 2 ? 3 : kGemmNS; }

template <int BITS, class T, int NT, int GS, bool ASYM, int MINB>
__global__ void __launch_bounds__(kGemmThreads, MINB) logits_gemm_mma_sync_kernel(const LogitsArgs a, int Mpad) {
  constexpr int RT = 2, BV = 256, BM = 8 * NT, NS = gemm_stages<MINB>();
  using Gg = GemmGeometry<BITS, BV, BM, ASYM, NS>;
  constexpr int SPS = Gg::SPS, KBS = Gg::KBS, P = Gg::P;
  constexpr int GPS = GS > 0 ? SPS / GS : 1;  // groups a stage touches
  constexpr int GS1 = GS > 0 ? GS : 1;
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3, wic = tid >> 5;
  extern __shared__ __align__(16) unsigned char gm_smem[];
  GemmStream<BITS, BV, BM, GS, ASYM, NS> st;
  if (!st.init(a, Mpad, smem_u32(gm_smem))) return;
  const uint32_t smem0 = st.smem0;

  const uint32_t lane_off = uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 16);
  float acc[RT][NT][4], cacc[RT][NT][4];
  zero_acc(acc);
  uint32_t bias[RT][2], bias16[RT][2];
  float zoff[RT][2];
  init_bias<BITS, T>(bias, bias16, zoff);

  for (int64_t q = 0; q < st.total; ++q) {
    const int slot = st.begin(a, q);
    const unsigned char* stp = gm_smem + slot * Gg::STAGE;
    const uint32_t wb = smem0 + slot * Gg::STAGE + wic * 32 * P;
    uint32_t w[RT][SPS][2];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int sp = 0; sp < SPS / 2; ++sp)
        ldmatrix_x4(wb + r * 16 * P + sp * 32 + lane_off, w[r][2 * sp][0], w[r][2 * sp][1], w[r][2 * sp + 1][0],
                    w[r][2 * sp + 1][1]);
    const uint2* xsm = reinterpret_cast<const uint2*>(stp + Gg::W_BYTES) + (g * 4 + t);
    const unsigned char* ss = stp + Gg::W_BYTES + Gg::X_BYTES;
    const uint32_t* zs = reinterpret_cast<const uint32_t*>(stp + Gg::W_BYTES + Gg::X_BYTES + Gg::S_BYTES);
    const int64_t row0 = st.row0, g0 = st.g0;
#pragma unroll
    for (int sg = 0; sg < SPS; ++sg) {
      const bool gstart = GS > 0 ? (sg % GS1 == 0) : (sg == 0 && st.group_starts());
      const bool gend = GS > 0 ? (sg % GS1 == GS1 - 1) : (sg == SPS - 1 && st.group_ends());
      const int gi = GS > 0 ? sg / GS1 : 0;
      if (gstart) {
        zero_acc(cacc);
        if constexpr (ASYM) {
#pragma unroll
          for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              set_bias<BITS, T>(gemm_zero<BITS>(zs, wic * 32 + r * 16 + h * 8 + g, gi), bias[r][h], bias16[r][h], zoff[r][h]);
        }
      }
#pragma unroll
      for (int j = 0; j < KBS; ++j) {
        const int kb = sg * KBS + j;
        uint32_t A[RT][4];
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          A[r][0] = dequant_pair<BITS, T>(w[r][sg][0], j, 0, bias[r][0], bias16[r][0], zoff[r][0]);
          A[r][1] = dequant_pair<BITS, T>(w[r][sg][1], j, 0, bias[r][1], bias16[r][1], zoff[r][1]);
          A[r][2] = dequant_pair<BITS, T>(w[r][sg][0], j, 1, bias[r][0], bias16[r][0], zoff[r][0]);
          A[r][3] = dequant_pair<BITS, T>(w[r][sg][1], j, 1, bias[r][1], bias16[r][1], zoff[r][1]);
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint2 B = xsm[(kb * BM + n * 8) * 4];
#pragma unroll
          for (int r = 0; r < RT; ++r) mma16816<T>(cacc[r][n], A[r], B.x, B.y);
        }
      }
      if (gend) {  // the group ends: scale its f32 partial sums once
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          const float s0 = gemm_scale<GPS>(a, ss, wic * 32 + r * 16 + g, gi, row0, g0);
          const float s1 = gemm_scale<GPS>(a, ss, wic * 32 + r * 16 + 8 + g, gi, row0, g0);
          fold_group<NT>(acc[r], cacc[r], s0, s1);
        }
      }
    }
    if (st.end_stage()) {  // the unit is done: C fragments → out
      store_tile<RT, NT>(a, acc, row0 + wic * 32, st.m0, g, t);
      zero_acc(acc);
      st.next_unit();
    }
  }
  cp_async_wait<0>();  // no copy outlives the kernel (the trailing empty groups)
}

}  // namespace qhead::cuda_detail
