// The CPU fast paths (src/ops/cpu/): every ISA path this CPU can run, forced
// one at a time, against the float64 oracle on the dequantized weights with
// the f32 dot-product bound γ_H Σ|x·w| (test_util.h), outputs NaN-poisoned
// before each call.
//
// Coverage and sampling (CI runs this in Release and under ASan/UBSan on 2
// cores, so the sweep is sized to stay well under a minute in Release):
//   - the full cross product ISA × bits {4, 8} × group {32, 64, 128, per row}
//     × sym/asym × activation dtype {F32, F16, BF16} runs on small shapes
//     (V = 1, 3, 67; H = 64, 576 where the group divides; M = 1, 3, 17), with
//     the scale dtype rotating through F16/BF16/F32 across cases;
//   - V = 50257 (not a multiple of the 64-row blocks nor of any row tile),
//     M = 1, 17 and 256, H = 1024, runs for a subset of schemes and checks a
//     sample of rows (every 97th plus the first and last 130) against the
//     oracle — the oracle in double is the slow part, not the kernel. In
//     unoptimized (Debug + ASan/UBSan) builds only the first case keeps
//     V = 50257 and the others use V = 5003 (same code paths, a tenth of the
//     rows), and so do the large top-k cases;
//   - thread counts 1, 2, 3 give bitwise-identical logits and top-k;
//   - the opt-in int8-activation mode (set_cpu_activations(kInt8)) on every
//     ISA path that has VNNI here, over the same cross product and large
//     shapes, held to the bound derived from the int8 rounding of x
//     (|x - s_b·q| <= s_b/2 per element, s_b = max|x|/127 per block of 32)
//     plus the f32 bound; skipped where no path has VNNI.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/thread_pool.h"
#include "qhead/ops.h"
#include "qhead/quantize.h"
#include "test_util.h"

namespace qhead::test {
namespace {

// Forces an ISA (and optionally a thread count) for the scope of a test.
struct CpuGuard {
  explicit CpuGuard(CpuIsa isa, int threads = 0) {
    set_cpu_isa(isa);
    set_num_threads(threads);
  }
  ~CpuGuard() {
    set_cpu_isa(CpuIsa::kAuto);
    set_num_threads(0);
  }
};

// The fast ISA paths this CPU runs (the reference is the oracle's business).
std::vector<CpuIsa> fast_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa i : available_cpu_isas())
    if (i != CpuIsa::kReference) out.push_back(i);
  return out;
}

// Rows of the table dequantized as the library contract says, rounded once
// to f32 (the operands the kernels must use).
std::vector<float> dequant_rows_f32(const PackedTable& p, const std::vector<int64_t>& rows) {
  std::vector<double> d(static_cast<size_t>(p.hidden));
  std::vector<float> out(rows.size() * static_cast<size_t>(p.hidden));
  for (size_t i = 0; i < rows.size(); ++i) {
    dequant_row_expected(p, rows[i], d.data());
    for (int64_t j = 0; j < p.hidden; ++j) out[i * static_cast<size_t>(p.hidden) + static_cast<size_t>(j)] = static_cast<float>(d[static_cast<size_t>(j)]);
  }
  return out;
}

// Every row for small V; for large V every 97th row plus the first and last 130.
std::vector<int64_t> sample_rows(int64_t v) {
  std::vector<int64_t> r;
  for (int64_t i = 0; i < v; ++i)
    if (v <= 400 || i < 130 || i >= v - 130 || i % 97 == 0) r.push_back(i);
  return r;
}

// Checks out[M, V] against the oracle on the sampled rows; returns the number of failures.
int check_logits(const PackedTable& p, const TensorView& x, const TensorView& out, const std::string& what) {
  const int64_t m = x.size(0), h = x.size(1), v = p.vocab;
  const std::vector<float> xf = to_f32(x);
  const std::vector<int64_t> rows = sample_rows(v);
  const std::vector<float> w = dequant_rows_f32(p, rows);
  const float* o = out.ptr<float>();
  int bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      const Dot d = dot_f64(xf.data() + i * h, w.data() + ri * static_cast<size_t>(h), h);
      const float got = o[i * v + rows[ri]];
      const double err = std::fabs(static_cast<double>(got) - d.value);
      if (!(err <= logit_tol(d, h)) && bad++ < 3)
        ADD_FAILURE() << what << ": logit[" << i << ", " << rows[ri] << "] = " << got << ", oracle " << d.value
                      << ", |err| " << err << " > bound " << logit_tol(d, h);
    }
  return bad;
}

struct Case {
  int64_t v, h, m;
};

#if defined(NDEBUG)
constexpr bool kOptimized = true;
#else
constexpr bool kOptimized = false;
#endif
// A large vocab, cut to 5003 rows in unoptimized (sanitizer) builds.
int64_t big_v(int64_t v) { return kOptimized ? v : std::min<int64_t>(v, 5003); }

TEST(CpuKernels, ReportsIsas) {
  const auto isas = available_cpu_isas();
  ASSERT_FALSE(isas.empty());
  EXPECT_EQ(isas.front(), CpuIsa::kReference);
  std::string names;
  for (CpuIsa i : isas) names += std::string(cpu_isa_name(i)) + " ";
  std::printf("[ INFO     ] CPU paths: %s(kAuto runs %s)\n", names.c_str(), cpu_isa_name(active_cpu_isa()));
  for (CpuIsa i : {CpuIsa::kAvx2, CpuIsa::kAvx512})
    if (std::find(isas.begin(), isas.end(), i) == isas.end())
      expect_error([&] { set_cpu_isa(i); }, ErrorCode::kUnsupported);
}

// The full cross product on small, awkward shapes.
TEST(CpuKernels, LogitsSweepSmallShapes) {
  const std::vector<Case> cases = {{1, 64, 1}, {3, 576, 3}, {67, 64, 17}, {3, 64, 256}, {5, 256, 1}, {5, 256, 4}, {7, 512, 6}};
  const DType scale_dtypes[] = {DType::kF16, DType::kBF16, DType::kF32};
  int n = 0;
  for (CpuIsa isa : fast_isas()) {
    CpuGuard g(isa);
    for (int bits : {4, 8})
      for (int group : {32, 64, 128, -1})
        for (bool sym : {true, false})
          for (DType xt : {DType::kF32, DType::kF16, DType::kBF16})
            for (const Case& c : cases) {
              if (group > 0 && c.h % group != 0) continue;
              const QuantScheme s = make_scheme(bits, group, sym, scale_dtypes[n % 3]);
              ++n;
              const PackedTable p = random_packed(c.v, c.h, s, 1000 + static_cast<uint64_t>(n));
              const Table t = Table::packed(p);
              const Tensor x = random_tensor(xt, c.m, c.h, 7 + static_cast<uint64_t>(n));
              Tensor out = Tensor::empty(DType::kF32, {c.m, c.v});
              poison(out.view());
              ASSERT_TRUE(cpu::logits(t, x.view(), out.view())) << "fast path declined " << s.name();
              const std::string what = std::string(cpu_isa_name(isa)) + " " + s.name() + " scale " +
                                       dtype_name(s.scale_dtype) + " x " + dtype_name(xt) + " V=" +
                                       std::to_string(c.v) + " H=" + std::to_string(c.h) + " M=" + std::to_string(c.m);
              EXPECT_EQ(count_nan(out.view()), 0) << what;
              EXPECT_EQ(check_logits(p, x.view(), out.view(), what), 0) << what;
            }
  }
  EXPECT_GT(n, 0);
}

// A sampled large-vocabulary case (the LogitsLargeVocabSampled tests).
struct Big {
  int bits, group;
  bool sym;
  DType scale, x;
  int64_t m;
};

// V = 50257 (a partial last block and row tile), H = 1024, M = 1, 17, 256, a
// subset of schemes; sampled rows.
TEST(CpuKernels, LogitsLargeVocabSampled) {
  const std::vector<Big> big = {
      {4, 64, true, DType::kF16, DType::kF32, 1},    {4, 128, false, DType::kBF16, DType::kBF16, 17},
      {8, 128, true, DType::kBF16, DType::kF16, 1},  {8, -1, false, DType::kF32, DType::kF32, 17},
      {4, 32, true, DType::kF32, DType::kF16, 256},
  };
  const int64_t h = 1024;
  int n = 0;
  for (const Big& b : big) {
    const int64_t v = n == 0 ? 50257 : big_v(50257);
    const QuantScheme s = make_scheme(b.bits, b.group, b.sym, b.scale);
    const PackedTable p = random_packed(v, h, s, 77 + static_cast<uint64_t>(n));
    const Table t = Table::packed(p);
    const Tensor x = random_tensor(b.x, b.m, h, 99 + static_cast<uint64_t>(n++));
    for (CpuIsa isa : fast_isas()) {
      if (b.m == 256 && isa != active_cpu_isa() && isa != fast_isas().back()) continue;  // M=256 on the best ISA only
      CpuGuard g(isa);
      Tensor out = Tensor::empty(DType::kF32, {b.m, v});
      poison(out.view());
      logits(t, x.view(), out.view());
      const std::string what = std::string(cpu_isa_name(isa)) + " " + s.name() + " M=" + std::to_string(b.m);
      EXPECT_EQ(count_nan(out.view()), 0) << what;
      EXPECT_EQ(check_logits(p, x.view(), out.view(), what), 0) << what;
    }
  }
}

// 1, 2 and 3 threads compute every logit identically (each (row, m) result
// depends only on the ISA), and top-k with them.
TEST(CpuKernels, ThreadCountsGiveIdenticalResults) {
  const QuantScheme s = make_scheme(4, 64, false, DType::kF16);
  const int64_t v = 50257, h = 64, m = 3, k = 50;
  const Table t = Table::packed(random_packed(v, h, s, 5));
  const Tensor x = random_tensor(DType::kF32, m, h, 6);
  for (CpuIsa isa : fast_isas()) {
    std::vector<float> first;
    std::vector<int32_t> first_ids;
    for (int threads : {1, 2, 3}) {
      CpuGuard g(isa, threads);
      EXPECT_EQ(num_threads(), threads);
      Tensor out = Tensor::empty(DType::kF32, {m, v});
      poison(out.view());
      logits(t, x.view(), out.view());
      Tensor vals = Tensor::empty(DType::kF32, {m, k}), ids = Tensor::empty(DType::kI32, {m, k}),
             lse = Tensor::empty(DType::kF32, {m});
      poison(vals.view());
      poison(ids.view(), -1);
      poison(lse.view());
      topk(t, x.view(), k, vals.view(), ids.view(), lse.view());
      std::vector<float> o(out.ptr<float>(), out.ptr<float>() + m * v);
      std::vector<int32_t> id(ids.ptr<int32_t>(), ids.ptr<int32_t>() + m * k);
      if (first.empty()) {
        first = o;
        first_ids = id;
      } else {
        EXPECT_EQ(0, std::memcmp(first.data(), o.data(), o.size() * sizeof(float)))
            << cpu_isa_name(isa) << " threads=" << threads;
        EXPECT_EQ(first_ids, id) << cpu_isa_name(isa) << " threads=" << threads;
      }
    }
  }
}

// top-k against the fused logits of the same ISA: the ids and values are
// exactly the k best (larger value, then lower id) of those logits, and the
// log-sum-exp is within the logit bound (LSE is 1-Lipschitz in the max norm)
// plus the vectorized exp and summation error of the double LSE of the oracle.
TEST(CpuKernels, TopkMatchesFusedLogitsAndOracleLse) {
  struct TkCase {
    int64_t v, h, m, k;
    int bits, group;
    bool sym;
    DType x;
  };
  const std::vector<TkCase> cases = {
      {1, 64, 1, 1, 4, 32, true, DType::kF32},          {3, 576, 3, 3, 8, 64, false, DType::kBF16},
      {50257, 64, 1, 50, 4, 64, true, DType::kF16},      {50257, 128, 17, 50, 8, -1, false, DType::kF32},
      {1000, 64, 3, 1000, 4, -1, false, DType::kF32},   {131, 64, 256, 7, 4, 64, true, DType::kBF16},
  };
  int n = 0;
  for (TkCase c : cases) {
    const QuantScheme s = make_scheme(c.bits, c.group, c.sym, n % 2 ? DType::kBF16 : DType::kF16);
    c.v = big_v(c.v);
    const PackedTable p = random_packed(c.v, c.h, s, 300 + static_cast<uint64_t>(n));
    const Table t = Table::packed(p);
    const Tensor x = random_tensor(c.x, c.m, c.h, 400 + static_cast<uint64_t>(n++));
    for (CpuIsa isa : fast_isas()) {
      CpuGuard g(isa);
      const std::string what = std::string(cpu_isa_name(isa)) + " " + s.name() + " V=" + std::to_string(c.v) +
                               " M=" + std::to_string(c.m) + " k=" + std::to_string(c.k);
      Tensor out = Tensor::empty(DType::kF32, {c.m, c.v});
      poison(out.view());
      ASSERT_TRUE(cpu::logits(t, x.view(), out.view()));
      Tensor vals = Tensor::empty(DType::kF32, {c.m, c.k}), ids = Tensor::empty(DType::kI32, {c.m, c.k}),
             lse = Tensor::empty(DType::kF32, {c.m});
      poison(vals.view());
      poison(ids.view(), -1);
      poison(lse.view());
      ASSERT_TRUE(cpu::topk(t, x.view(), c.k, vals.view(), ids.view(), lse.view()));
      const std::vector<float> xf = to_f32(x.view());
      std::vector<int64_t> all_rows(static_cast<size_t>(c.v));
      std::iota(all_rows.begin(), all_rows.end(), 0);
      const std::vector<float> w = dequant_rows_f32(p, all_rows);
      for (int64_t i = 0; i < c.m; ++i) {
        const float* l = out.ptr<float>() + i * c.v;
        std::vector<int32_t> order(static_cast<size_t>(c.v));
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
        for (int64_t j = 0; j < c.k; ++j) {
          ASSERT_EQ(ids.ptr<int32_t>()[i * c.k + j], order[static_cast<size_t>(j)]) << what << " m=" << i << " j=" << j;
          ASSERT_EQ(vals.ptr<float>()[i * c.k + j], l[order[static_cast<size_t>(j)]]) << what;
        }
        // The oracle's log-sum-exp in double, and the largest logit bound.
        double mx = -INFINITY, max_tol = 0.0;
        std::vector<double> lo(static_cast<size_t>(c.v));
        for (int64_t r = 0; r < c.v; ++r) {
          const Dot d = dot_f64(xf.data() + i * c.h, w.data() + r * c.h, c.h);
          lo[static_cast<size_t>(r)] = d.value;
          mx = std::max(mx, d.value);
          max_tol = std::max(max_tol, logit_tol(d, c.h));
        }
        double sum = 0.0;
        for (double v : lo) sum += std::exp(v - mx);
        const double want = mx + std::log(sum);
        const double tol = max_tol + 4e-6 + std::fabs(want) * kU32 * 2;
        EXPECT_NEAR(lse.ptr<float>()[i], want, tol) << what << " m=" << i;
      }
    }
  }
}

// Duplicate rows give exactly equal logits: top-k lists them lower id first,
// on every ISA and thread count, as the reference does.
TEST(CpuKernels, TopkTiesLowerIdFirst) {
  const int64_t v = 2000, h = 64, k = 6;
  Tensor dense = random_tensor(DType::kF32, v, h, 11, -0.1, 0.1);
  float* d = dense.ptr<float>();
  const std::vector<int64_t> dup = {3, 64, 65, 700, 1999};  // across blocks and row tiles
  for (int64_t j = 0; j < h; ++j) d[dup[0] * h + j] = 1.0f;
  for (int64_t r : dup) std::copy(d + dup[0] * h, d + dup[0] * h + h, d + r * h);
  for (bool sym : {true, false}) {
    const Table t = quantize_table(Table::dense(Tensor::copy_of(dense.view())),
                                   make_scheme(4, 32, sym, DType::kF16));
    Tensor x = Tensor::empty(DType::kF32, {2, h});
    for (int64_t j = 0; j < 2 * h; ++j) x.ptr<float>()[j] = 1.0f;
    TopK want;
    {
      CpuGuard g(CpuIsa::kReference);
      want = topk(t, x.view(), k);
    }
    for (CpuIsa isa : fast_isas())
      for (int threads : {1, 2, 3}) {
        CpuGuard g(isa, threads);
        const TopK got = topk(t, x.view(), k);
        for (int64_t i = 0; i < 2; ++i) {
          for (size_t j = 0; j < dup.size(); ++j)
            EXPECT_EQ(got.ids.ptr<int32_t>()[i * k + static_cast<int64_t>(j)], dup[j])
                << cpu_isa_name(isa) << " threads=" << threads << " sym=" << sym;
          EXPECT_EQ(got.values.ptr<float>()[i * k], got.values.ptr<float>()[i * k + 4]);
          for (int64_t j = 0; j < 5; ++j)
            EXPECT_EQ(got.ids.ptr<int32_t>()[i * k + j], want.ids.ptr<int32_t>()[i * k + j]);
        }
      }
  }
}

// Gather: bitwise equal to the reference (dequantization is exact; the
// rounding into F16/BF16 is the library's one conversion).
TEST(CpuKernels, EmbedMatchesReferenceExactly) {
  int n = 0;
  for (int bits : {4, 8})
    for (int group : {32, 128, -1})
      for (bool sym : {true, false}) {
        const QuantScheme s = make_scheme(bits, group, sym, n % 3 == 0 ? DType::kF32 : n % 3 == 1 ? DType::kF16 : DType::kBF16);
        const int64_t v = 301, h = 256;
        const Table t = Table::packed(random_packed(v, h, s, 50 + static_cast<uint64_t>(n++)));
        Tensor ids = Tensor::empty(DType::kI64, {300});
        for (int64_t i = 0; i < 300; ++i) ids.ptr<int64_t>()[i] = (i * 37) % v;
        ids.ptr<int64_t>()[0] = v - 1;
        for (DType ot : {DType::kF32, DType::kF16, DType::kBF16}) {
          Tensor want = Tensor::empty(ot, {300, h});
          embed(t, ids.view(), want.view(), Backend::kReference);
          for (CpuIsa isa : fast_isas()) {
            CpuGuard g(isa);
            Tensor got = Tensor::empty(ot, {300, h});
            poison(got.view());
            ASSERT_TRUE(cpu::embed(t, ids.view(), got.view()));
            EXPECT_EQ(0, std::memcmp(got.data(), want.data(), want.nbytes()))
                << cpu_isa_name(isa) << " " << s.name() << " out " << dtype_name(ot);
          }
        }
      }
}

// rescore on dense F32/F16/BF16 rows: values within the bound, sorted, ties lower id first.
TEST(CpuKernels, RescoreWithinBoundAndSorted) {
  const int64_t v = 500, h = 1000, m = 3, k = 9;  // H not a multiple of any vector width
  for (DType wt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const Tensor w = random_tensor(wt, v, h, 21);
    const Table t = Table::dense(Tensor::copy_of(w.view()));
    const Tensor x = random_tensor(DType::kBF16, m, h, 22);
    Tensor cand = Tensor::empty(DType::kI32, {m, k});
    for (int64_t i = 0; i < m * k; ++i) cand.ptr<int32_t>()[i] = static_cast<int32_t>((i * 53) % v);
    cand.ptr<int32_t>()[1] = cand.ptr<int32_t>()[0];  // a duplicate candidate
    const std::vector<float> xf = to_f32(x.view()), wf = to_f32(w.view());
    for (CpuIsa isa : fast_isas()) {
      CpuGuard g(isa);
      Tensor vals = Tensor::empty(DType::kF32, {m, k}), ids = Tensor::empty(DType::kI32, {m, k});
      poison(vals.view());
      poison(ids.view(), -1);
      ASSERT_TRUE(cpu::rescore(t, x.view(), cand.view(), vals.view(), ids.view()));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < k; ++j) {
          const int32_t id = ids.ptr<int32_t>()[i * k + j];
          ASSERT_GE(id, 0);
          const Dot d = dot_f64(xf.data() + i * h, wf.data() + id * h, h);
          EXPECT_LE(std::fabs(vals.ptr<float>()[i * k + j] - d.value), logit_tol(d, h)) << cpu_isa_name(isa);
          if (j > 0) {
            const float a = vals.ptr<float>()[i * k + j - 1], b = vals.ptr<float>()[i * k + j];
            EXPECT_TRUE(a > b || (a == b && ids.ptr<int32_t>()[i * k + j - 1] <= id));
          }
        }
    }
  }
}

// What the fast path declines runs the reference: 3-bit, a dense table, a
// per-row group not a multiple of 32, the reference forced.
TEST(CpuKernels, DeclinedCasesFallBackToReference) {
  const Tensor x = random_tensor(DType::kF32, 2, 96, 1);
  Tensor out = Tensor::empty(DType::kF32, {2, 5});
  const Table w3 = Table::packed(random_packed(5, 96, make_scheme(3, 32, true, DType::kF16), 2));
  EXPECT_FALSE(cpu::logits(w3, x.view(), out.view()));
  const Tensor x48 = random_tensor(DType::kF32, 2, 48, 1);
  const Table w4_48 = Table::packed(random_packed(5, 48, make_scheme(4, -1, true, DType::kF16), 3));
  EXPECT_FALSE(cpu::logits(w4_48, x48.view(), out.view()));
  const Table dense = Table::dense(random_tensor(DType::kF32, 5, 96, 4));
  EXPECT_FALSE(cpu::logits(dense, x.view(), out.view()));
  {
    CpuGuard g(CpuIsa::kReference);
    const Table w4 = Table::packed(random_packed(5, 96, make_scheme(4, 32, true, DType::kF16), 5));
    EXPECT_FALSE(cpu::logits(w4, x.view(), out.view()));
  }
  // Through the public op (kAuto), the 3-bit table still gives oracle-exact results.
  poison(out.view());
  logits(w3, x.view(), out.view());
  EXPECT_EQ(check_logits(w3.packed(), x.view(), out.view(), "w3 via reference"), 0);
}

TEST(CpuThreadPool, RunsEveryTaskOnceAndRethrows) {
  for (int threads : {1, 2, 3}) {
    cpu::ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    std::vector<std::atomic<int>> hits(1000);
    pool.run(1000, [&](int64_t t, int w) {
      ASSERT_LT(w, threads);
      hits[static_cast<size_t>(t)]++;
      pool.run(2, [](int64_t, int) {});  // nested: runs inline
    });
    for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    EXPECT_THROW(pool.run(100, [](int64_t t, int) {
      if (t == 37) throw Error(ErrorCode::kInternal, "test", "task 37");
    }),
                 Error);
    int after = 0;
    pool.run(1, [&](int64_t, int) { ++after; });  // still usable
    EXPECT_EQ(after, 1);
  }
}

// ---- the int8-activation mode --------------------------------------------------------

struct ActGuard {
  explicit ActGuard(CpuActivations a) { set_cpu_activations(a); }
  ~ActGuard() { set_cpu_activations(CpuActivations::kExact); }
};

// The int8 mode's paths on this CPU: every fast ISA path with each integer
// dot product it can run there (VNNI where the CPU has it, vpmaddubsw always).
struct Int8Path {
  CpuIsa isa;
  cpu::Int8Dot dot;
  std::string name() const { return std::string(cpu_isa_name(isa)) + "/" + cpu::int8_dot_name(dot); }
};
std::vector<Int8Path> int8_paths() {
  std::vector<Int8Path> out;
  for (CpuIsa i : fast_isas()) {
    CpuGuard g(i);
    if (!cpu_int8_available()) continue;
    if (cpu::int8_dot() == cpu::Int8Dot::kVnni) out.push_back({i, cpu::Int8Dot::kVnni});
    out.push_back({i, cpu::Int8Dot::kMaddubs});
  }
  return out;
}
// The ISA path, thread count and dot product of an int8 path, for a scope.
struct Int8Guard {
  explicit Int8Guard(const Int8Path& p, int threads = 0) : isa(p.isa, threads) { cpu::set_int8_dot(p.dot); }
  ~Int8Guard() { cpu::set_int8_dot(cpu::Int8Dot::kAuto); }
  CpuGuard isa;
};

// The int8 mode's contract, re-derived here: per activation row and block of
// 32 elements, s_b = max|x| / 127 (f32) and q = rint(fl(x / s_b)), so
//   |x - s_b·q| <= s_b·(1/2 + 127·u·(1 + u)) <= s_b/2 · (1 + 2^-15)  (u = 2^-24).
// The kernel then computes Σ_j (s_b q_j)·(c_j - z)·s_g with exact integer
// dot products and a few f32 roundings per term, i.e. x̂·w within the f32
// bound γ·Σ|x̂_j w_j| (w in exact arithmetic differs from the oracle's f32 w
// by at most u·|w|, which γ_{H+8} covers). Against the oracle on the exact x:
//   |logit - Σ x_j w_j| <= E + γ_{H+8}(u)·(Σ|x_j w_j| + E),   E = Σ_j |w_j|·s_b(j)/2·(1 + 2^-15)
// (+ the oracle's own double error).
std::vector<float> int8_block_scales(const std::vector<float>& xf, int64_t m, int64_t h) {
  std::vector<float> s(static_cast<size_t>(m * h / 32));
  for (size_t b = 0; b < s.size(); ++b) {
    float amax = 0.0f;
    for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(xf[b * 32 + static_cast<size_t>(e)]));
    s[b] = amax / 127.0f;
  }
  return s;
}

struct Int8Check {
  int bad = 0;               // logits outside the bound
  int64_t differ = 0;        // logits that differ from the exact path's (proof the int8 path ran)
  double worst_ratio = 0.0;  // max |err| / bound seen
};

Int8Check check_logits_int8(const PackedTable& p, const TensorView& x, const TensorView& out, const TensorView& exact,
                            const std::string& what) {
  const int64_t m = x.size(0), h = x.size(1), v = p.vocab;
  const std::vector<float> xf = to_f32(x);
  const std::vector<float> sb = int8_block_scales(xf, m, h);
  const std::vector<int64_t> rows = sample_rows(v);
  const std::vector<float> w = dequant_rows_f32(p, rows);
  const float* o = out.ptr<float>();
  const float* ex = exact.ptr<float>();
  Int8Check c;
  for (int64_t i = 0; i < m; ++i)
    for (size_t ri = 0; ri < rows.size(); ++ri) {
      const float* wr = w.data() + ri * static_cast<size_t>(h);
      const Dot d = dot_f64(xf.data() + i * h, wr, h);
      double e_x = 0.0;
      for (int64_t j = 0; j < h; ++j)
        e_x += std::fabs(static_cast<double>(wr[j])) * sb[static_cast<size_t>((i * h + j) / 32)] * 0.5 * (1.0 + std::ldexp(1.0, -15));
      const double tol = e_x + (gamma_n(h + 8, kU32) + gamma_n(h + 4, kU64)) * (d.abs_sum + e_x);
      const float got = o[i * v + rows[ri]];
      const double err = std::fabs(static_cast<double>(got) - d.value);
      if (got != ex[i * v + rows[ri]]) ++c.differ;
      if (tol > 0) c.worst_ratio = std::max(c.worst_ratio, err / tol);
      if (!(err <= tol) && c.bad++ < 3)
        ADD_FAILURE() << what << ": int8 logit[" << i << ", " << rows[ri] << "] = " << got << ", oracle " << d.value
                      << ", |err| " << err << " > derived bound " << tol << " (x rounding part " << e_x << ")";
    }
  return c;
}

TEST(CpuKernelsInt8, DefaultIsExactAndSwitchIsProcessWide) {
  EXPECT_EQ(cpu_activations(), CpuActivations::kExact);
  {
    ActGuard a(CpuActivations::kInt8);
    EXPECT_EQ(cpu_activations(), CpuActivations::kInt8);
  }
  EXPECT_EQ(cpu_activations(), CpuActivations::kExact);
  std::printf("[ INFO     ] int8 mode runs on: ");
  for (const Int8Path& p : int8_paths()) std::printf("%s ", p.name().c_str());
  std::printf("\n");
  // Every fast ISA path has the int8 mode (vpmaddubsw needs nothing past the
  // ISA); with the reference path, kInt8 runs the exact reference: same bits.
  for (CpuIsa isa : fast_isas()) {
    CpuGuard g(isa);
    EXPECT_TRUE(cpu_int8_available()) << cpu_isa_name(isa);
  }
  const QuantScheme s = make_scheme(4, 32, true, DType::kF16);
  const Table t = Table::packed(random_packed(67, 64, s, 3));
  const Tensor x = random_tensor(DType::kF32, 3, 64, 4);
  CpuGuard g(CpuIsa::kReference);
  EXPECT_FALSE(cpu_int8_available());
  Tensor a = Tensor::empty(DType::kF32, {3, 67}), b = Tensor::empty(DType::kF32, {3, 67});
  logits(t, x.view(), a.view());
  ActGuard act(CpuActivations::kInt8);
  logits(t, x.view(), b.view());
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes()));
}

// The two integer dot products compute the same integers: bit-identical
// logits wherever both run (VNNI and vpmaddubsw on one ISA path).
TEST(CpuKernelsInt8, Int8DotProductsAgree) {
  int pairs = 0;
  for (CpuIsa isa : fast_isas()) {
    CpuGuard g(isa);
    if (!cpu_int8_available() || cpu::int8_dot() != cpu::Int8Dot::kVnni) continue;
    for (int bits : {4, 8})
      for (bool sym : {true, false})
        for (int64_t m : {int64_t{1}, int64_t{3}, int64_t{12}, int64_t{17}}) {
          const QuantScheme s = make_scheme(bits, 64, sym, DType::kBF16);
          const Table t = Table::packed(random_packed(1003, 576, s, 41 + uint64_t(bits) + uint64_t(m)));
          const Tensor x = random_tensor(DType::kF16, m, 576, 42 + uint64_t(m), -4.0, 4.0);
          Tensor a = Tensor::empty(DType::kF32, {m, 1003}), b = Tensor::empty(DType::kF32, {m, 1003});
          poison(a.view());
          poison(b.view());
          ActGuard act(CpuActivations::kInt8);
          cpu::set_int8_dot(cpu::Int8Dot::kVnni);
          logits(t, x.view(), a.view());
          cpu::set_int8_dot(cpu::Int8Dot::kMaddubs);
          logits(t, x.view(), b.view());
          cpu::set_int8_dot(cpu::Int8Dot::kAuto);
          EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.nbytes()))
              << cpu_isa_name(isa) << " " << s.name() << " M=" << m;
          ++pairs;
        }
  }
  if (pairs == 0) GTEST_SKIP() << "no ISA path with VNNI on this CPU: only vpmaddubsw runs (the sweeps test it)";
}

// A logit does not depend on the batch it was computed in: each activation
// row alone (M = 1: the row-quad form), in pairs (M = 2) and in batches whose
// blocks take the quad form (8, 4, the padded 3) gives the same bits. V = 1,
// 3 and 67 leave a short last quad of table rows; H = 96 a partial chunk.
TEST(CpuKernelsInt8, LogitsDoNotDependOnTheBatch) {
  const auto paths = int8_paths();
  if (paths.empty()) GTEST_SKIP() << "no CPU path with the int8 mode here";
  int checked = 0;
  for (const Int8Path& ip : paths) {
    Int8Guard g(ip);
    ActGuard act(CpuActivations::kInt8);
    for (int bits : {4, 8})
      for (int group : {32, 64, -1})
        for (bool sym : {true, false})
          for (int64_t v : {int64_t{1}, int64_t{3}, int64_t{67}})
            for (int64_t h : {int64_t{96}, int64_t{576}}) {
              if (group > 0 && h % group != 0) continue;
              const QuantScheme s = make_scheme(bits, group, sym, DType::kF16);
              const uint64_t seed = 900 + uint64_t(bits) * 7 + uint64_t(v) * 3 + uint64_t(h) + (sym ? 1 : 0);
              const Table t = Table::packed(random_packed(v, h, s, seed));
              const int64_t m = 15;  // blocks of 8, 4 and the padded 3
              const Tensor x = random_tensor(DType::kF32, m, h, seed + 1, -3.0, 3.0);
              Tensor all = Tensor::empty(DType::kF32, {m, v});
              poison(all.view());
              ASSERT_TRUE(cpu::logits(t, x.view(), all.view()));
              const std::string what = ip.name() + " " + s.name() + " V=" + std::to_string(v) + " H=" + std::to_string(h);
              for (int64_t rows : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{6}})
                for (int64_t i = 0; i + rows <= m; i += rows) {
                  const TensorView xs(const_cast<float*>(x.ptr<float>()) + i * h, DType::kF32, {rows, h});
                  Tensor part = Tensor::empty(DType::kF32, {rows, v});
                  poison(part.view());
                  ASSERT_TRUE(cpu::logits(t, xs, part.view()));
                  EXPECT_EQ(0, std::memcmp(part.data(), all.ptr<float>() + i * v, part.nbytes()))
                      << what << ": rows " << i << ".." << i + rows - 1 << " alone differ from the batch of " << m;
                  ++checked;
                }
            }
  }
  EXPECT_GT(checked, 0);
}

// The full cross product on small, awkward shapes (H = 576 leaves a partial
// last chunk for the 4-bit kernels), against the derived bound.
TEST(CpuKernelsInt8, LogitsSweepSmallShapes) {
  const auto paths = int8_paths();
  if (paths.empty()) GTEST_SKIP() << "no CPU path with the int8 mode here";
  // M = 3 and 7 reach the quad form's padded block of 3, 12 its block of 4,
  // 17 and 256 its blocks of 8; H = 96 and 160 end in a partial chunk for
  // both widths.
  const std::vector<Case> cases = {{1, 64, 1},  {3, 576, 3},  {67, 64, 17}, {3, 64, 256},
                                   {50, 160, 2}, {5, 96, 7}, {66, 576, 12}, {5, 160, 7}};
  const DType scale_dtypes[] = {DType::kF16, DType::kBF16, DType::kF32};
  int n = 0;
  double worst = 0.0;
  for (const Int8Path& ip : paths) {
    Int8Guard g(ip);
    for (int bits : {4, 8})
      for (int group : {32, 64, 128, -1})
        for (bool sym : {true, false})
          for (DType xt : {DType::kF32, DType::kF16, DType::kBF16})
            for (const Case& c : cases) {
              if (group > 0 && c.h % group != 0) continue;
              const QuantScheme s = make_scheme(bits, group, sym, scale_dtypes[n % 3]);
              ++n;
              const PackedTable p = random_packed(c.v, c.h, s, 2000 + static_cast<uint64_t>(n));
              const Table t = Table::packed(p);
              const Tensor x = random_tensor(xt, c.m, c.h, 17 + static_cast<uint64_t>(n));
              Tensor exact = Tensor::empty(DType::kF32, {c.m, c.v}), out = Tensor::empty(DType::kF32, {c.m, c.v});
              ASSERT_TRUE(cpu::logits(t, x.view(), exact.view()));
              poison(out.view());
              {
                ActGuard act(CpuActivations::kInt8);
                ASSERT_TRUE(cpu::logits(t, x.view(), out.view())) << "fast path declined " << s.name();
              }
              const std::string what = ip.name() + " int8 " + s.name() + " x " + dtype_name(xt) +
                                       " V=" + std::to_string(c.v) + " H=" + std::to_string(c.h) +
                                       " M=" + std::to_string(c.m);
              EXPECT_EQ(count_nan(out.view()), 0) << what;
              const Int8Check r = check_logits_int8(p, x.view(), out.view(), exact.view(), what);
              EXPECT_EQ(r.bad, 0) << what;
              EXPECT_GT(r.differ, 0) << what << ": identical to the exact path — did the int8 kernel run?";
              worst = std::max(worst, r.worst_ratio);
            }
  }
  std::printf("[ INFO     ] int8: %d cases, largest |err| / derived bound %.3f\n", n, worst);
}

// V = 50257, H = 1024, M = 1, 17, 256; sampled rows; and the extra error the
// mode actually shows on these random inputs, reported.
TEST(CpuKernelsInt8, LogitsLargeVocabSampled) {
  const auto paths = int8_paths();
  if (paths.empty()) GTEST_SKIP() << "no CPU path with the int8 mode here";
  const std::vector<Big> big = {
      {4, 64, true, DType::kBF16, DType::kF32, 1},  {4, 128, false, DType::kF16, DType::kBF16, 17},
      {8, 128, true, DType::kBF16, DType::kF32, 1}, {8, -1, false, DType::kF32, DType::kF16, 17},
      {4, 32, true, DType::kF32, DType::kF32, 256},
  };
  const int64_t h = 1024;
  int n = 0;
  for (const Big& b : big) {
    const int64_t v = n == 0 ? 50257 : big_v(50257);
    const QuantScheme s = make_scheme(b.bits, b.group, b.sym, b.scale);
    const PackedTable p = random_packed(v, h, s, 177 + static_cast<uint64_t>(n));
    const Table t = Table::packed(p);
    const Tensor x = random_tensor(b.x, b.m, h, 199 + static_cast<uint64_t>(n++));
    for (const Int8Path& ip : paths) {
      if (b.m == 256 && ip.isa != paths.back().isa) continue;
      Int8Guard g(ip);
      Tensor exact = Tensor::empty(DType::kF32, {b.m, v}), out = Tensor::empty(DType::kF32, {b.m, v});
      logits(t, x.view(), exact.view());
      poison(out.view());
      {
        ActGuard act(CpuActivations::kInt8);
        logits(t, x.view(), out.view());
      }
      const std::string what = ip.name() + " int8 " + s.name() + " M=" + std::to_string(b.m);
      EXPECT_EQ(count_nan(out.view()), 0) << what;
      const Int8Check r = check_logits_int8(p, x.view(), out.view(), exact.view(), what);
      EXPECT_EQ(r.bad, 0) << what;
      EXPECT_GT(r.differ, 0) << what;
      double max_d = 0.0, max_l = 0.0;
      for (int64_t i = 0; i < b.m * v; ++i) {
        max_d = std::max(max_d, std::fabs(static_cast<double>(out.ptr<float>()[i]) - exact.ptr<float>()[i]));
        max_l = std::max(max_l, std::fabs(static_cast<double>(exact.ptr<float>()[i])));
      }
      std::printf("[ INFO     ] %s: max |int8 - exact| = %.3g (max |logit| %.3g), |err| / bound <= %.3f\n",
                  what.c_str(), max_d, max_l, r.worst_ratio);
    }
  }
}

// Blocks of zeros (s_b = 0), a block with one non-zero value and huge/tiny
// magnitudes side by side: the per-block scales keep each block's relative
// precision, and a zero block contributes exactly nothing.
TEST(CpuKernelsInt8, ZeroAndSpreadBlocks) {
  const auto paths = int8_paths();
  if (paths.empty()) GTEST_SKIP() << "no CPU path with the int8 mode here";
  const int64_t v = 131, h = 256, m = 5;  // rows 0-3 in a block of 4, row 4 alone
  Tensor x = random_tensor(DType::kF32, m, h, 8);
  float* xp = x.ptr<float>();
  for (int64_t j = 0; j < h; ++j) xp[j] = 0.0f;  // row 0: all zero
  for (int64_t j = 0; j < 32; ++j) xp[h + j] = 0.0f;
  xp[h + 5] = 3.0f;                                          // row 1, block 0: one value
  for (int64_t j = 64; j < 96; ++j) xp[h + j] *= 1e-6f;      // row 1, block 2: tiny
  for (int64_t j = 96; j < 128; ++j) xp[h + j] *= 1e6f;      // row 1, block 3: huge
  for (int64_t j = 0; j < h; j += 2) xp[2 * h + j] = 0.0f;  // row 2: every other one zero
  for (const Int8Path& ip : paths)
    for (int bits : {4, 8})
      for (bool sym : {true, false}) {
        Int8Guard g(ip);
        const QuantScheme s = make_scheme(bits, 64, sym, DType::kBF16);
        const PackedTable p = random_packed(v, h, s, 9);
        const Table t = Table::packed(p);
        Tensor exact = Tensor::empty(DType::kF32, {m, v}), out = Tensor::empty(DType::kF32, {m, v});
        logits(t, x.view(), exact.view());
        poison(out.view());
        {
          ActGuard act(CpuActivations::kInt8);
          logits(t, x.view(), out.view());
        }
        const std::string what = ip.name() + " int8 " + s.name();
        for (int64_t r = 0; r < v; ++r) EXPECT_EQ(out.ptr<float>()[r], 0.0f) << what << " zero row, logit " << r;
        EXPECT_EQ(check_logits_int8(p, x.view(), out.view(), exact.view(), what).bad, 0) << what;
      }
}

// Thread counts 1, 2, 3 give identical int8 logits, and top-k in int8 mode
// returns exactly the k best of those logits (the same pass with the epilogue).
TEST(CpuKernelsInt8, ThreadCountsAndTopkConsistent) {
  const auto paths = int8_paths();
  if (paths.empty()) GTEST_SKIP() << "no CPU path with the int8 mode here";
  const int64_t v = big_v(50257), h = 128, m = 7, k = 50;  // a block of 4 and a padded quad of 3
  for (bool sym : {true, false}) {
    const QuantScheme s = make_scheme(4, 64, sym, DType::kF16);
    const Table t = Table::packed(random_packed(v, h, s, 55));
    const Tensor x = random_tensor(DType::kBF16, m, h, 56);
    for (const Int8Path& ip : paths) {
      std::vector<float> first;
      for (int threads : {1, 2, 3}) {
        Int8Guard g(ip, threads);
        ActGuard act(CpuActivations::kInt8);
        Tensor out = Tensor::empty(DType::kF32, {m, v});
        poison(out.view());
        logits(t, x.view(), out.view());
        std::vector<float> o(out.ptr<float>(), out.ptr<float>() + m * v);
        if (first.empty())
          first = o;
        else
          EXPECT_EQ(0, std::memcmp(first.data(), o.data(), o.size() * sizeof(float)))
              << ip.name() << " threads=" << threads;
        Tensor vals = Tensor::empty(DType::kF32, {m, k}), ids = Tensor::empty(DType::kI32, {m, k}),
               lse = Tensor::empty(DType::kF32, {m});
        poison(vals.view());
        poison(ids.view(), -1);
        poison(lse.view());
        topk(t, x.view(), k, vals.view(), ids.view(), lse.view());
        for (int64_t i = 0; i < m; ++i) {
          const float* l = o.data() + i * v;
          std::vector<int32_t> order(static_cast<size_t>(v));
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
          for (int64_t j = 0; j < k; ++j) {
            ASSERT_EQ(ids.ptr<int32_t>()[i * k + j], order[static_cast<size_t>(j)]) << ip.name();
            ASSERT_EQ(vals.ptr<float>()[i * k + j], l[order[static_cast<size_t>(j)]]);
          }
          EXPECT_FALSE(std::isnan(lse.ptr<float>()[i]));
        }
      }
    }
  }
}

TEST(CpuThreadPool, ContiguousScheduleRunsEveryTaskOnce) {
  for (int threads : {1, 2, 3}) {
    cpu::ThreadPool pool(threads);
    for (int64_t n : {1, 2, 5, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::vector<std::atomic<int>> by(static_cast<size_t>(n));
      pool.run(n, [&](int64_t t, int w) {
        ASSERT_LT(w, threads);
        hits[static_cast<size_t>(t)]++;
        by[static_cast<size_t>(t)] = w;
        pool.run(2, [](int64_t, int) {}, cpu::ThreadPool::Schedule::kContiguous);  // nested: inline
      }, cpu::ThreadPool::Schedule::kContiguous);
      for (auto& h : hits) EXPECT_EQ(h.load(), 1) << "threads=" << threads << " n=" << n;
    }
    EXPECT_THROW(pool.run(100, [](int64_t t, int) {
      if (t == 37) throw Error(ErrorCode::kInternal, "test", "task 37");
    }, cpu::ThreadPool::Schedule::kContiguous),
                 Error);
    std::atomic<int> after{0};  // the three tasks may run on three workers at once
    pool.run(3, [&](int64_t, int) { ++after; }, cpu::ThreadPool::Schedule::kContiguous);
    EXPECT_EQ(after.load(), 3);
  }
}

}  // namespace
}  // namespace qhead::test
