// Sizes of the fused kernels' layouts, shared by the kernels (device and
// host code) and by the kernel selector (select.cc, plain C++): one formula
// each, so a plan's shared memory is the kernel's.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define QHEAD_HD __host__ __device__
#else
#define QHEAD_HD
#endif

namespace qhead::cuda_geometry {

// ---- staged GEMV -----------------------------------------------------------------------
// The design constants of the staged kernel (measured, docs/tuning-notes.md
// "Staged GEMV"): one 16-row tile per warp, 3 stages in flight per warp (2
// with four column tiles in 8 warps), two accumulator chains per tile, 8
// warps per CTA.
constexpr int kStagedRowTiles = 1;
constexpr int kStagedStages = 3;
// Four column tiles of 128-byte stages in 8 warps (select.cc): 2 stages.
// 151936x1024 4-bit M = 17-32 1.5-5 us faster than 3 (top-k by tile select
// 9-13 us), the large tables within +-2 %; and 2 fit where the activations
// leave no room for 3 (262144x2560 w4g64 M = 32, H = 4096 M = 20-21).
constexpr int kStagedFourTileStages = 2;
constexpr int kStagedChains = 2;
constexpr int kStagedWarps = 8;
constexpr int kStagedWideWarps = 16;  // 8-bit rows, four column tiles (select.cc)
// Stages per staged-GEMV warp for a plan's column tiles, stage bytes and warps
// (the selector sets it, the launcher checks it).
QHEAD_HD constexpr int staged_stages(int col_tiles, int stage_bytes, int warps) {
  return col_tiles == 4 && stage_bytes == 128 && warps == kStagedWarps ? kStagedFourTileStages : kStagedStages;
}

// The activations in the staged kernel's B-fragment order: per column m a
// 2H + 64-byte region (the pad puts consecutive columns half a bank row
// apart: a quarter-warp's 16-byte loads never conflict), then a zero block
// that lanes of columns >= M read instead (no predicates).
QHEAD_HD constexpr int staged_zero_bytes(int bits, int stage_bytes) { return (stage_bytes / 16) * (bits == 4 ? 2 : 1) * 32; }
QHEAD_HD constexpr int staged_col_bytes(int H) { return 2 * H + 64; }
QHEAD_HD constexpr int staged_x_bytes(int bits, int stage_bytes, int H, int M) {
  return M * staged_col_bytes(H) + staged_zero_bytes(bits, stage_bytes);
}
// The warpgroup form (LogitsPlan::wgmma): the activations in the wgmma B
// layout of one 8·col_tiles-column tile (permute_x_wg_kernel, BM = 8·col_tiles):
// per k-block 32 bytes per column, columns >= M zero.
QHEAD_HD constexpr int staged_wg_x_bytes(int H, int col_tiles) { return 2 * H * 8 * col_tiles; }
// Bytes the staged layout of M columns needs beyond M·H 16-bit values (the
// activation workspace holds either layout).
QHEAD_HD constexpr int64_t staged_x_extra(int64_t M) { return M * 64 + 512; }

// Shared memory of one staged-GEMV warp: its stage ring (rows padded to
// C + 16 bytes), two buffers of its tile's scales and two of its zero points.
QHEAD_HD constexpr int staged_warp_bytes(int bits, int stage_bytes, int row_tiles, int stages, bool asym, int groups,
                                         int scale_bytes) {
  const int sblk = 16 * row_tiles * groups * scale_bytes;  // a multiple of 32
  const int zblk = asym ? ((16 * row_tiles * bits / 32) * groups * 4 + 15) / 16 * 16 : 0;
  return stages * 16 * row_tiles * (stage_bytes + 16) + 2 * sblk + 2 * zblk;
}

// Scratch bytes the pool epilogue's final selection needs (inside the staged
// kernel's stage ring, free by then), for ncols columns. kGather: candidates
// gathered per column.
QHEAD_HD constexpr int topk_finish_scratch(int ncols, int warps, int gather) {
  return ncols * (gather * 8 + 8 + warps * 8 + 256 * 4 + 4 + 4) + 4;
}

// Dynamic shared memory of the tile-select block (src/ops/cuda/topk_select.cu) for V rows in
// tiles of `tile_rows`: every tile's max (f32, padded to 16 bytes), then `hot_cap` entries of
// the candidate tiles' logits (8 bytes each).
QHEAD_HD constexpr int64_t tile_select_smem(int64_t V, int tile_rows, int hot_cap) {
  return ((V + tile_rows - 1) / tile_rows * 4 + 15) / 16 * 16 + int64_t(hot_cap) * 8;
}

// ---- GEMMs -----------------------------------------------------------------------------
constexpr int kGemmStageBytes = 64;  // code bytes per row per stage (mma.sync and wgmma GEMMs)
constexpr int kGemmMaxCols = 128;    // the widest column tile: the activation workspace pads M to it
// Code bytes per row per stage of the warp-specialized wgmma GEMM: 128 k for
// both widths (docs/tuning-notes.md "Warp-specialized wgmma GEMM").
QHEAD_HD constexpr int wgmma_ws_stage_bytes(int bits) { return bits == 8 ? 128 : kGemmStageBytes; }

}  // namespace qhead::cuda_geometry
