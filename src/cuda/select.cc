// The kernel selector (plan.h): every threshold in one table, each with its
// measurement, then one predicate per kernel family ("can it take this
// problem, and how"), then the two selectors that combine them.
#include <algorithm>
#include <cstdlib>
#include <string>

#include "cuda/geometry.h"
#include "cuda/plan.h"
#include "qhead/error.h"

namespace qhead::cuda_plan {

namespace g = cuda_geometry;

namespace {

// ---- the thresholds ---------------------------------------------------------------------
// H200 figures, f16 activations unless said; the records are in
// docs/tuning-notes.md under the kernel's name.
//
// Staged GEMV: up to 32 columns (four 8-column tiles per warp) where the
// activations fit its shared memory; the pool epilogue keeps pools for up to
// 8. At 17-32 columns it reads the table once where the mma.sync GEMM ran
// at its own pace whatever M (151936x1024 w4g64 M = 32: 58.0 vs 70.7 us,
// w8g128 70.7 vs 90.9; 262144x2560 w4g128 176.5 vs 200.2).
constexpr int kStagedMaxM = 32;
// Staged GEMV, 8-bit rows with four column tiles: 16 warps in one CTA per SM
// (one copy of the activations) where they fit, else 8 (151936x1024 w8g128
// M = 17/24/32: 60.7/62.3/64.2 vs 62.4/65.0/70.7 us; 4-bit gained nowhere
// consistently: w4g64 M = 32 59.5 vs 58.0, w4g128 58.1 vs 53.4).
constexpr bool kStaged8BitWide = true;
constexpr int kPoolsMaxM = 8;
// Staged GEMV, four column tiles of 128-byte stages on sm_90, 4-bit rows: the
// warpgroup form (four warps' row tiles by one wgmma m64n32k16 per k-block,
// B read from shared memory by the tensor cores) where two of its CTAs share
// an SM. It needs <= 128 registers where the per-warp mma.sync form needs
// 142-148, so it runs 16 warps per SM instead of 8: 151936x1024 M = 17-32
// w4g64 56.9-58.2 -> 53.2-54.8 us, w4g128 51.6-54.0 -> 50.4-51.8, top-k by
// tile select 75.4-82.1 -> 66.9-71.4 (one binary, two runs; in another call
// w4g128 gained nothing, w4g64 1-3 us, the top-k 5-10 us). At one CTA per
// SM it lost (262144x2560 w4g128 M = 17 176.1 -> 180.7, w8g128 198.7 ->
// 262.7); 8-bit rows gained only in the top-k (w8g128 f16 logits +-1.5 us,
// bf16 +5 us against the 16-warp form), so they keep the mma.sync form unless
// forced (QHEAD_CUDA_STAGED_WGMMA=1).
constexpr bool kStagedWgmma4Bit = true;
constexpr int kStagedWgmmaMinCtas = 2;
// Staged GEMV: a tile's scale block is copied with its first stage into one
// of two buffers; above this it would not leave room for the ring.
constexpr int kStagedMaxScaleBlock = 4096;
// Staged GEMV: staged-layout activations up to this many bytes each CTA
// builds itself; larger ones one staged_x_kernel launch builds once. The
// CTA's own build wins at 66 KB (H = 4096, M = 8: 94 vs 95 us), the extra
// launch at 83 KB (H = 2560, M = 16: 144 vs 148 us).
constexpr int kStagedCtaX = 72 * 1024;
// The kernels after a logits kernel (selection levels, tile select, the
// sample op's) launched as its programmatic dependents, on sm_90: 1.7-4.4 us
// off logits + top-k at M = 1-16 on the H200 (docs/tuning-notes.md, "Top-k
// selection"); QHEAD_CUDA_DEPENDENT_LAUNCH=0 turns it off.
constexpr bool kDependentLaunch = true;
// Pool epilogue: shared memory per CTA above which it is not taken.
constexpr int kPoolsMaxSmem = 160 * 1024;
// GEMMs from this many columns where the staged GEMV does not take the
// problem (its activations past its shared memory); below, the GEMV kernels
// (M = 16: 67 us GEMV vs 69 us mma.sync and 77 us wgmma).
constexpr int64_t kGemmMinM = 17;
// wgmma GEMMs from this many columns on sm_90; below, mma.sync (M = 32:
// 69-70 vs 78-83 us; M = 64: 80-88 vs 100-104 us).
constexpr int64_t kWgmmaMinM = 33;
// The warp-specialized wgmma GEMM from this many columns; below, the
// CTA-barrier one (its two warpgroups in lockstep cost less than the
// producer warpgroup at 64 columns).
constexpr int64_t kWgmmaWsMinM = 65;
// Column tiles: 64 columns (two CTAs per SM) up to 64, 128 above. Measured
// slower: 256-row tiles at M = 64 and 256, 64-column tiles at M = 256.
constexpr int64_t kGemmNarrowMaxM = 64;
// mma.sync GEMM: 32 columns per CTA (two CTAs per SM, 128 registers) up to
// 32, 64 above.
constexpr int64_t kMmaNarrowMaxM = 32;
// kAuto: above this many columns the GEMV kernels lose to dequantize +
// cuBLAS (151936x1024 w4g64, M = 256: 820 vs ~250 us), so only a GEMM or
// cuBLAS runs there.
constexpr int64_t kGemvMaxMAuto = 64;
// kAuto takes the list top-k from this vocab (a sample of at most a quarter
// of the rows) and from this many columns: faster than logits + selection
// from M = 128 on every shape (w4g128: 151936x1024 166 vs 199 us,
// 262144x2560 439 vs 491, 128256x4096 352 vs 355), slower at M = 96 on
// 128256x4096 (358 vs 344 us).
constexpr int64_t kListMinVocabAuto = 4 * kSlice;
constexpr int64_t kListMinRowsAuto = 128;
// The list top-k needs the warp-specialized GEMM's column tiles: from the
// columns where logits takes it.
constexpr int64_t kListMinRows = kWgmmaWsMinM;
// The list top-k's threshold sample: this many whole 128-row tiles spread
// evenly over the vocab (kSlice rows: one threshold block per column).
constexpr int64_t kListSampleTiles = kSlice / 128;
// Logits then select: the first level takes quarter slices (2048 logits per
// block) while that grid is at most two waves of 8 blocks per SM and its
// candidates fit one final block (a 2048-logit block ~8 us, an 8192-logit
// one ~23 us at 4 per SM; at M = 1 on a 152k vocab kSlice slices would be 19
// blocks).
constexpr int kSelSmallPer = kSelPer / 4;
// Tile select from this many columns: wherever the staged GEMV runs. One
// select block after the GEMV against two selection levels, faster on every
// shape and M measured (bcbb14d, same run: 151936x1024 w4g64 M = 1 44.3 vs
// 47.6 us, w8g128 60.5 vs 63.8, M = 4 47.3 vs 50.4, M = 16 70.0 vs 77.5;
// 262144x2560 w4g128 M = 1 111.6 vs 116.1; docs/tuning-notes.md, "Top-k
// selection").
constexpr int64_t kTileSelectMinM = 1;
constexpr int kSelSmallWavesBlocks = 16;  // blocks per SM

// Reasons, as the plan prints them.
constexpr const char* kWhyFallbackBackend = "backend kFallbackBlas";
constexpr const char* kWhyDense = "dense table: cuBLAS";
constexpr const char* kWhyNoFused = "no fused kernel takes the scheme";
constexpr const char* kWhyForced = "forced by the overrides";
constexpr const char* kWhyStaged = "M <= 32 and the staged GEMV takes the row";
constexpr const char* kWhyWs = "M >= 65 on sm_90";
constexpr const char* kWhyWgmma = "M >= 33 on sm_90";
constexpr const char* kWhyMma = "M >= 17";
constexpr const char* kWhyAutoLarge = "kAuto above M = 64 and no GEMM takes the group layout";
constexpr const char* kWhyRegRing = "the GEMV no other kernel replaces here";
constexpr const char* kWhySample = "the list top-k's threshold sample";

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes per lane per chunk of the register-ring GEMV: the quad's 4·L bytes
// must lie inside one group and tile it. 0: no fused kernel.
int piece_bytes(int bits, int64_t group) {
  const int64_t gbytes = group * bits / 8;
  for (int l : {16, 8, 4})
    if (gbytes > 0 && gbytes % (4 * l) == 0) return l;
  return 0;
}

// A scheme some fused kernel takes: 4- or 8-bit codes in groups whose bytes
// tile a quad's pieces (the top-k pool epilogue takes exactly these).
bool fused_scheme(const LogitsProblem& p) {
  return p.packed && (p.bits == 4 || p.bits == 8) && p.group > 0 && p.H % p.group == 0 &&
         piece_bytes(p.bits, p.group) != 0;
}
// A scheme the fused logits take: 8-bit codes need groups of 32 h or more
// (4-byte pieces, groups of 16, leave 8-bit to cuBLAS).
bool logits_scheme(const LogitsProblem& p) {
  return fused_scheme(p) && !(p.bits == 8 && piece_bytes(p.bits, p.group) == 4);
}

// A group's place in the stages of `stage_bytes` code bytes per row: sets
// group_segs / stages_per_group, or false. `one_segment`: the kernel takes
// groups of one 16-byte segment.
bool group_layout(const LogitsProblem& p, int stage_bytes, bool one_segment, LogitsPlan& plan) {
  if (p.row_bytes() % stage_bytes != 0) return false;
  const int64_t gbytes = p.group * p.bits / 8;
  if (gbytes % 16 != 0) return false;
  const int64_t segs = gbytes / 16, per_stage = stage_bytes / 16;
  if ((segs == 1 && one_segment) || segs == 2 || segs == 4) {
    plan.group_segs = int(segs);
    plan.stages_per_group = 1;
    return true;
  }
  if (segs % per_stage != 0) return false;
  plan.group_segs = 0;
  plan.stages_per_group = int(segs / per_stage);
  return true;
}

// ---- the families ---------------------------------------------------------------------

std::optional<LogitsPlan> plan_regring(const LogitsProblem& p) {
  if (!logits_scheme(p)) return std::nullopt;
  const int l = piece_bytes(p.bits, p.group);
  LogitsPlan plan;
  plan.kernel = LogitsKernel::kGemvRegRing;
  plan.piece_bytes = l;
  // (row tiles, column tiles, chunks in flight, warps): 4-bit 16-byte pieces
  // take two row tiles × two column tiles, 4 warps, up to M = 16 (faster
  // than one column tile even at M = 1); smaller 4-bit pieces two row tiles
  // up to M = 8, then one; 8-bit one row tile (two cost occupancy: 61 vs
  // 70 us at M = 1).
  auto set = [&](int rt, int nt, int d, int w) {
    plan.row_tiles = rt;
    plan.col_tiles = nt;
    plan.stages = d;
    plan.warps = w;
  };
  if (p.bits == 4 && l == 16 && p.M <= 16) set(2, 2, 4, 4);
  else if (p.bits == 4 && l != 16 && p.M <= 8) set(2, 1, 4, 4);
  else if (p.bits == 8 && p.M <= 8) set(1, 1, 4, 8);
  else if (p.M <= 16) set(1, 2, 4, 8);
  else if (p.M <= 32) set(1, 4, 4, 8);
  else set(1, 8, 2, 8);
  return plan;
}

// Code bytes per row per stage the staged GEMV takes for this row (0: none):
// 128-byte stages (a copy with 64-byte pieces per row and stage read HBM at
// ~2.5 TB/s, with 128-byte ones ~3.7 TB/s), 64-byte ones for 4-bit rows that
// are not whole 128-byte stages (for 8-bit the register ring is faster there).
int staged_stage_bytes(const LogitsProblem& p) {
  const int64_t rb = p.row_bytes();
  if (rb % 128 == 0 && rb / 128 >= g::kStagedStages) return 128;
  if (p.bits == 4 && rb % 64 == 0 && rb / 64 >= g::kStagedStages) return 64;
  return 0;
}

// The staged GEMV's plan without its epilogue's needs (both epilogues).
std::optional<LogitsPlan> plan_staged_base(const LogitsProblem& p, const DeviceInfo& d, const LogitsOverrides& ov,
                                           int max_m) {
  if (!fused_scheme(p) || p.M > max_m || p.M < 1) return std::nullopt;
  LogitsPlan plan;
  plan.kernel = LogitsKernel::kGemvStaged;
  plan.warps = g::kStagedWarps;
  plan.row_tiles = g::kStagedRowTiles;
  plan.stages = g::kStagedStages;
  plan.col_tiles = p.M > 16 ? 4 : p.M > 8 ? 2 : 1;
  plan.stage_bytes = staged_stage_bytes(p);
  if (plan.stage_bytes == 0) return std::nullopt;
  // 8-bit rows with four column tiles: 16 warps by default or by the override
  // (other plans take 8 whatever it says); back to 8 below where they do not fit.
  if (p.bits == 8 && plan.col_tiles == 4 && plan.stage_bytes == 128 &&
      ov.staged_warps.value_or(kStaged8BitWide ? g::kStagedWideWarps : g::kStagedWarps) == g::kStagedWideWarps)
    plan.warps = g::kStagedWideWarps;
  if (16 * g::kStagedRowTiles * p.groups() * p.scale_bytes > kStagedMaxScaleBlock) return std::nullopt;
  if (!group_layout(p, plan.stage_bytes, /*one_segment=*/true, plan)) return std::nullopt;
  auto smem = [&](int xs, int warps, int stages) {
    return xs + warps * g::staged_warp_bytes(p.bits, plan.stage_bytes, g::kStagedRowTiles, stages, !p.symmetric,
                                             int(p.groups()), p.scale_bytes);
  };
  const int cta_x = ov.staged_cta_x.value_or(kStagedCtaX);
  // The warpgroup form: 8 warps, 2 stages, the activations in the wgmma layout.
  if (d.has_wgmma() && plan.col_tiles == 4 && plan.stage_bytes == 128 &&
      ov.staged_wgmma.value_or(kStagedWgmma4Bit && p.bits == 4)) {
    LogitsPlan wg = plan;
    wg.wgmma = true;
    wg.warps = g::kStagedWarps;
    wg.stages = g::staged_stages(wg.col_tiles, wg.stage_bytes, wg.warps);
    const int xs = g::staged_wg_x_bytes(int(p.H), wg.col_tiles);
    wg.x_prebuilt = xs > cta_x;
    wg.smem_bytes = smem(xs, wg.warps, wg.stages);
    // By default only where two CTAs share an SM (kStagedWgmmaMinCtas); forced, wherever it fits.
    if (wg.smem_bytes <= d.smem_optin &&
        (ov.staged_wgmma.has_value() || d.blocks_per_sm(p, wg, wg.smem_bytes) >= kStagedWgmmaMinCtas))
      return wg;
  }
  const int xs = g::staged_x_bytes(p.bits, plan.stage_bytes, int(p.H), int(p.M));
  plan.x_prebuilt = xs > cta_x;
  if (plan.warps != g::kStagedWarps && smem(xs, plan.warps, plan.stages) > d.smem_optin) plan.warps = g::kStagedWarps;
  // Four column tiles of 128-byte stages in 8 warps take 2 stages per warp.
  plan.stages = g::staged_stages(plan.col_tiles, plan.stage_bytes, plan.warps);
  plan.smem_bytes = smem(xs, plan.warps, plan.stages);
  return plan;
}

std::optional<LogitsPlan> plan_staged(const LogitsProblem& p, const DeviceInfo& d, const LogitsOverrides& ov) {
  auto plan = plan_staged_base(p, d, ov, kStagedMaxM);
  if (!plan || plan->smem_bytes > d.smem_optin) return std::nullopt;
  return plan;
}

std::optional<LogitsPlan> plan_mma_sync(const LogitsProblem& p) {
  if (!fused_scheme(p)) return std::nullopt;
  LogitsPlan plan;
  plan.kernel = LogitsKernel::kGemmMmaSync;
  plan.warps = 8;
  plan.stage_bytes = g::kGemmStageBytes;
  plan.col_tiles = p.M <= kMmaNarrowMaxM ? 4 : 8;
  plan.block_cols = 8 * plan.col_tiles;
  if (!group_layout(p, plan.stage_bytes, p.bits == 4, plan)) return std::nullopt;
  return plan;
}

std::optional<LogitsPlan> plan_wgmma(const LogitsProblem& p, const DeviceInfo& d) {
  if (!fused_scheme(p) || !d.has_wgmma()) return std::nullopt;
  LogitsPlan plan;
  plan.kernel = LogitsKernel::kGemmWgmma;
  plan.warps = 8;
  plan.stage_bytes = g::kGemmStageBytes;
  plan.block_cols = p.M <= kGemmNarrowMaxM ? 64 : 128;
  if (!group_layout(p, plan.stage_bytes, p.bits == 4, plan)) return std::nullopt;
  return plan;
}

std::optional<LogitsPlan> plan_wgmma_ws(const LogitsProblem& p, const DeviceInfo& d, int block_cols) {
  if (!fused_scheme(p) || !d.has_wgmma()) return std::nullopt;
  LogitsPlan plan;
  plan.kernel = LogitsKernel::kGemmWgmmaWs;
  plan.warps = 12;
  plan.stage_bytes = g::wgmma_ws_stage_bytes(p.bits);
  plan.block_cols = block_cols;
  if (!group_layout(p, plan.stage_bytes, p.bits == 4, plan)) return std::nullopt;
  return plan;
}

LogitsPlan fallback(const char* why) {
  LogitsPlan plan;
  plan.kernel = LogitsKernel::kCublasFallback;
  plan.reason = why;
  return plan;
}

std::optional<LogitsPlan> plan_family(LogitsKernel k, const LogitsProblem& p, const DeviceInfo& d,
                                      const LogitsOverrides& ov) {
  if (k != LogitsKernel::kCublasFallback && !logits_scheme(p)) return std::nullopt;
  switch (k) {
    case LogitsKernel::kGemvRegRing: return plan_regring(p);
    case LogitsKernel::kGemvStaged: return plan_staged(p, d, ov);
    case LogitsKernel::kGemmMmaSync: return plan_mma_sync(p);
    case LogitsKernel::kGemmWgmma: return plan_wgmma(p, d);
    case LogitsKernel::kGemmWgmmaWs: return plan_wgmma_ws(p, d, p.M <= kGemmNarrowMaxM ? 64 : 128);
    case LogitsKernel::kCublasFallback: return fallback(kWhyForced);
  }
  return std::nullopt;
}

std::optional<LogitsPlan> with_reason(std::optional<LogitsPlan> plan, const char* why) {
  if (plan) plan->reason = why;
  return plan;
}

// The default choice for a fused problem (no override), or nullopt.
std::optional<LogitsPlan> default_fused(const LogitsProblem& p, const DeviceInfo& d, const LogitsOverrides& ov,
                                        Backend backend) {
  if (!logits_scheme(p)) return std::nullopt;
  if (p.M <= kStagedMaxM)
    if (auto plan = with_reason(plan_staged(p, d, ov), kWhyStaged)) return plan;
  if (p.M >= kGemmMinM) {
    const bool wg = d.has_wgmma() && p.M >= kWgmmaMinM;
    if (wg && p.M >= kWgmmaWsMinM)
      if (auto plan = with_reason(plan_wgmma_ws(p, d, p.M <= kGemmNarrowMaxM ? 64 : 128), kWhyWs)) return plan;
    if (wg) {
      if (auto plan = with_reason(plan_wgmma(p, d), kWhyWgmma)) return plan;
    } else if (auto plan = with_reason(plan_mma_sync(p), kWhyMma)) {
      return plan;
    }
  }
  if (backend != Backend::kFused && p.M > kGemvMaxMAuto) return std::nullopt;
  return with_reason(plan_regring(p), kWhyRegRing);
}

std::string env_value(const char* name) {
  const char* e = std::getenv(name);
  return e ? std::string(e) : std::string();
}

}  // namespace

// ---- names -----------------------------------------------------------------------------

const char* logits_kernel_name(LogitsKernel k) {
  switch (k) {
    case LogitsKernel::kGemvRegRing: return "gemv_regring";
    case LogitsKernel::kGemvStaged: return "gemv_staged";
    case LogitsKernel::kGemmMmaSync: return "gemm_mma_sync";
    case LogitsKernel::kGemmWgmma: return "gemm_wgmma";
    case LogitsKernel::kGemmWgmmaWs: return "gemm_wgmma_ws";
    case LogitsKernel::kCublasFallback: return "cublas";
  }
  return "?";
}

const char* topk_path_name(TopkPath p) {
  switch (p) {
    case TopkPath::kPoolEpilogue: return "pool_epilogue";
    case TopkPath::kLists: return "lists";
    case TopkPath::kLogitsThenSelect: return "logits_then_select";
    case TopkPath::kTileSelect: return "tile_select";
  }
  return "?";
}

LogitsKernel parse_logits_kernel(const std::string& name, const char* what) {
  for (LogitsKernel k : {LogitsKernel::kGemvRegRing, LogitsKernel::kGemvStaged, LogitsKernel::kGemmMmaSync,
                         LogitsKernel::kGemmWgmma, LogitsKernel::kGemmWgmmaWs, LogitsKernel::kCublasFallback})
    if (name == logits_kernel_name(k)) return k;
  throw Error(ErrorCode::kInvalidArgument, what,
              "'" + name + "' is not a logits kernel; one of gemv_regring, gemv_staged, gemm_mma_sync, gemm_wgmma, "
              "gemm_wgmma_ws, cublas");
}

TopkPath parse_topk_path(const std::string& name, const char* what) {
  for (TopkPath p : {TopkPath::kPoolEpilogue, TopkPath::kLists, TopkPath::kLogitsThenSelect, TopkPath::kTileSelect})
    if (name == topk_path_name(p)) return p;
  throw Error(ErrorCode::kInvalidArgument, what,
              "'" + name + "' is not a top-k path; one of pool_epilogue, lists, logits_then_select, tile_select");
}

std::string LogitsProblem::describe() const {
  std::string s = packed ? "w" + std::to_string(bits) + (group == H ? std::string() : "g" + std::to_string(group)) +
                               (symmetric ? "" : "a")
                         : std::string("dense");
  return s + (act_bf16 ? " bf16" : " f16") + " M=" + std::to_string(M) + " V=" + std::to_string(V) +
         " H=" + std::to_string(H) + (tile_stride > 1 ? " tile_stride=" + std::to_string(tile_stride) : "");
}

std::string LogitsPlan::describe() const {
  std::string s = logits_kernel_name(kernel);
  auto add = [&](const char* k, int v) {
    if (v) s += std::string(" ") + k + "=" + std::to_string(v);
  };
  add("warps", warps);
  add("rt", row_tiles);
  add("nt", col_tiles);
  add("bn", block_cols);
  add("stages", stages);
  add("l", piece_bytes);
  add("c", stage_bytes);
  if (stage_bytes) s += " gs=" + std::to_string(group_segs) + (group_segs == 0 ? "x" + std::to_string(stages_per_group) : "");
  if (wgmma) s += " wgmma";
  if (x_prebuilt) s += " x_prebuilt";
  if (epilogue == LogitsEpilogue::kTopkPools)
    s += " +pools(cols=" + std::to_string(pool_cols) + " cap=" + std::to_string(pool_cap) + " grid=" + std::to_string(grid) + ")";
  if (epilogue == LogitsEpilogue::kStoreTiles) s += " +tile_summaries";
  if (epilogue == LogitsEpilogue::kTopkLists)
    s += " +lists(segs=" + std::to_string(list_segments) + " cap=" + std::to_string(list_seg_cap) + " grid=" + std::to_string(grid) + ")";
  if (*reason) s += std::string(" (") + reason + ")";
  if (!note.empty()) s += " [" + note + "]";
  return s;
}

std::string TopkPlan::describe() const {
  std::string s = std::string(topk_path_name(path)) + ": " + main.describe();
  if (sample) s += "; sample " + std::to_string(sample_rows) + " rows: " + sample->describe();
  if (path == TopkPath::kLogitsThenSelect)
    s += "; select " + std::to_string(select_blocks) + (select_small ? " quarter-slice" : "") + " blocks per row";
  if (path == TopkPath::kTileSelect)
    s += "; one select block per row over " + std::to_string(tile_rows) + "-row tiles (" + std::to_string(tile_smem) +
         " B shared)";
  if (dependent_launch) s += "; dependent launches";
  if (*reason) s += std::string(" (") + reason + ")";
  if (!note.empty()) s += " [" + note + "]";
  return s;
}

// ---- the device ------------------------------------------------------------------------

int DeviceInfo::blocks_per_sm(const LogitsProblem& problem, const LogitsPlan& plan, int smem_bytes) const {
  if (occupancy) return occupancy(problem, plan, smem_bytes);
  // The model: threads and shared memory (1 KB reserved per block, 128-byte
  // granules); registers are assumed not to bind.
  const int threads = std::max(32, plan.warps * 32);
  const int by_threads = max_threads_per_sm / threads;
  const int by_smem = smem_per_sm / (((smem_bytes + 127) / 128) * 128 + 1024);
  return std::min({by_threads, by_smem, 32});
}

DeviceInfo DeviceInfo::h200() {
  DeviceInfo d;
  d.cc_major = 9;
  d.cc_minor = 0;
  d.sm_count = 132;
  d.smem_optin = 232448;   // 227 KB
  d.smem_per_sm = 233472;  // 228 KB
  d.max_threads_per_sm = 2048;
  return d;
}

// ---- overrides -------------------------------------------------------------------------

LogitsOverrides LogitsOverrides::from_env() {
  LogitsOverrides ov;
  if (std::string v = env_value("QHEAD_CUDA_LOGITS_KERNEL"); !v.empty())
    ov.kernel = parse_logits_kernel(v, "QHEAD_CUDA_LOGITS_KERNEL");
  if (std::string v = env_value("QHEAD_CUDA_TOPK_PATH"); !v.empty()) ov.topk_path = parse_topk_path(v, "QHEAD_CUDA_TOPK_PATH");
  if (std::string v = env_value("QHEAD_CUDA_STAGED_CTA_X"); !v.empty()) {
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(v.c_str(), &end, 10);
    if (errno != 0 || end == v.c_str() || *end != '\0' || n < 0 || n > (1L << 20))
      throw Error(ErrorCode::kInvalidArgument, "QHEAD_CUDA_STAGED_CTA_X",
                  "'" + v + "' is not a byte count; an integer from 0 to 1048576");
    ov.staged_cta_x = int(n);
  }
  if (std::string v = env_value("QHEAD_CUDA_STAGED_WARPS"); !v.empty()) {  // 8-bit rows, four column tiles
    if (v != "8" && v != "16")
      throw Error(ErrorCode::kInvalidArgument, "QHEAD_CUDA_STAGED_WARPS", "'" + v + "' is not 8 or 16");
    ov.staged_warps = std::stoi(v);
  }
  auto flag = [](const char* name) -> std::optional<bool> {
    const std::string v = env_value(name);
    if (v.empty()) return std::nullopt;
    if (v == "0" || v == "1") return v == "1";
    throw Error(ErrorCode::kInvalidArgument, name, "'" + v + "' is not 0 or 1");
  };
  ov.dependent_launch = flag("QHEAD_CUDA_DEPENDENT_LAUNCH");
  ov.staged_wgmma = flag("QHEAD_CUDA_STAGED_WGMMA");
  return ov;
}

const LogitsOverrides& env_overrides() {
  static const LogitsOverrides ov = LogitsOverrides::from_env();
  return ov;
}

// ---- the selectors ---------------------------------------------------------------------

LogitsPlan select_logits_kernel(const LogitsProblem& p, const DeviceInfo& d, const LogitsOverrides& ov,
                                Backend backend) {
  if (backend == Backend::kFallbackBlas) return fallback(kWhyFallbackBackend);
  if (!p.packed) return fallback(kWhyDense);
  if (p.tile_stride != 1) {  // the list top-k's sample: 128-column tiles of the warp-specialized GEMM
    if (auto plan = with_reason(plan_wgmma_ws(p, d, 128), kWhySample)) return *plan;
    return fallback(kWhyNoFused);
  }
  std::string note;
  if (ov.kernel) {
    if (auto plan = plan_family(*ov.kernel, p, d, ov)) {
      plan->reason = kWhyForced;
      return *plan;
    }
    note = std::string(logits_kernel_name(*ov.kernel)) + " was forced but cannot take " + p.describe();
  }
  LogitsPlan plan;
  if (auto fused = default_fused(p, d, ov, backend)) plan = *fused;
  else plan = fallback(plan_regring(p) ? kWhyAutoLarge : kWhyNoFused);
  plan.note = note;
  return plan;
}

std::optional<LogitsPlan> plan_topk_pools(const LogitsProblem& p, int64_t k, const DeviceInfo& d,
                                          const LogitsOverrides& ov) {
  if (k > kTopkGather || p.V < 1) return std::nullopt;
  auto plan = plan_staged_base(p, d, ov, kPoolsMaxM);
  // 128-byte stages only, and the pools need the CTAs that CTA-built activations leave.
  if (!plan || plan->stage_bytes != 128 || plan->x_prebuilt) return std::nullopt;
  const int wbytes = g::staged_warp_bytes(p.bits, plan->stage_bytes, g::kStagedRowTiles, plan->stages,
                                          !p.symmetric, int(p.groups()), p.scale_bytes);
  const int cols = int(std::min<int64_t>(kPoolsMaxM, p.M));
  if (g::topk_finish_scratch(cols, g::kStagedWarps, kTopkGather) > g::kStagedWarps * wbytes) return std::nullopt;
  plan->epilogue = LogitsEpilogue::kTopkPools;
  plan->pool_cols = cols;
  // The pools hold every logit a CTA computes (no compaction): size them for
  // the grid the occupancy allows with them, which shrinks as they grow.
  const int rows = 16 * g::kStagedRowTiles;
  const int64_t tiles = ceil_div(p.V, rows), want = ceil_div(tiles, g::kStagedWarps);
  const int base = plan->smem_bytes;
  int64_t grid = std::min<int64_t>(want, int64_t(d.sm_count) * std::max(1, d.blocks_per_sm(p, *plan, base)));
  const int max_smem = std::min(d.smem_optin, kPoolsMaxSmem);
  for (int iter = 0; iter < 4; ++iter) {
    const int64_t per_warp = ceil_div(tiles, grid * g::kStagedWarps);
    int64_t cap = 1;
    while (cap < per_warp * g::kStagedWarps * rows) cap <<= 1;
    const int64_t smem = base + int64_t(cols) * (cap * 8 + 4);
    if (smem > max_smem) return std::nullopt;
    const int b = d.blocks_per_sm(p, *plan, int(smem));
    if (b < 1) return std::nullopt;
    const int64_t fits = std::min<int64_t>(want, int64_t(d.sm_count) * b);
    if (fits >= grid) {  // the pools fit the grid they were sized for
      plan->pool_cap = int(cap);
      plan->smem_bytes = int(smem);
      plan->grid = int(grid);
      return plan;
    }
    grid = fits;
  }
  return std::nullopt;
}

namespace {

// The list epilogue's kernel: the warp-specialized GEMM, 128 columns per CTA,
// C CTAs per column tile (CTA c takes vocab tiles c, c + C, ...), its 8
// consumer warps owning segments 8c .. 8c + 7 of each column.
std::optional<LogitsPlan> plan_topk_lists(const LogitsProblem& p, int64_t k, const DeviceInfo& d) {
  if (k > kTopkGather) return std::nullopt;
  auto plan = plan_wgmma_ws(p, d, 128);
  if (!plan) return std::nullopt;
  const int64_t col_tiles = ceil_div(p.M, 128), tiles = ceil_div(p.V, 128);
  const int64_t per_col_tile = std::min<int64_t>(tiles, d.sm_count / col_tiles);
  if (per_col_tile < 1) return std::nullopt;
  plan->epilogue = LogitsEpilogue::kTopkLists;
  plan->grid = int(per_col_tile * col_tiles);
  plan->list_segments = int(8 * per_col_tile);
  plan->list_seg_cap = int(16 * ceil_div(tiles, per_col_tile));
  return plan;
}

TopkPlan logits_then_select(const LogitsProblem& p, int64_t k, const DeviceInfo& d, const LogitsOverrides& ov,
                            Backend backend, const char* why) {
  TopkPlan t;
  t.path = TopkPath::kLogitsThenSelect;
  LogitsOverrides lov = ov;
  lov.topk_path.reset();
  t.main = select_logits_kernel(p, d, lov, backend);
  const int64_t small_slice = int64_t(kSelThreads) * kSelSmallPer;
  const int64_t p_small = ceil_div(p.V, small_slice);
  t.select_small = p.M * p_small <= kSelSmallWavesBlocks * int64_t(d.sm_count) && p_small * k <= kSlice;
  t.select_blocks = int(t.select_small ? p_small : ceil_div(p.V, kSlice));
  t.reason = why;
  return t;
}

// kTileSelect: the staged GEMV (the default logits kernel here) with the tile
// summaries, and a select block whose tile maxima fit its shared memory.
std::optional<TopkPlan> tile_select(const LogitsProblem& p, int64_t k, const DeviceInfo& d, const LogitsOverrides& ov,
                                    Backend backend, const char* why) {
  if (k > kTopkGather) return std::nullopt;
  LogitsOverrides lov = ov;
  lov.topk_path.reset();
  TopkPlan t;
  t.main = select_logits_kernel(p, d, lov, backend);
  if (t.main.kernel != LogitsKernel::kGemvStaged) return std::nullopt;
  t.path = TopkPath::kTileSelect;
  t.main.epilogue = LogitsEpilogue::kStoreTiles;
  t.tile_rows = 16 * g::kStagedRowTiles;
  const int64_t smem = g::tile_select_smem(p.V, t.tile_rows, kTileThreads * kTileHotPer);
  if (smem + kTileStaticSmem > d.smem_optin) return std::nullopt;
  t.tile_smem = int(smem);
  t.reason = why;
  return t;
}

}  // namespace

bool dependent_launch(const DeviceInfo& d, const LogitsOverrides& ov) {
  return d.cc_major >= 9 && ov.dependent_launch.value_or(kDependentLaunch);
}

namespace {
TopkPlan topk_path(const LogitsProblem& p, int64_t k, const DeviceInfo& d, const LogitsOverrides& ov, Backend backend) {
  auto pools = [&]() -> std::optional<TopkPlan> {
    auto plan = plan_topk_pools(p, k, d, ov);
    if (!plan) return std::nullopt;
    TopkPlan t;
    t.path = TopkPath::kPoolEpilogue;
    t.main = *plan;
    t.main.reason = "the staged GEMV's pool epilogue";
    return t;
  };
  auto lists = [&]() -> std::optional<TopkPlan> {
    if (p.M < kListMinRows) return std::nullopt;
    auto plan = plan_topk_lists(p, k, d);
    if (!plan) return std::nullopt;
    TopkPlan t;
    t.path = TopkPath::kLists;
    t.main = *plan;
    t.main.reason = "the warp-specialized GEMM's list epilogue";
    const int64_t full = p.V / 128, ns = std::min(kListSampleTiles, full);
    if (ns * 128 >= k) {  // else no threshold: every logit is a candidate
      LogitsProblem sp = p;
      sp.tile_stride = full / ns;
      sp.V = ns * 128;
      LogitsPlan s = select_logits_kernel(sp, d, LogitsOverrides{}, Backend::kFused);
      if (s.kernel == LogitsKernel::kGemmWgmmaWs) {
        t.sample = s;
        t.sample_rows = sp.V;
        t.sample_stride = sp.tile_stride;
      }
    }
    return t;
  };
  if (!p.packed || backend == Backend::kFallbackBlas || k > kTopkGather || p.M < 1 || !fused_scheme(p))
    return logits_then_select(p, k, d, ov, backend, "no fused top-k for this backend, scheme or k");
  std::string note;
  if (ov.topk_path) {
    std::optional<TopkPlan> forced;
    switch (*ov.topk_path) {
      case TopkPath::kPoolEpilogue: forced = pools(); break;
      case TopkPath::kLists: forced = lists(); break;
      case TopkPath::kLogitsThenSelect: return logits_then_select(p, k, d, ov, backend, kWhyForced);
      case TopkPath::kTileSelect: forced = tile_select(p, k, d, ov, backend, kWhyForced); break;
    }
    if (forced) {
      forced->reason = kWhyForced;
      return *forced;
    }
    note = std::string(topk_path_name(*ov.topk_path)) + " was forced but cannot take " + p.describe() +
           " k=" + std::to_string(k);
  }
  // kFused: the pool epilogue where it applies (M <= 8); kAuto never takes it: logits + selection
  // is faster (67 vs 78 us at M = 1, 151936x1024 w4g64).
  std::optional<TopkPlan> t;
  if (backend == Backend::kFused) t = pools();
  if (!t && (backend == Backend::kFused || (p.V >= kListMinVocabAuto && p.M >= kListMinRowsAuto))) t = lists();
  if (t) {
    t->reason = backend == Backend::kFused ? "kFused" : "kAuto, M >= 128 and V >= 32768";
    t->note = note;
    return *t;
  }
  if (p.M >= kTileSelectMinM)
    if (auto ts = tile_select(p, k, d, ov, backend, "the default where the staged GEMV runs: its tile summaries")) {
      ts->note = note;
      return *ts;
    }
  TopkPlan sel = logits_then_select(p, k, d, ov, backend, "the default");
  sel.note = note;
  return sel;
}
}  // namespace

TopkPlan select_topk_path(const LogitsProblem& p, int64_t k, const DeviceInfo& d, const LogitsOverrides& ov,
                          Backend backend) {
  TopkPlan t = topk_path(p, k, d, ov, backend);
  t.dependent_launch = dependent_launch(d, ov);
  return t;
}

}  // namespace qhead::cuda_plan
