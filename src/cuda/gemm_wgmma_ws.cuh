// The warp-specialized wgmma GEMM (LogitsKernel::kGemmWgmmaWs, sm_90a), with
// its optional list epilogue.
#pragma once

#include "epilogue_topk_lists.cuh"
#include "gemm_wgmma.cuh"

namespace qhead::cuda_detail {

// ---- the warp-specialized wgmma GEMM (sm_90a) -----------------------------------------
//
// Why. The CTA-barrier wgmma GEMM's eight warps meet at a CTA barrier every stage and
// both warpgroups wait for their wgmmas at every group end, so they dequantize,
// multiply and fold in lockstep: at M = 256 the tensor cores were busy
// ~16–25 % of the time (docs/tuning-notes.md, "The GEMMs"). Here one warpgroup
// only copies (cp.async for the codes and scales, one bulk copy for the
// activations; completion signalled on a per-slot "full" mbarrier)
// and the two consumer warpgroups never meet: each waits for a slot to be
// full, computes, and marks it free on the slot's "empty" mbarrier (one
// arrival per consumer warp), so one warpgroup's dequant and fold overlap
// the other's wgmmas. Inside a consumer the work is pipelined by batch (one
// group's part of a stage): the next batch is dequantized into the second A
// set while the current batch's wgmmas run; then wait, fold, issue. The
// arithmetic is the CTA-barrier kernel's (same bytes, exact q − z fragments, the same f32
// per-group fold). The producer gives up registers to the consumers
// (setmaxnreg). CTA: 384 threads, 128 rows × BN columns, one per SM.


constexpr int kWsThreads = 384;         // producer warpgroup + two consumer warpgroups
constexpr int kWsSmem = 200 * 1024;     // stage ring budget (of 227 KB per block)
// Code bytes per row per stage: 128 k for both widths. A stage's fixed costs (the two mbarrier
// hand-offs, the scale reads, the batch chain's wait) then buy eight m64nNk16 wgmmas per
// consumer warpgroup, not four: with kGemmC's 64 bytes the 8-bit kernel took 1.45-1.65x
// cuBLAS's time at M = 256 against 1.16-1.31x for 4-bit (docs/tuning-notes.md, "8-bit stage size").
template <int BITS>
constexpr int ws_c() { return BITS == 8 ? 128 : kGemmC; }
template <int BITS, int BN, bool ASYM, int NS = 1>
using WsGeometry = GemmGeometry<BITS, 128, BN, ASYM, NS, ws_c<BITS>()>;
template <int BITS, int BN, bool ASYM>
constexpr int ws_stage_bytes() {  // a WsGeometry stage rounded up to whole 1024-byte swizzle atoms
  return (WsGeometry<BITS, BN, ASYM>::STAGE + 1023) / 1024 * 1024;
}
template <int BITS, int BN, bool ASYM>
constexpr int ws_stages() {
  constexpr int n = kWsSmem / ws_stage_bytes<BITS, BN, ASYM>();
  return n < 6 ? n : 6;
}
template <int BITS, int BN, bool ASYM>
constexpr int ws_smem_bytes() {  // the ring + alignment slack
  return ws_stages<BITS, BN, ASYM>() * ws_stage_bytes<BITS, BN, ASYM>() + 1024;
}



template <int BITS, class T, int BN, int GS, bool ASYM, bool TOPK = false>
__global__ void __launch_bounds__(kWsThreads, 1) logits_gemm_wgmma_ws_kernel(const LogitsArgs a, int Mpad, uint64_t desc_hi) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BV = 128, BM = BN, NT = BN / 8, NS = ws_stages<BITS, BN, ASYM>(), C = ws_c<BITS>();
  using Gg = WsGeometry<BITS, BN, ASYM, NS>;
  constexpr int SPS = Gg::SPS, KBST = Gg::KBST, P = Gg::P, STAGE = ws_stage_bytes<BITS, BN, ASYM>();
  constexpr int GPS = GS > 0 ? SPS / GS : 1;
  static_assert(NS >= 2 && Gg::X_BYTES % (128 * 16) == 0 && KBST % 4 == 0 && Gg::W_BYTES % 1024 == 0,
                "ring of at least two stages; whole 128-thread activation rounds; 1024-byte swizzle atoms");
  static_assert(!TOPK || ws_smem_bytes<BITS, BN, ASYM>() + BN * (4 + 8 * 4 + 8 * 8 * 4) + 16 * NS <= 227 * 1024,
                "the ring and the top-k arrays fit a block's shared memory");
  extern __shared__ __align__(128) unsigned char ws_smem[];
  __shared__ __align__(8) uint64_t bars[2 * NS];  // full[0, NS), empty[NS, 2·NS)
  // TOPK (topk_lists_tile): the CTA's columns' thresholds; each consumer warp's list lengths, and its
  // sums of exp(min(l − thr, 0)) per column and lane row.
  __shared__ float thr_s[TOPK ? BN : 1];
  __shared__ uint32_t cnt_s[TOPK ? 8 : 1][TOPK ? BN : 1];
  __shared__ float sum_s[TOPK ? 8 : 1][TOPK ? BN * 8 : 1];
  const int tid = threadIdx.x;
  // The ring starts at a 1024-byte boundary (the swizzle pattern is taken from address bits 7-9).
  const uint32_t smem0 = (smem_u32(ws_smem) + 1023u) & ~1023u, full0 = smem_u32(bars), empty0 = full0 + NS * 8;
  unsigned char* const sbase = ws_smem + (smem0 - smem_u32(ws_smem));
  if (tid == 0) {
    for (int i = 0; i < NS; ++i) {
      // The producer's 128 threads, each once its cp.async copies landed, + thread 0's expect_tx
      // arrival (the phase completes when the bulk copy's bytes landed too).
      mbar_init(full0 + i * 8, 129);
      mbar_init(empty0 + i * 8, 8);   // the 8 consumer warps, each once done with the slot
    }
  }
  if constexpr (TOPK) {  // the launcher makes gridDim.x a multiple of the column tiles: one tile per CTA
    const int m0 = int(blockIdx.x % unsigned(Mpad / BM)) * BM;
    for (int i = tid; i < BN; i += kWsThreads) {
      thr_s[i] = m0 + i >= a.M ? INFINITY : a.tk_thr ? a.tk_thr[m0 + i] : -INFINITY;
    }
    for (int i = tid; i < 8 * BN; i += kWsThreads) cnt_s[i / BN][i % BN] = 0;
    for (int i = tid; i < 8 * BN * 8; i += kWsThreads) sum_s[i / (BN * 8)][i % (BN * 8)] = 0.0f;
  }
  __syncthreads();
  GemmCursor<BITS, BV, BM, GS, C> cur;
  if (!cur.init(a, Mpad)) return;

  if (tid < 128) {  // producer warpgroup: thread tid copies code row tid of each stage
    setmaxnreg_dec<40>();
    const int64_t row_bytes = int64_t(a.H) * BITS / 8;
    const int sbytes = scale_bytes(a.scale_type);
    const char* wp = nullptr;
    const char* xp = nullptr;
    int wn = 0;
    int64_t soff = 0;
    bool sok = false, zok = false;
    const uint32_t* z = nullptr;
    int slot = 0;
    uint32_t phase = 0;
    for (int64_t q = 0; q < cur.total; ++q) {
      if (q >= NS) mbar_wait(empty0 + slot * 8, phase ^ 1u);  // the slot's previous use was consumed
      if (cur.ks == 0) {  // a new unit: this thread's row, scale row, zero-point word row, column tile
        // The table row (a.tile_stride: a sample's tiles lie apart; they are whole, inside the table).
        const int64_t trow0 = cur.row0 * a.tile_stride, row = trow0 + tid, tv = a.table_rows();
        sok = row < tv;
        wp = reinterpret_cast<const char*>(a.packed) + (sok ? row : 0) * row_bytes;
        wn = sok ? 16 : 0;  // rows past V: zero-filled from an in-range address
        soff = (sok ? row : 0) * a.groups * sbytes;
        if constexpr (ASYM) {
          const int64_t wr = trow0 * BITS / 32 + tid;
          zok = tid < Gg::ZROWS && wr < (tv * BITS + 31) / 32;
          z = a.zp + (zok ? wr : 0) * a.groups;
        }
        xp = static_cast<const char*>(a.x_frag) + int64_t(cur.m0 / BM) * Gg::X_BYTES;  // permute_x_wg_kernel<.., KBST>
      }
      const uint32_t st = smem0 + slot * STAGE;
#pragma unroll
      for (int sp = 0; sp < SPS; ++sp) cp_async<16>(st + tid * P + sp * 16, wp + sp * 16, wn);
      wp += C;
      if (tid == 0) {  // the stage's activations: one block, laid out already, in one bulk copy
        mbar_arrive_expect_tx(full0 + slot * 8, Gg::X_BYTES);
        bulk_copy_g2s(st + Gg::W_BYTES, xp, Gg::X_BYTES, full0 + slot * 8);
      }
      xp += int64_t(Mpad / BM) * Gg::X_BYTES;
      copy_scales_zeros<BITS, BV, GPS, ASYM>(a, st + Gg::W_BYTES + Gg::X_BYTES, soff, sok, z, zok, cur.g0, tid);
      cp_async_mbar_arrive(full0 + slot * 8);
      if (cur.end_stage()) cur.next_unit();
      if (++slot == NS) { slot = 0; phase ^= 1u; }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
  } else {  // consumer warpgroups: warp wic = 0..7 of rows wic·16 + {g, g+8}
    setmaxnreg_inc<232>();
    constexpr int KBS = Gg::KBS, SEGS = GS > 0 ? GS : SPS;  // segments of one group inside a stage
    constexpr int NB = SEGS * KBS;  // k-blocks of a batch: one group's part of a stage
    const int ctid = tid - 128, lane = ctid & 31, g = lane >> 2, t = lane & 3, wic = ctid >> 5;
    const uint32_t lane_off = uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 16);
    float acc[1][NT][4], cacc[1][NT][4];  // acc: set by the unit's first fold
    const int seg = int(blockIdx.x / unsigned(Mpad / BM)) * 8 + wic;  // TOPK: the warp's list segment
    uint32_t bias[1][2], bias16[1][2];
    float zoff[1][2];
    init_bias<BITS, T>(bias, bias16, zoff);
    uint32_t A[2][NB][4];  // two batches' A fragments: one dequantized while the other's wgmmas run
    // The batch in flight and what completing it takes: fold (its group ends; scales read at
    // issue), release its slot (the stage's last batch), store (the unit's last stage).
    bool p_fold = false, p_release = false, p_store = false, store_now = false, fresh = true;
    float p_s0 = 0.0f, p_s1 = 0.0f;
    int p_slot = 0, p_m0 = 0;
    int64_t p_row0 = 0;
    auto complete = [&] {  // wait0 on every path, also with nothing in flight (ptxas tracks the paths)
      wgmma_wait0();
      fence_regs<NT>(cacc[0]);
      keep_regs<NB>(A[0]);  // the in-flight wgmmas read their A registers until here
      keep_regs<NB>(A[1]);
      if (p_fold) {
        if (fresh) {  // the unit's first fold: acc = s · cacc (acc was stored, not zeroed: see store)
          fold_first<NT>(acc[0], cacc[0], p_s0, p_s1);
          fresh = false;
        } else {
          fold_group<NT>(acc[0], cacc[0], p_s0, p_s1);
        }
      }
      if (p_release) {
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + p_slot * 8);
      }
      store_now = p_store;  // stored after the next batch is issued, under its wgmmas
      p_fold = p_release = p_store = false;
    };
    auto store = [&] {
      // No zeroing here: it would wait for the stores to read acc; the next fold assigns instead.
      if constexpr (TOPK) topk_lists_tile<NT>(a, acc[0], p_row0 + wic * 16, p_m0, seg, lane, thr_s, cnt_s[wic], sum_s[wic]);
      else store_tile<1, NT, true>(a, acc, p_row0 + wic * 16, p_m0, g, t);
      fresh = true;
      store_now = false;
    };
    int slot = 0;
    uint32_t phase = 0;
    // One stage; B0: the A set of its first batch (batches alternate sets across stages).
    auto stage = [&](auto b0) {
      // The wgmmas read only the activations, which the bulk copy wrote through the async proxy, the
      // one they read through: no proxy fence (the codes and scales came by cp.async, the generic
      // proxy, and are read by ldmatrix and ld.shared). The fence cost a MEMBAR.ALL.CTA per stage,
      // which waited for the previous unit's logit stores.
      mbar_wait(full0 + slot * 8, phase);
      const uint32_t stu = smem0 + slot * STAGE;
      const unsigned char* stp = sbase + slot * STAGE;
      uint32_t w[SPS][2];
#pragma unroll
      for (int sp = 0; sp < SPS / 2; ++sp)
        ldmatrix_x4(stu + (wic * 16) * P + sp * 32 + lane_off, w[2 * sp][0], w[2 * sp][1], w[2 * sp + 1][0],
                    w[2 * sp + 1][1]);
      const uint32_t xb = stu + Gg::W_BYTES;
      const unsigned char* ss = stp + Gg::W_BYTES + Gg::X_BYTES;
      [[maybe_unused]] const uint32_t* zs = reinterpret_cast<const uint32_t*>(stp + Gg::W_BYTES + Gg::X_BYTES + Gg::S_BYTES);
#pragma unroll
      for (int gi = 0; gi < GPS; ++gi) {
        uint32_t(&Ab)[NB][4] = A[(decltype(b0)::value + gi) & 1];
        const bool gstart = cur.group_starts(), gend = cur.group_ends();
        float s0 = 0.0f, s1 = 0.0f;  // read before the dequant: their latency hides under it
        if (gend) {
          s0 = gemm_scale<GPS>(a, ss, wic * 16 + g, gi, cur.row0, cur.g0);
          s1 = gemm_scale<GPS>(a, ss, wic * 16 + 8 + g, gi, cur.row0, cur.g0);
        }
        if constexpr (ASYM) {
          if (gstart) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
              set_bias<BITS, T>(gemm_zero<BITS>(zs, wic * 16 + h * 8 + g, gi), bias[0][h], bias16[0][h], zoff[0][h]);
          }
        }
        dequant_batch<BITS, T, SEGS, KBS>(w, gi, bias, bias16, zoff, Ab);
        complete();  // the previous batch (if any): its wgmmas ran while this one was dequantized
        p_s0 = s0;
        p_s1 = s1;
        fence_regs<NT>(cacc[0]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < NB; ++kk) {
          // k-block kb of the stage: four per 128-byte row of a column, BM·128 bytes per such k-region
          // (wgmma_ws_x_offset: 128-byte swizzle).
          const int kb = gi * NB + kk;
          const uint32_t kaddr = xb + (kb / 4) * BM * 128 + (kb % 4) * 32;
          const uint64_t desc = desc_hi | uint64_t((kaddr & 0x3FFFF) >> 4);
          const int scale_d = (kk > 0 || !gstart) ? 1 : 0;
          if constexpr (BN == 128) wgmma_n128<T>(cacc[0], Ab[kk], desc, scale_d);
          else wgmma_n64<T>(cacc[0], Ab[kk], desc, scale_d);
        }
        wgmma_commit();
        if (store_now) store();  // the finished unit's logits (p_row0/p_m0 change only below)
        p_fold = gend;
        p_release = gi == GPS - 1;
        p_slot = slot;
        p_store = false;
      }
      if (cur.end_stage()) {
        p_store = true;
        p_row0 = cur.row0;
        p_m0 = cur.m0;
        cur.next_unit();
      }
      if (++slot == NS) { slot = 0; phase ^= 1u; }
    };
    // Stages in pairs, so that every path into a stage that dequantizes into set s comes from one
    // whose batch in flight used the other set (else ptxas inserts a wait for the wgmmas, C7517).
    int64_t q = 0;
    for (; q + 1 < cur.total; q += 2) {
      stage(std::integral_constant<int, 0>());
      stage(std::integral_constant<int, GPS & 1>());
    }
    if (q < cur.total) stage(std::integral_constant<int, 0>());
    complete();
    if (store_now) store();
    if constexpr (TOPK) {  // the warp's list lengths and sums
      __syncwarp();
      const int m0 = int(blockIdx.x % unsigned(Mpad / BM)) * BM;
      for (int col = lane; col < BN && m0 + col < a.M; col += 32) {
        float v = 0.0f;
#pragma unroll
        for (int r = 0; r < 8; ++r) v += sum_s[wic][col * 8 + r];
        a.tk_out.sum[int64_t(m0 + col) * a.tk_out.nseg + seg] = v;
        a.tk_out.count[int64_t(m0 + col) * a.tk_out.nseg + seg] = cnt_s[wic][col];
      }
    }
  }
#endif
}

}  // namespace qhead::cuda_detail
