// CUDA ops against the float64 oracle on the dequantized weights. Every test
// skips when no GPU is visible (CI); on the H200 they all run.
//
// Tolerance of the fused logits (derived): per group the kernel sums the
// products (q − z)·x — exact, an integer times an f16/bf16 value — in the
// tensor cores' f32 accumulator, then adds s·partial with one FMA. That is a
// sum of H products plus `groups` scaled partials, each addition rounded in
// f32; tensor cores may truncate instead of rounding to nearest, so we take
// u = 2^-23 (one full ulp) instead of 2^-24:
//     |Δ| <= γ_{H + groups + 1}(2^-23) · Σ_j |x_j w_j|.
// The cuBLAS fallback rounds each dequantized weight to the activation dtype
// first (that is what dequant + F.linear does), adding u_T · Σ|x w|.
// As the one oracle's parameters (test_util.h, LogitBound): u_add = 2^-23,
// extra_adds = groups + 1, u_weights = u_T where cuBLAS may compute the
// logits (cuda_bound), floor = 1e-30.
//
// The named cases (tests/cases.h) run as CudaLogits.Sweep/<backend>_<case>
// and CudaTopk.Sweep/<backend>_<case> (one ctest test each); the tests that force one kernel
// family through the environment loop over the registry's lists for it.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string>

#if defined(QHEAD_HAS_CUDA)
#include <cuda_runtime.h>
#endif

#include "cases.h"
#include "ops/ops_cuda.h"
#include "qhead/cuda.h"
#include "qhead/ops.h"
#include "qhead/quantize.h"
#include "test_util.h"

namespace qhead {
namespace {

using namespace qhead::test;

#define SKIP_WITHOUT_GPU() \
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device"

Tensor upload(const Tensor& h) { return cuda::to_device(h.view()); }
Tensor download(const Tensor& d) { return cuda::to_host(d.view()); }

// A poisoned device tensor (NaN / int poison), so unwritten outputs show.
Tensor poisoned_device(DType t, Shape s) {
  Tensor h = Tensor::empty(t, std::move(s));
  poison(h.view(), -1);
  return upload(h);
}

const char* backend_tag(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kFused: return "fused";
    case Backend::kFallbackBlas: return "blas";
    case Backend::kReference: return "reference";
  }
  return "?";
}

// Whether the logits of `backend` may come from dequant + cuBLAS: the
// fallback always; any backend for a scheme without a fused kernel (bits
// other than 4 and 8); kAuto above 64 rows where no GEMM takes the shape.
bool may_take_cublas(Backend backend, int bits, int64_t M) {
  return backend == Backend::kFallbackBlas || (bits != 4 && bits != 8) || (backend == Backend::kAuto && M > 64);
}

// The bound of the file comment for a [*, H] table of scheme s.
LogitBound cuda_bound(const QuantScheme& s, int64_t H, DType act, bool cublas) {
  LogitBound b;
  b.u_add = 2.0 * kU32;
  b.extra_adds = s.groups(H) + 1;
  b.u_weights = cublas ? unit_roundoff(act) : 0.0;
  b.floor = 1e-30;
  return b;
}

// Rows checked against the oracle: all of them for small V, else the first
// and last 40 and 400 seeded random ones (every element is still checked for
// having been written).
std::vector<int64_t> rows_to_check(int64_t V, uint64_t seed) {
  if (V <= 4096) return all_rows(V);
  std::vector<int64_t> r;
  for (int64_t i = 0; i < 40; ++i) { r.push_back(i); r.push_back(V - 1 - i); }
  Rng rng(seed);
  std::uniform_int_distribution<int64_t> d(0, V - 1);
  for (int i = 0; i < 400; ++i) r.push_back(d(rng));
  return r;
}

QuantScheme scheme_of(const LogitsCase& c) { return make_scheme(c.bits, c.group, c.symmetric, c.scale); }

// Logits of case c on `backend`, its inputs seeded from the case's name,
// against the float64 oracle. With `ov`, they run under those overrides
// (through the kernel-plan door, cuda_ops::run_logits) and `expect_plan`
// checks the plan that ran; without, under the environment's.
void check_logits_ov(const LogitsCase& c, Backend backend, const std::optional<cuda_plan::LogitsOverrides>& ov,
                     const std::function<void(const cuda_plan::LogitsPlan&)>& expect_plan, const std::string& what) {
  SCOPED_TRACE(case_name(c) + " on " + backend_tag(backend) + what);
  const uint64_t seed = case_seed(c);
  const QuantScheme s = scheme_of(c);
  const PackedTable host = random_packed(c.V, c.H, s, seed);
  const Table dev = cuda::to_device(Table::packed(host));
  const Tensor xh = random_tensor(c.act, c.M, c.H, seed + 1);
  const Tensor xd = upload(xh);
  Tensor out = poisoned_device(DType::kF32, {c.M, c.V});
  if (ov) {
    const cuda_plan::LogitsPlan plan = cuda_ops::run_logits(dev, xd.view(), out.view(), backend, *ov);
    expect_plan(plan);
  } else {
    logits(dev, xd.view(), out.view(), backend);
  }
  cuda::synchronize();
  const Tensor oh = download(out);
  ASSERT_EQ(count_nan(oh.view()), 0) << "unwritten (NaN-poisoned) outputs remain";
  const std::vector<float> xf = to_f32(xh.view());
  const Oracle o = make_oracle(Table::packed(host), xf.data(), c.M, rows_to_check(c.V, seed + 2),
                               cuda_bound(s, c.H, c.act, may_take_cublas(backend, c.bits, c.M)));
  int bad = 0;
  for (int64_t m = 0; m < c.M; ++m)
    for (int64_t r = 0; r < int64_t(o.rows.size()); ++r) {
      const double got = oh.ptr<float>()[m * c.V + o.rows[size_t(r)]];
      const double want = o.val(m, r), tol = o.tl(m, r);
      if (!(std::fabs(got - want) <= tol) && bad++ < 5)
        ADD_FAILURE() << "m=" << m << " row=" << o.rows[size_t(r)] << " got " << got << " want " << want << " tol "
                      << tol;
    }
  EXPECT_EQ(bad, 0);
}

// The plan kFused would run for case c under `ov`, without running it (a
// one-row table of the case's scheme: the plan depends on the shape, not the values).
cuda_plan::LogitsPlan planned(const LogitsCase& c, const cuda_plan::LogitsOverrides& ov) {
  const Table probe = cuda::to_device(Table::packed(random_packed(1, c.H, scheme_of(c), 1)));
  const Tensor xp = cuda::empty(c.act, {c.M, c.H});
  return cuda_ops::plan_logits(probe, xp.view(), Backend::kFused, ov);
}

// With `force`, the logits kernel it names runs, and the plan that ran must name it.
void check_logits(const LogitsCase& c, Backend backend, std::optional<cuda_plan::LogitsKernel> force = std::nullopt) {
  if (!force) return check_logits_ov(c, backend, std::nullopt, {}, "");
  cuda_plan::LogitsOverrides ov;
  ov.kernel = force;
  check_logits_ov(
      c, backend, ov, [&](const cuda_plan::LogitsPlan& plan) { ASSERT_EQ(plan.kernel, *force) << plan.describe(); },
      std::string(" forced ") + cuda_plan::logits_kernel_name(*force));
}

// ---- the logits sweep: backend × case (tests/cases.h, the CUDA sweep) --------------------------
//
// Every scheme and dtype at V = 50257, H = 1024 and every M that selects a
// kernel family; awkward vocabs (1, 3, 151936, 49152 + 64); the hidden sizes
// of real models (576, 640, 2560, 4096); the shapes cuBLAS serves (3-bit).
// Each on kFused (the fused kernel even where kAuto takes cuBLAS), kAuto and
// kFallbackBlas.

struct LogitsParam {
  Backend backend;
  LogitsCase c;
};

std::vector<LogitsParam> logits_params() {
  std::vector<LogitsParam> out;
  for (const LogitsCase& c : logits_cases(kCudaSweep))
    for (Backend b : {Backend::kFused, Backend::kAuto, Backend::kFallbackBlas}) out.push_back({b, c});
  return out;
}

std::string logits_param_name(const testing::TestParamInfo<LogitsParam>& info) {
  return std::string(backend_tag(info.param.backend)) + "_" + case_name(info.param.c);
}

// --gtest_list_tests prints the parameter: its name, not its bytes.
void PrintTo(const LogitsParam& p, std::ostream* os) { *os << backend_tag(p.backend) << " " << case_name(p.c); }

class CudaLogits : public testing::TestWithParam<LogitsParam> {};

TEST_P(CudaLogits, Sweep) {
  SKIP_WITHOUT_GPU();
  check_logits(GetParam().c, GetParam().backend);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaLogits, testing::ValuesIn(logits_params()), logits_param_name);

// Every fused kernel family at every M it takes, forced through the
// overrides: the GEMVs up to M = 256, the GEMMs down to M = 1, so each is
// checked on the shapes the others normally take; each run asserts the plan
// named the forced kernel. A family that cannot take a case (the staged GEMV
// above 32 columns, the wgmma GEMMs off sm_90) is skipped there, and the test
// counts the cases each family ran.
TEST(Cuda, LogitsEveryKernelAtEveryM) {
  SKIP_WITHOUT_GPU();
  using cuda_plan::LogitsKernel;
  const bool wgmma = cuda_ops::device_info().has_wgmma();
  int mode = 0;
  for (LogitsKernel k : {LogitsKernel::kGemvRegRing, LogitsKernel::kGemvStaged, LogitsKernel::kGemmMmaSync,
                         LogitsKernel::kGemmWgmma, LogitsKernel::kGemmWgmmaWs}) {
    const std::vector<LogitsCase> cases = every_m_cases(mode++ % 4);
    int ran = 0;
    for (const LogitsCase& c : cases) {
      // Which kernel the forced plan names for this case.
      cuda_plan::LogitsOverrides ov;
      ov.kernel = k;
      if (planned(c, ov).kernel != k) continue;
      check_logits(c, Backend::kFused, k);
      ++ran;
    }
    if (k == LogitsKernel::kGemvStaged) EXPECT_EQ(ran, 2 * 3 * 5) << "the staged GEMV at M <= 32";
    else if (k == LogitsKernel::kGemmWgmma || k == LogitsKernel::kGemmWgmmaWs) EXPECT_EQ(ran, wgmma ? int(cases.size()) : 0);
    else EXPECT_EQ(ran, int(cases.size())) << cuda_plan::logits_kernel_name(k);
  }
  // The staged GEMV's configurations (M <= 32): 128-byte stages (H = 2560) and
  // 64-byte ones (4-bit H = 640), one, two or four activation tiles, partial tiles.
  for (const LogitsCase& c : staged_gemv_cases()) check_logits(c, Backend::kFused);
  // H whose stage count is odd or a group spans several stages (8-bit g128: 2 stages; per row).
  for (const LogitsCase& c : odd_stage_cases()) check_logits(c, Backend::kAuto);
}

// Logits stored in 16 bits: every fused kernel, forced, writes exactly its f32
// logits rounded to nearest even (the same plan, so the same accumulation
// order: bit-exact), into a NaN-poisoned f16 / bf16 out; the cuBLAS fallback,
// which may pick another algorithm for a 16-bit output, stays within the
// case's bound plus half an ulp of the output dtype. Awkward V (3: inside one
// tile; 50257 and 49152 + 64: partial tiles) and M = 1, 3, 17, 256 (partial
// column tiles of every family); f16 and bf16 activations.
TEST(Cuda, LogitsStoredIn16Bit) {
  SKIP_WITHOUT_GPU();
  using cuda_plan::LogitsKernel;
  int checked = 0, n = 0;
  for (int64_t V : {int64_t(3), int64_t(50257), int64_t(49152 + 64)})
    for (int64_t M : {1, 3, 17, 256})
      for (std::optional<LogitsKernel> k :
           {std::optional<LogitsKernel>(LogitsKernel::kGemvRegRing), std::optional<LogitsKernel>(LogitsKernel::kGemvStaged),
            std::optional<LogitsKernel>(LogitsKernel::kGemmMmaSync), std::optional<LogitsKernel>(LogitsKernel::kGemmWgmma),
            std::optional<LogitsKernel>(LogitsKernel::kGemmWgmmaWs), std::optional<LogitsKernel>()}) {
        ++n;
        LogitsCase c;
        c.bits = n % 3 == 0 ? 8 : 4;
        c.group = n % 2 ? 64 : 128;
        c.symmetric = n % 4 != 1;
        c.act = n % 2 ? DType::kF16 : DType::kBF16;
        c.V = V;
        c.H = 1024;
        c.M = M;
        cuda_plan::LogitsOverrides ov;
        const LogitsKernel want = k ? *k : LogitsKernel::kCublasFallback;
        ov.kernel = want;
        if (planned(c, ov).kernel != want) continue;  // this kernel does not take the shape
        SCOPED_TRACE(case_name(c) + " on " + cuda_plan::logits_kernel_name(want));
        const uint64_t seed = case_seed(c) + 77;
        const QuantScheme s = scheme_of(c);
        const PackedTable host = random_packed(V, c.H, s, seed);
        const Table dev = cuda::to_device(Table::packed(host));
        const Tensor xh = random_tensor(c.act, M, c.H, seed + 1);
        const Tensor xd = upload(xh);
        Tensor o32 = poisoned_device(DType::kF32, {M, V});
        const cuda_plan::LogitsPlan p32 = cuda_ops::run_logits(dev, xd.view(), o32.view(), Backend::kFused, ov);
        const Tensor h32 = download(o32);
        ASSERT_EQ(count_nan(h32.view()), 0);
        for (DType out : {DType::kF16, DType::kBF16}) {
          Tensor o16 = poisoned_device(out, {M, V});
          const cuda_plan::LogitsPlan p16 = cuda_ops::run_logits(dev, xd.view(), o16.view(), Backend::kFused, ov);
          ASSERT_EQ(p16.describe(), p32.describe());
          cuda::synchronize();
          const Tensor h16 = download(o16);
          ASSERT_EQ(count_nan(h16.view()), 0) << dtype_name(out) << ": unwritten (NaN-poisoned) outputs remain";
          const uint16_t* got = h16.ptr<uint16_t>();
          const float* f = h32.ptr<float>();
          int bad = 0;
          if (k) {  // a fused kernel: the f32 logits, rounded
            for (int64_t i = 0; i < M * V; ++i) {
              const uint16_t want = out == DType::kF16 ? f32_to_f16(f[i]) : f32_to_bf16(f[i]);
              if (got[i] != want && bad++ < 5)
                ADD_FAILURE() << dtype_name(out) << " [" << i / V << ", " << i % V << "]: got 0x" << std::hex << got[i]
                              << " want 0x" << want << std::dec << " (f32 " << f[i] << ")";
            }
          } else {  // cuBLAS: the case's bound, plus the output's rounding
            const std::vector<float> xf = to_f32(xh.view());
            const Oracle o = make_oracle(Table::packed(host), xf.data(), M, rows_to_check(V, seed + 2),
                                         cuda_bound(s, c.H, c.act, true));
            for (int64_t m = 0; m < M; ++m)
              for (size_t r = 0; r < o.rows.size(); ++r) {
                const double g = load_as_f32(got, out, m * V + o.rows[r]), want = o.val(m, int64_t(r));
                const double tol = o.tl(m, int64_t(r)) + unit_roundoff(out) * std::fabs(want) * 1.0001;
                if (!(std::fabs(g - want) <= tol) && bad++ < 5)
                  ADD_FAILURE() << dtype_name(out) << " m=" << m << " row=" << o.rows[r] << " got " << g << " want "
                                << want << " tol " << tol;
              }
          }
          EXPECT_EQ(bad, 0);
          ++checked;
        }
      }
  EXPECT_GE(checked, 2 * 3 * 4 * 3) << "every V and M on at least three kernels";
}

// The warp-specialized wgmma GEMM (M > 64 on sm_90, elsewhere the mma.sync
// GEMM): CTAs of a persistent grid taking several units each (V = 20011 at
// M = 256: 157 row tiles × 2 column tiles), the stage ring's phases wrapping
// inside a unit and across units, every group layout (several groups per
// stage, one, a group over several stages), zero points. Small enough for
// compute-sanitizer. Its 8-bit stages hold 128 bytes of a row (ws_c): rows of
// 576 bytes take the CTA-barrier wgmma GEMM's 64-byte stages instead, at the
// same M (the list's last two cases).
TEST(Cuda, LogitsWgmmaWarpSpecialized) {
  SKIP_WITHOUT_GPU();
  const bool wgmma = cuda_ops::device_info().has_wgmma();
  const std::vector<LogitsCase> cases = wgmma_ws_cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    const bool cta_barrier = i + 2 >= cases.size();  // the two 576-byte-row cases
    const auto want = !wgmma ? std::nullopt
                      : cta_barrier ? std::optional(cuda_plan::LogitsKernel::kGemmWgmma)
                                    : std::optional(cuda_plan::LogitsKernel::kGemmWgmmaWs);
    check_logits(cases[i], Backend::kFused, want);
  }
}

// The staged GEMV with large activations: up to 72 KB (here M = 7) each CTA
// builds their shared layout itself, above (M = 16) staged_x_kernel builds it
// once per call and each CTA copies it (one CTA per SM). 8-bit g32 with f32
// scales exceeds the scale block and takes the register-ring GEMV.
TEST(Cuda, LogitsStagedLargeActivations) {
  SKIP_WITHOUT_GPU();
  for (const LogitsCase& c : staged_large_x_cases()) check_logits(c, Backend::kFused);
}

// Four column tiles in 8 warps run 2 stages per warp; these activations
// leave room for no more (H = 2560 at M = 32 with groups of 64 or f32
// scales, H = 4096 at M = 20-21): vocabularies ending inside a tile (1001,
// 3), zero points, both activation types; the plan must name 2 stages.
TEST(Cuda, LogitsStagedTwoStages) {
  SKIP_WITHOUT_GPU();
  struct Tight {
    int bits, group;
    bool sym;
    DType act, scale;
    int64_t V, H, M;
  };
  const Tight cases[] = {
      {4, 64, true, DType::kF16, DType::kBF16, 1001, 2560, 32},  {4, 64, false, DType::kBF16, DType::kF16, 3, 2560, 32},
      {8, 64, true, DType::kBF16, DType::kBF16, 1001, 2560, 32}, {4, 128, false, DType::kF16, DType::kF32, 1001, 2560, 32},
      {4, 128, true, DType::kBF16, DType::kBF16, 1001, 4096, 21}, {8, 128, true, DType::kF16, DType::kF16, 3, 4096, 20},
  };
  cuda_plan::LogitsOverrides ov;  // the default plan
  for (const Tight& t : cases) {
    const LogitsCase c = cases_detail::cuda_case(t.bits, t.group, t.sym, t.act, t.scale, t.V, t.H, t.M);
    check_logits_ov(
        c, Backend::kFused, ov,
        [&](const cuda_plan::LogitsPlan& plan) {
          ASSERT_EQ(plan.kernel, cuda_plan::LogitsKernel::kGemvStaged) << plan.describe();
          EXPECT_EQ(plan.stages, 2) << plan.describe();
        },
        " (2 stages)");
  }
}

// The staged GEMV's two forms, each forced, at M = 9-32: the warpgroup form
// (sm_90, four column tiles of 128-byte stages: four warps' row tiles by one
// wgmma per k-block; at two column tiles, M <= 16, it must not be taken)
// and the per-warp mma.sync form. Tile
// counts that are not whole warpgroups (V = 1, 3, 1001, 50257, 49152 + 64),
// every group layout (32, 64, 128, per row; zero points), both activation
// types, H = 640 / 2560 / 4096 and the 2-stage shapes; each plan must name
// the form that ran.
TEST(Cuda, LogitsStagedWarpgroupForm) {
  SKIP_WITHOUT_GPU();
  const bool wgmma = cuda_ops::device_info().has_wgmma();
  std::vector<LogitsCase> cases;
  for (const LogitsCase& c : staged_gemv_cases())
    if (c.M > 8) cases.push_back(c);
  int n = 0;
  for (int64_t v : {int64_t(1), int64_t(3), int64_t(50257), int64_t(49152 + 64)})
    for (int64_t m : {9, 17, 32}) {
      const bool even = n++ % 2 == 0;
      cases.push_back(cases_detail::cuda_case(even ? 4 : 8, even ? 64 : 128, n % 3 != 0, even ? DType::kF16 : DType::kBF16,
                                              n % 3 == 0 ? DType::kF32 : DType::kBF16, v, 1024, m));
    }
  cases.push_back(cases_detail::cuda_case(4, 64, false, DType::kBF16, DType::kF16, 1001, 2560, 32));
  cases.push_back(cases_detail::cuda_case(8, 128, true, DType::kF16, DType::kF16, 1001, 4096, 20));
  cases.push_back(cases_detail::cuda_case(4, -1, false, DType::kF16, DType::kBF16, 1001, 4096, 12));
  int ran_wg = 0, ran = 0;
  for (const LogitsCase& c : cases)
    for (bool form : {true, false}) {
      cuda_plan::LogitsOverrides ov;
      ov.staged_wgmma = form;
      // Cases the staged GEMV does not take (a scale block past its limit) are not its.
      if (planned(c, ov).kernel != cuda_plan::LogitsKernel::kGemvStaged) continue;
      ++ran;
      check_logits_ov(
          c, Backend::kFused, ov,
          [&](const cuda_plan::LogitsPlan& plan) {
            ASSERT_EQ(plan.kernel, cuda_plan::LogitsKernel::kGemvStaged) << plan.describe();
            // Forced, the warpgroup form runs wherever its shared memory fits (at H = 1024 everywhere).
            EXPECT_TRUE(!plan.wgmma || (form && wgmma && plan.col_tiles == 4 && plan.stage_bytes == 128))
                << plan.describe();
            if (form && wgmma && c.H == 1024 && c.M > 16) EXPECT_TRUE(plan.wgmma) << plan.describe();
            ran_wg += plan.wgmma ? 1 : 0;
          },
          form ? " (warpgroup form)" : " (mma.sync form)");
    }
  EXPECT_GE(ran, 100);
  if (wgmma) EXPECT_GE(ran_wg, 20) << "the warpgroup form ran on too few cases";
}

TEST(Cuda, EmbedMatchesDequantizedRows) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 3000;
  for (int bits : {4, 8, 3})
    for (bool sym : {true, false})
      for (DType out_t : {DType::kF32, DType::kF16, DType::kBF16}) {
        QuantScheme s;
        s.bits = bits;
        s.group_size = bits == 3 ? 32 : 64;
        s.symmetric = sym;
        s.scale_dtype = DType::kBF16;
        const int64_t V = 50257, H = 576;
        const PackedTable host = random_packed(V, H, s, seed++);
        const Table dev = cuda::to_device(Table::packed(host));
        Tensor ids = Tensor::empty(DType::kI64, {7});
        const int64_t idv[7] = {0, V - 1, 12345, 0, 777, V - 2, 3};
        std::copy(idv, idv + 7, ids.ptr<int64_t>());
        Tensor out = poisoned_device(out_t, {7, H});
        embed(dev, upload(ids).view(), out.view());
        const Tensor oh = download(out);
        std::vector<double> row(static_cast<size_t>(H));
        for (int i = 0; i < 7; ++i) {
          dequant_row_expected(host, idv[i], row.data());
          for (int64_t j = 0; j < H; ++j)
            ASSERT_EQ(load_as_f32(oh.data(), out_t, i * H + j), round_through(float(row[size_t(j)]), out_t))
                << "bits " << bits << " id " << idv[i] << " h " << j;
        }
        // An id out of range: an error, not a read out of bounds.
        ids.ptr<int64_t>()[3] = V;
        expect_error([&] { embed(dev, upload(ids).view(), out.view()); }, ErrorCode::kInvalidArgument);
      }
}

// ---- top-k ---------------------------------------------------------------------------------
//
// Two checks per case:
//  1. Against the kernel's own logits: topk runs the same logits arithmetic
//     as `logits` with the same backend and M (the fused kernel with the same
//     configuration, or cuBLAS), so its values and ids must equal, bit for
//     bit, the exact top-k (value descending, lower id first) of those logits
//     — for every activation row, with no tie ambiguity. Its log-sum-exp is
//     held to the f32 summation bound of a sum of positive terms:
//       |Δlse| <= γ_n(2^-24) + 2^-21   (n = longest chain of additions, taken
//     as V/8 + 64 — each column's terms are spread over >= 8 lanes — plus
//     about 2 ulp of expf per term).
//  2. Against the float64 oracle on dequantized weights, for up to two rows:
//     each value within the logit bound of its id, each id a true top-k id
//     or tied with the k-th within tolerance, the lse within the largest
//     logit bound.

// A top-k case of H = 1024 (cases.h's TopkCase) from its fields.
TopkCase tk(int bits, int group, bool sym, DType act, DType scale, int64_t V, int64_t M, int64_t k) {
  TopkCase c;
  c.bits = bits;
  c.group = group;
  c.symmetric = sym;
  c.act = act;
  c.scale = scale;
  c.V = V;
  c.H = 1024;
  c.M = M;
  c.k = k;
  return c;
}

// Exact top-k of one row of logits (the reference's order).
std::vector<int32_t> exact_topk(const float* l, int64_t V, int64_t k) {
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  order.resize(static_cast<size_t>(k));
  return order;
}

// The log-sum-exp of one row of logits, in double, and the relative tolerance of the
// CUDA top-k's lse against it (f32 partial sums over ≈ V / 8 terms, ex2.approx).
double exact_lse(const float* l, int64_t V) {
  double mx = -INFINITY, sum = 0;
  for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(l[v]));
  for (int64_t v = 0; v < V; ++v) sum += std::exp(double(l[v]) - mx);
  return mx + std::log(sum);
}
double lse_tolerance(int64_t V) { return gamma_n(V / 8 + 64, kU32) + std::ldexp(1.0, -21); }

// Top-k of case c on `backend`, its inputs seeded from the case's name.
// edit: changes the random table before it is uploaded.
void check_topk(const TopkCase& c, Backend backend, const std::function<void(PackedTable&)>& edit = {}) {
  const QuantScheme s = make_scheme(c.bits, c.group, c.symmetric, c.scale);
  const uint64_t seed = case_seed(c);
  const int64_t H = c.H, V = c.V, M = c.M, K = c.k;
  SCOPED_TRACE(case_name(c) + " on " + backend_tag(backend));
  PackedTable host = random_packed(V, H, s, seed);
  if (edit) edit(host);
  const Table dev = cuda::to_device(Table::packed(host));
  const Tensor xh = random_tensor(c.act, M, H, seed + 1);
  const Tensor xd = upload(xh);
  // The logits the top-k is computed from, by the same path.
  Tensor ld = poisoned_device(DType::kF32, {M, V});
  logits(dev, xd.view(), ld.view(), backend);
  Tensor vals = poisoned_device(DType::kF32, {M, K}), ids = poisoned_device(DType::kI32, {M, K}),
         lse = poisoned_device(DType::kF32, {M});
  topk(dev, xd.view(), K, vals.view(), ids.view(), lse.view(), backend);
  cuda::synchronize();
  const Tensor lh = download(ld), vh = download(vals), ih = download(ids), sh = download(lse);
  ASSERT_EQ(count_nan(vh.view()) + count_nan(sh.view()), 0) << "unwritten (NaN-poisoned) outputs remain";
  const double lse_tol = lse_tolerance(V);
  int bad = 0;
  for (int64_t m = 0; m < M && bad < 5; ++m) {
    const float* l = lh.ptr<float>() + m * V;
    const std::vector<int32_t> want = exact_topk(l, V, K);
    for (int64_t j = 0; j < K; ++j) {
      const int32_t id = ih.ptr<int32_t>()[m * K + j];
      const float v = vh.ptr<float>()[m * K + j];
      if (id != want[size_t(j)] || !(v == l[want[size_t(j)]])) {
        ADD_FAILURE() << "m=" << m << " j=" << j << " got id " << id << " value " << v << ", want id "
                      << want[size_t(j)] << " value " << l[want[size_t(j)]];
        ++bad;
        break;
      }
    }
    const double want_lse = exact_lse(l, V);
    if (!(std::fabs(sh.ptr<float>()[m] - want_lse) <= lse_tol * std::max(1.0, std::fabs(want_lse)))) {
      ADD_FAILURE() << "m=" << m << " lse " << sh.ptr<float>()[m] << " want " << want_lse;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0);
  // The oracle on up to two rows.
  const std::vector<float> xf = to_f32(xh.view());
  const LogitBound bound = cuda_bound(s, H, c.act, may_take_cublas(backend, c.bits, M));
  // One pass of the (slow, bit-by-bit) dequantizer for both rows.
  const std::vector<int64_t> ms = M == 1 ? std::vector<int64_t>{0} : std::vector<int64_t>{0, M - 1};
  std::vector<float> xsel;
  for (int64_t m : ms) xsel.insert(xsel.end(), xf.begin() + m * H, xf.begin() + (m + 1) * H);
  const Oracle o = make_oracle(Table::packed(host), xsel.data(), int64_t(ms.size()), all_rows(V), bound);
  for (size_t mi = 0; mi < ms.size(); ++mi) {
    const int64_t m = ms[mi];
    const double* ov = o.value.data() + o.at(int64_t(mi), 0);
    const double* ot = o.tol.data() + o.at(int64_t(mi), 0);
    std::vector<int64_t> order(static_cast<size_t>(V));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + K, order.end(),
                      [&](int64_t a, int64_t b) { return ov[a] > ov[b] || (ov[a] == ov[b] && a < b); });
    const double kth = ov[order[size_t(K - 1)]];
    double mx = -INFINITY, sum = 0, max_tol = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, ov[v]), max_tol = std::max(max_tol, ot[v]);
    for (int64_t v = 0; v < V; ++v) sum += std::exp(ov[v] - mx);
    EXPECT_NEAR(sh.ptr<float>()[m], mx + std::log(sum), max_tol + lse_tol * std::max(1.0, std::fabs(mx + std::log(sum))));
    for (int64_t j = 0; j < K; ++j) {
      const int id = ih.ptr<int32_t>()[m * K + j];
      ASSERT_TRUE(id >= 0 && id < V) << "m " << m << " j " << j << " id " << id;
      EXPECT_NEAR(vh.ptr<float>()[m * K + j], ov[id], ot[id]) << "value of id " << id;
      EXPECT_GE(ov[id], kth - 2 * ot[id]) << "id " << id << " is not in the top " << K;
    }
  }
}

// ---- the top-k sweep: backend × case (tests/cases.h, topk_cases) -------------------------------
//
// bits × group × sym × dtype, crossed with V ∈ {1, 3, 50257, 151936} × M ∈
// {1, 3, 16, 17, 64, 256} × k ∈ {1, 50, 200 (more than a CTA's tile step of
// 128 rows), 1000 (beyond the fused epilogue's k), V (tiny V)}, with kAuto
// (logits, then the selection) and, where it applies (M <= 8, k <= 256, rows
// the staged GEMV takes with 128-byte stages), kFused (the fused epilogue).

struct TopkParam {
  Backend backend;
  TopkCase c;
};

std::vector<TopkParam> topk_params() {
  std::vector<TopkParam> out;
  for (const TopkCase& c : topk_cases()) {
    if (c.on_auto) out.push_back({Backend::kAuto, c});
    if (c.on_fused) out.push_back({Backend::kFused, c});
  }
  return out;
}

std::string topk_param_name(const testing::TestParamInfo<TopkParam>& info) {
  return std::string(backend_tag(info.param.backend)) + "_" + case_name(info.param.c);
}

void PrintTo(const TopkParam& p, std::ostream* os) { *os << backend_tag(p.backend) << " " << case_name(p.c); }

class CudaTopk : public testing::TestWithParam<TopkParam> {};

TEST_P(CudaTopk, Sweep) {
  SKIP_WITHOUT_GPU();
  check_topk(GetParam().c, GetParam().backend);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaTopk, testing::ValuesIn(topk_params()), topk_param_name);

// The other paths: logits by dequant + cuBLAS for small M, the fused logits
// kernel (not its epilogue) at M > 64; every scheme once at M = 5 (the fused
// epilogue) and at M = 16 (logits, then the selection). Every third case has
// F32 scales, the others the activation's.
TEST(Cuda, TopkOtherPaths) {
  SKIP_WITHOUT_GPU();
  check_topk(tk(4, 64, true, DType::kF16, DType::kF16, 50257, 5, 50), Backend::kFallbackBlas);
  check_topk(tk(8, 128, false, DType::kBF16, DType::kBF16, 50257, 17, 200), Backend::kFallbackBlas);
  check_topk(tk(4, 128, false, DType::kBF16, DType::kF32, 50257, 100, 50), Backend::kFused);
  check_topk(tk(8, -1, true, DType::kF16, DType::kF16, 3001, 256, 7), Backend::kFused);
  int n = 0;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128, -1})
      for (bool sym : {true, false})
        for (DType act : {DType::kF16, DType::kBF16})
          for (int64_t M : {5, 16}) {
            const DType scale = n++ % 3 == 1 ? DType::kF32 : act;
            check_topk(tk(bits, group, sym, act, scale, 20011, M, 50), M <= 8 ? Backend::kFused : Backend::kAuto);
          }
}

// The list top-k of the warp-specialized wgmma GEMM (kFused above 64 rows on
// sm_90; elsewhere logits, then selection): every group layout, zero points
// or not, both activation dtypes, k from 1 to the epilogue's 256; M = 65 (one
// column tile, 63 masked columns) and 130 (two tiles, half the SMs each); V
// with a partial last tile (20011), exactly the sample plus a partial tile
// (8192 + 5: every whole tile sampled), and without a whole tile to sample
// (V = 100: no threshold, every logit a candidate). Scales are F32 for every
// third case, else the activation's. Then rows whose logits lie far above
// the rest (their scales × 2^12): the lse must not overflow where the max is
// not in the sample, and the top-k holds them.
TEST(Cuda, TopkListEpilogue) {
  SKIP_WITHOUT_GPU();
  const std::array<int64_t, 3> ks = {1, 50, 256};
  int i = 0;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128, -1})
      for (bool sym : {true, false}) {
        const DType act = i % 2 ? DType::kBF16 : DType::kF16;
        const DType scale = i % 3 == 1 ? DType::kF32 : act;
        const int64_t M = i % 3 == 0 ? 130 : 65;
        check_topk(tk(bits, group, sym, act, scale, 20011, M, ks[size_t(i++) % 3]), Backend::kFused);
      }
  check_topk(tk(4, 64, true, DType::kF16, DType::kF32, 8192 + 5, 130, 50), Backend::kFused);
  check_topk(tk(8, 128, false, DType::kBF16, DType::kBF16, 100, 65, 50), Backend::kFused);
  check_topk(tk(4, 128, true, DType::kF16, DType::kF16, 3, 70, 3), Backend::kFused);
  // The sample takes every 6th of the 392 tiles: row 200 lies outside it, row 7 inside.
  for (int64_t r : {int64_t(200), int64_t(7)}) {
    SCOPED_TRACE("row " + std::to_string(r) + " scaled by 4096");
    check_topk(tk(4, 128, false, DType::kF16, DType::kF32, 50257, 96, 50), Backend::kFused, [r](PackedTable& t) {
      ASSERT_EQ(t.scheme.scale_dtype, DType::kF32);
      float* sc = t.scale.ptr<float>() + r * t.scheme.groups(t.hidden);
      for (int64_t g = 0; g < t.scheme.groups(t.hidden); ++g) sc[g] *= 4096.0f;
    });
  }
}

// The list top-k's sample reads its tiles in place, stride tiles apart, so
// its rows run past the sample's own size (8192): their scales must be read
// as the table's. With V = 20011 the sample takes every 2nd tile and row
// 8192 is one of its rows. Its scales are made 4096× larger, so that its
// logit leads or trails every other by far: a sample that misread two of its
// 16-bit scales (groups 0 and 1 of a 64-byte-group layout, one group per
// stage) got a logit of one sign where the true one has the other, and with
// k = 1 that value is the threshold — the true top-1 below it was dropped.
TEST(Cuda, TopkListSampleRowsPastTheSample) {
  SKIP_WITHOUT_GPU();
  auto scale_row = [](PackedTable& t) {
    const int64_t G = t.scheme.groups(t.hidden), r = 8192;
    for (int64_t g = 0; g < G; ++g)
      store_from_f32(t.scale.data(), t.scheme.scale_dtype, r * G + g,
                     4096.0f * load_as_f32(t.scale.data(), t.scheme.scale_dtype, r * G + g));
  };
  // 16-bit scales.
  check_topk(tk(4, 128, true, DType::kBF16, DType::kBF16, 20011, 65, 1), Backend::kFused, scale_row);
  check_topk(tk(8, 64, false, DType::kBF16, DType::kBF16, 20011, 65, 1), Backend::kFused, scale_row);
  check_topk(tk(4, 128, false, DType::kBF16, DType::kBF16, 20011, 130, 50), Backend::kFused, scale_row);
}

// Small shapes for the compute-sanitizer runs (memcheck, racecheck): each
// path of topk once — the fused epilogue (M = 1, 8, 3; k up to its limit of
// 256, beyond a CTA's 128-row tile step), logits then selection (M = 64,
// 70), tiny V with k = V, the cuBLAS logits, on sm_90 the list top-k
// (M = 65 and 70: its sample's tiles adjacent, and two apart with zero
// points and k = 256), and tile select (kAuto at M = 1, 9, 10 with V = 1,
// 16, and 17 and 24 on the staged GEMV's four column tiles: 8 warps for
// 4-bit, 16 for 8-bit).
TEST(Cuda, TopkSmallShapes) {
  SKIP_WITHOUT_GPU();
  check_topk(tk(4, 64, true, DType::kF16, DType::kF32, 4099, 1, 50), Backend::kFused);
  check_topk(tk(4, 128, false, DType::kBF16, DType::kBF16, 4099, 8, 200), Backend::kFused);
  check_topk(tk(4, -1, true, DType::kF16, DType::kF16, 4099, 3, 256), Backend::kFused);
  check_topk(tk(4, 64, true, DType::kF16, DType::kF32, 4099, 1, 50), Backend::kAuto);
  check_topk(tk(4, 128, false, DType::kBF16, DType::kBF16, 4099, 17, 200), Backend::kAuto);
  check_topk(tk(8, 128, true, DType::kF16, DType::kF16, 4099, 64, 50), Backend::kAuto);
  check_topk(tk(4, 32, false, DType::kF16, DType::kF32, 3, 3, 3), Backend::kAuto);
  check_topk(tk(8, -1, true, DType::kBF16, DType::kBF16, 4099, 70, 50), Backend::kAuto);
  check_topk(tk(4, 64, true, DType::kF16, DType::kF16, 4099, 2, 1000), Backend::kFallbackBlas);
  check_topk(tk(4, 64, true, DType::kF16, DType::kF32, 8192 + 5, 65, 50), Backend::kFused);
  check_topk(tk(8, 128, false, DType::kBF16, DType::kBF16, 16384 + 129, 70, 256), Backend::kFused);
  // Tile select (kAuto wherever the staged GEMV runs: the kAuto M = 1 case above too): a partial last tile,
  // zero points, k = 256 and 1; V = 1.
  check_topk(tk(4, 64, false, DType::kF16, DType::kF16, 4099, 16, 256), Backend::kAuto);
  check_topk(tk(8, 64, true, DType::kBF16, DType::kF32, 4099, 9, 1), Backend::kAuto);
  check_topk(tk(4, 128, true, DType::kF16, DType::kF16, 1, 10, 1), Backend::kAuto);
  check_topk(tk(8, 64, false, DType::kBF16, DType::kF32, 4099, 24, 50), Backend::kAuto);
}

// Each top-k path, forced through the overrides, returns the same values and ids as
// logits then select, and its plan names the path that ran (lists on sm_90 only).
TEST(Cuda, TopkPathsAgreeAndNameThemselves) {
  SKIP_WITHOUT_GPU();
  using cuda_plan::TopkPath;
  struct Row {
    int64_t M;
    TopkPath path;
  };
  const bool wgmma = cuda_ops::device_info().has_wgmma();
  for (const Row& r : {Row{1, TopkPath::kPoolEpilogue}, Row{8, TopkPath::kPoolEpilogue}, Row{65, TopkPath::kLists},
                       Row{130, TopkPath::kLists}, Row{1, TopkPath::kTileSelect}, Row{3, TopkPath::kTileSelect},
                       Row{16, TopkPath::kTileSelect}}) {
    if (r.path == TopkPath::kLists && !wgmma) continue;
    SCOPED_TRACE("M=" + std::to_string(r.M) + " " + cuda_plan::topk_path_name(r.path));
    QuantScheme s;
    s.bits = 4;
    s.group_size = 64;
    s.scale_dtype = DType::kF16;
    const int64_t V = 50257, H = 1024, k = 50;
    const Table dev = cuda::to_device(Table::packed(random_packed(V, H, s, 5100 + uint64_t(r.M))));
    const Tensor x = upload(random_tensor(DType::kF16, r.M, H, 5200 + uint64_t(r.M)));
    auto run = [&](TopkPath path, Tensor& v, Tensor& i, Tensor& l) {
      v = poisoned_device(DType::kF32, {r.M, k});
      i = poisoned_device(DType::kI32, {r.M, k});
      l = poisoned_device(DType::kF32, {r.M});
      cuda_plan::LogitsOverrides ov;
      ov.topk_path = path;
      const cuda_plan::TopkPlan plan = cuda_ops::run_topk(dev, x.view(), k, v.view(), i.view(), l.view(), Backend::kFused, ov);
      cuda::synchronize();
      EXPECT_EQ(plan.path, path) << plan.describe();
    };
    Tensor v0, i0, l0, v1, i1, l1;
    run(TopkPath::kLogitsThenSelect, v0, i0, l0);
    run(r.path, v1, i1, l1);
    const Tensor hv0 = download(v0), hi0 = download(i0), hl0 = download(l0);
    const Tensor hv1 = download(v1), hi1 = download(i1), hl1 = download(l1);
    // The same fused arithmetic per logit (f32 partial sums, one scale per group) in both; the
    // ids agree where the values do not tie, the lse within a few ulp of f32 (sums in a different order).
    int diff = 0;
    for (int64_t j = 0; j < r.M * k; ++j) {
      const float a = hv0.ptr<float>()[j], b = hv1.ptr<float>()[j];
      if (std::fabs(a - b) > 1e-5f * std::max(1.0f, std::fabs(a)) && diff++ < 5)
        ADD_FAILURE() << "value " << j << ": " << a << " vs " << b;
      if (a == b && hi0.ptr<int32_t>()[j] != hi1.ptr<int32_t>()[j] && diff++ < 5)
        ADD_FAILURE() << "id " << j << ": " << hi0.ptr<int32_t>()[j] << " vs " << hi1.ptr<int32_t>()[j];
    }
    for (int64_t m = 0; m < r.M; ++m) {
      const float a = hl0.ptr<float>()[m], b = hl1.ptr<float>()[m];
      EXPECT_NEAR(a, b, 1e-5 * std::max(1.0f, std::fabs(a))) << "lse row " << m;
    }
    EXPECT_EQ(diff, 0);
  }
}

// Every row identical: all logits of a row tie, so every candidate list and
// threshold is all ties (the selection's exact fallback); the answer is ids
// 0 .. k-1 with equal values.
TEST(Cuda, TopkAllTied) {
  SKIP_WITHOUT_GPU();
  QuantScheme s;
  s.bits = 4;
  s.group_size = 64;
  s.scale_dtype = DType::kF16;
  const int64_t V = 50257, H = 256;
  PackedTable host = random_packed(V, H, s, 5100);
  const int64_t W = s.packed_cols(H), G = s.groups(H);
  for (int64_t v = 1; v < V; ++v) {
    std::memcpy(host.packed.ptr<int32_t>() + v * W, host.packed.ptr<int32_t>(), size_t(W) * 4);
    std::memcpy(static_cast<char*>(host.scale.data()) + v * G * 2, host.scale.data(), size_t(G) * 2);
  }
  const Table dev = cuda::to_device(Table::packed(host));
  for (Backend b : {Backend::kAuto, Backend::kFused, Backend::kFallbackBlas})
    for (int64_t M : {1, 17, 100})
      for (int64_t K : {1, 50, 1000}) {
        SCOPED_TRACE("M=" + std::to_string(M) + " k=" + std::to_string(K) +
                     (b == Backend::kAuto ? "" : b == Backend::kFused ? " (fused)" : " (fallback)"));
        const Tensor xh = random_tensor(DType::kF16, M, H, 5101 + uint64_t(M));
        Tensor vals = poisoned_device(DType::kF32, {M, K}), ids = poisoned_device(DType::kI32, {M, K}),
               lse = poisoned_device(DType::kF32, {M});
        topk(dev, upload(xh).view(), K, vals.view(), ids.view(), lse.view(), b);
        const Tensor vh = download(vals), ih = download(ids), sh = download(lse);
        for (int64_t m = 0; m < M; ++m) {
          for (int64_t j = 0; j < K; ++j) {
            ASSERT_EQ(ih.ptr<int32_t>()[m * K + j], j) << "m " << m;
            ASSERT_EQ(vh.ptr<float>()[m * K + j], vh.ptr<float>()[m * K]) << "m " << m;
          }
          const double l0 = vh.ptr<float>()[m * K];
          EXPECT_NEAR(sh.ptr<float>()[m], l0 + std::log(double(V)), 1e-3 * std::max(1.0, std::fabs(l0)) + 1e-3);
        }
      }
}

// Tile select with the top of a row tied across many tiles: n copies of row 0,
// one every 16th row (each in its own tile), with row 0's scales × 4096 and
// n more with × −4096, so that one set of copies leads every row of x. The
// bound is then the copies' logit and every copy's tile a candidate: with
// 300 copies the candidates outgrow the rank counting (selected above the
// bound among the gathered ones), with 600 the candidate tiles outgrow the
// block (the whole row above the bound). The top-k must be the logits' exact
// top-k (the copies, lowest id first) and the lse the logits'.
TEST(Cuda, TileSelectTiedAcrossTiles) {
  SKIP_WITHOUT_GPU();
  const QuantScheme s = make_scheme(4, 64, true, DType::kF32);
  const int64_t V = 50257, H = 1024, W = s.packed_cols(H), G = s.groups(H);  // rows the staged GEMV takes
  for (int64_t n : {300, 600}) {
    PackedTable host = random_packed(V, H, s, 5300);
    for (int64_t i = 0; i < 2 * n; ++i) {
      const int64_t v = 16 * (i + 1);
      std::memcpy(host.packed.ptr<int32_t>() + v * W, host.packed.ptr<int32_t>(), size_t(W) * 4);
      for (int64_t g = 0; g < G; ++g)
        host.scale.ptr<float>()[v * G + g] = host.scale.ptr<float>()[g] * (i < n ? 4096.0f : -4096.0f);
    }
    const Table dev = cuda::to_device(Table::packed(host));
    for (int64_t M : {1, 3})
      for (int64_t k : {50, 200}) {
        SCOPED_TRACE("copies=" + std::to_string(n) + " M=" + std::to_string(M) + " k=" + std::to_string(k));
        const Tensor x = upload(random_tensor(DType::kF16, M, H, 5301 + uint64_t(M)));
        Tensor l = poisoned_device(DType::kF32, {M, V});
        logits(dev, x.view(), l.view(), Backend::kFused);
        Tensor v = poisoned_device(DType::kF32, {M, k}), id = poisoned_device(DType::kI32, {M, k}),
               lse = poisoned_device(DType::kF32, {M});
        cuda_plan::LogitsOverrides ov;
        ov.topk_path = cuda_plan::TopkPath::kTileSelect;
        const cuda_plan::TopkPlan plan =
            cuda_ops::run_topk(dev, x.view(), k, v.view(), id.view(), lse.view(), Backend::kFused, ov);
        ASSERT_EQ(plan.path, cuda_plan::TopkPath::kTileSelect) << plan.describe();
        const Tensor lh = download(l), vh = download(v), ih = download(id), sh = download(lse);
        for (int64_t m = 0; m < M; ++m) {
          const float* row = lh.ptr<float>() + m * V;
          const std::vector<int32_t> want = exact_topk(row, V, k);
          // The copies lead: the first k ids are copies (a multiple of 16), ascending.
          for (int64_t j = 0; j < k; ++j) ASSERT_EQ(want[size_t(j)] % 16, 0) << "m " << m << " j " << j;
          for (int64_t j = 0; j < k; ++j) {
            ASSERT_EQ(ih.ptr<int32_t>()[m * k + j], want[size_t(j)]) << "m " << m << " j " << j;
            ASSERT_EQ(vh.ptr<float>()[m * k + j], row[want[size_t(j)]]) << "m " << m << " j " << j;
          }
          const double want_lse = exact_lse(row, V);
          EXPECT_NEAR(sh.ptr<float>()[m], want_lse, lse_tolerance(V) * std::max(1.0, std::fabs(want_lse))) << "m " << m;
        }
      }
  }
}

TEST(Cuda, TopkTiesLowerIdFirst) {
  SKIP_WITHOUT_GPU();
  // Identical rows give bit-identical logits: the lower id must come first.
  QuantScheme s;
  s.bits = 4;
  s.group_size = 64;
  s.scale_dtype = DType::kF16;
  PackedTable host = random_packed(64, 128, s, 5000);
  const int64_t W = s.packed_cols(128);
  for (int64_t v = 1; v < 64; v += 2) {  // odd rows copy the even row before them
    std::memcpy(host.packed.ptr<int32_t>() + v * W, host.packed.ptr<int32_t>() + (v - 1) * W, size_t(W) * 4);
    std::memcpy(static_cast<char*>(host.scale.data()) + v * 2 * 2, static_cast<char*>(host.scale.data()) + (v - 1) * 2 * 2, 4);
  }
  const Table dev = cuda::to_device(Table::packed(host));
  const Tensor xh = random_tensor(DType::kF16, 2, 128, 5001);
  TopK r = topk(dev, upload(xh).view(), 10);
  const Tensor ih = download(r.ids), vh = download(r.values);
  for (int m = 0; m < 2; ++m)
    for (int j = 0; j + 1 < 10; ++j)
      if (vh.ptr<float>()[m * 10 + j] == vh.ptr<float>()[m * 10 + j + 1]) {
        EXPECT_LT(ih.ptr<int32_t>()[m * 10 + j], ih.ptr<int32_t>()[m * 10 + j + 1]);
      }
}

TEST(Cuda, RescoreFromDenseRows) {
  SKIP_WITHOUT_GPU();
  const int64_t V = 5000, H = 1024, M = 3, K = 20;
  const Tensor wh = random_tensor(DType::kBF16, V, H, 6000, -0.05, 0.05);
  const Table dense_dev = cuda::to_device(Table::dense(Tensor::copy_of(wh.view())));
  const Tensor xh = random_tensor(DType::kBF16, M, H, 6001);
  Tensor cand = Tensor::empty(DType::kI32, {M, K});
  for (int64_t i = 0; i < M * K; ++i) cand.ptr<int32_t>()[i] = int32_t((i * 7919) % V);
  Rescored r = rescore(dense_dev, upload(xh).view(), upload(cand).view());
  const Tensor vh = download(r.values), ih = download(r.ids);
  const std::vector<float> w = to_f32(wh.view()), x = to_f32(xh.view());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < K; ++j) {
      const int id = ih.ptr<int32_t>()[m * K + j];
      const Dot d = dot_f64(x.data() + m * H, w.data() + int64_t(id) * H, H);
      EXPECT_NEAR(vh.ptr<float>()[m * K + j], d.value, logit_tol(d, H));
      if (j) {
        EXPECT_GE(vh.ptr<float>()[m * K + j - 1], vh.ptr<float>()[m * K + j]);
      }
    }
}

TEST(Cuda, TiedTableIsOneAllocation) {
  SKIP_WITHOUT_GPU();
  for (bool sym : {true, false}) {
    QuantScheme s;
    s.bits = 4;
    s.group_size = 64;
    s.symmetric = sym;
    const PackedTable host = random_packed(49152, 576, s, 7000);
    const size_t before_n = cuda::allocation_count(), before_b = cuda::allocated_bytes();
    const TokenTables roles = quantize_roles(cuda::to_device(Table::packed(host)), nullptr, std::nullopt, std::nullopt);
    EXPECT_TRUE(roles.tied());
    EXPECT_EQ(cuda::allocation_count() - before_n, 1u) << "packed + scale (+ zero points) in one allocation";
    auto up = [](size_t b) { return (b + 255) / 256 * 256; };
    const size_t expect = up(host.packed.nbytes()) + up(host.scale.nbytes()) +
                          (sym ? 0 : up(host.zero_point.nbytes()));
    EXPECT_EQ(cuda::allocated_bytes() - before_b, expect);
    EXPECT_EQ(roles.head.nbytes(), host.nbytes());
  }
}

// include/qhead/ops.h, "Threads": CUDA ops may be called from several host
// threads; they take turns (their scratch buffers and the cuBLAS handle are
// process-wide) and each returns exactly what it returns alone. Four threads
// run logits, top-k and embed on two shared tables — M = 5 (the staged GEMV,
// logits then selection) and, on sm_90, M = 200 on a 40000-row vocab (the
// list top-k) — and every result is compared byte for byte with a call made
// alone.
TEST(Cuda, ConcurrentCallsFromSeveralThreads) {
  SKIP_WITHOUT_GPU();
  const Table t4 = cuda::to_device(Table::packed(random_packed(40000, 256, QuantScheme::parse("w4g64a", DType::kBF16), 8100)));
  const Table t8 = cuda::to_device(Table::packed(random_packed(3001, 256, QuantScheme::parse("w8g128", DType::kF16), 8101)));
  const Table* tables[2] = {&t4, &t8};
  const Tensor xs[2] = {upload(random_tensor(DType::kF16, 200, 256, 8102)), upload(random_tensor(DType::kBF16, 5, 256, 8103))};
  const Tensor ids = upload(make_ids({0, 3000, 17, 17, 2999, 1}, DType::kI32));
  struct Result {
    Tensor logits, values, top_ids, lse, rows;  // on the host
  };
  // Case c: table c % 2, activations c / 2.
  auto run = [&](int c) {
    const Table& t = *tables[c % 2];
    const Tensor& x = xs[c / 2];
    const int64_t M = x.size(0);
    Tensor l = poisoned_device(DType::kF32, {M, t.vocab()});
    Tensor v = poisoned_device(DType::kF32, {M, 50}), i = poisoned_device(DType::kI32, {M, 50});
    Tensor lse = poisoned_device(DType::kF32, {M});
    logits(t, x.view(), l.view());
    topk(t, x.view(), 50, v.view(), i.view(), lse.view());
    const Tensor rows = embed(t, ids.view(), DType::kF16);
    return Result{download(l), download(v), download(i), download(lse), download(rows)};
  };
  const int cases[3] = {0, 2, 3};  // t4 × M = 200, t4 × M = 5, t8 × M = 5
  std::array<Result, 4> want;
  for (int c : cases) want[size_t(c)] = run(c);
  constexpr int kThreads = 4, kRounds = 5;
  std::atomic<int> mismatches{0}, calls{0};
  run_concurrently(kThreads, kRounds, [&](int u, int r) {
    const int c = cases[(u + r) % 3];
    const Result got = run(c);
    const Result& w = want[size_t(c)];
    const bool same = same_bytes(got.logits, w.logits) && same_bytes(got.values, w.values) &&
                      same_bytes(got.top_ids, w.top_ids) && same_bytes(got.lse, w.lse) && same_bytes(got.rows, w.rows);
    if (!same) ++mismatches;
    calls += 3;
  });
  EXPECT_EQ(calls.load(), 3 * kThreads * kRounds);
  EXPECT_EQ(mismatches.load(), 0);
}

#if defined(QHEAD_HAS_CUDA)
// The kernels after the logits launched as programmatic dependents (the
// default on sm_90, cuda/plan.h) give the bytes of plain launches: eagerly,
// and captured into a CUDA graph (which keeps the programmatic edges) and
// replayed from poisoned outputs. Logits, top-k (logits then selection at
// M = 1, 3; tile select at 12, 16), sample over the whole vocabulary and with
// top_k.
struct Shape2 {
  DType t;
  Shape s;
};
bool all_finite(const TensorView& v) {
  const float* p = static_cast<const float*>(v.data);
  return std::all_of(p, p + v.numel(), [](float f) { return std::isfinite(f); });
}

TEST(Cuda, DependentLaunchAndGraphReplayKeepTheBytes) {
  SKIP_WITHOUT_GPU();
  auto ok = [](cudaError_t e) {
    if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA: ") + cudaGetErrorString(e));
  };
  constexpr int64_t K = 50;
  SampleParams whole;  // T = 1 over the whole vocabulary: the Gumbel slices
  whole.seed = 11;
  SampleParams cut;  // T = 0.8, top_k = 50: the scaled logits, the selection levels, the draw
  cut.temperature = 0.8f;
  cut.top_k = K;
  cut.seed = 12;
  cut.offset = 3;
  cuda_plan::LogitsOverrides plain, dependent;
  plain.dependent_launch = false;
  dependent.dependent_launch = true;
  struct TableCase {
    int64_t V, H;
    const char* scheme;
  };
  // H = 2560 at M = 12 and 16 builds the staged activations once per call (the prebuilt copy).
  for (const TableCase& sh : {TableCase{50257, 256, "w4g64"}, TableCase{49216, 2560, "w8g128"}}) {
    const Table t =
        cuda::to_device(Table::packed(random_packed(sh.V, sh.H, QuantScheme::parse(sh.scheme, DType::kF16), 8200)));
    for (int64_t M : {1, 3, 12, 16}) {
      SCOPED_TRACE(std::string(sh.scheme) + " V = " + std::to_string(sh.V) + " M = " + std::to_string(M));
      const Tensor x = upload(random_tensor(DType::kF16, M, sh.H, 8201 + M));
      const std::array<Shape2, 6> shapes = {Shape2{DType::kF32, {M, sh.V}}, Shape2{DType::kF32, {M, K}},
                                            Shape2{DType::kI32, {M, K}},    Shape2{DType::kF32, {M}},
                                            Shape2{DType::kI32, {M}},       Shape2{DType::kI32, {M}}};
      std::array<Tensor, 6> out, poison;
      for (size_t j = 0; j < out.size(); ++j) {
        out[j] = poisoned_device(shapes[j].t, shapes[j].s);
        poison[j] = poisoned_device(shapes[j].t, shapes[j].s);
      }
      auto calls = [&](const cuda_plan::LogitsOverrides& ov) {
        cuda_ops::run_logits(t, x.view(), out[0].view(), Backend::kAuto, ov);
        cuda_ops::run_topk(t, x.view(), K, out[1].view(), out[2].view(), out[3].view(), Backend::kAuto, ov);
        cuda_ops::run_sample(t, x.view(), whole, out[4].view(), Backend::kAuto, ov);
        cuda_ops::run_sample(t, x.view(), cut, out[5].view(), Backend::kAuto, ov);
      };
      auto repoison = [&](void* s) {
        for (size_t j = 0; j < out.size(); ++j)
          ok(cudaMemcpyAsync(out[j].data(), poison[j].data(), out[j].nbytes(), cudaMemcpyDeviceToDevice,
                             static_cast<cudaStream_t>(s)));
      };
      calls(plain);  // plain launches, the reference; also sizes the workspaces
      std::array<Tensor, 6> want;
      for (size_t j = 0; j < out.size(); ++j) want[j] = download(out[j]);
      EXPECT_TRUE(all_finite(want[0].view())) << "logits";
      for (int64_t m = 0; m < M; ++m)
        for (size_t j : {size_t(4), size_t(5)}) ASSERT_LT(uint32_t(want[j].ptr<int32_t>()[m]), uint32_t(sh.V));
      for (const cuda_plan::LogitsOverrides& ov : {plain, dependent, cuda_plan::LogitsOverrides{}}) {
        const std::string which = !ov.dependent_launch ? "default" : *ov.dependent_launch ? "dependent" : "plain";
        repoison(cuda::stream());
        calls(ov);
        for (size_t j = 0; j < out.size(); ++j)
          EXPECT_TRUE(same_bytes(download(out[j]), want[j])) << which << ", eager, output " << j;
        cudaStream_t s = nullptr;
        ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        void* const before = cuda::stream();
        cuda::set_stream(s);
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        ok(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        calls(ov);
        ok(cudaStreamEndCapture(s, &graph));
        ok(cudaGraphInstantiate(&exec, graph, 0));
        for (int rep = 0; rep < 2; ++rep) {
          repoison(s);
          ok(cudaGraphLaunch(exec, s));
          ok(cudaStreamSynchronize(s));
          for (size_t j = 0; j < out.size(); ++j)
            EXPECT_TRUE(same_bytes(download(out[j]), want[j])) << which << ", replay " << rep << ", output " << j;
        }
        cuda::set_stream(before);
        ok(cudaGraphExecDestroy(exec));
        ok(cudaGraphDestroy(graph));
        ok(cudaStreamDestroy(s));
      }
    }
  }
}
#endif

TEST(Cuda, ArgumentErrors) {
  SKIP_WITHOUT_GPU();
  QuantScheme s;
  s.bits = 4;
  s.group_size = 64;
  const Table dev = cuda::to_device(Table::packed(random_packed(100, 128, s, 8000)));
  const Tensor x32 = upload(random_tensor(DType::kF32, 2, 128, 8001));
  Tensor out = cuda::empty(DType::kF32, {2, 100});
  expect_error([&] { logits(dev, x32.view(), out.view()); }, ErrorCode::kInvalidArgument);  // f32 x on GPU
  const Tensor xhost = random_tensor(DType::kF16, 2, 128, 8002);
  expect_error([&] { logits(dev, xhost.view(), out.view()); }, ErrorCode::kInvalidArgument);  // x on the host
}

}  // namespace
}  // namespace qhead
