// The arguments every fused logits kernel takes (raw pointers and sizes), and
// the list epilogue's outputs.
#pragma once

#include <cstdint>
#include "common.cuh"
#include "cuda/geometry.h"
#include "cuda/plan.h"

namespace qhead::cuda_detail {

using namespace ::qhead::cuda_geometry;
using ::qhead::cuda_plan::kTopkGather;
using ::qhead::cuda_plan::LogitsPlan;

// The list epilogue's output (logits_gemm_wgmma_ws_kernel<..., TOPK = true>), read
// by the merge (topk_lists_kernel, src/ops/cuda/topk_lists.cu).
struct TopkLists {
  uint64_t* list = nullptr;   // [M, nseg, seg_cap] entries >= the column's threshold
  uint32_t* count = nullptr;  // [M, nseg] entries in each list
  float* sum = nullptr;       // [M, nseg] Σ exp(min(l − threshold, 0)) over the segment's logits
  int nseg = 0, seg_cap = 0;
};

// The dtype the logits are stored in (LogitsArgs::out_type).
enum OutType : int { kOutF32 = 0, kOutF16 = 1, kOutBF16 = 2 };

struct LogitsArgs {
  const uint32_t* packed;  // [V, H·b/32] codes, pack-quantized
  const void* scale;       // [V, groups] in scale_type
  int scale_type;          // ScaleType
  const uint32_t* zp;      // [ceil(V·b/32), groups] packed along V; nullptr = symmetric
  const void* x;           // [M, H] activations (f16/bf16), as given
  void* x_frag;            // workspace, >= Mpad·H elements + staged_x_extra(Mpad): x in MMA B-fragment order
                           // (permute_x), or in the staged kernel's shared layout (staged_x_kernel)
  const void* x_stage = nullptr;  // staged kernel: x already in its shared layout (staged_x_bytes), copied
                                  // flat into each CTA; nullptr = each CTA builds it from x
  void* out;               // [M, V] logits in out_type, row stride ldo (elements)
  int64_t ldo;
  int out_type = kOutF32;  // OutType: the logits' dtype in memory (rounded to nearest even from the f32 accumulators)
  int64_t V;
  int H;
  int group;   // group length along H (H for per-row)
  int groups;  // H / group
  int M;
  // Fused top-k epilogue (logits_gemv_staged_kernel<..., TOPK = true>); out is unused then.
  int k = 0;                 // candidates kept per (activation row, CTA), <= kTopkGather
  int tk_cap = 0;            // pool entries per activation row in shared memory (>= the rows a CTA computes;
                             // the launcher sets it from LogitsPlan::pool_cap)
  int tk_cols = 0;           // activation rows (columns) a CTA keeps pools for: M (<= 8; LogitsPlan::pool_cols)
  uint64_t* tk_cand = nullptr;  // [M, gridDim.y, k] entries (common.cuh), written
  float2* tk_part = nullptr;    // [M, gridDim.y] (max, Σ exp(l − max)) of the CTA's logits, written
                                // (gridDim.y = LogitsPlan::grid)
  // Top-k candidate lists (logits_gemm_wgmma_ws_kernel<..., TOPK = true>): every logit >= its
  // column's threshold goes to the list of its (column, CTA warp); the others are summed.
  const float* tk_thr = nullptr;  // [M] column m's threshold (<= its k-th logit, list_threshold_kernel);
                                  // nullptr: no threshold, every logit is a candidate
  TopkLists tk_out;               // the lists and sums it writes (the caller's workspace, sized by the plan)
  bool x_frag_ready = false;    // warp-specialized GEMM: x_frag already holds x in its layout for 128 columns (the list
                                // top-k's sample call, same table, made it): no permute_x_wg_kernel
  int64_t tile_stride = 1;      // warp-specialized GEMM only (the plan takes no other then): its 128-row tile j reads
                                // the table's tile j·tile_stride, and V counts the tiles read — the list
                                // top-k's threshold sample, computed in place (V ≤ the table's V / tile_stride)
  // The table rows the kernel may read: every bound on the table's arrays (codes, scales, zero points)
  // takes this, not V.
  __host__ __device__ int64_t table_rows() const { return V * tile_stride; }
  // Tile summaries (staged GEMV, kStoreTiles): beside the logits, each warp tile's (max, Σ exp(l − max))
  // of column m → tile_part[m · tile_ld + tile], tile = its first row / (16·RT). nullptr: none.
  float2* tile_part = nullptr;
  int64_t tile_ld = 0;
  int st_spg = 1;               // staged / GEMM kernel, groups longer than a stage: stages per group
                                // (the launcher sets it from LogitsPlan::stages_per_group)
};

}  // namespace qhead::cuda_detail
