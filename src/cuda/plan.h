// The CUDA kernel plan: which kernel computes a call's logits (or top-k), as
// data. select_logits_kernel() and select_topk_path() are pure functions of
// the problem, the device and the overrides — call them, print the plan, test
// it — and the launchers take the plan they return and decide nothing.
// Every threshold they apply is in one table in select.cc, each with the
// measurement behind it; docs/architecture.md#kernel-plan shows the result.
//
// Plain C++ (no CUDA headers): the selector is built into every qhead
// library, so its table is tested without a GPU.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "qhead/ops.h"

namespace qhead::cuda_plan {

// The logits kernels, by design (src/cuda/gemv_*.cuh, gemm_*.cuh).
enum class LogitsKernel : uint8_t {
  kGemvRegRing,     // register-ring GEMV: each warp's row tile and all M columns, loads in a register ring
  kGemvStaged,      // staged GEMV: the row tiles stream through a shared-memory cp.async ring (M <= 32)
  kGemmMmaSync,     // mma.sync GEMM: 256 rows × BM columns per CTA, codes and activations staged together
  kGemmWgmma,       // wgmma GEMM (sm_90a): two warpgroups, 128 rows × BN columns, CTA barriers per stage
  kGemmWgmmaWs,     // warp-specialized wgmma GEMM (sm_90a): a producer warpgroup, two consumers, mbarriers
  kCublasFallback,  // dequantize the table (when packed) + cuBLAS GEMM
};

// What a fused kernel does with its finished tiles.
enum class LogitsEpilogue : uint8_t {
  kStore,      // the logits to out [M, V]
  kStoreTiles, // staged GEMV: the logits to out, and each warp tile's (max, Σ exp) per column (tile_select)
  kTopkPools,  // staged GEMV, M <= 8: per-CTA pools in shared memory → each CTA's best k and (max, Σ exp)
  kTopkLists,  // warp-specialized wgmma GEMM: candidate lists above a sampled threshold, sums below it
};

// How a top-k is computed.
enum class TopkPath : uint8_t {
  kPoolEpilogue,      // the staged GEMV with the pool epilogue, then the merge levels
  kLists,             // a threshold sample, the list epilogue, then one merge block per row
  kLogitsThenSelect,  // logits into a workspace, then slice selection and the merge levels
  kTileSelect,        // the staged GEMV stores the logits and each 16-row tile's (max, Σ exp); one block per
                      // row selects from the tiles whose max can reach the row's k-th logit
};

const char* logits_kernel_name(LogitsKernel k);  // "gemv_staged", ...
const char* topk_path_name(TopkPath p);          // "pool_epilogue", "lists", "logits_then_select", "tile_select"

// One logits call: the table's scheme and the call's shape.
struct LogitsProblem {
  bool packed = true;       // false: a dense table (only cuBLAS takes it)
  int bits = 4;             // code width (the fused kernels take 4 and 8)
  int group = 0;            // group length along H (H for per-row)
  bool symmetric = true;    // false: zero points
  int scale_bytes = 2;      // bytes per stored scale (f16/bf16 2, f32 4)
  bool act_bf16 = false;    // activations bf16 (else f16)
  int64_t V = 0, H = 0, M = 0;
  // > 1: the list top-k's threshold sample, whose 128-row tile j is the
  // table's tile j·tile_stride (V counts the rows read); only the
  // warp-specialized wgmma GEMM takes it.
  int64_t tile_stride = 1;

  int64_t row_bytes() const { return H * bits / 8; }
  int64_t groups() const { return group > 0 ? H / group : 0; }
  std::string describe() const;  // "w4g64 f16 M=17 V=50257 H=1024"
};

struct LogitsPlan;

// What the selector needs to know of the GPU.
struct DeviceInfo {
  int cc_major = 0, cc_minor = 0;
  int sm_count = 1;
  int smem_optin = 0;        // bytes of dynamic shared memory one block may opt in to
  int smem_per_sm = 0;       // bytes of shared memory per multiprocessor
  int max_threads_per_sm = 2048;
  // Resident blocks per multiprocessor of `plan`'s kernel at `smem_bytes` of
  // dynamic shared memory (the CUDA occupancy calculator on the real
  // kernel; the pool epilogue sizes its pools for the grid this allows).
  // nullptr: blocks_per_sm() models it from the shared memory and threads.
  int (*occupancy)(const LogitsProblem& problem, const LogitsPlan& plan, int smem_bytes) = nullptr;

  bool has_wgmma() const { return cc_major == 9; }  // sm_90a code is in the fat binary
  int blocks_per_sm(const LogitsProblem& problem, const LogitsPlan& plan, int smem_bytes) const;
  // An H200 (sm_90, 132 multiprocessors, 227 KB opt-in), for the selector's tests.
  static DeviceInfo h200();
};

// Explicit choices a test or benchmark passes instead of the defaults.
// A forced kernel or path that cannot take the problem is not taken: the
// selection proceeds without it and the plan's `note` says so (tests assert
// plan.kernel, so a refused override shows).
struct LogitsOverrides {
  std::optional<LogitsKernel> kernel;  // this logits kernel (any backend but kFallbackBlas)
  std::optional<TopkPath> topk_path;   // this top-k path
  // Bytes of staged-layout activations up to which each staged-GEMV CTA
  // builds them itself; above, one staged_x_kernel launch builds them once.
  std::optional<int> staged_cta_x;
  // Warps per staged-GEMV CTA for 8-bit rows with four column tiles: 8 or 16
  // (one CTA per SM then shares one copy of the activations; taken where its
  // shared memory fits). Other plans take 8 whatever this says.
  std::optional<int> staged_warps;
  // The kernels that read what the logits kernel (or the level before) wrote
  // (selection levels, tile select, sampling) launched as programmatic
  // dependents of it (cuda/pdl.cuh); sm_90 and later only.
  std::optional<bool> dependent_launch;
  // The staged GEMV's warpgroup form (LogitsPlan::wgmma): true, wherever it can run (four column
  // tiles of 128-byte stages on sm_90, its shared memory fitting); false, never. Unset: 4-bit
  // rows where two of its CTAs fit an SM.
  std::optional<bool> staged_wgmma;

  // From the environment (documented in docs/architecture.md#kernel-plan):
  //   QHEAD_CUDA_LOGITS_KERNEL     gemv_regring | gemv_staged | gemm_mma_sync | gemm_wgmma | gemm_wgmma_ws | cublas
  //   QHEAD_CUDA_TOPK_PATH         pool_epilogue | lists | logits_then_select | tile_select
  //   QHEAD_CUDA_STAGED_CTA_X      bytes, 0 to 1048576
  //   QHEAD_CUDA_STAGED_WARPS      8 | 16
  //   QHEAD_CUDA_DEPENDENT_LAUNCH  0 | 1
  //   QHEAD_CUDA_STAGED_WGMMA      0 | 1
  // An unset or empty variable is no override; any other value that is not
  // one of those throws Error(kInvalidArgument) naming the variable and the
  // values allowed.
  static LogitsOverrides from_env();
};
// LogitsOverrides::from_env(), read once (the first CUDA logits/top-k call).
const LogitsOverrides& env_overrides();
LogitsKernel parse_logits_kernel(const std::string& name, const char* what);  // throws naming `what`
TopkPath parse_topk_path(const std::string& name, const char* what);

// How one kernel runs one problem. Fields a kernel does not use stay 0.
struct LogitsPlan {
  LogitsKernel kernel = LogitsKernel::kCublasFallback;
  LogitsEpilogue epilogue = LogitsEpilogue::kStore;
  int warps = 0;             // warps per CTA
  int row_tiles = 0;         // GEMV: 16-row tiles per warp
  int col_tiles = 0;         // GEMV, mma.sync GEMM: 8-column activation tiles per warp
  int block_cols = 0;        // GEMMs: activation columns per CTA (BM / BN)
  int stages = 0;            // register ring: chunks in flight; staged GEMV: stages per warp
  int piece_bytes = 0;       // register ring: bytes per lane per row per chunk (L)
  int stage_bytes = 0;       // staged GEMV, GEMMs: code bytes per row per stage (C)
  int group_segs = 0;        // staged GEMV, GEMMs: 16-byte segments per group (1, 2, 4); 0: a group spans stages
  int stages_per_group = 1;  // group_segs == 0: stages per group
  bool x_prebuilt = false;   // staged GEMV: the activations built once per call (staged_x_kernel,
                             // permute_x_wg_kernel for wgmma), not by each CTA
  // Staged GEMV (sm_90a, four column tiles, 8 warps): each warpgroup's four row tiles multiply
  // the activations by one wgmma per k-block, B read from shared memory by the tensor cores (the
  // activations in the wgmma B layout: x_prebuilt as for the other form), instead of an mma.sync
  // per column tile (logits_gemv_staged_wg_kernel).
  bool wgmma = false;
  int smem_bytes = 0;        // staged GEMV: dynamic shared memory per CTA
  // kTopkPools: pools for pool_cols columns of pool_cap entries, grid CTAs.
  // kTopkLists: grid CTAs (per column tile), list_segments lists of
  // list_seg_cap entries per column.
  int pool_cols = 0, pool_cap = 0;
  int grid = 0;
  int list_segments = 0, list_seg_cap = 0;
  const char* reason = "";   // the table row that chose this kernel
  std::string note;          // an override that was refused, and why

  std::string describe() const;  // "gemm_wgmma_ws bn=128 c=64 gs=2 (M >= 65 on sm_90)"
};

// The logits kernel for `problem` under `backend` (kAuto and kReference:
// the fastest measured; kFused: a fused kernel at any M where one takes the
// scheme; kFallbackBlas: cuBLAS).
LogitsPlan select_logits_kernel(const LogitsProblem& problem, const DeviceInfo& device, const LogitsOverrides& ov,
                                Backend backend);

// The staged GEMV with the pool epilogue for a top-k of k, or nullopt when
// it cannot take the problem.
std::optional<LogitsPlan> plan_topk_pools(const LogitsProblem& problem, int64_t k, const DeviceInfo& device,
                                          const LogitsOverrides& ov);

struct TopkPlan {
  TopkPath path = TopkPath::kLogitsThenSelect;
  LogitsPlan main;                   // the pool or list epilogue's kernel, or the logits kernel
  std::optional<LogitsPlan> sample;  // kLists: the threshold sample's kernel (none: no threshold)
  int64_t sample_rows = 0;           // kLists: rows of the sample (sample_tiles · 128)
  int64_t sample_stride = 1;         // kLists: tiles between the sample's tiles
  int select_blocks = 0;             // kLogitsThenSelect: first-level selection blocks per row
  bool select_small = false;         // kLogitsThenSelect: those blocks take quarter slices
  int tile_rows = 0;                 // kTileSelect: rows per tile summary (the staged GEMV's warp tile)
  int tile_smem = 0;                 // kTileSelect: the selection block's dynamic shared memory
  // The selection (and a sample op's draw) launched as programmatic dependents
  // of the kernel before them (dependent_launch()).
  bool dependent_launch = false;
  const char* reason = "";
  std::string note;

  std::string describe() const;
};

TopkPlan select_topk_path(const LogitsProblem& problem, int64_t k, const DeviceInfo& device, const LogitsOverrides& ov,
                          Backend backend);

// Whether the kernels after a logits kernel are launched as its programmatic
// dependents: the override, else kDependentLaunch; never below sm_90.
bool dependent_launch(const DeviceInfo& device, const LogitsOverrides& ov);

// Top-k constants the kernels and the selector share.
constexpr int kTopkMaxK = 1024;          // the CUDA top-k's largest k
constexpr int kTopkGather = 256;         // epilogue candidates per column (>= k)
constexpr int kSelThreads = 256;         // threads per selection block
constexpr int kSelPer = 32;              // logits per selection thread
constexpr int64_t kSlice = int64_t(kSelThreads) * kSelPer;  // logits per selection block
constexpr int kTileThreads = 1024;       // threads of a tile-select block (one per row)
constexpr int kTileHotPer = 8;           // candidate entries a tile-select block gathers, per thread
constexpr int kTileStaticSmem = 24 * 1024;  // a tile-select block's static shared memory, at most

}  // namespace qhead::cuda_plan
