// The sample op: its random numbers (Philox4x32-10 against Random123's known
// answers), its exactness (chi-square goodness of fit of 10^6 draws per
// setting against the distribution the contract defines, computed in f64
// from the dequantized table, and the same test rejecting a wrong
// distribution), agreement of the paths draw for draw, the whole-row draw
// against a sorted-index draw id for id, reproducibility, the cut past the
// first candidates, awkward vocab sizes and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/kernels.h"
#include "ops/sample.h"
#include "ops/sample_host.h"
#include "qhead/cuda.h"
#include "qhead/ops.h"
#include "test_util.h"

namespace qhead {
namespace {

using namespace qhead::test;

TEST(SamplePhilox, RandomOneTwoThreeKnownAnswers) {
  struct Kat {
    uint32_t c[4], k[2], out[4];
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& t : kats) {
    const sampling::Philox4 r = sampling::philox4x32_10(t.c[0], t.c[1], t.c[2], t.c[3], t.k[0], t.k[1]);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(r.v[i], t.out[i]) << "word " << i;
  }
}

TEST(SamplePhilox, UniformsAndNoiseStayInRange) {
  for (uint32_t w : {0u, 1u, 511u, 512u, 0x7fffffffu, 0xfffffe00u, 0xffffffffu}) {
    const float u = sampling::uniform23(w);
    EXPECT_GT(u, 0.0f);
    EXPECT_LT(u, 1.0f);
    const float g = sampling::gumbel(w);
    EXPECT_TRUE(std::isfinite(g));
    EXPECT_LT(g, sampling::kGumbelBound);
  }
  EXPECT_GT(sampling::gumbel(0xffffffffu), 16.0f);  // the bound is tight, not loose
  for (uint32_t row = 0; row < 64; ++row) {
    const double u = sampling::draw_uniform(12345, 7, row);
    EXPECT_GT(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

// The CPU kernels' vectorized noise is the scalar noise of sample.h up to the
// last bits of the logarithm (Cephes logf against libm's): the same Philox
// words, |Δg| <= 1e-6 · (1 + |g|), for every ISA path, at odd group offsets
// and counts.
TEST(SamplePhilox, VectorNoiseMatchesTheScalarNoise) {
  std::vector<CpuIsa> isas;
  for (CpuIsa i : available_cpu_isas())
    if (i != CpuIsa::kReference) isas.push_back(i);
  if (isas.empty()) GTEST_SKIP() << "no vector ISA path on this CPU";
  const uint64_t seed = 0x0123456789abcdefull, offset = 0xfedcba9876543210ull;
  for (CpuIsa isa : isas) {
    set_cpu_isa(isa);
    const cpu::KernelTable* kt = cpu::active_kernels();
    ASSERT_NE(kt, nullptr);
    double worst = 0.0;
    for (uint32_t row : {0u, 1u, 77u})
      for (uint32_t g0 : {0u, 5u, 1000003u}) {
        const int64_t groups = 4099;
        std::vector<float> out(static_cast<size_t>(4 * groups), std::numeric_limits<float>::quiet_NaN());
        kt->gumbel_noise(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), row,
                         static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32) & ~sampling::kDrawStream, g0,
                         groups, out.data());
        for (int64_t g = 0; g < groups; ++g) {
          const sampling::Philox4 w = sampling::gumbel_words(seed, offset, row, g0 + static_cast<uint32_t>(g));
          for (int e = 0; e < 4; ++e) {
            const double want = sampling::gumbel(w.v[e]), got = out[static_cast<size_t>(4 * g + e)];
            const double err = std::fabs(got - want);
            worst = std::max(worst, err / (1.0 + std::fabs(want)));
            ASSERT_LE(err, 1e-6 * (1.0 + std::fabs(want))) << cpu_isa_name(isa) << " row " << row << " group "
                                                           << g0 + g << " word " << e;
          }
        }
      }
    std::printf("[ INFO     ] %s noise: largest |Δg| / (1 + |g|) = %.2e\n", cpu_isa_name(isa), worst);
  }
  set_cpu_isa(CpuIsa::kAuto);
}

// The distribution the contract defines, in f64, from f64 logits.
std::vector<double> contract_probs(const std::vector<double>& l, const SampleParams& p) {
  const int64_t v = static_cast<int64_t>(l.size());
  std::vector<int64_t> order(static_cast<size_t>(v));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)] ||
           (l[static_cast<size_t>(a)] == l[static_cast<size_t>(b)] && a < b);
  });
  const double z0 = l[static_cast<size_t>(order[0])] / p.temperature;
  std::vector<double> w(static_cast<size_t>(v));
  for (int64_t i = 0; i < v; ++i) w[static_cast<size_t>(i)] = std::exp(l[static_cast<size_t>(order[static_cast<size_t>(i)])] / p.temperature - z0);
  const int64_t k = p.top_k > 0 ? p.top_k : v;
  double total = 0.0;
  for (int64_t i = 0; i < k; ++i) total += w[static_cast<size_t>(i)];
  int64_t n = k;
  if (p.top_p < 1.0f) {
    double acc = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      acc += w[static_cast<size_t>(i)];
      if (acc >= p.top_p * total) {
        n = std::min(n, i + 1);
        break;
      }
    }
  }
  for (int64_t i = 1; i < k; ++i)
    if (w[static_cast<size_t>(i)] < p.min_p) {
      n = std::min(n, i);
      break;
    }
  double kept = 0.0;
  for (int64_t i = 0; i < n; ++i) kept += w[static_cast<size_t>(i)];
  std::vector<double> out(static_cast<size_t>(v), 0.0);
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(order[static_cast<size_t>(i)])] = w[static_cast<size_t>(i)] / kept;
  return out;
}

// f64 logits of one activation row against every table row.
std::vector<double> f64_logits(const Table& t, const float* x) {
  const int64_t v = t.vocab(), h = t.hidden();
  std::vector<float> row(static_cast<size_t>(h));
  std::vector<double> l(static_cast<size_t>(v));
  for (int64_t r = 0; r < v; ++r) {
    expected_row(t, r, row.data());
    double s = 0.0;
    for (int64_t j = 0; j < h; ++j) s += static_cast<double>(x[j]) * row[static_cast<size_t>(j)];
    l[static_cast<size_t>(r)] = s;
  }
  return l;
}

// Upper alpha quantile of chi-square with df degrees of freedom
// (Wilson-Hilferty; z the standard normal quantile).
double chi2_critical(int df, double z) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + z * std::sqrt(a), 3.0);
}

struct Fit {
  double chi2 = 0.0;
  int df = 0;
  int64_t outside = 0;  // draws of tokens the distribution gives probability 0
};
// Pearson's statistic of the counts against probs: one bin per token with an
// expected count >= 5, the rest pooled into one bin (dropped when its
// expectation is below 5).
Fit fit(const std::vector<int64_t>& counts, const std::vector<double>& probs, int64_t n) {
  Fit f;
  double pool_e = 0.0;
  int64_t pool_o = 0;
  int bins = 0;
  for (size_t v = 0; v < probs.size(); ++v) {
    const double e = probs[v] * static_cast<double>(n);
    if (probs[v] == 0.0) {
      f.outside += counts[v];
      continue;
    }
    if (e >= 5.0) {
      f.chi2 += (counts[v] - e) * (counts[v] - e) / e;
      ++bins;
    } else {
      pool_e += e;
      pool_o += counts[v];
    }
  }
  if (pool_e >= 5.0) {
    f.chi2 += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
    ++bins;
  }
  f.df = bins - 1;
  return f;
}

struct Setting {
  const char* name;
  SampleParams p;
};
SampleParams setting(float t, int64_t k, float tp, float mp) {
  SampleParams p;
  p.temperature = t;
  p.top_k = k;
  p.top_p = tp;
  p.min_p = mp;
  p.seed = 0x5eed0000u + static_cast<uint64_t>(t * 100) + static_cast<uint64_t>(k) * 7;
  return p;
}
std::vector<Setting> settings() {
  const auto make = setting;
  return {{"T1", make(1.0f, 0, 1.0f, 0.0f)},
          {"T0.7", make(0.7f, 0, 1.0f, 0.0f)},
          {"T1.5_k10", make(1.5f, 10, 1.0f, 0.0f)},
          {"T1_p0.8", make(1.0f, 0, 0.8f, 0.0f)},
          {"T0.6_p0.9", make(0.6f, 0, 0.9f, 0.0f)},
          {"T0.8_k20_p0.9", make(0.8f, 20, 0.9f, 0.0f)},
          {"T1.2_minp0.05", make(1.2f, 0, 1.0f, 0.05f)},
          {"T1.3_p0.7_minp0.1", make(1.3f, 0, 0.7f, 0.1f)}};
}

// 10^6 draws (rows x offsets) of one activation row repeated, by `backend`;
// the counts per token.
std::vector<int64_t> draw_counts(const Table& t, const Tensor& x1, SampleParams p, Backend backend, int64_t rows,
                                 int64_t calls, bool on_gpu = false) {
  const int64_t h = t.hidden();
  Tensor x = Tensor::empty(x1.dtype(), {rows, h});
  const size_t rb = static_cast<size_t>(h) * dtype_size(x1.dtype());
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(x.data()) + i * rb, x1.data(), rb);
  Tensor xd = on_gpu ? cuda::to_device(x.view()) : x;
  Tensor ids = on_gpu ? cuda::to_device(Tensor::empty(DType::kI32, {rows}).view()) : Tensor::empty(DType::kI32, {rows});
  std::vector<int64_t> counts(static_cast<size_t>(t.vocab()), 0);
  for (int64_t c = 0; c < calls; ++c) {
    p.offset = static_cast<uint64_t>(c);
    sample(t, xd.view(), p, ids.view(), backend);
    const Tensor h_ids = on_gpu ? cuda::to_host(ids.view()) : ids;
    for (int64_t i = 0; i < rows; ++i) {
      const int32_t id = h_ids.ptr<int32_t>()[i];
      EXPECT_GE(id, 0);
      EXPECT_LT(id, t.vocab());
      if (id >= 0 && id < t.vocab()) ++counts[static_cast<size_t>(id)];
    }
  }
  return counts;
}

// Checks the counts against the contract's distribution (they must fit at
// alpha = 1e-6) and against the same distribution at a temperature 5% off
// (it must be rejected: the test has power).
void expect_exact(const std::vector<int64_t>& counts, const std::vector<double>& l, const SampleParams& p,
                  int64_t n, const std::string& what) {
  const std::vector<double> probs = contract_probs(l, p);
  const int64_t kept = std::count_if(probs.begin(), probs.end(), [](double q) { return q > 0.0; });
  ASSERT_GE(kept, 3) << what << ": the setting keeps too few tokens to test";
  const Fit good = fit(counts, probs, n);
  EXPECT_EQ(good.outside, 0) << what << ": draws of tokens the cut removes";
  ASSERT_GE(good.df, 1) << what;
  const double crit = chi2_critical(good.df, 4.753);  // alpha = 1e-6
  EXPECT_LT(good.chi2, crit) << what << ": chi2 " << good.chi2 << " on " << good.df << " df";
  SampleParams off = p;
  off.temperature *= 1.05f;
  const Fit bad = fit(counts, contract_probs(l, off), n);
  EXPECT_TRUE(bad.outside > 0 || bad.chi2 > chi2_critical(std::max(bad.df, 1), 4.753))
      << what << ": a distribution 5% off in temperature was not rejected (chi2 " << bad.chi2 << ")";
}

// A small vocab (37: not a multiple of anything) whose logits spread over a
// few nats, so every cut keeps a different set.
struct Small {
  Table t;
  Tensor x1;  // [1, H] f32
  std::vector<double> l;
};
// A [V, 64] w4g32a table (seed) and one activation row uniform in [-x, x] (seed + 1).
Small make_case(int64_t v, uint64_t seed, double x, DType xdt) {
  Small s;
  s.t = Table::packed(random_packed(v, 64, make_scheme(4, 32, false), seed));
  s.x1 = random_tensor(xdt, 1, 64, seed + 1, -x, x);
  const std::vector<float> xf = to_f32(s.x1.view());
  s.l = f64_logits(s.t, xf.data());
  return s;
}
Small small_case(DType xdt = DType::kF32) { return make_case(37, 901, 1.5, xdt); }

// A vocab of 2048 whose logits spread over a few nats: these cuts keep more
// than the 1024 candidates (or top_k is more than the GPU top-k takes), so
// every draw comes from the whole sorted row.
Small wide_case(DType xdt = DType::kF32) { return make_case(2048, 907, 0.5, xdt); }
std::vector<Setting> wide_settings() {
  return {{"T1_p0.9", setting(1.0f, 0, 0.9f, 0.0f)},
          {"T1_k1500", setting(1.0f, 1500, 1.0f, 0.0f)},
          {"T0.8_k1800_p0.9", setting(0.8f, 1800, 0.9f, 0.0f)},
          {"T1.2_minp0.1", setting(1.2f, 0, 1.0f, 0.1f)}};
}
int64_t kept_tokens(const std::vector<double>& l, const SampleParams& p) {
  const std::vector<double> q = contract_probs(l, p);
  return std::count_if(q.begin(), q.end(), [](double v) { return v > 0.0; });
}

TEST(Sample, ChiSquareFusedCpu) {
  const Small s = small_case();
  for (const Setting& st : settings()) {
    const auto counts = draw_counts(s.t, s.x1, st.p, Backend::kAuto, 4096, 245);
    expect_exact(counts, s.l, st.p, 4096 * 245, std::string("cpu fused ") + st.name);
  }
}

// The CPU's whole-row draws (a cut past the candidates), at 1.25·10^5 draws:
// the two settings whose 5%-off distribution that many draws reject.
TEST(Sample, ChiSquareWholeRowsCpu) {
  const Small s = wide_case();
  const std::vector<Setting> all = wide_settings();
  for (const Setting& st : {all[0], all[3]}) {
    ASSERT_GT(kept_tokens(s.l, st.p), 1024) << st.name << ": the cut must lie past the candidates";
    const auto counts = draw_counts(s.t, s.x1, st.p, Backend::kAuto, 512, 245);
    expect_exact(counts, s.l, st.p, 512 * 245, std::string("cpu whole rows ") + st.name);
  }
}

TEST(Sample, ChiSquareReference) {
  const Small s = small_case();
  for (const Setting& st : settings()) {
    const auto counts = draw_counts(s.t, s.x1, st.p, Backend::kReference, 1024, 256);
    expect_exact(counts, s.l, st.p, 1024 * 256, std::string("reference ") + st.name);
  }
}

// The paths use the same random numbers: on a table where the logits'
// rounding rarely decides, they agree draw for draw.
TEST(Sample, FusedAndReferenceAgreeDrawForDraw) {
  const Table t = Table::packed(random_packed(3001, 128, make_scheme(4, 64, true), 911));
  const Tensor x = random_tensor(DType::kBF16, 17, 128, 912, -4.0, 4.0);
  for (const Setting& st : settings()) {
    Tensor a = Tensor::empty(DType::kI32, {17}), b = Tensor::empty(DType::kI32, {17});
    int64_t same = 0, n = 0;
    for (uint64_t off = 0; off < 12; ++off) {
      SampleParams p = st.p;
      p.offset = off;
      poison(a.view());
      poison(b.view());
      sample(t, x.view(), p, a.view(), Backend::kAuto);
      sample(t, x.view(), p, b.view(), Backend::kReference);
      for (int i = 0; i < 17; ++i) same += a.ptr<int32_t>()[i] == b.ptr<int32_t>()[i];
      n += 17;
    }
    EXPECT_GE(same, n - 2) << st.name << ": " << same << " of " << n << " draws agree";
  }
}

TEST(Sample, ReproducibleAndIndependentOfThreads) {
  const Table t = Table::packed(random_packed(50257, 64, make_scheme(8, -1, true), 921));
  const Tensor x = random_tensor(DType::kF16, 3, 64, 922, -0.05, 0.05);  // 8-bit weights reach 8: broad logits need small x
  const int threads = num_threads();
  for (const Setting& st : settings()) {
    set_num_threads(1);
    const Tensor a = sample(t, x.view(), st.p);
    set_num_threads(std::max(2, threads));
    const Tensor b = sample(t, x.view(), st.p);
    EXPECT_TRUE(same_bytes(a, b)) << st.name;
    SampleParams q = st.p;
    int differ = 0;
    for (uint64_t off = 1; off <= 8; ++off) {
      q.offset = off;
      const Tensor c = sample(t, x.view(), q);
      for (int i = 0; i < 3; ++i) differ += c.ptr<int32_t>()[i] != a.ptr<int32_t>()[i];
    }
    EXPECT_GT(differ, 0) << st.name << ": the offset changes nothing";
  }
  set_num_threads(threads);
}

TEST(Sample, TemperatureZeroIsTheArgmax) {
  const Table t = Table::packed(random_packed(50257, 96, make_scheme(4, 32, false), 931));
  const Tensor x = random_tensor(DType::kF32, 5, 96, 932);
  SampleParams p;
  p.temperature = 0.0f;
  p.top_k = 3;  // ignored
  const Tensor ids = sample(t, x.view(), p);
  const TopK top = topk(t, x.view(), 1);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ids.ptr<int32_t>()[i], top.ids.ptr<int32_t>()[i]);
  Tensor r = Tensor::empty(DType::kI32, {5});
  sample(t, x.view(), p, r.view(), Backend::kReference);
  EXPECT_TRUE(same_bytes(ids, r));
}

// Without top_k, a nucleus of more than the first 1024 candidates: the rows
// go again with more, and still match the reference.
TEST(Sample, CutPastTheFirstCandidates) {
  const Table t = Table::packed(random_packed(49152 + 64, 32, make_scheme(4, 32, true), 941));
  const Tensor x = random_tensor(DType::kF32, 4, 32, 942, -0.2, 0.2);  // nearly flat logits
  SampleParams p;
  p.top_p = 0.95f;
  p.seed = 77;
  int64_t same = 0;
  for (uint64_t off = 0; off < 4; ++off) {
    p.offset = off;
    Tensor a = Tensor::empty(DType::kI32, {4}), b = Tensor::empty(DType::kI32, {4});
    sample(t, x.view(), p, a.view(), Backend::kAuto);
    sample(t, x.view(), p, b.view(), Backend::kReference);
    for (int i = 0; i < 4; ++i) same += a.ptr<int32_t>()[i] == b.ptr<int32_t>()[i];
  }
  EXPECT_GE(same, 15);
  p.top_p = 1.0f;
  p.min_p = 0.9f;  // nearly flat: thousands of tokens within 10% of the best
  Tensor a = Tensor::empty(DType::kI32, {4}), b = Tensor::empty(DType::kI32, {4});
  sample(t, x.view(), p, a.view(), Backend::kAuto);
  sample(t, x.view(), p, b.view(), Backend::kReference);
  int agree = 0;
  for (int i = 0; i < 4; ++i) agree += a.ptr<int32_t>()[i] == b.ptr<int32_t>()[i];
  EXPECT_GE(agree, 3);
}

TEST(Sample, AwkwardVocabSizes) {
  for (int64_t v : {1, 3, 50}) {
    const Table t = Table::packed(random_packed(v, 64, make_scheme(4, 64, false), 950 + uint64_t(v)));
    const Tensor x = random_tensor(DType::kBF16, 3, 64, 951);
    for (const Setting& st : settings()) {
      SampleParams p = st.p;
      p.top_k = std::min(p.top_k, v);
      for (Backend b : {Backend::kAuto, Backend::kReference, Backend::kFallbackBlas}) {
        Tensor ids = Tensor::empty(DType::kI32, {3});
        poison(ids.view());
        sample(t, x.view(), p, ids.view(), b);
        for (int i = 0; i < 3; ++i) {
          EXPECT_GE(ids.ptr<int32_t>()[i], 0) << st.name << " V=" << v;
          EXPECT_LT(ids.ptr<int32_t>()[i], v) << st.name << " V=" << v;
        }
      }
    }
  }
  // M = 0: nothing to write.
  const Table t = Table::packed(random_packed(3, 32, make_scheme(4, 32, true), 960));
  const Tensor x = Tensor::empty(DType::kF32, {0, 32});
  EXPECT_EQ(sample(t, x.view(), SampleParams{}).numel(), 0);
}

TEST(Sample, DenseAndEightBitTables) {
  const Table packed = Table::packed(random_packed(500, 64, make_scheme(8, 32, true), 970));
  const Table dense = Table::dense(random_tensor(DType::kF32, 500, 64, 971));
  const Tensor x = random_tensor(DType::kF32, 2, 64, 972, -3.0, 3.0);
  for (const Setting& st : settings())
    for (const Table* t : {&packed, &dense}) {
      int same = 0;
      for (uint64_t off = 0; off < 8; ++off) {
        SampleParams p = st.p;
        p.offset = off;
        const Tensor a = sample(*t, x.view(), p);
        Tensor b = Tensor::empty(DType::kI32, {2});
        sample(*t, x.view(), p, b.view(), Backend::kReference);
        for (int i = 0; i < 2; ++i) same += a.ptr<int32_t>()[i] == b.ptr<int32_t>()[i];
      }
      EXPECT_GE(same, 15) << st.name << (t == &dense ? " dense" : " w8");
    }
}

// The oracle of from_logits' draw under a cut, in its plainest form: the
// row's indices sorted by z = l * (1 / T) descending, ties to the lower id
// (a comparator on the values), the log-sum-exp in f64 in column order,
// draw_sorted on the sorted values. rows as in from_logits.
void whole_row_draw_ref(const float* logits, int64_t m, int64_t v, const SampleParams& p, int32_t* ids,
                        const int64_t* rows) {
  const float inv_t = 1.0f / p.temperature;
  const sampling::Cut cut = sampling::cut_of(p);
  std::vector<float> z(static_cast<size_t>(v)), sorted(static_cast<size_t>(v));
  std::vector<int32_t> order(static_cast<size_t>(v));
  for (int64_t r = 0; r < m; ++r) {
    const int64_t i = rows ? rows[r] : r;
    for (int64_t j = 0; j < v; ++j) z[static_cast<size_t>(j)] = logits[r * v + j] * inv_t;
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      const float za = z[static_cast<size_t>(a)], zb = z[static_cast<size_t>(b)];
      return za > zb || (za == zb && a < b);
    });
    const double mx = z[static_cast<size_t>(order[0])];
    double s = 0.0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(static_cast<double>(z[static_cast<size_t>(j)]) - mx);
    const double lse = mx + std::log(s);
    const int64_t k = p.top_k > 0 ? p.top_k : v;
    for (int64_t j = 0; j < k; ++j) sorted[static_cast<size_t>(j)] = z[static_cast<size_t>(order[static_cast<size_t>(j)])];
    const int j = sampling::draw_sorted(sorted.data(), k, lse, true, cut,
                                        sampling::draw_uniform(p.seed, p.offset, static_cast<uint32_t>(i)));
    ASSERT_GE(j, 0);
    ids[i] = order[static_cast<size_t>(j)];
  }
}

// from_logits returns the reference's id for every draw: rows of logits on a
// grid of a few values (long runs of ties, -0 beside +0) and rows of distinct
// values, at V = 1, 3, 1000 and 50257 (below the radix sort, the radix sort,
// a top-k cut on its own histogram), over temperatures and every cut, with
// the rows of a call permuted (their counters and slots).
TEST(Sample, WholeRowDrawMatchesTheSortedIndexDraw) {
  struct Cfg {
    float t;
    int64_t k;  // top_k; -1: V / 3
    float tp, mp;
  };
  const Cfg cfgs[] = {{1.0f, 0, 0.9f, 0.0f},   {0.7f, 0, 0.5f, 0.0f},  {1.7f, 0, 0.95f, 0.02f},
                      {0.5f, 0, 1.0f, 0.05f},  {1.0f, 1, 1.0f, 0.0f},  {1.3f, 7, 1.0f, 0.0f},
                      {0.9f, -1, 0.9f, 0.0f},  {1.0f, -1, 1.0f, 0.3f}, {2.0f, 0, 0.999f, 0.0f}};
  for (int64_t v : {int64_t{1}, int64_t{3}, int64_t{1000}, int64_t{50257}}) {
    const int64_t m = 4;
    // Rows 0 and 1: values on a grid of 9 (V = 1000: 111 ties a value on
    // average) with zeros of both signs; row 2: distinct values; row 3: zeros
    // of both signs throughout (one run of ties, -0 == +0).
    Rng rng(7000 + static_cast<uint64_t>(v));
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    std::vector<float> l(static_cast<size_t>(m * v));
    for (int64_t j = 0; j < v; ++j) {
      for (int64_t r = 0; r < 2; ++r) {
        float q = std::round(u(rng) * 2.0f) * 0.5f;
        if (q == 0.0f && (rng() & 1)) q = -0.0f;
        l[static_cast<size_t>(r * v + j)] = q;
      }
      l[static_cast<size_t>(2 * v + j)] = u(rng);
      l[static_cast<size_t>(3 * v + j)] = (rng() & 1) ? -0.0f : 0.0f;
    }
    const int64_t order[m] = {2, 0, 3, 1};
    for (const Cfg& c : cfgs) {
      SampleParams p;
      p.temperature = c.t;
      p.top_k = c.k < 0 ? std::max<int64_t>(1, v / 3) : std::min(c.k, v);
      p.top_p = c.tp;
      p.min_p = c.mp;
      p.seed = 0xd1ce0000u + static_cast<uint64_t>(v);
      ASSERT_TRUE(sampling::truncated(p));
      int64_t differ = 0, n = 0;
      std::string first;  // the first draw that differs
      for (uint64_t off = 0; off < (v > 10000 ? 2u : 6u); ++off) {
        p.offset = off;
        const int64_t* rows = (off & 1) ? order : nullptr;
        std::vector<int32_t> want(static_cast<size_t>(m), -1), got(static_cast<size_t>(m), -2);
        whole_row_draw_ref(l.data(), m, v, p, want.data(), rows);
        sampling::from_logits(l.data(), m, v, p, got.data(), rows);
        for (int64_t i = 0; i < m; ++i, ++n) {
          const int32_t w = want[static_cast<size_t>(i)], g = got[static_cast<size_t>(i)];
          if (g == w) continue;
          if (differ++ == 0)
            first = "offset " + std::to_string(off) + " row " + std::to_string(i) + ": " + std::to_string(g) +
                    " against " + std::to_string(w);
        }
      }
      EXPECT_EQ(differ, 0) << "V=" << v << " T=" << c.t << " top_k=" << p.top_k << " top_p=" << c.tp
                           << " min_p=" << c.mp << ": " << differ << " of " << n << " draws differ, first " << first;
    }
  }
}

TEST(Sample, BadArgumentsNameTheSetting) {
  const Table t = Table::packed(random_packed(50, 32, make_scheme(4, 32, true), 980));
  const Tensor x = random_tensor(DType::kF32, 2, 32, 981);
  auto bad = [&](SampleParams p, const std::string& needle) {
    const std::string msg = expect_error([&] { sample(t, x.view(), p); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_NE(msg.find("sample"), std::string::npos) << msg;
  };
  SampleParams p;
  p.temperature = -1.0f;
  bad(p, "temperature");
  p.temperature = std::numeric_limits<float>::quiet_NaN();
  bad(p, "temperature");
  p.temperature = 1e-39f;
  bad(p, "temperature");
  p = SampleParams{};
  p.top_k = 51;
  bad(p, "top_k");
  p.top_k = -1;
  bad(p, "top_k");
  p = SampleParams{};
  p.top_p = 0.0f;
  bad(p, "top_p");
  p.top_p = 1.5f;
  bad(p, "top_p");
  p = SampleParams{};
  p.min_p = 1.0f;
  bad(p, "min_p");
  Tensor wrong = Tensor::empty(DType::kI64, {2});
  const std::string m1 = expect_error([&] { sample(t, x.view(), SampleParams{}, wrong.view()); },
                                      ErrorCode::kInvalidArgument);
  EXPECT_NE(m1.find("ids"), std::string::npos) << m1;
  Tensor short_ids = Tensor::empty(DType::kI32, {1});
  expect_error([&] { sample(t, x.view(), SampleParams{}, short_ids.view()); }, ErrorCode::kInvalidArgument);
  const Tensor x_bad = random_tensor(DType::kF32, 2, 33, 982);
  expect_error([&] { sample(t, x_bad.view(), SampleParams{}); }, ErrorCode::kInvalidArgument);
}

// ---- CUDA ------------------------------------------------------------------------------

#define SKIP_WITHOUT_GPU() \
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device"

TEST(SampleCuda, ChiSquare) {
  SKIP_WITHOUT_GPU();
  const Small s = small_case(DType::kF16);
  const Table dev = cuda::to_device(s.t);
  for (const Setting& st : settings()) {
    const auto counts = draw_counts(dev, s.x1, st.p, Backend::kAuto, 4096, 245, true);
    expect_exact(counts, s.l, st.p, 4096 * 245, std::string("cuda ") + st.name);
  }
}

TEST(SampleCuda, ChiSquareWholeRows) {
  SKIP_WITHOUT_GPU();
  const Small s = wide_case(DType::kF16);
  const Table dev = cuda::to_device(s.t);
  for (const Setting& st : wide_settings()) {
    ASSERT_GT(kept_tokens(s.l, st.p), 1024) << st.name << ": the cut must lie past the candidates";
    const auto counts = draw_counts(dev, s.x1, st.p, Backend::kAuto, 4096, 245, true);
    expect_exact(counts, s.l, st.p, 4096 * 245, std::string("cuda whole rows ") + st.name);
  }
}

// Rows drawn from the whole row (a cut past the candidates, top_k past what
// the top-k takes) agree with the CPU's, draw for draw, at real vocab sizes
// and several rows (some pending, some not).
TEST(SampleCuda, WholeRowsAgreeWithTheCpu) {
  SKIP_WITHOUT_GPU();
  for (int64_t v : {int64_t{50257}, int64_t{49152 + 64}}) {
    const Table host = Table::packed(random_packed(v, 64, make_scheme(4, 32, true), 995 + uint64_t(v)));
    const Table dev = cuda::to_device(host);
    for (int64_t m : {int64_t{1}, int64_t{5}}) {
      Tensor xf = random_tensor(DType::kF32, m, 64, 996, -0.3, 0.3);  // nearly flat logits
      if (m > 1)  // a peaked row: its cut lies within the candidates
        for (int j = 0; j < 64; ++j) xf.ptr<float>()[64 + j] *= 40.0f;
      Tensor x = Tensor::empty(DType::kF16, {m, 64});  // CUDA takes f16/bf16 activations
      for (int64_t i = 0; i < m * 64; ++i) store_from_f32(x.data(), DType::kF16, i, xf.ptr<float>()[i]);
      const Tensor xd = cuda::to_device(x.view());
      for (const Setting& st : {Setting{"p0.95", setting(1.0f, 0, 0.95f, 0.0f)},
                                Setting{"T0.7_p0.9", setting(0.7f, 0, 0.9f, 0.0f)},
                                Setting{"minp0.9", setting(1.0f, 0, 1.0f, 0.9f)},
                                Setting{"k2000", setting(1.0f, 2000, 1.0f, 0.0f)},
                                Setting{"T1.3_k3000_p0.8", setting(1.3f, 3000, 0.8f, 0.0f)}}) {
        SampleParams p = st.p;
        int64_t same = 0, n = 0;
        for (uint64_t off = 0; off < 4; ++off) {
          p.offset = off;
          const Tensor a = sample(host, x.view(), p);
          Tensor bd = cuda::to_device(Tensor::empty(DType::kI32, {m}).view());
          sample(dev, xd.view(), p, bd.view());
          const Tensor b = cuda::to_host(bd.view());
          for (int64_t i = 0; i < m; ++i) {
            EXPECT_GE(b.ptr<int32_t>()[i], 0);
            EXPECT_LT(b.ptr<int32_t>()[i], v);
            same += a.ptr<int32_t>()[i] == b.ptr<int32_t>()[i];
          }
          n += m;
        }
        EXPECT_GE(same, n - std::max<int64_t>(1, n / 50)) << st.name << " V=" << v << " M=" << m;
      }
    }
  }
}

// The GPU and the CPU draw with the same random numbers: on the same table
// and activations they agree draw for draw, except where the logits'
// rounding decides.
TEST(SampleCuda, AgreesWithTheCpuDrawForDraw) {
  SKIP_WITHOUT_GPU();
  for (int64_t v : {int64_t{3}, int64_t{50257}, int64_t{49152 + 64}}) {
    for (int64_t m : {int64_t{1}, int64_t{17}}) {
      const Table host = Table::packed(random_packed(v, 256, make_scheme(4, 64, false), 990 + uint64_t(v)));
      const Table dev = cuda::to_device(host);
      const Tensor x = random_tensor(DType::kBF16, m, 256, 991, -2.0, 2.0);
      const Tensor xd = cuda::to_device(x.view());
      for (Setting st : settings()) {
        st.p.top_k = std::min(st.p.top_k, v);
        int64_t same = 0, n = 0;
        for (uint64_t off = 0; off < 4; ++off) {
          st.p.offset = off;
          const Tensor a = sample(host, x.view(), st.p);
          Tensor bd = cuda::to_device(Tensor::empty(DType::kI32, {m}).view());
          sample(dev, xd.view(), st.p, bd.view());
          const Tensor b = cuda::to_host(bd.view());
          for (int64_t i = 0; i < m; ++i) same += a.ptr<int32_t>()[i] == b.ptr<int32_t>()[i];
          n += m;
        }
        EXPECT_GE(same, n - std::max<int64_t>(1, n / 50)) << st.name << " V=" << v << " M=" << m;
      }
    }
  }
}

}  // namespace
}  // namespace qhead
