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
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>

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

struct Oracle {
  std::vector<double> value;  // [M, rows.size()]
  std::vector<double> tol;
};

// Float64 logits of rows `rows` for all M activations, with the bound.
Oracle oracle(const PackedTable& p, const std::vector<float>& x, int64_t M, const std::vector<int64_t>& rows,
              double u_extra) {
  const int64_t H = p.hidden;
  const int64_t groups = p.scheme.groups(H);
  Oracle o;
  o.value.resize(size_t(M) * rows.size());
  o.tol.resize(size_t(M) * rows.size());
  std::vector<double> wd(static_cast<size_t>(H));
  std::vector<float> w(static_cast<size_t>(H));
  for (size_t r = 0; r < rows.size(); ++r) {
    dequant_row_expected(p, rows[r], wd.data());
    for (int64_t j = 0; j < H; ++j) w[size_t(j)] = float(wd[size_t(j)]);  // exact in f32
    for (int64_t m = 0; m < M; ++m) {
      const Dot d = dot_f64(x.data() + m * H, w.data(), H);
      o.value[size_t(m) * rows.size() + r] = d.value;
      o.tol[size_t(m) * rows.size() + r] =
          (gamma_n(H + groups + 1, 2.0 * kU32) + u_extra + gamma_n(H + 4, kU64)) * d.abs_sum + 1e-30;
    }
  }
  return o;
}

// Rows checked against the oracle: all of them for small V, else the first
// and last 40 and 400 seeded random ones (every element is still checked for
// having been written).
std::vector<int64_t> rows_to_check(int64_t V, uint64_t seed) {
  std::vector<int64_t> r;
  if (V <= 4096) {
    r.resize(size_t(V));
    std::iota(r.begin(), r.end(), 0);
    return r;
  }
  for (int64_t i = 0; i < 40; ++i) { r.push_back(i); r.push_back(V - 1 - i); }
  Rng rng(seed);
  std::uniform_int_distribution<int64_t> d(0, V - 1);
  for (int i = 0; i < 400; ++i) r.push_back(d(rng));
  return r;
}

struct LogitsCase {
  int bits, group;
  bool sym;
  DType act, scale;
  int64_t V, H, M;
};

QuantScheme scheme_of(const LogitsCase& c) {
  QuantScheme s;
  s.bits = c.bits;
  s.group_size = c.group;
  s.symmetric = c.sym;
  s.scale_dtype = c.scale;
  return s;
}

std::string describe(const LogitsCase& c) {
  return scheme_of(c).name() + " act=" + dtype_name(c.act) + " scale=" + dtype_name(c.scale) +
         " V=" + std::to_string(c.V) + " H=" + std::to_string(c.H) + " M=" + std::to_string(c.M);
}

// With `force`, the logits kernel it names runs (through the kernel-plan door,
// cuda_ops::run_logits), and the plan that ran must name it.
void check_logits(const LogitsCase& c, uint64_t seed, Backend backend = Backend::kAuto,
                  std::optional<cuda_plan::LogitsKernel> force = std::nullopt) {
  SCOPED_TRACE(describe(c) + (backend == Backend::kFallbackBlas ? " (fallback)" : "") +
               (force ? std::string(" forced ") + cuda_plan::logits_kernel_name(*force) : std::string()));
  const QuantScheme s = scheme_of(c);
  const PackedTable host = random_packed(c.V, c.H, s, seed);
  const Table dev = cuda::to_device(Table::packed(host));
  const Tensor xh = random_tensor(c.act, c.M, c.H, seed + 1);
  const Tensor xd = upload(xh);
  Tensor out = poisoned_device(DType::kF32, {c.M, c.V});
  if (force) {
    cuda_plan::LogitsOverrides ov;
    ov.kernel = force;
    const cuda_plan::LogitsPlan plan = cuda_ops::run_logits(dev, xd.view(), out.view(), backend, ov);
    ASSERT_EQ(plan.kernel, *force) << plan.describe();
  } else {
    logits(dev, xd.view(), out.view(), backend);
  }
  cuda::synchronize();
  const Tensor oh = download(out);
  ASSERT_EQ(count_nan(oh.view()), 0) << "unwritten (NaN-poisoned) outputs remain";
  const std::vector<float> xf = to_f32(xh.view());
  const std::vector<int64_t> rows = rows_to_check(c.V, seed + 2);
  const double u_extra = backend == Backend::kFallbackBlas ? unit_roundoff(c.act) : 0.0;
  const Oracle o = oracle(host, xf, c.M, rows, u_extra);
  int bad = 0;
  for (int64_t m = 0; m < c.M; ++m)
    for (size_t r = 0; r < rows.size(); ++r) {
      const double got = oh.ptr<float>()[m * c.V + rows[r]];
      const double want = o.value[size_t(m) * rows.size() + r], tol = o.tol[size_t(m) * rows.size() + r];
      if (!(std::fabs(got - want) <= tol) && bad++ < 5)
        ADD_FAILURE() << "m=" << m << " row=" << rows[r] << " got " << got << " want " << want << " tol " << tol;
    }
  EXPECT_EQ(bad, 0);
}

TEST(Cuda, LogitsEverySchemeAndDtype) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128, -1})
      for (bool sym : {true, false})
        for (DType act : {DType::kF16, DType::kBF16})
          for (int64_t M : {1, 3, 16, 17, 64, 256}) {
            const DType scale = (seed % 3 == 0) ? DType::kF32 : act;
            check_logits({bits, group, sym, act, scale, 50257, 1024, M}, seed++, Backend::kFused);
          }
}

TEST(Cuda, LogitsAwkwardVocab) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 900;
  for (int64_t V : {1, 3, 151936, 49152 + 64})
    for (int64_t M : {1, 3, 16, 17, 64, 256}) {
      const int bits = (seed % 2) ? 4 : 8;
      const int group = (seed % 4 < 2) ? 64 : 128;
      check_logits({bits, group, seed % 3 != 0, seed % 2 ? DType::kBF16 : DType::kF16, DType::kBF16, V, 1024, M},
                   seed++, Backend::kFused);
    }
}

TEST(Cuda, LogitsOtherHidden) {
  SKIP_WITHOUT_GPU();
  // H = 576 (SmolLM2), 640 (Gemma-3-270M), 2560 (Gemma-3-4B), 4096 (Llama-3-8B).
  uint64_t seed = 1300;
  for (int64_t H : {576, 640, 2560, 4096})
    for (int group : {32, 64, 128, -1}) {
      if (group > 0 && H % group) continue;
      for (int64_t M : {1, 17})
        check_logits({seed % 2 ? 4 : 8, group, seed % 3 != 0, DType::kBF16, DType::kF16, 4099, H, M}, seed++, Backend::kFused);
    }
}

// Every fused kernel family at every M it takes, forced through the
// overrides: the GEMVs up to M = 256, the GEMMs down to M = 1, so each is
// checked on the shapes the others normally take; each run asserts the plan
// named the forced kernel. A family that cannot take a case (the staged GEMV
// above 16 columns, the wgmma GEMMs off sm_90) is skipped there, and each
// family must have run on most cases.
TEST(Cuda, LogitsEveryKernelAtEveryM) {
  SKIP_WITHOUT_GPU();
  using cuda_plan::LogitsKernel;
  uint64_t seed = 1700;
  for (LogitsKernel k : {LogitsKernel::kGemvRegRing, LogitsKernel::kGemvStaged, LogitsKernel::kGemmMmaSync,
                         LogitsKernel::kGemmWgmma, LogitsKernel::kGemmWgmmaWs}) {
    int ran = 0, cases = 0;
    for (int bits : {4, 8})
      for (int group : {32, 128, -1})
        for (int64_t M : {1, 3, 8, 16, 17, 33, 64, 65, 256}) {
          const bool sym = seed % 2 == 0;
          const DType act = seed % 3 == 0 ? DType::kF16 : DType::kBF16;
          const DType scale = seed % 5 == 0 ? DType::kF32 : (seed % 5 < 3 ? DType::kF16 : DType::kBF16);
          const int64_t V = seed % 4 == 0 ? 257 : 3001;
          const LogitsCase c{bits, group, sym, act, scale, V, 1024, M};
          ++cases;
          // Which kernel the forced plan names for this case (without running it).
          const Table probe = cuda::to_device(Table::packed(random_packed(1, c.H, scheme_of(c), 1)));
          const Tensor xp = cuda::empty(act, {M, c.H});
          cuda_plan::LogitsOverrides ov;
          ov.kernel = k;
          const cuda_plan::LogitsPlan plan = cuda_ops::plan_logits(probe, xp.view(), Backend::kFused, ov);
          if (plan.kernel != k) {
            ++seed;
            continue;
          }
          check_logits(c, seed++, Backend::kFused, k);
          ++ran;
        }
    const bool wgmma = cuda_ops::device_info().has_wgmma();
    if (k == LogitsKernel::kGemvStaged) EXPECT_EQ(ran, 2 * 3 * 4) << "the staged GEMV at M <= 16";
    else if (k == LogitsKernel::kGemmWgmma || k == LogitsKernel::kGemmWgmmaWs) EXPECT_EQ(ran, wgmma ? cases : 0);
    else EXPECT_EQ(ran, cases) << cuda_plan::logits_kernel_name(k);
  }
  // The staged GEMV's configurations (M <= 16): 128-byte stages (H = 2560) and
  // 64-byte ones (4-bit H = 640), one or two activation tiles, partial tiles.
  for (int64_t H : {640, 2560})
    for (int bits : {4, 8})
      for (int group : {32, 64, 128, -1})
        for (int64_t M : {2, 9, 12}) {
          const DType act = seed % 3 == 0 ? DType::kF16 : DType::kBF16;
          const DType scale = seed % 5 == 0 ? DType::kF32 : (seed % 5 < 3 ? DType::kF16 : DType::kBF16);
          check_logits({bits, group, seed % 2 == 0, act, scale, 1001, H, M}, seed++, Backend::kFused);
        }
  // H whose stage count is odd or a group spans several stages (8-bit g128: 2 stages; per row).
  for (int64_t H : {640, 2560, 4096})
    for (int group : {64, 128, -1})
      for (int bits : {4, 8}) {
        if (group > 0 && H % group) continue;
        check_logits({bits, group, seed % 2 == 0, DType::kF16, DType::kBF16, 1000, H, 40}, seed++, Backend::kAuto);
      }
}

// The warp-specialized wgmma GEMM (M > 64 on sm_90, elsewhere the mma.sync
// GEMM): CTAs of a persistent grid taking several units each (V = 20011 at
// M = 256: 157 row tiles × 2 column tiles), the stage ring's phases wrapping
// inside a unit and across units, every group layout (several groups per
// stage, one, a group over several stages), zero points. Small enough for
// compute-sanitizer.
TEST(Cuda, LogitsWgmmaWarpSpecialized) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 2100;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128, -1})
      for (int64_t M : {65, 256}) {
        const DType act = seed % 3 == 0 ? DType::kF16 : DType::kBF16;
        const DType scale = seed % 5 == 0 ? DType::kF32 : (seed % 5 < 3 ? DType::kF16 : DType::kBF16);
        check_logits({bits, group, seed % 2 == 0, act, scale, M == 256 ? 20011 : 3001, 1024, M}, seed++,
                     Backend::kFused);
      }
  // Its 8-bit stages hold 128 bytes of a row: rows of 576 bytes take the CTA-barrier wgmma
  // GEMM's 64-byte stages instead, at the same M.
  const bool wgmma = cuda_ops::device_info().has_wgmma();
  const auto cta_wgmma = wgmma ? std::optional(cuda_plan::LogitsKernel::kGemmWgmma) : std::nullopt;
  check_logits({8, 64, true, DType::kF16, DType::kF16, 3001, 576, 256}, seed++, Backend::kFused, cta_wgmma);
  check_logits({8, -1, false, DType::kBF16, DType::kBF16, 3001, 576, 70}, seed++, Backend::kFused, cta_wgmma);
}

// The staged GEMV with large activations: up to 72 KB (here M = 7) each CTA
// builds their shared layout itself, above (M = 16) staged_x_kernel builds it
// once per call and each CTA copies it (one CTA per SM). 8-bit g32 with f32
// scales exceeds the scale block and takes the register kernel.
TEST(Cuda, LogitsStagedLargeActivations) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1900;
  for (int64_t H : {2560, 4096})
    for (int bits : {4, 8})
      for (int group : {32, 128, -1})
        for (int64_t M : {7, 16}) {
          const DType act = seed % 3 == 0 ? DType::kF16 : DType::kBF16;
          const DType scale = seed % 5 == 0 ? DType::kF32 : (seed % 5 < 3 ? DType::kF16 : DType::kBF16);
          check_logits({bits, group, seed % 2 == 0, act, scale, H == 2560 && M == 7 ? 50257 : 1001, H, M}, seed++,
                       Backend::kFused);
        }
}

TEST(Cuda, LogitsFallbackAndUnsupportedShapes) {
  SKIP_WITHOUT_GPU();
  check_logits({4, 64, true, DType::kF16, DType::kF16, 3001, 1024, 5}, 2001, Backend::kFallbackBlas);
  // The fallback (dequant to the activation dtype + cuBLAS): the weight-rounding bound applies.
  check_logits({4, 128, false, DType::kBF16, DType::kBF16, 3001, 1024, 200}, 2004, Backend::kFallbackBlas);
  check_logits({8, -1, false, DType::kBF16, DType::kBF16, 3001, 512, 33}, 2002, Backend::kFallbackBlas);
  // 3-bit has no fused kernel: the dispatcher falls back, results still right.
  LogitsCase c{3, 32, true, DType::kBF16, DType::kBF16, 777, 256, 4};
  check_logits(c, 2003, Backend::kFallbackBlas);
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

struct TopkCase {
  int bits, group;
  bool sym;
  DType act;
  int64_t V, M, k;
  Backend backend;
};

// Exact top-k of one row of logits (the reference's order).
std::vector<int32_t> exact_topk(const float* l, int64_t V, int64_t k) {
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  order.resize(static_cast<size_t>(k));
  return order;
}

// edit: changes the random table before it is uploaded.
void check_topk(const TopkCase& c, uint64_t seed, const std::function<void(PackedTable&)>& edit = {}) {
  QuantScheme s;
  s.bits = c.bits;
  s.group_size = c.group;
  s.symmetric = c.sym;
  s.scale_dtype = (seed % 3 == 0) ? DType::kF32 : c.act;
  const int64_t H = 1024, V = c.V, M = c.M, K = c.k;
  SCOPED_TRACE(s.name() + " act=" + dtype_name(c.act) + " V=" + std::to_string(V) + " M=" + std::to_string(M) +
               " k=" + std::to_string(K) + (c.backend == Backend::kFallbackBlas ? " (fallback)" : "") +
               (c.backend == Backend::kFused ? " (fused)" : ""));
  PackedTable host = random_packed(V, H, s, seed);
  if (edit) edit(host);
  const Table dev = cuda::to_device(Table::packed(host));
  const Tensor xh = random_tensor(c.act, M, H, seed + 1);
  const Tensor xd = upload(xh);
  // The logits the top-k is computed from, by the same path.
  Tensor ld = poisoned_device(DType::kF32, {M, V});
  logits(dev, xd.view(), ld.view(), c.backend);
  Tensor vals = poisoned_device(DType::kF32, {M, K}), ids = poisoned_device(DType::kI32, {M, K}),
         lse = poisoned_device(DType::kF32, {M});
  topk(dev, xd.view(), K, vals.view(), ids.view(), lse.view(), c.backend);
  cuda::synchronize();
  const Tensor lh = download(ld), vh = download(vals), ih = download(ids), sh = download(lse);
  ASSERT_EQ(count_nan(vh.view()) + count_nan(sh.view()), 0) << "unwritten (NaN-poisoned) outputs remain";
  const double lse_tol = gamma_n(V / 8 + 64, kU32) + std::ldexp(1.0, -21);
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
    double mx = -INFINITY, sum = 0;
    for (int64_t v = 0; v < V; ++v) mx = std::max(mx, double(l[v]));
    for (int64_t v = 0; v < V; ++v) sum += std::exp(double(l[v]) - mx);
    const double want_lse = mx + std::log(sum);
    if (!(std::fabs(sh.ptr<float>()[m] - want_lse) <= lse_tol * std::max(1.0, std::fabs(want_lse)))) {
      ADD_FAILURE() << "m=" << m << " lse " << sh.ptr<float>()[m] << " want " << want_lse;
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0);
  // The oracle on up to two rows.
  const std::vector<float> xf = to_f32(xh.view());
  std::vector<int64_t> all(static_cast<size_t>(V));
  std::iota(all.begin(), all.end(), 0);
  const double u_extra = c.backend == Backend::kFallbackBlas || (c.backend == Backend::kAuto && M > 64)
                             ? unit_roundoff(c.act) : 0.0;
  // One pass of the (slow, bit-by-bit) dequantizer for both rows.
  const std::vector<int64_t> ms = M == 1 ? std::vector<int64_t>{0} : std::vector<int64_t>{0, M - 1};
  std::vector<float> xsel;
  for (int64_t m : ms) xsel.insert(xsel.end(), xf.begin() + m * H, xf.begin() + (m + 1) * H);
  const Oracle o = oracle(host, xsel, int64_t(ms.size()), all, u_extra);
  for (size_t mi = 0; mi < ms.size(); ++mi) {
    const int64_t m = ms[mi];
    const double* ov = o.value.data() + mi * size_t(V);
    const double* ot = o.tol.data() + mi * size_t(V);
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

// bits × group × sym × dtype, crossed with every (V, M, k) of the top-k
// sweep: V ∈ {1, 3, 50257, 151936} × M ∈ {1, 3, 16, 17, 64, 256} ×
// k ∈ {1, 50, 200 (more than a CTA's tile step of 128 rows), 1000 (beyond the
// fused epilogue's k), V (tiny V)}, with kAuto (logits, then the selection)
// and, where it applies (M <= 8, k <= 256, rows the staged kernel takes with
// 128-byte stages), kFused (the fused epilogue).
TEST(Cuda, TopkSweep) {
  SKIP_WITHOUT_GPU();
  std::vector<TopkCase> cases;
  int si = 0;
  for (int64_t V : {1, 3, 50257, 151936})
    for (int64_t M : {1, 3, 16, 17, 64, 256}) {
      std::vector<int64_t> ks = V == 1 ? std::vector<int64_t>{1} : V == 3 ? std::vector<int64_t>{1, 3}
                                                                            : std::vector<int64_t>{1, 50, 200, 1000};
      for (int64_t k : ks) {
        const int sc = si++;  // cycles through the 32 (bits, group, sym, dtype) schemes
        const int bits = (sc & 1) ? 8 : 4;
        const int group = std::array<int, 4>{32, 64, 128, -1}[size_t((sc >> 1) & 3)];
        const bool sym = ((sc >> 3) & 1) == 0;
        const DType act = ((sc >> 4) & 1) ? DType::kBF16 : DType::kF16;
        cases.push_back({bits, group, sym, act, V, M, k, Backend::kAuto});
        // The pool epilogue (kFused) where it applies: M <= 8, k <= 256, 4- and 8-bit.
        if (M <= 8 && k <= 256) cases.push_back({bits, group, sym, act, V, M, k, Backend::kFused});
      }
    }
  uint64_t seed = 4000;
  for (const TopkCase& c : cases) {
    check_topk(c, seed);
    seed += 2;
  }
}

// The other paths: logits by dequant + cuBLAS for small M, the fused logits
// kernel (not its epilogue) at M > 64; every scheme once at M = 5 (the fused
// epilogue) and at M = 16 (logits, then the selection).
TEST(Cuda, TopkOtherPaths) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 4600;
  check_topk({4, 64, true, DType::kF16, 50257, 5, 50, Backend::kFallbackBlas}, seed++);
  check_topk({8, 128, false, DType::kBF16, 50257, 17, 200, Backend::kFallbackBlas}, seed++);
  check_topk({4, 128, false, DType::kBF16, 50257, 100, 50, Backend::kFused}, seed++);
  check_topk({8, -1, true, DType::kF16, 3001, 256, 7, Backend::kFused}, seed++);
  for (int bits : {4, 8})
    for (int group : {32, 64, 128, -1})
      for (bool sym : {true, false})
        for (DType act : {DType::kF16, DType::kBF16})
          for (int64_t M : {5, 16})
            check_topk({bits, group, sym, act, 20011, M, 50, M <= 8 ? Backend::kFused : Backend::kAuto}, seed++);
}

// The list top-k of the warp-specialized GEMM (kFused above 64 rows on sm_90; elsewhere
// logits, then selection): every group layout, zero points or not, both
// activation dtypes, k from 1 to the epilogue's 256; M = 65 (one column tile,
// 63 masked columns) and 130 (two tiles, half the SMs each); V with a
// partial last tile (20011), exactly the sample plus a partial tile
// (8192 + 5: every whole tile sampled), and without a whole tile to sample
// (V = 100: no threshold, every logit a candidate). Then rows whose logits
// lie far above the rest (their scales × 2^12): the lse must not overflow
// where the max is not in the sample, and the top-k holds them.
TEST(Cuda, TopkListEpilogue) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 4700;
  const std::array<int64_t, 3> ks = {1, 50, 256};
  int i = 0;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128, -1})
      for (bool sym : {true, false}) {
        const DType act = i % 2 ? DType::kBF16 : DType::kF16;
        const int64_t M = i % 3 == 0 ? 130 : 65;
        check_topk({bits, group, sym, act, 20011, M, ks[size_t(i++) % 3], Backend::kFused}, seed++);
      }
  check_topk({4, 64, true, DType::kF16, 8192 + 5, 130, 50, Backend::kFused}, seed++);
  check_topk({8, 128, false, DType::kBF16, 100, 65, 50, Backend::kFused}, seed++);
  check_topk({4, 128, true, DType::kF16, 3, 70, 3, Backend::kFused}, seed++);
  // The sample takes every 6th of the 392 tiles: row 200 lies outside it, row 7 inside.
  for (int64_t r : {int64_t(200), int64_t(7)}) {
    seed = (seed + 2) / 3 * 3;  // f32 scales (check_topk: seed % 3 == 0)
    check_topk({4, 128, false, DType::kF16, 50257, 96, 50, Backend::kFused}, seed++, [r](PackedTable& t) {
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
  uint64_t seed = 4901;  // seed % 3 != 0: 16-bit scales (check_topk)
  check_topk({4, 128, true, DType::kBF16, 20011, 65, 1, Backend::kFused}, seed, scale_row);
  seed = 4903;
  check_topk({8, 64, false, DType::kBF16, 20011, 65, 1, Backend::kFused}, seed, scale_row);
  seed = 4904;
  check_topk({4, 128, false, DType::kBF16, 20011, 130, 50, Backend::kFused}, seed, scale_row);
}

// Small shapes for the compute-sanitizer runs (memcheck, racecheck): each
// path of topk once — the fused epilogue (M = 1, 8, 3; k up to its limit of
// 256, beyond a CTA's 128-row tile step), logits then selection (M = 17, 64,
// 70), tiny V with k = V, the cuBLAS logits, and on sm_90 the list top-k
// (M = 65 and 70: its sample's tiles adjacent, and two apart with zero
// points and k = 256).
TEST(Cuda, TopkSmallShapes) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 4800;
  check_topk({4, 64, true, DType::kF16, 4099, 1, 50, Backend::kFused}, seed++);
  check_topk({4, 128, false, DType::kBF16, 4099, 8, 200, Backend::kFused}, seed++);
  check_topk({4, -1, true, DType::kF16, 4099, 3, 256, Backend::kFused}, seed++);
  check_topk({4, 64, true, DType::kF16, 4099, 1, 50, Backend::kAuto}, seed++);
  check_topk({4, 128, false, DType::kBF16, 4099, 17, 200, Backend::kAuto}, seed++);
  check_topk({8, 128, true, DType::kF16, 4099, 64, 50, Backend::kAuto}, seed++);
  check_topk({4, 32, false, DType::kF16, 3, 3, 3, Backend::kAuto}, seed++);
  check_topk({8, -1, true, DType::kBF16, 4099, 70, 50, Backend::kAuto}, seed++);
  check_topk({4, 64, true, DType::kF16, 4099, 2, 1000, Backend::kFallbackBlas}, seed++);
  check_topk({4, 64, true, DType::kF16, 8192 + 5, 65, 50, Backend::kFused}, seed++);
  check_topk({8, 128, false, DType::kBF16, 16384 + 129, 70, 256, Backend::kFused}, seed++);
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
                       Row{130, TopkPath::kLists}}) {
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
      if (vh.ptr<float>()[m * 10 + j] == vh.ptr<float>()[m * 10 + j + 1])
        EXPECT_LT(ih.ptr<int32_t>()[m * 10 + j], ih.ptr<int32_t>()[m * 10 + j + 1]);
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
      if (j) EXPECT_GE(vh.ptr<float>()[m * K + j - 1], vh.ptr<float>()[m * K + j]);
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
