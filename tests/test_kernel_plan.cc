// The CUDA kernel plan (src/cuda/plan.h): the selector is a pure function of
// the problem, the device and the overrides, so its table is checked here
// without a GPU, on an H200 (sm_90) and an A100-like sm_80 device. The GPU
// tests (test_cuda.cc) check that the kernel each plan names is the one that
// runs and that its output is right.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "cuda/plan.h"
#include "qhead/error.h"

namespace qhead::cuda_plan {
namespace {

LogitsProblem problem(int bits, int group, int64_t V, int64_t H, int64_t M, bool sym = true, bool bf16 = false) {
  LogitsProblem p;
  p.bits = bits;
  p.group = group;
  p.symmetric = sym;
  p.act_bf16 = bf16;
  p.V = V;
  p.H = H;
  p.M = M;
  return p;
}

DeviceInfo sm80() {
  DeviceInfo d;
  d.cc_major = 8;
  d.sm_count = 108;
  d.smem_optin = 166912;
  d.smem_per_sm = 167936;
  return d;
}

LogitsPlan pick(const LogitsProblem& p, const DeviceInfo& d = DeviceInfo::h200(), Backend b = Backend::kAuto,
                const LogitsOverrides& ov = {}) {
  return select_logits_kernel(p, d, ov, b);
}

TEST(KernelPlan, NamesRoundTrip) {
  for (LogitsKernel k : {LogitsKernel::kGemvRegRing, LogitsKernel::kGemvStaged, LogitsKernel::kGemmMmaSync,
                         LogitsKernel::kGemmWgmma, LogitsKernel::kGemmWgmmaWs, LogitsKernel::kCublasFallback})
    EXPECT_EQ(parse_logits_kernel(logits_kernel_name(k), "test"), k);
  for (TopkPath t : {TopkPath::kPoolEpilogue, TopkPath::kLists, TopkPath::kLogitsThenSelect, TopkPath::kTileSelect})
    EXPECT_EQ(parse_topk_path(topk_path_name(t), "test"), t);
}

// The H200 table for the 151936 × 1024 w4g64 head (architecture.md#kernel-plan).
TEST(KernelPlan, H200LogitsByM) {
  struct Row {
    int64_t M;
    LogitsKernel kernel;
    int col_tiles, block_cols;
  };
  const Row rows[] = {
      {1, LogitsKernel::kGemvStaged, 1, 0},    {8, LogitsKernel::kGemvStaged, 1, 0},
      {9, LogitsKernel::kGemvStaged, 2, 0},    {16, LogitsKernel::kGemvStaged, 2, 0},
      {17, LogitsKernel::kGemvStaged, 4, 0},   {32, LogitsKernel::kGemvStaged, 4, 0},
      {33, LogitsKernel::kGemmWgmma, 0, 64},   {64, LogitsKernel::kGemmWgmma, 0, 64},
      {65, LogitsKernel::kGemmWgmmaWs, 0, 128}, {256, LogitsKernel::kGemmWgmmaWs, 0, 128},
  };
  for (const Row& r : rows) {
    const LogitsPlan plan = pick(problem(4, 64, 151936, 1024, r.M));
    SCOPED_TRACE(plan.describe());
    EXPECT_EQ(plan.kernel, r.kernel) << "M=" << r.M;
    EXPECT_EQ(plan.col_tiles, r.col_tiles);
    EXPECT_EQ(plan.block_cols, r.block_cols);
    EXPECT_TRUE(plan.note.empty());
    EXPECT_NE(std::string(plan.reason), "");
  }
  // The staged GEMV's layout for this shape: 128-byte stages, a group of two 16-byte segments.
  const LogitsPlan s = pick(problem(4, 64, 151936, 1024, 1));
  EXPECT_EQ(s.stage_bytes, 128);
  EXPECT_EQ(s.group_segs, 2);
  EXPECT_FALSE(s.x_prebuilt);
  EXPECT_GT(s.smem_bytes, 0);
  // Above 16 columns: four column tiles; 8-bit rows take 16 warps where they fit (one copy of
  // the activations per SM), else 8; 4-bit rows 8. The override takes 8-bit rows back to 8.
  const LogitsPlan w4 = pick(problem(4, 64, 151936, 1024, 32));
  EXPECT_EQ(w4.warps, 8);
  const LogitsPlan w8 = pick(problem(8, 128, 151936, 1024, 24));
  EXPECT_EQ(w8.kernel, LogitsKernel::kGemvStaged);
  EXPECT_EQ(w8.col_tiles, 4);
  EXPECT_EQ(w8.warps, 16);
  EXPECT_LE(w8.smem_bytes, DeviceInfo::h200().smem_optin);
  const LogitsPlan w8big = pick(problem(8, 32, 262144, 2560, 20));  // 16 warps: 235008 bytes
  EXPECT_EQ(w8big.kernel, LogitsKernel::kGemvStaged);
  EXPECT_TRUE(w8big.x_prebuilt);
  EXPECT_EQ(w8big.warps, 8);
  EXPECT_LE(w8big.smem_bytes, DeviceInfo::h200().smem_optin);
  EXPECT_EQ(pick(problem(8, 128, 151936, 1024, 16)).warps, 8);
  LogitsOverrides eight;
  eight.staged_warps = 8;
  EXPECT_EQ(pick(problem(8, 128, 151936, 1024, 24), DeviceInfo::h200(), Backend::kAuto, eight).warps, 8);
  // Four column tiles of 128-byte stages in 8 warps take 2 stages per warp, which also fit
  // where 3 would not: 262144x2560 w4g64 at M = 32 (3 stages: 242176 bytes), 128256x4096
  // w4g128 at M = 20-21; past what 2 stages fit (H = 4096, M = 22) the mma.sync GEMM runs.
  // Fewer column tiles, and 8-bit rows in 16 warps, keep 3.
  for (const LogitsProblem& q : {problem(4, 64, 262144, 2560, 32), problem(4, 128, 262144, 2560, 32),
                                 problem(4, 128, 128256, 4096, 21), problem(4, 64, 151936, 1024, 17),
                                 problem(8, 64, 262144, 2560, 32)}) {
    const LogitsPlan plan = pick(q);
    SCOPED_TRACE(plan.describe());
    EXPECT_EQ(plan.kernel, LogitsKernel::kGemvStaged);
    EXPECT_EQ(plan.stages, 2);
    EXPECT_EQ(plan.warps, 8);
    EXPECT_LE(plan.smem_bytes, DeviceInfo::h200().smem_optin);
  }
  EXPECT_EQ(pick(problem(4, 128, 128256, 4096, 22)).kernel, LogitsKernel::kGemmMmaSync);
  EXPECT_EQ(pick(problem(4, 64, 151936, 1024, 16)).stages, 3);
  EXPECT_EQ(pick(problem(4, 64, 151936, 1024, 1)).stages, 3);
  EXPECT_EQ(w8.stages, 3);  // 16 warps
  // The warp-specialized GEMM's 4-bit stages are 64 bytes, 8-bit ones 128.
  EXPECT_EQ(pick(problem(4, 64, 151936, 1024, 256)).stage_bytes, 64);
  EXPECT_EQ(pick(problem(8, 128, 151936, 1024, 256)).stage_bytes, 128);
}

// The staged GEMV's warpgroup form: 4-bit rows with four column tiles on
// sm_90 where two of its CTAs fit an SM; forced, any width wherever it fits;
// never with fewer column tiles or off sm_90.
TEST(KernelPlan, StagedWarpgroupForm) {
  for (int64_t m : {17, 24, 32})
    for (int group : {64, 128}) {
      const LogitsPlan plan = pick(problem(4, group, 151936, 1024, m));
      SCOPED_TRACE(plan.describe());
      EXPECT_EQ(plan.kernel, LogitsKernel::kGemvStaged);
      EXPECT_TRUE(plan.wgmma);
      EXPECT_EQ(plan.warps, 8);
      EXPECT_EQ(plan.stages, 2);
      EXPECT_FALSE(plan.x_prebuilt);  // 64 KB, built by each CTA
      EXPECT_LE(2 * (plan.smem_bytes + 1024), DeviceInfo::h200().smem_per_sm);
      EXPECT_NE(plan.describe().find(" wgmma"), std::string::npos);
    }
  EXPECT_FALSE(pick(problem(4, 64, 151936, 1024, 16)).wgmma);  // two column tiles
  EXPECT_FALSE(pick(problem(8, 128, 151936, 1024, 24)).wgmma);  // 8-bit: the 16-warp form
  // One CTA per SM (the activations alone 160 KB): the mma.sync form.
  const LogitsPlan big = pick(problem(4, 128, 262144, 2560, 32));
  EXPECT_EQ(big.kernel, LogitsKernel::kGemvStaged);
  EXPECT_FALSE(big.wgmma);
  LogitsOverrides on, off;
  on.staged_wgmma = true;
  off.staged_wgmma = false;
  EXPECT_FALSE(pick(problem(4, 64, 151936, 1024, 32), DeviceInfo::h200(), Backend::kAuto, off).wgmma);
  const LogitsPlan w8 = pick(problem(8, 128, 151936, 1024, 24), DeviceInfo::h200(), Backend::kAuto, on);
  EXPECT_TRUE(w8.wgmma);
  EXPECT_EQ(w8.warps, 8);
  const LogitsPlan forced = pick(problem(4, 128, 262144, 2560, 32), DeviceInfo::h200(), Backend::kAuto, on);
  EXPECT_TRUE(forced.wgmma);
  EXPECT_TRUE(forced.x_prebuilt);  // 160 KB: built once per call
  EXPECT_LE(forced.smem_bytes, DeviceInfo::h200().smem_optin);
  // H = 4096 at M = 20: the wgmma layout (256 KB) does not fit; the mma.sync form does.
  const LogitsPlan h4096 = pick(problem(4, 128, 128256, 4096, 20), DeviceInfo::h200(), Backend::kAuto, on);
  EXPECT_EQ(h4096.kernel, LogitsKernel::kGemvStaged);
  EXPECT_FALSE(h4096.wgmma);
  DeviceInfo a100 = DeviceInfo::h200();
  a100.cc_major = 8;
  EXPECT_FALSE(pick(problem(4, 64, 151936, 1024, 32), a100, Backend::kAuto, on).wgmma);
}

TEST(KernelPlan, Sm80HasNoWgmma) {
  for (int64_t M : {33, 64, 65, 256}) {
    const LogitsPlan plan = pick(problem(4, 64, 151936, 1024, M), sm80());
    EXPECT_EQ(plan.kernel, LogitsKernel::kGemmMmaSync) << M;
    EXPECT_EQ(plan.col_tiles, 8) << M;
  }
  for (int64_t M : {1, 32}) EXPECT_EQ(pick(problem(4, 64, 151936, 1024, M), sm80()).kernel, LogitsKernel::kGemvStaged);
  // Where the staged GEMV's activations do not fit (M = 32 at H = 4096: 264 KB), the mma.sync GEMM.
  const LogitsPlan wide = pick(problem(4, 128, 128256, 4096, 32), sm80());
  EXPECT_EQ(wide.kernel, LogitsKernel::kGemmMmaSync);
  EXPECT_EQ(wide.col_tiles, 4);
}

TEST(KernelPlan, GroupLayoutsTheGemmsCannotTake) {
  // 4-bit per row, H = 1056: 528-byte rows are neither whole 64- nor 128-byte stages, so
  // only the register ring takes it; kAuto gives M > 64 to cuBLAS, kFused keeps the GEMV.
  const LogitsProblem p = problem(4, 1056, 50257, 1056, 1);
  EXPECT_EQ(pick(p).kernel, LogitsKernel::kGemvRegRing);
  LogitsProblem big = p;
  big.M = 256;
  EXPECT_EQ(pick(big).kernel, LogitsKernel::kCublasFallback);
  const LogitsPlan fused = pick(big, DeviceInfo::h200(), Backend::kFused);
  EXPECT_EQ(fused.kernel, LogitsKernel::kGemvRegRing);
  EXPECT_EQ(fused.col_tiles, 8);
  EXPECT_EQ(fused.stages, 2);
  // 8-bit per row, H = 1088: 1088-byte rows are whole 64-byte stages but not 128-byte ones,
  // so above M = 64 the CTA-barrier wgmma GEMM runs, groups spanning 17 stages.
  const LogitsPlan w8 = pick(problem(8, 1088, 50257, 1088, 65));
  EXPECT_EQ(w8.kernel, LogitsKernel::kGemmWgmma);
  EXPECT_EQ(w8.block_cols, 128);
  EXPECT_EQ(w8.group_segs, 0);
  EXPECT_EQ(w8.stages_per_group, 17);
}

TEST(KernelPlan, RegisterRingConfigurations) {
  struct Row {
    int bits, group;
    int64_t M;
    int piece, rt, nt, d, w;
  };
  // Per-row 4-bit H = 1056 (528-byte groups: 4-byte pieces), per-row 8-bit (1056 bytes:
  // 8-byte pieces), 4-bit g128 of H = 1024 (64-byte groups: 16-byte pieces).
  const Row rows[] = {
      {4, 1056, 1, 4, 2, 1, 4, 4},  {4, 1056, 9, 4, 1, 2, 4, 8}, {4, 1056, 17, 4, 1, 4, 4, 8},
      {4, 1056, 33, 4, 1, 8, 2, 8}, {4, 128, 1, 16, 2, 2, 4, 4}, {4, 128, 16, 16, 2, 2, 4, 4},
      {8, 1056, 1, 8, 1, 1, 4, 8},  {8, 1056, 16, 8, 1, 2, 4, 8},
  };
  for (const Row& r : rows) {
    LogitsOverrides ov;
    ov.kernel = LogitsKernel::kGemvRegRing;
    const int64_t H = r.group == 128 ? 1024 : 1056;
    const LogitsPlan plan = pick(problem(r.bits, r.group, 50257, H, r.M), DeviceInfo::h200(), Backend::kFused, ov);
    SCOPED_TRACE(plan.describe());
    ASSERT_EQ(plan.kernel, LogitsKernel::kGemvRegRing);
    EXPECT_EQ(plan.piece_bytes, r.piece);
    EXPECT_EQ(plan.row_tiles, r.rt);
    EXPECT_EQ(plan.col_tiles, r.nt);
    EXPECT_EQ(plan.stages, r.d);
    EXPECT_EQ(plan.warps, r.w);
  }
}

TEST(KernelPlan, SchemesWithoutAFusedKernel) {
  // 8-bit groups of 16 (L = 4 only), 4-bit groups of 8, 2-bit codes, a dense table, kFallbackBlas.
  EXPECT_EQ(pick(problem(8, 16, 1000, 1024, 1)).kernel, LogitsKernel::kCublasFallback);
  EXPECT_EQ(pick(problem(4, 8, 1000, 1024, 1)).kernel, LogitsKernel::kCublasFallback);
  EXPECT_EQ(pick(problem(2, 64, 1000, 1024, 1)).kernel, LogitsKernel::kCublasFallback);
  LogitsProblem dense = problem(4, 64, 1000, 1024, 1);
  dense.packed = false;
  EXPECT_EQ(pick(dense, DeviceInfo::h200(), Backend::kFused).kernel, LogitsKernel::kCublasFallback);
  EXPECT_EQ(pick(problem(4, 64, 1000, 1024, 1), DeviceInfo::h200(), Backend::kFallbackBlas).kernel,
            LogitsKernel::kCublasFallback);
}

TEST(KernelPlan, OverridesForceAKernelOrSayWhyNot) {
  LogitsOverrides ov;
  ov.kernel = LogitsKernel::kGemmWgmmaWs;
  const LogitsPlan ws = pick(problem(4, 64, 151936, 1024, 1), DeviceInfo::h200(), Backend::kFused, ov);
  EXPECT_EQ(ws.kernel, LogitsKernel::kGemmWgmmaWs);
  EXPECT_EQ(ws.block_cols, 64);
  EXPECT_TRUE(ws.note.empty());
  // The staged GEMV takes at most 32 columns: the override is refused and the plan says so.
  ov.kernel = LogitsKernel::kGemvStaged;
  const LogitsPlan refused = pick(problem(4, 64, 151936, 1024, 33), DeviceInfo::h200(), Backend::kFused, ov);
  EXPECT_EQ(refused.kernel, LogitsKernel::kGemmWgmma);
  EXPECT_NE(refused.note.find("gemv_staged was forced but cannot take"), std::string::npos) << refused.note;
  // No wgmma on sm_80.
  ov.kernel = LogitsKernel::kGemmWgmma;
  EXPECT_EQ(pick(problem(4, 64, 151936, 1024, 64), sm80(), Backend::kFused, ov).kernel, LogitsKernel::kGemmMmaSync);
  // The staged activations built once per call from the override's byte count.
  LogitsOverrides x;
  x.staged_cta_x = 0;
  EXPECT_TRUE(pick(problem(4, 64, 151936, 1024, 1), DeviceInfo::h200(), Backend::kAuto, x).x_prebuilt);
}

// The kernels after the logits launched as programmatic dependents: on by
// default on sm_90, never below it, off through the override.
TEST(KernelPlan, DependentLaunchFollowsTheDeviceAndTheOverride) {
  const LogitsProblem p1 = problem(4, 64, 151936, 1024, 1), p12 = problem(4, 64, 151936, 1024, 12);
  EXPECT_TRUE(dependent_launch(DeviceInfo::h200(), {}));
  EXPECT_FALSE(dependent_launch(sm80(), {}));  // programmatic dependent launch needs sm_90
  LogitsOverrides dep, plain;
  dep.dependent_launch = true;
  plain.dependent_launch = false;
  EXPECT_TRUE(dependent_launch(DeviceInfo::h200(), dep));
  EXPECT_FALSE(dependent_launch(sm80(), dep));
  EXPECT_FALSE(dependent_launch(DeviceInfo::h200(), plain));
  for (const LogitsProblem& p : {p1, p12, problem(4, 64, 151936, 1024, 256)}) {  // every top-k path carries it
    for (const LogitsOverrides& ov : {LogitsOverrides{}, dep}) {
      const TopkPlan t = select_topk_path(p, 50, DeviceInfo::h200(), ov, Backend::kAuto);
      EXPECT_TRUE(t.dependent_launch) << t.describe();
      EXPECT_NE(t.describe().find("dependent launches"), std::string::npos) << t.describe();
    }
    const TopkPlan off = select_topk_path(p, 50, DeviceInfo::h200(), plain, Backend::kAuto);
    EXPECT_FALSE(off.dependent_launch) << off.describe();
    EXPECT_EQ(off.describe().find("dependent launches"), std::string::npos) << off.describe();
    EXPECT_FALSE(select_topk_path(p, 50, sm80(), {}, Backend::kAuto).dependent_launch);
  }
}

struct ScopedEnv {
  std::string name;
  ScopedEnv(const char* n, const char* v) : name(n) { setenv(n, v, 1); }
  ~ScopedEnv() { unsetenv(name.c_str()); }
};

TEST(KernelPlan, EnvironmentOverridesAreValidated) {
  {
    ScopedEnv e("QHEAD_CUDA_LOGITS_KERNEL", "on");
    try {
      (void)LogitsOverrides::from_env();
      FAIL() << "a bad kernel name was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      const std::string m = e.what();
      EXPECT_NE(m.find("QHEAD_CUDA_LOGITS_KERNEL"), std::string::npos) << m;
      EXPECT_NE(m.find("gemv_staged"), std::string::npos) << m;  // lists the values allowed
    }
  }
  for (const char* bad : {"abc", "-1", "12x", "2000000"}) {
    ScopedEnv e("QHEAD_CUDA_STAGED_CTA_X", bad);
    EXPECT_THROW((void)LogitsOverrides::from_env(), Error) << bad;
  }
  {
    ScopedEnv e("QHEAD_CUDA_TOPK_PATH", "pools");
    EXPECT_THROW((void)LogitsOverrides::from_env(), Error);
  }
  for (const char* bad : {"4", "32", "16 ", "x"}) {
    ScopedEnv e("QHEAD_CUDA_STAGED_WARPS", bad);
    EXPECT_THROW((void)LogitsOverrides::from_env(), Error) << bad;
  }
  for (const char* name : {"QHEAD_CUDA_DEPENDENT_LAUNCH", "QHEAD_CUDA_STAGED_WGMMA"})
    for (const char* bad : {"yes", "2", "on", " 1"}) {
      ScopedEnv e(name, bad);
      try {
        (void)LogitsOverrides::from_env();
        ADD_FAILURE() << name << "=" << bad << " was accepted";
      } catch (const Error& err) {
        EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(err.what()).find(name), std::string::npos) << err.what();
      }
    }
  for (const char* v : {"0", "1"}) {
    ScopedEnv b("QHEAD_CUDA_DEPENDENT_LAUNCH", v);
    EXPECT_EQ(LogitsOverrides::from_env().dependent_launch, v[0] == '1');
  }
  EXPECT_FALSE(LogitsOverrides::from_env().dependent_launch.has_value());
  for (const char* v : {"0", "1"}) {
    ScopedEnv b("QHEAD_CUDA_STAGED_WGMMA", v);
    EXPECT_EQ(LogitsOverrides::from_env().staged_wgmma, v[0] == '1');
  }
  EXPECT_FALSE(LogitsOverrides::from_env().staged_wgmma.has_value());
  ScopedEnv k("QHEAD_CUDA_LOGITS_KERNEL", "gemm_mma_sync");
  ScopedEnv t("QHEAD_CUDA_TOPK_PATH", "lists");
  ScopedEnv x("QHEAD_CUDA_STAGED_CTA_X", "4096");
  ScopedEnv w("QHEAD_CUDA_STAGED_WARPS", "8");
  const LogitsOverrides ov = LogitsOverrides::from_env();
  EXPECT_EQ(ov.kernel, LogitsKernel::kGemmMmaSync);
  EXPECT_EQ(ov.topk_path, TopkPath::kLists);
  EXPECT_EQ(ov.staged_cta_x, 4096);
  EXPECT_EQ(ov.staged_warps, 8);
  ScopedEnv empty("QHEAD_CUDA_LOGITS_KERNEL", "");
  EXPECT_FALSE(LogitsOverrides::from_env().kernel.has_value());
}

TopkPlan topk_plan(const LogitsProblem& p, int64_t k, Backend b, const LogitsOverrides& ov = {}) {
  return select_topk_path(p, k, DeviceInfo::h200(), ov, b);
}

TEST(KernelPlan, TopkPaths) {
  // kAuto at M = 16: the staged GEMV with its tile summaries, one select block per row; its
  // shared memory holds the 9496 tile maxima and 8192 candidate entries.
  const TopkPlan a16 = topk_plan(problem(4, 64, 151936, 1024, 16), 50, Backend::kAuto);
  ASSERT_EQ(a16.path, TopkPath::kTileSelect) << a16.describe();
  EXPECT_EQ(a16.main.kernel, LogitsKernel::kGemvStaged);
  EXPECT_EQ(a16.main.epilogue, LogitsEpilogue::kStoreTiles);
  EXPECT_EQ(a16.tile_rows, 16);
  EXPECT_EQ(a16.tile_smem, 9496 * 4 + kTileThreads * kTileHotPer * 8);
  EXPECT_NE(a16.describe().find("+tile_summaries"), std::string::npos) << a16.describe();
  // ... at every M the staged GEMV takes; M = 33 (no staged GEMV) takes logits, then selection.
  for (int64_t M : {1, 3, 8, 17, 32})
    EXPECT_EQ(topk_plan(problem(4, 64, 151936, 1024, M), 50, Backend::kAuto).path, TopkPath::kTileSelect) << M;
  EXPECT_EQ(topk_plan(problem(4, 64, 151936, 1024, 33), 50, Backend::kAuto).path, TopkPath::kLogitsThenSelect);
  // Not above the epilogues' k, nor where the tile maxima outgrow the block's shared memory.
  EXPECT_EQ(topk_plan(problem(4, 64, 151936, 1024, 16), 257, Backend::kAuto).path, TopkPath::kLogitsThenSelect);
  EXPECT_EQ(topk_plan(problem(4, 64, 262144, 2560, 16), 50, Backend::kAuto).path, TopkPath::kTileSelect);
  EXPECT_EQ(topk_plan(problem(4, 64, 4000000, 1024, 16), 50, Backend::kAuto).path, TopkPath::kLogitsThenSelect);
  // Logits then select, forced at M = 1: first-level blocks of quarter slices (75 on a 151936 vocab).
  LogitsOverrides levels;
  levels.topk_path = TopkPath::kLogitsThenSelect;
  const TopkPlan a1 = topk_plan(problem(4, 64, 151936, 1024, 1), 50, Backend::kAuto, levels);
  EXPECT_EQ(a1.path, TopkPath::kLogitsThenSelect) << a1.describe();
  EXPECT_EQ(a1.main.epilogue, LogitsEpilogue::kStore);
  EXPECT_TRUE(a1.select_small);
  EXPECT_EQ(a1.select_blocks, 75);
  // Tile select at M = 1, by default.
  const TopkPlan t1 = topk_plan(problem(4, 64, 151936, 1024, 1), 50, Backend::kAuto);
  EXPECT_EQ(t1.path, TopkPath::kTileSelect) << t1.describe();
  EXPECT_EQ(t1.main.epilogue, LogitsEpilogue::kStoreTiles);
  // Tile select needs the staged GEMV: refused, with a note, when another logits kernel is forced.
  LogitsOverrides ring;
  ring.topk_path = TopkPath::kTileSelect;
  ring.kernel = LogitsKernel::kGemvRegRing;
  const TopkPlan r1 = topk_plan(problem(4, 64, 151936, 1024, 1), 50, Backend::kAuto, ring);
  EXPECT_EQ(r1.path, TopkPath::kLogitsThenSelect) << r1.describe();
  EXPECT_NE(r1.note.find("tile_select was forced"), std::string::npos) << r1.note;
  // kFused at M <= 8: the staged GEMV's pool epilogue, pools sized for the grid.
  const TopkPlan f1 = topk_plan(problem(4, 64, 151936, 1024, 1), 50, Backend::kFused);
  ASSERT_EQ(f1.path, TopkPath::kPoolEpilogue) << f1.describe();
  EXPECT_EQ(f1.main.epilogue, LogitsEpilogue::kTopkPools);
  EXPECT_EQ(f1.main.pool_cols, 1);
  EXPECT_GT(f1.main.grid, 0);
  const int64_t per_cta = (151936 / 16 + int64_t(f1.main.grid) * 8 - 1) / (int64_t(f1.main.grid) * 8) * 8 * 16;
  EXPECT_GE(f1.main.pool_cap, per_cta);  // every logit a CTA computes fits its pool
  EXPECT_LE(f1.main.smem_bytes, 160 * 1024);
  // kAuto from M = 128 on a large vocab: the list epilogue with a threshold sample of 64 tiles.
  const TopkPlan a128 = topk_plan(problem(4, 64, 151936, 1024, 128), 50, Backend::kAuto);
  ASSERT_EQ(a128.path, TopkPath::kLists) << a128.describe();
  EXPECT_EQ(a128.main.kernel, LogitsKernel::kGemmWgmmaWs);
  EXPECT_EQ(a128.main.block_cols, 128);
  ASSERT_TRUE(a128.sample.has_value());
  EXPECT_EQ(a128.sample_rows, 8192);
  EXPECT_EQ(a128.sample_stride, 151936 / 128 / 64);
  EXPECT_EQ(a128.main.grid, 132);
  EXPECT_EQ(a128.main.list_segments, 8 * 132);
  // ... but not at M = 96 (kAuto), which kFused takes from M = 65.
  EXPECT_EQ(topk_plan(problem(4, 64, 151936, 1024, 96), 50, Backend::kAuto).path, TopkPath::kLogitsThenSelect);
  EXPECT_EQ(topk_plan(problem(4, 64, 151936, 1024, 65), 50, Backend::kFused).path, TopkPath::kLists);
  EXPECT_EQ(topk_plan(problem(4, 64, 151936, 1024, 64), 50, Backend::kFused).path, TopkPath::kLogitsThenSelect);
  // 8-bit groups of 16 have no fused logits but the pool epilogue takes them.
  EXPECT_EQ(topk_plan(problem(8, 16, 50257, 1024, 1), 50, Backend::kFused).path, TopkPath::kPoolEpilogue);
  EXPECT_EQ(topk_plan(problem(8, 16, 50257, 1024, 1), 50, Backend::kFused).main.group_segs, 1);
  // k above the epilogues' gather: logits then select.
  EXPECT_EQ(topk_plan(problem(4, 64, 151936, 1024, 1), 300, Backend::kFused).path, TopkPath::kLogitsThenSelect);
  // No threshold sample when the vocab has fewer than k rows in whole tiles.
  const TopkPlan tiny = topk_plan(problem(4, 64, 200, 1024, 65), 200, Backend::kFused);
  ASSERT_EQ(tiny.path, TopkPath::kLists) << tiny.describe();
  EXPECT_FALSE(tiny.sample.has_value());
  // A forced path that cannot take the problem is refused, with a note.
  LogitsOverrides pools;
  pools.topk_path = TopkPath::kPoolEpilogue;
  const TopkPlan refused = topk_plan(problem(4, 64, 151936, 1024, 9), 50, Backend::kFused, pools);
  EXPECT_NE(refused.path, TopkPath::kPoolEpilogue);
  EXPECT_NE(refused.note.find("pool_epilogue was forced"), std::string::npos) << refused.note;
  // The pool epilogue takes only 128-byte stages: 4-bit H = 640 rows (320 bytes) take 64-byte ones,
  // and kFused takes tile select there.
  EXPECT_EQ(pick(problem(4, 64, 262144, 640, 1)).stage_bytes, 64);
  EXPECT_EQ(topk_plan(problem(4, 64, 262144, 640, 1), 50, Backend::kFused).path, TopkPath::kTileSelect);
  EXPECT_EQ(topk_plan(problem(4, 64, 262144, 640, 12), 50, Backend::kFused).path, TopkPath::kTileSelect);
}

}  // namespace
}  // namespace qhead::cuda_plan
