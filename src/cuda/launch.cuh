// The launch of a LogitsPlan: one switch on plan.kernel, then the plan's
// fields turned into template constants. The launchers decide nothing (the
// selector did: select.cc) and never write into the caller's arguments.
// One instantiation per (code width, activation dtype) in instances/.
#pragma once

#include <algorithm>
#include <string>
#include <type_traits>

#include "gemm_mma_sync.cuh"
#include "gemm_wgmma_ws.cuh"
#include "gemv_regring.cuh"
#include "gemv_staged.cuh"

namespace qhead::cuda_detail {

using cuda_plan::LogitsEpilogue;
using cuda_plan::LogitsKernel;

[[noreturn]] inline void plan_not_compiled(const LogitsPlan& plan, const char* why) {
  throw Error(ErrorCode::kInternal, "logits", "plan " + plan.describe() + ": " + why);
}

// Calls f(std::integral_constant<int, GS>()) for plan.group_segs: the group
// layouts a kernel is compiled for (one_segment: groups of one 16-byte
// segment too).
template <bool ONE_SEGMENT, class F>
void with_group_segs(const LogitsPlan& plan, F&& f) {
  switch (plan.group_segs) {
    case 1:
      if constexpr (ONE_SEGMENT) return f(std::integral_constant<int, 1>());
      break;
    case 2: return f(std::integral_constant<int, 2>());
    case 4: return f(std::integral_constant<int, 4>());
    case 0: return f(std::integral_constant<int, 0>());
    default: break;
  }
  plan_not_compiled(plan, "no kernel is compiled for this group layout");
}

template <class F>
void with_asym(bool asym, F&& f) {
  if (asym) f(std::true_type());
  else f(std::false_type());
}

// ---- register-ring GEMV ------------------------------------------------------------------

template <int BITS, class T, int L, int RT, int NT, int D, bool ASYM, int W>
void launch_regring_cfg(const LogitsArgs& a, cudaStream_t s) {
  auto kernel = logits_gemv_regring_kernel<BITS, T, L, RT, NT, D, ASYM>;
  static int per_sm = [&] {
    int b = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, W * 32, 0);
    return b > 0 ? b : 1;
  }();
  const int Mpad = (a.M + 7) & ~7;
  const int64_t nfrag = int64_t(a.H / 4) * Mpad;
  permute_x_kernel<BITS, T, L><<<static_cast<unsigned>((nfrag + 255) / 256), 256, 0, s>>>(
      static_cast<const T*>(a.x), static_cast<T*>(a.x_frag), a.M, Mpad, a.H);
  QHEAD_CUDA_CHECK_LAUNCH("permute_x_kernel");
  const int mtiles = (Mpad + 8 * NT - 1) / (8 * NT);
  const int64_t tiles = (a.V + 16 * RT - 1) / (16 * RT);
  const int64_t want = (tiles + W - 1) / W;
  const int64_t room = std::max<int64_t>(1, int64_t(sm_count()) * per_sm / mtiles);
  dim3 grid(static_cast<unsigned>(mtiles), static_cast<unsigned>(std::min(want, room)));
  kernel<<<grid, W * 32, 0, s>>>(a);
  QHEAD_CUDA_CHECK_LAUNCH("logits_gemv_regring_kernel");
}

// The configurations select.cc's plan_regring chooses, and only those.
template <int BITS, class T, int L>
void launch_regring_l(const LogitsArgs& a, const LogitsPlan& p, cudaStream_t s) {
  const bool asym = a.zp != nullptr;
#define QHEAD_REGRING(RT, NT, D, W)                                                                              \
  if (p.row_tiles == RT && p.col_tiles == NT && p.stages == D && p.warps == W)                                   \
    return asym ? launch_regring_cfg<BITS, T, L, RT, NT, D, true, W>(a, s)                                       \
                : launch_regring_cfg<BITS, T, L, RT, NT, D, false, W>(a, s);
  if constexpr (BITS == 4 && L == 16) {
    QHEAD_REGRING(2, 2, 4, 4)
  } else if constexpr (BITS == 4) {
    QHEAD_REGRING(2, 1, 4, 4)
    QHEAD_REGRING(1, 2, 4, 8)
  } else {
    QHEAD_REGRING(1, 1, 4, 8)
    QHEAD_REGRING(1, 2, 4, 8)
  }
  QHEAD_REGRING(1, 4, 4, 8)
  QHEAD_REGRING(1, 8, 2, 8)
#undef QHEAD_REGRING
  plan_not_compiled(p, "no register-ring configuration is compiled for these tiles");
}

template <int BITS, class T>
void launch_regring(const LogitsArgs& a, const LogitsPlan& p, cudaStream_t s) {
  switch (p.piece_bytes) {
    case 16: return launch_regring_l<BITS, T, 16>(a, p, s);
    case 8: return launch_regring_l<BITS, T, 8>(a, p, s);
    case 4:
      if constexpr (BITS == 4) return launch_regring_l<BITS, T, 4>(a, p, s);
      break;
    default: break;
  }
  plan_not_compiled(p, "no register-ring kernel is compiled for this piece size");
}

// ---- staged GEMV -------------------------------------------------------------------------

template <int C_, int GS_, bool ASYM_, bool TOPK_, int NT_, int NW_ = kStagedWarps, int NS_ = kStagedStages,
          bool WG_ = false>
struct StagedConfig {
  static constexpr int C = C_, GS = GS_, NT = NT_, NW = NW_, NS = NS_;
  static constexpr bool ASYM = ASYM_, TOPK = TOPK_, WG = WG_;
};

// Calls f(StagedConfig<...>()) for the plan's staged configuration: 128- or
// (4-bit, no epilogue) 64-byte stages; two column tiles above 8 columns and
// four above 16 (no epilogue; 2 stages with 128-byte stages in 8 warps); the
// pool epilogue with 128-byte stages and one column tile.
template <int BITS, class F>
void with_staged_config(const LogitsPlan& p, bool asym, F&& f) {
  const bool wide = p.warps == kStagedWideWarps;
  if (p.row_tiles != kStagedRowTiles || p.stages != staged_stages(p.col_tiles, p.stage_bytes, p.warps) ||
      (p.warps != kStagedWarps &&
       !(BITS == 8 && wide && p.col_tiles == 4 && p.stage_bytes == 128)))
    plan_not_compiled(p, "the staged GEMV is compiled for one row tile, 3 stages (2 for four column tiles of "
                         "128-byte stages in 8 warps) and 8 warps (16 for 8-bit rows with four column tiles)");
  const bool topk = p.epilogue == LogitsEpilogue::kTopkPools;
  with_asym(asym, [&](auto as) {
    constexpr bool ASYM = decltype(as)::value;
    with_group_segs<true>(p, [&](auto gs) {
      constexpr int GS = decltype(gs)::value;
      // 8-bit groups of one 16-byte segment (16 h) take no fused kernel (select.cc).
      if constexpr (BITS == 8 && GS == 1) plan_not_compiled(p, "no staged kernel for 8-bit groups of 16");
      else if (p.wgmma) {  // the warpgroup form: 128-byte stages, four column tiles, 8 warps
        if (p.stage_bytes == 128 && !topk && p.col_tiles == 4 && !wide)
          return f(StagedConfig<128, GS, ASYM, false, 4, kStagedWarps, kStagedFourTileStages, true>());
      } else if (topk) {
        if (p.stage_bytes == 128 && p.col_tiles == 1) return f(StagedConfig<128, GS, ASYM, true, 1>());
      } else if (p.stage_bytes == 128) {
        if (p.col_tiles == 4) {
          if constexpr (BITS == 8) {
            if (wide) return f(StagedConfig<128, GS, ASYM, false, 4, kStagedWideWarps>());
          }
          return f(StagedConfig<128, GS, ASYM, false, 4, kStagedWarps, kStagedFourTileStages>());
        }
        if (p.col_tiles == 2) return f(StagedConfig<128, GS, ASYM, false, 2>());
        if (p.col_tiles == 1) return f(StagedConfig<128, GS, ASYM, false, 1>());
      } else if (p.stage_bytes == 64) {
        if constexpr (BITS == 4) {
          if (p.col_tiles == 4) return f(StagedConfig<64, GS, ASYM, false, 4>());
          if (p.col_tiles == 2) return f(StagedConfig<64, GS, ASYM, false, 2>());
          if (p.col_tiles == 1) return f(StagedConfig<64, GS, ASYM, false, 1>());
        }
      }
      plan_not_compiled(p, "no staged configuration is compiled for these stages and tiles");
    });
  });
}

template <int BITS, class T, class Cfg>
constexpr auto staged_kernel() {
  // Two accumulator chains per group for one column tile; with more, the
  // tiles' MMAs are the independent chains.
  if constexpr (Cfg::WG)
    return logits_gemv_staged_wg_kernel<BITS, T, Cfg::C, Cfg::NS, Cfg::GS, Cfg::ASYM, Cfg::NW>;
  else
    return logits_gemv_staged_kernel<BITS, T, Cfg::C, kStagedRowTiles, Cfg::NS, Cfg::GS, Cfg::ASYM, Cfg::TOPK,
                                     Cfg::NT == 1 ? kStagedChains : 1, Cfg::NW, Cfg::NT>;
}

inline int smem_optin() {
  static const int v = [] {
    int dev = 0, b = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&b, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return b;
  }();
  return v;
}

template <int BITS, class T>
void launch_staged(const LogitsArgs& args, const LogitsPlan& p, cudaStream_t s) {
  with_staged_config<BITS>(p, args.zp != nullptr, [&](auto cfg) {
    using Cfg = decltype(cfg);
    constexpr auto kernel = staged_kernel<BITS, T, Cfg>();
    allow_dynamic_smem<kernel>(smem_optin());
    LogitsArgs a = args;
    const int64_t want = ((a.V + 15) / 16 + Cfg::NW - 1) / Cfg::NW;
    int64_t grid = 0;
    if constexpr (Cfg::TOPK) {
      grid = p.grid;  // the pools are sized for it
      a.tk_cap = p.pool_cap;
      a.tk_cols = p.pool_cols;
    } else {
      // As many CTAs as fit at once (occupancy at the plan's shared memory, read once per size).
      static size_t occ_smem = 0;
      static int occ = 1;
      if (size_t(p.smem_bytes) != occ_smem) {
        int b = 0;
        QHEAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, Cfg::NW * 32, p.smem_bytes));
        occ = std::max(1, b);
        occ_smem = size_t(p.smem_bytes);
      }
      grid = std::min<int64_t>(want, int64_t(sm_count()) * occ);
    }
    if (p.x_prebuilt) {  // the activations built once per call, in the layout the form reads
      if constexpr (Cfg::WG) {  // the wgmma B layout of one 8·NT-column tile, copied flat by each CTA
        const int64_t nunits = int64_t(a.H / 16) * (8 * Cfg::NT) * 2;
        permute_x_wg_kernel<BITS, T><<<unsigned((nunits + 255) / 256), 256, 0, s>>>(
            static_cast<const T*>(a.x), static_cast<T*>(a.x_frag), a.M, 8 * Cfg::NT, 8 * Cfg::NT, a.H);
        QHEAD_CUDA_CHECK_LAUNCH("permute_x_wg_kernel");
      } else {
        const int n = a.M * a.H / 4 + staged_zero_bytes(BITS, Cfg::C) / 16;
        staged_x_kernel<BITS, T, Cfg::C><<<unsigned((n + 255) / 256), 256, 0, s>>>(
            static_cast<const T*>(a.x), a.M, a.H, static_cast<unsigned char*>(a.x_frag));
        QHEAD_CUDA_CHECK_LAUNCH("staged_x_kernel");
      }
      a.x_stage = a.x_frag;
    }
    kernel<<<dim3(1u, unsigned(grid)), Cfg::NW * 32, p.smem_bytes, s>>>(a);
    QHEAD_CUDA_CHECK_LAUNCH("logits_gemv_staged_kernel");
  });
}

// Resident staged-GEMV CTAs per SM at smem_bytes of shared memory (the
// selector sizes the pool epilogue's pools with it).
template <int BITS, class T>
int staged_occupancy(const LogitsPlan& p, bool asym, int smem_bytes) {
  int b = 0;
  with_staged_config<BITS>(p, asym, [&](auto cfg) {
    using Cfg = decltype(cfg);
    constexpr auto kernel = staged_kernel<BITS, T, Cfg>();
    allow_dynamic_smem<kernel>(smem_optin());
    QHEAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, Cfg::NW * 32, smem_bytes));
  });
  return b;
}

// ---- GEMMs ---------------------------------------------------------------------------

template <int BITS, class T, int NT, int GS, bool ASYM>
void launch_mma_sync_cfg(const LogitsArgs& a, cudaStream_t s) {
  constexpr int BM = 8 * NT, BV = 256, MINB = NT <= 4 ? 2 : 1;
  using Gg = GemmGeometry<BITS, BV, BM, ASYM, gemm_stages<MINB>()>;
  constexpr auto kernel = logits_gemm_mma_sync_kernel<BITS, T, NT, GS, ASYM, MINB>;
  allow_dynamic_smem<kernel>(Gg::SMEM);
  const int Mpad = (a.M + BM - 1) / BM * BM;
  const int64_t nfrag = int64_t(a.H / 4) * Mpad;
  permute_x_kernel<BITS, T, 4><<<static_cast<unsigned>((nfrag + 255) / 256), 256, 0, s>>>(
      static_cast<const T*>(a.x), static_cast<T*>(a.x_frag), a.M, Mpad, a.H);
  QHEAD_CUDA_CHECK_LAUNCH("permute_x_kernel");
  const int64_t units = (a.V + BV - 1) / BV * (Mpad / BM);
  kernel<<<unsigned(std::min<int64_t>(units, int64_t(sm_count()) * MINB)), kGemmThreads, Gg::SMEM, s>>>(a, Mpad);
  QHEAD_CUDA_CHECK_LAUNCH("logits_gemm_mma_sync_kernel");
}

template <int BITS, class T>
void launch_mma_sync(const LogitsArgs& a, const LogitsPlan& p, cudaStream_t s) {
  with_asym(a.zp != nullptr, [&](auto as) {
    constexpr bool ASYM = decltype(as)::value;
    with_group_segs<BITS == 4>(p, [&](auto gs) {
      constexpr int GS = decltype(gs)::value;
      if (p.col_tiles == 4) return launch_mma_sync_cfg<BITS, T, 4, GS, ASYM>(a, s);
      if (p.col_tiles == 8) return launch_mma_sync_cfg<BITS, T, 8, GS, ASYM>(a, s);
      plan_not_compiled(p, "the mma.sync GEMM is compiled for 4 or 8 column tiles");
    });
  });
}

template <int BITS, class T, int BN, int GS, bool ASYM>
void launch_wgmma_cfg(const LogitsArgs& a, cudaStream_t s) {
  constexpr int BV = 128, MINB = BN <= 64 ? 2 : 1;
  using Gg = GemmGeometry<BITS, BV, BN, ASYM, gemm_stages<MINB>()>;
  constexpr auto kernel = logits_gemm_wgmma_kernel<BITS, T, BN, GS, ASYM, MINB>;
  allow_dynamic_smem<kernel>(Gg::SMEM);
  const int Mpad = (a.M + BN - 1) / BN * BN;
  const int64_t nunits = int64_t(a.H / 16) * Mpad * 2;
  permute_x_wg_kernel<BITS, T><<<static_cast<unsigned>((nunits + 255) / 256), 256, 0, s>>>(
      static_cast<const T*>(a.x), static_cast<T*>(a.x_frag), a.M, Mpad, BN, a.H);
  QHEAD_CUDA_CHECK_LAUNCH("permute_x_wg_kernel");
  // B descriptor without the start address: LBO = BN·16 bytes (the k-halves), SBO = 128 bytes, no swizzle.
  const uint64_t desc_hi = (uint64_t(BN * 16 >> 4) << 16) | (uint64_t(128 >> 4) << 32);
  const int64_t units = (a.V + BV - 1) / BV * (Mpad / BN);
  kernel<<<unsigned(std::min<int64_t>(units, int64_t(sm_count()) * MINB)), kGemmThreads, Gg::SMEM, s>>>(a, Mpad, desc_hi);
  QHEAD_CUDA_CHECK_LAUNCH("logits_gemm_wgmma_kernel");
}

template <int BITS, class T>
void launch_wgmma(const LogitsArgs& a, const LogitsPlan& p, cudaStream_t s) {
  with_asym(a.zp != nullptr, [&](auto as) {
    constexpr bool ASYM = decltype(as)::value;
    with_group_segs<BITS == 4>(p, [&](auto gs) {
      constexpr int GS = decltype(gs)::value;
      if (p.block_cols == 64) return launch_wgmma_cfg<BITS, T, 64, GS, ASYM>(a, s);
      if (p.block_cols == 128) return launch_wgmma_cfg<BITS, T, 128, GS, ASYM>(a, s);
      plan_not_compiled(p, "the wgmma GEMM is compiled for 64 or 128 columns");
    });
  });
}

// grid: CTAs (0: one per SM, at most one per unit).
template <int BITS, class T, int BN, int GS, bool ASYM, bool TOPK>
void launch_wgmma_ws_cfg(const LogitsArgs& a, cudaStream_t s, int64_t grid) {
  constexpr int BV = 128;
  constexpr int SMEM = ws_smem_bytes<BITS, BN, ASYM>();
  constexpr auto kernel = logits_gemm_wgmma_ws_kernel<BITS, T, BN, GS, ASYM, TOPK>;
  allow_dynamic_smem<kernel>(SMEM);
  const int Mpad = (a.M + BN - 1) / BN * BN;
  const int64_t nunits = int64_t(a.H / 16) * Mpad * 2;
  if (!(a.x_frag_ready && BN == 128)) {
    permute_x_wg_kernel<BITS, T, WsGeometry<BITS, BN, ASYM>::KBST><<<static_cast<unsigned>((nunits + 255) / 256), 256, 0, s>>>(
        static_cast<const T*>(a.x), static_cast<T*>(a.x_frag), a.M, Mpad, BN, a.H);
    QHEAD_CUDA_CHECK_LAUNCH("permute_x_wg_kernel");
  }
  // B descriptor without the start address: 128-byte swizzle (layout type 1), SBO = 1024 bytes
  // between 8-column atoms, LBO unused (1).
  const uint64_t desc_hi = (uint64_t(1) << 62) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 16);
  const int64_t units = (a.V + BV - 1) / BV * (Mpad / BN);
  if (grid == 0) grid = std::min<int64_t>(units, int64_t(sm_count()));
  kernel<<<unsigned(grid), kWsThreads, SMEM, s>>>(a, Mpad, desc_hi);
  QHEAD_CUDA_CHECK_LAUNCH("logits_gemm_wgmma_ws_kernel");
}

template <int BITS, class T>
void launch_wgmma_ws(const LogitsArgs& a, const LogitsPlan& p, cudaStream_t s) {
  const bool lists = p.epilogue == LogitsEpilogue::kTopkLists;
  with_asym(a.zp != nullptr, [&](auto as) {
    constexpr bool ASYM = decltype(as)::value;
    with_group_segs<BITS == 4>(p, [&](auto gs) {
      constexpr int GS = decltype(gs)::value;
      if (lists && p.block_cols == 128) return launch_wgmma_ws_cfg<BITS, T, 128, GS, ASYM, true>(a, s, p.grid);
      if (!lists && p.block_cols == 64) return launch_wgmma_ws_cfg<BITS, T, 64, GS, ASYM, false>(a, s, 0);
      if (!lists && p.block_cols == 128) return launch_wgmma_ws_cfg<BITS, T, 128, GS, ASYM, false>(a, s, 0);
      plan_not_compiled(p, "the warp-specialized GEMM is compiled for 64 or 128 columns (lists: 128)");
    });
  });
}

// ---- the one entry ---------------------------------------------------------------------

// Runs `plan` (a fused kernel) on `args`: the caller has set the table, x,
// the workspaces and the outputs the plan's epilogue writes (out, or the
// pools' tk_cand / tk_part for plan.grid CTAs, or the lists' tk_out).
template <int BITS, class T>
void launch_logits(const LogitsArgs& args, const LogitsPlan& plan, cudaStream_t s) {
  LogitsArgs a = args;
  a.st_spg = plan.stages_per_group;
  switch (plan.kernel) {
    case LogitsKernel::kGemvRegRing: return launch_regring<BITS, T>(a, plan, s);
    case LogitsKernel::kGemvStaged: return launch_staged<BITS, T>(a, plan, s);
    case LogitsKernel::kGemmMmaSync: return launch_mma_sync<BITS, T>(a, plan, s);
    case LogitsKernel::kGemmWgmma: return launch_wgmma<BITS, T>(a, plan, s);
    case LogitsKernel::kGemmWgmmaWs: return launch_wgmma_ws<BITS, T>(a, plan, s);
    case LogitsKernel::kCublasFallback: break;
  }
  plan_not_compiled(plan, "not a fused kernel");
}

// Declared here, defined in instances/logits_w{4,8}_{f16,bf16}.cu (one configuration each).
void launch_logits_w4_f16(const LogitsArgs& a, const LogitsPlan& plan, cudaStream_t s);
void launch_logits_w4_bf16(const LogitsArgs& a, const LogitsPlan& plan, cudaStream_t s);
void launch_logits_w8_f16(const LogitsArgs& a, const LogitsPlan& plan, cudaStream_t s);
void launch_logits_w8_bf16(const LogitsArgs& a, const LogitsPlan& plan, cudaStream_t s);
int staged_occupancy_w4_f16(const LogitsPlan& plan, bool asym, int smem_bytes);
int staged_occupancy_w4_bf16(const LogitsPlan& plan, bool asym, int smem_bytes);
int staged_occupancy_w8_f16(const LogitsPlan& plan, bool asym, int smem_bytes);
int staged_occupancy_w8_bf16(const LogitsPlan& plan, bool asym, int smem_bytes);

}  // namespace qhead::cuda_detail
