// What the CUDA ops share (internal to src/ops/cuda/): argument errors, the
// process-wide workspaces and cuBLAS handle, the table as kernel arguments,
// and the pieces one op file calls in another.
#pragma once

#include <cublas_v2.h>

#include <memory>
#include <string>

#include "cuda/args.cuh"
#include "cuda/common.cuh"
#include "cuda/plan.h"
#include "qhead/ops.h"
#include "qhead/table.h"

namespace qhead {
namespace cuda_detail {
std::shared_ptr<const void> device_alloc(size_t bytes);
}  // namespace cuda_detail

namespace cuda_ops {

using namespace cuda_detail;

[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, op, what);
}

// ---- workspace and cuBLAS handle (process-wide, reused across calls: workspace.cu) --------

// One grow-only buffer per use, so buffers of one call never alias.
enum WorkspaceSlot : int {
  kWsActivations = 0,  // the fused kernels' activations in their layout
  kWsDenseTable,       // the fallback's dequantized [V, H] table
  kWsLogits,           // [M, V] logits the top-k reads
  kWsTopkCandidates,   // level-0 top-k candidates and partial sums; the list epilogue's lists
  kWsTopkLevels,       // the merge levels' candidates (two buffers)
  kWsTopkSample,       // the list top-k's threshold sample: its logits [M, 8192], the thresholds [M]
  kWsEmbedFlag,        // embed's out-of-range flag
  kWsSample,           // sample's candidates, partial maxima and pending flags
  kWsSampleSort,       // sample's whole-row draw: sorted rows, ids, segment offsets, CUB's temporary storage
  kWsFallbackF32,      // the fallback's f32 logits before their rounding to a 16-bit dtype cuBLAS cannot store
  kWsCount
};
// Grow-only scratch buffer `slot` of at least `bytes` (stream-ordered reuse).
void* workspace(int slot, size_t bytes);
// The cuBLAS handle, on the current stream.
cublasHandle_t blas();
// A cuBLAS failure as an Error naming the call and the status.
void check_blas(cublasStatus_t s, const char* what);

inline cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF16: return CUDA_R_16F;
    case DType::kBF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}
inline int scale_type(DType t) { return t == DType::kF16 ? kScaleF16 : t == DType::kBF16 ? kScaleBF16 : kScaleF32; }
inline int blocks_for(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

inline void check_act(const TensorView& x, const char* op) {
  if (x.dtype != DType::kF16 && x.dtype != DType::kBF16)
    fail(op, std::string("CUDA ops take F16 or BF16 activations, got ") + dtype_name(x.dtype));
}

// ---- the table as kernel arguments (embed, dequantization) -------------------------------
// Dequantized value of (row, h) in f32 — exact.
__device__ __forceinline__ float dequant_at(const uint32_t* packed, const void* scale, int stype, const uint32_t* zp,
                                            int bits, int64_t row, int h, int words, int group, int groups) {
  const int grp = h / group;
  const int q = int(stored_code(packed + row * words, h, bits, 1)) - (1 << (bits - 1));
  const int z = zp ? zero_point(zp, groups, row, grp, bits) : 0;
  return float(q - z) * load_scale(scale, stype, row * groups + grp);
}

struct TableArgs {
  const uint32_t* packed;
  const void* scale;
  int stype;
  const uint32_t* zp;
  int bits, words, group, groups;
  int64_t V;
  int H;
};

inline TableArgs table_args(const PackedTable& p) {
  TableArgs t;
  t.packed = static_cast<const uint32_t*>(p.packed.data());
  t.scale = p.scale.data();
  t.stype = scale_type(p.scheme.scale_dtype);
  t.zp = p.scheme.symmetric ? nullptr : static_cast<const uint32_t*>(p.zero_point.data());
  t.bits = p.scheme.bits;
  t.words = static_cast<int>(p.scheme.packed_cols(p.hidden));
  t.group = static_cast<int>(p.scheme.group_len(p.hidden));
  t.groups = static_cast<int>(p.scheme.groups(p.hidden));
  t.V = p.vocab;
  t.H = static_cast<int>(p.hidden);
  return t;
}

template <class OutT>
__device__ __forceinline__ void store_out(OutT* p, int64_t i, float v) {
  if constexpr (std::is_same_v<OutT, float>) p[i] = v;
  else if constexpr (std::is_same_v<OutT, __half>) p[i] = __float2half_rn(v);
  else p[i] = __float2bfloat16_rn(v);
}

// ---- dequant.cu ------------------------------------------------------------------------
// out[M, V] (row stride ldo, f32/f16/bf16) = x · Wᵀ by dequantize (when packed) + cuBLAS.
void gemm_fallback(const Table& table, const TensorView& x, void* out, DType out_dtype, int64_t ldo);

// ---- ops_cuda.cu -------------------------------------------------------------------------
// The logits of `plan` into out (row stride ldo, dtype out_dtype: f32, f16 or bf16).
void logits_into(const Table& table, const TensorView& x, const cuda_plan::LogitsProblem& problem,
                 const cuda_plan::LogitsPlan& plan, void* out, int64_t ldo, DType out_dtype = DType::kF32);

// ---- topk_select.cu ----------------------------------------------------------------------
// `dependent` (TopkPlan::dependent_launch): each selection kernel launched as a
// programmatic dependent of the kernel before it (cuda/pdl.cuh).
//
// Level-0 candidates cand[M, P0, k] and partial sums part[M, P0] → the top-k
// values, ids and lse: selection levels of kSlice entries per block until one
// block per row holds them all, then the final level.
void merge_topk(const uint64_t* cand, const float2* part, int P0, int64_t M, int64_t k, float* values, int* ids,
                float* lse, bool dependent);
// The top-k of logits l [M, V] (row stride V): first-level slice selection
// (select_blocks per row, quarter slices when select_small) and merge_topk.
void select_from_logits(const float* l, int64_t M, int64_t V, int64_t k, int select_blocks, bool select_small,
                        float* values, int* ids, float* lse, bool dependent);

// The top-k of logits l [M, V] (row stride V) from the staged GEMV's tile summaries part
// [M, ceil(V / rows)] (kTileSelect): one block per row, smem_bytes of dynamic shared memory
// (TopkPlan::tile_smem).
void select_from_tiles(const float* l, const float2* part, int64_t M, int64_t V, int rows, int64_t k, int smem_bytes,
                       float* values, int* ids, float* lse, bool dependent);

// ---- topk_lists.cu -----------------------------------------------------------------------
// thr[m] = a lower bound of row m's k-th largest logit of the sample logits [M, n] (n <= kSlice).
void list_thresholds(const float* sample, int64_t M, int n, int k, float* thr);
// The top-k and lse of M rows from the list epilogue's lists (and thresholds thr, nullptr: none).
void merge_lists(const TopkLists& lists, const float* thr, int64_t M, int64_t k, float* values, int* ids, float* lse);

}  // namespace cuda_ops
}  // namespace qhead
