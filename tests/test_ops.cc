// Tests for qhead/ops.h: logits, topk, embed and rescore on every backend
// (reference, BLAS fallback, auto = the fused CPU path where this CPU has one),
// on packed and dense tables, against a float64 oracle computed here
// from the dequantized rows. Every output is poisoned with NaN (or an
// impossible id) before each call and checked to be fully written.
//
// Error bounds. A logit is a length-H dot product accumulated in f32. For any
// summation order (the reference's index order, OpenBLAS's blocked FMA order)
//   |computed - exact| <= γ_H · Σ_j |x_j w_j|,   γ_n = n·u / (1 - n·u), u = 2^-24
// (Higham, Accuracy and Stability of Numerical Algorithms, §3.1), where x_j are
// the activations as converted to f32 (f16/bf16 widen exactly) and w_j the
// dequantized weights (exactly the f32 values Table::row_f32 returns; the
// oracle recomputes them independently). test_util.h: logit_tol().
//
// The tolerance is LogitBound{} (test_util.h): u_add = 2^-24, no extra
// additions, no weight rounding.
//
// The cases (tests/cases.h, the CPU sweep) run as
// <Small|Shapes|Dense>/CpuOps.Sweep/<backend>_<case> on the reference, the
// fused CPU kernels (auto) and the BLAS fallback:
//  - Small: every scheme and activation dtype (bits {4, 8} × group {32, 64, 128, per
//    row} × sym/asym × {F32, F16, BF16}) at V = 37, H = 128, M = 3, on tables
//    quantized by quantize_rtn;
//  - Shapes: awkward shapes V ∈ {1, 3, 50257, 49152 + 64} × H ∈ {64, 576, 1024} ×
//    M ∈ {1, 3, 17}, schemes and dtypes rotating;
//  - Dense: dense F32/F16/BF16 tables.
// Each case checks logits on its backend, topk on the reference and auto
// backends, embed on the reference and auto backends. The float64 oracle
// covers every entry of every shape. What is sampled is topk on shapes above
// kTopkFullMacs multiply-adds: its reference is single-threaded and
// re-dequantizes every row for every activation row, so there it runs once
// per case (the case's cpu_topk_k) on the first row of x (multi-row
// reference topk is covered by the smaller shapes); the auto backend's topk
// runs on every row and every k when a fused CPU path is active (it then
// costs milliseconds), else on the same prefix. Rows of x are independent in
// every op, so a prefix's results are those of the full batch.

#include "qhead/ops.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "qhead/error.h"
#include "qhead/quantize.h"
#include "cases.h"
#include "test_util.h"

namespace {

using qhead::Backend;
using qhead::DType;
using qhead::ErrorCode;
using qhead::PackedTable;
using qhead::QuantScheme;
using qhead::Shape;
using qhead::Table;
using qhead::Tensor;
using qhead::TensorView;
namespace qt = qhead::test;
using qt::make_ids;

constexpr double kTopkFullMacs = 24e6;  // V·H·M above which the reference topk runs on row 0 of x only

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kReference: return "reference";
    case Backend::kFallbackBlas: return "fallback-blas";
    case Backend::kFused: return "fused";
  }
  return "?";
}

// Forces the CPU path kAuto (and rescore) take, for the scope of a test.
struct IsaGuard {
  explicit IsaGuard(qhead::CpuIsa isa) { qhead::set_cpu_isa(isa); }
  ~IsaGuard() { qhead::set_cpu_isa(qhead::CpuIsa::kAuto); }
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;
};

// ---- inputs ------------------------------------------------------------------------------

// Activations generated in their own dtype; `f` is what every op sees after
// the exact widening to f32, so the oracle uses `f`.
struct Acts {
  Tensor x;
  std::vector<float> f;
  int64_t m = 0, h = 0;
};
Acts make_acts(DType t, int64_t m, int64_t h, uint64_t seed) {
  Acts a;
  a.x = qt::random_tensor(t, m, h, seed, -2.0, 2.0);
  a.f = qt::to_f32(a.x.view());
  a.m = m;
  a.h = h;
  return a;
}

using qt::expected_row;
using qt::Oracle;

// The oracle of every logit of a CPU case under the CPU paths' bound.
Oracle cpu_oracle(const Table& t, const Acts& a) {
  return qt::make_oracle(t, a.f.data(), a.m, qt::all_rows(t.vocab()), qt::LogitBound{});
}

// log Σ_v exp(l_v) in double, shifted by the max.
double lse_f64(const double* l, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, l[i]);
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += std::exp(l[i] - mx);
  return mx + std::log(s);
}
// Tolerance of a computed log-sum-exp against the oracle's. With computed
// logits l_v, |l_v - l*_v| <= τ_v, and lse 1-Lipschitz in the max norm,
// |lse(l) - lse(l*)| <= max τ. On top of that, the error of evaluating
// lse(l) itself:
//  - reference: Σ exp(l - max) in double (ops_ref.cc). Each exp and each
//    rescale of the running sum costs a few 2^-53 relative; n terms plus up to
//    n rescales give a relative error <= 4n·2^-53 on the sum, i.e. absolute on
//    the log (the oracle's own double lse has the same bound, counted twice);
//  - auto (fused CPU path): exp evaluated in f32 (a polynomial documented at
//    < 2 ulp = 2^-22 relative, src/ops/cpu/kernels_impl.h), of an argument
//    l - max rounded in f32 (relative error of the term <= |l - max|·u32, and
//    terms with l - max < -88 are below 2^-126 and do not matter), summed in
//    f32 in some order (γ_n): δ = 2^-22 + 88·u32 + γ_n·(1 + 2^-22 + 88·u32)
//    relative on the sum, -log(1 - δ) on the log. Generic, hence loose (the
//    kernel sums short runs in f32 and the rest in double).
// plus the rounding of the result to f32: (|lse| + max τ)·u32.
double lse_tol(Backend backend, int64_t n, double lse, double max_tau) {
  double eval;
  if (backend == Backend::kReference) {
    eval = 2 * (4.0 * static_cast<double>(n + 2) * qt::kU64 + std::fabs(lse) * qt::kU64);
  } else {
    const double e = std::ldexp(1.0, -22) + 88 * qt::kU32;
    const double delta = e + qt::gamma_n(n, qt::kU32) * (1 + e);
    eval = -std::log1p(-delta) + 2 * (4.0 * static_cast<double>(n + 2) * qt::kU64);
  }
  return max_tau + eval + (std::fabs(lse) + max_tau) * qt::kU32;
}

// ---- checks -------------------------------------------------------------------------------------

// Runs logits on `backend`, poisoned first; checks every entry was written
// and every oracle entry is within its bound. Returns the output.
Tensor check_logits(const Table& t, const Acts& a, const Oracle& o, Backend backend) {
  SCOPED_TRACE(std::string("logits/") + backend_name(backend));
  Tensor out = Tensor::empty(DType::kF32, {a.m, t.vocab()});
  qt::poison(out.view());
  qhead::logits(t, a.x.view(), out.view(), backend);
  EXPECT_EQ(qt::count_nan(out.view()), 0) << "entries left unwritten (NaN)";
  int64_t bad = 0;
  const float* p = out.ptr<float>();
  for (int64_t mi = 0; mi < a.m; ++mi)
    for (int64_t r = 0; r < t.vocab(); ++r) {
      const double got = p[mi * t.vocab() + r], want = o.val(mi, r), tol = o.tl(mi, r);
      if (!(std::fabs(got - want) <= tol) && bad++ < 5)
        ADD_FAILURE() << "logits[" << mi << ", " << r << "] = " << got << ", oracle " << want << ", |Δ| "
                      << std::fabs(got - want) << " > bound " << tol;
    }
  EXPECT_EQ(bad, 0);
  return out;
}

// The exact top-k of a row of computed logits under the documented order:
// larger value first, then lower id.
std::vector<int32_t> exact_topk(const float* row, int64_t v, int64_t k) {
  std::vector<int32_t> idx(static_cast<size_t>(v));
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  });
  idx.resize(static_cast<size_t>(k));
  return idx;
}

// topk on `backend`: outputs poisoned; checks
//  - every output written, ids in range and distinct, values descending with
//    ties broken by lower id;
//  - (reference backend) ids are exactly the top-k of the reference logits and
//    values are those logits bitwise — the reference computes both the same way;
//  - each value within its oracle bound of the oracle logit of its id;
//  - no id left out beats a returned id by more than the two bounds: the ids
//    are the oracle's top-k except for near-ties;
//  - log-sum-exp within lse_tol() of the oracle's.
// `a` may be a prefix of the batch `o` and `ref_logits` were computed for.
void check_topk(const Table& t, const Acts& a, int64_t k, const Tensor& ref_logits, const Oracle& o,
                Backend backend) {
  SCOPED_TRACE("topk/" + std::string(backend_name(backend)) + " k=" + std::to_string(k) + " M=" + std::to_string(a.m));
  const int64_t v = t.vocab(), m = a.m;
  Tensor values = Tensor::empty(DType::kF32, {m, k}), ids = Tensor::empty(DType::kI32, {m, k}),
         lse = Tensor::empty(DType::kF32, {m});
  qt::poison(values.view());
  qt::poison(ids.view(), -1);
  qt::poison(lse.view());
  qhead::topk(t, a.x.view(), k, values.view(), ids.view(), lse.view(), backend);
  EXPECT_EQ(qt::count_nan(values.view()), 0);
  EXPECT_EQ(qt::count_nan(lse.view()), 0);
  int64_t bad = 0;
  auto fail = [&](const std::string& s) {
    if (bad++ < 5) ADD_FAILURE() << s;
  };
  for (int64_t mi = 0; mi < m; ++mi) {
    const float* val = values.ptr<float>() + mi * k;
    const int32_t* id = ids.ptr<int32_t>() + mi * k;
    const std::string row = "row " + std::to_string(mi) + ": ";
    std::vector<char> seen(static_cast<size_t>(v), 0);
    bool ids_ok = true;
    for (int64_t j = 0; j < k; ++j) {
      if (id[j] < 0 || id[j] >= v || seen[static_cast<size_t>(id[j])]) {
        fail(row + "id[" + std::to_string(j) + "] = " + std::to_string(id[j]) + " out of range or repeated");
        ids_ok = false;
        continue;
      }
      seen[static_cast<size_t>(id[j])] = 1;
      if (j > 0 && !(val[j - 1] > val[j] || (val[j - 1] == val[j] && id[j - 1] < id[j])))
        fail(row + "not sorted (value desc, id asc) at " + std::to_string(j));
    }
    if (!ids_ok) continue;
    if (backend == Backend::kReference) {
      const float* lrow = ref_logits.ptr<float>() + mi * v;
      const std::vector<int32_t> want = exact_topk(lrow, v, k);
      for (int64_t j = 0; j < k; ++j) {
        if (id[j] != want[static_cast<size_t>(j)])
          fail(row + "id[" + std::to_string(j) + "] = " + std::to_string(id[j]) + ", top-k of the logits has " +
               std::to_string(want[static_cast<size_t>(j)]));
        if (qhead::f32_to_bits(val[j]) != qhead::f32_to_bits(lrow[id[j]]))
          fail(row + "value[" + std::to_string(j) + "] is not bitwise the logit of its id");
      }
    }
    double worst_in = INFINITY;  // min over returned ids of (oracle + bound)
    for (int64_t j = 0; j < k; ++j) {
      const double ov = o.val(mi, id[j]), ot = o.tl(mi, id[j]);
      if (!(std::fabs(val[j] - ov) <= ot))
        fail(row + "value of id " + std::to_string(id[j]) + " = " + std::to_string(val[j]) + ", oracle " +
             std::to_string(ov) + " ± " + std::to_string(ot));
      worst_in = std::min(worst_in, ov + ot);
    }
    double best_out = -INFINITY;  // max over the ids left out of (oracle - bound)
    int64_t best_out_id = -1;
    for (int64_t r = 0; r < v; ++r)
      if (!seen[static_cast<size_t>(r)] && o.val(mi, r) - o.tl(mi, r) > best_out) {
        best_out = o.val(mi, r) - o.tl(mi, r);
        best_out_id = r;
      }
    if (best_out > worst_in)
      fail(row + "id " + std::to_string(best_out_id) + " was left out but its oracle logit beats a returned one "
                 "by more than the bounds");
    const double want = lse_f64(o.value.data() + o.at(mi, 0), v);
    const double tol = lse_tol(backend, v, want, o.max_tol(mi));
    if (!(std::fabs(lse.ptr<float>()[mi] - want) <= tol))
      fail(row + "logsumexp " + std::to_string(lse.ptr<float>()[mi]) + ", oracle " + std::to_string(want) + " ± " +
           std::to_string(tol));
  }
  EXPECT_EQ(bad, 0);
}

// embed on `backend` (and, for kAuto, the allocating form) with I32 and I64
// ids into F32/F16/BF16: every element equals the dequantized value rounded
// through the output dtype, bit for bit.
void check_embed(const Table& t, const std::vector<int64_t>& id_list, Backend backend) {
  const int64_t h = t.hidden(), n = static_cast<int64_t>(id_list.size());
  std::vector<float> want(static_cast<size_t>(n * h));
  for (int64_t i = 0; i < n; ++i) expected_row(t, id_list[static_cast<size_t>(i)], want.data() + i * h);
  for (DType idt : {DType::kI32, DType::kI64}) {
    const Tensor ids = make_ids(id_list, idt);
    for (DType od : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int form = 0; form < (backend == Backend::kAuto ? 2 : 1); ++form) {
        SCOPED_TRACE(std::string("embed ids ") + qhead::dtype_name(idt) + " -> " + qhead::dtype_name(od) + " " +
                     (form == 0 ? backend_name(backend) : "allocating"));
        Tensor out = Tensor::empty(od, {n, h});
        qt::poison(out.view());
        if (form == 1) out = qhead::embed(t, ids.view(), od);
        else qhead::embed(t, ids.view(), out.view(), backend);
        ASSERT_EQ(out.shape(), (Shape{n, h}));
        ASSERT_EQ(out.dtype(), od);
        int64_t bad = 0;
        for (int64_t i = 0; i < n * h; ++i) {
          const float w = qhead::round_through(want[static_cast<size_t>(i)], od);
          const float got = qhead::load_as_f32(out.data(), od, i);
          if (qhead::f32_to_bits(got) != qhead::f32_to_bits(w) && bad++ < 5)
            ADD_FAILURE() << "out[" << i / h << ", " << i % h << "] (id " << id_list[static_cast<size_t>(i / h)]
                          << ") = " << got << ", want " << w;
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

// Ids for embed: first, last, repeats, and a few random rows.
std::vector<int64_t> embed_ids(int64_t v, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> d(0, v - 1);
  std::vector<int64_t> ids = {0, v - 1, 0, d(rng), v - 1, d(rng)};
  for (int i = 0; i < 5; ++i) ids.push_back(d(rng));
  ids.push_back(ids[3]);
  return ids;
}

// The first `rows` rows of a batch (a contiguous prefix).
Acts first_rows(const Acts& a, int64_t rows) {
  Acts s;
  s.x = Tensor::copy_of(TensorView(a.x.data(), a.x.dtype(), {rows, a.h}));
  s.f.assign(a.f.begin(), a.f.begin() + rows * a.h);
  s.m = rows;
  s.h = a.h;
  return s;
}

// The table of a case: random codes, a random dense table quantized by
// quantize_rtn, or a random dense table.
Table make_table(const qt::LogitsCase& c, uint64_t seed) {
  switch (c.weights) {
    case qt::Weights::kDense: return Table::dense(qt::random_tensor(c.scale, c.V, c.H, seed));
    case qt::Weights::kRtn: {
      const Tensor dense = qt::random_tensor(DType::kF32, c.V, c.H, seed);
      return Table::packed(qhead::quantize_rtn(dense.view(), qt::make_scheme(c.bits, c.group, c.symmetric, c.scale), 1,
                                               "case"),
                           "case");
    }
    case qt::Weights::kRandomCodes: break;
  }
  return Table::packed(qt::random_packed(c.V, c.H, qt::make_scheme(c.bits, c.group, c.symmetric, c.scale), seed),
                       "case");
}

std::string scheme_label(const Table& t) {
  if (!t.is_packed()) return std::string("dense ") + qhead::dtype_name(t.dense().dtype());
  const QuantScheme& s = t.packed().scheme;
  return s.name() + " scale " + qhead::dtype_name(s.scale_dtype);
}

const DType kDtypes[3] = {DType::kF32, DType::kF16, DType::kBF16};

// ---- the case sweep: CPU backend × case (tests/cases.h) --------------------------------------

struct CpuParam {
  Backend backend;  // kReference, kAuto (the fused CPU kernels where this CPU has them), kFallbackBlas
  qt::LogitsCase c;
};

// The CPU sweep's cases made of `weights`, each on the three backends in turn.
std::vector<CpuParam> cpu_params(qt::Weights weights) {
  std::vector<CpuParam> out;
  for (const qt::LogitsCase& c : qt::logits_cases(qt::kCpuSweep))
    if (c.weights == weights)
      for (Backend b : {Backend::kReference, Backend::kAuto, Backend::kFallbackBlas}) out.push_back({b, c});
  return out;
}

// A case's table, activations and oracle. The last one made is kept for the
// next test of the same case (its other backends follow it in the sweep):
// the float64 oracle is the slow part, and it depends on the case alone.
struct Prepared {
  std::string name;
  Table t;
  Acts a;
  Oracle o;
};
const Prepared& prepare(const qt::LogitsCase& c, uint64_t seed) {
  static std::unique_ptr<Prepared> last;
  const std::string name = qt::case_name(c);
  if (!last || last->name != name) {
    last.reset();
    auto p = std::make_unique<Prepared>();
    p->name = name;
    p->t = make_table(c, seed);
    p->a = make_acts(c.act, c.M, c.H, seed + 1);
    p->o = cpu_oracle(p->t, p->a);
    last = std::move(p);
  }
  return *last;
}

std::string cpu_param_name(const testing::TestParamInfo<CpuParam>& info) {
  const char* b = info.param.backend == Backend::kReference ? "reference"
                  : info.param.backend == Backend::kAuto    ? "auto"
                                                            : "blas";
  return std::string(b) + "_" + qt::case_name(info.param.c);
}

// --gtest_list_tests prints the parameter: its name, not its bytes.
void PrintTo(const CpuParam& p, std::ostream* os) { *os << backend_name(p.backend) << " " << qt::case_name(p.c); }

class CpuOps : public testing::TestWithParam<CpuParam> {};

// One case on one backend: logits against the oracle; topk for k ∈ {1, 5,
// 50} (clipped to V) on the reference and auto backends — above
// kTopkFullMacs, the reference topk only for the case's cpu_topk_k on the
// first row of x, and the auto topk on the same prefix unless a fused CPU
// path is active (see the file comment); embed. A table quantized by
// quantize_rtn also has its row_f32 checked: the dequantization the contract
// states, bit for bit.
TEST_P(CpuOps, Sweep) {
  const Backend backend = GetParam().backend;
  const qt::LogitsCase& c = GetParam().c;
  const uint64_t seed = qt::case_seed(c);
  const Prepared& p = prepare(c, seed);
  const Table& t = p.t;
  const Acts& a = p.a;
  const Oracle& o = p.o;
  SCOPED_TRACE(scheme_label(t) + ", x " + qhead::dtype_name(c.act));
  if (c.weights == qt::Weights::kRtn && backend == Backend::kReference) {
    std::vector<float> got(static_cast<size_t>(c.H)), want(static_cast<size_t>(c.H));
    for (int64_t r = 0; r < c.V; ++r) {
      t.row_f32(r, got.data());
      expected_row(t, r, want.data());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "row_f32 row " << r;
    }
  }
  const Tensor l = check_logits(t, a, o, backend);
  if (backend != Backend::kFallbackBlas) {  // topk has no BLAS path: kFallbackBlas is the reference's
    const bool big = static_cast<double>(c.V) * c.H * c.M > kTopkFullMacs;
    const bool fused = qhead::active_cpu_isa() != qhead::CpuIsa::kReference;
    const bool sampled = big && (backend == Backend::kReference || !fused);
    std::vector<int64_t> ks = sampled ? std::vector<int64_t>{c.cpu_topk_k} : std::vector<int64_t>{1, 5, 50};
    for (auto& k : ks) k = std::min(k, c.V);
    ks.erase(std::unique(ks.begin(), ks.end()), ks.end());
    const Acts prefix = (sampled && a.m > 1) ? first_rows(a, 1) : a;
    for (int64_t k : ks) check_topk(t, prefix, k, l, o, backend);
  }
  check_embed(t, embed_ids(c.V, seed + 2), backend);
}

// One instantiation per kind of table: Small/ (every scheme and dtype at one
// small shape, quantize_rtn tables), Shapes/ (awkward shapes, random codes),
// Dense/ (dense tables). tests/CMakeLists.txt runs each as one ctest test.
INSTANTIATE_TEST_SUITE_P(Small, CpuOps, testing::ValuesIn(cpu_params(qt::Weights::kRtn)), cpu_param_name);
INSTANTIATE_TEST_SUITE_P(Shapes, CpuOps, testing::ValuesIn(cpu_params(qt::Weights::kRandomCodes)), cpu_param_name);
INSTANTIATE_TEST_SUITE_P(Dense, CpuOps, testing::ValuesIn(cpu_params(qt::Weights::kDense)), cpu_param_name);

// A scheme whose group does not divide H is refused by the quantizer (the
// shape sweep passes over such schemes for that H).
TEST(Ops, QuantizerRefusesGroupsNotDividingH) {
  int refused = 0;
  for (const auto& s : qt::cases_detail::kShapeSchemes)
    for (int64_t h : {64, 576, 1024}) {
      if (s.group < 0 || h % s.group == 0) continue;
      SCOPED_TRACE(qt::scheme_tag(s.bits, s.group, s.sym) + " H=" + std::to_string(h));
      const Tensor tiny = qt::random_tensor(DType::kF32, 2, h, 5000 + static_cast<uint64_t>(h));
      qt::expect_error([&] { qhead::quantize_rtn(tiny.view(), qt::make_scheme(s.bits, s.group, s.sym), 1); },
                       ErrorCode::kInvalidArgument);
      ++refused;
    }
  EXPECT_EQ(refused, 6);  // w4g128a, w8g128 and w4g256 at H = 64 and at H = 576
}

// ---- topk specifics ----------------------------------------------------------------------------------------

// Six identical dense rows (so identical packed rows, so bitwise-equal logits)
// that dominate every other row: ties must come out lower id first, including
// when more tied rows exist than k (the heap must keep the lower ids). On
// every backend, for tables the fused CPU path takes (w4, w8), one it does not
// (w3) and a dense one.
TEST(Ops, TopkTiesLowerIdFirst) {
  const int64_t v = 40, h = 64;
  const int64_t dup[6] = {2, 7, 11, 20, 30, 36};
  for (DType xt : {DType::kF32, DType::kF16}) {
    const Acts a = make_acts(xt, 2, h, 77);
    Tensor dense = qt::random_tensor(DType::kF32, v, h, 78, -0.5, 0.5);
    for (int64_t r : dup)
      for (int64_t j = 0; j < h; ++j) dense.ptr<float>()[r * h + j] = a.f[static_cast<size_t>(j)] > 0 ? 1.0f : -1.0f;
    for (const char* name : {"w4g32", "w8a", "w3g32", "dense"}) {
      const Table t = std::string(name) == "dense"
                          ? Table::dense(Tensor::copy_of(dense.view()))
                          : Table::packed(qhead::quantize_rtn(dense.view(), QuantScheme::parse(name), 1), "ties");
      for (Backend b : {Backend::kReference, Backend::kAuto}) {
        for (int64_t k : {1, 3, 5, 6, 7, 40}) {
          SCOPED_TRACE(std::string(name) + " x " + qhead::dtype_name(xt) + " " + backend_name(b) + " k=" +
                       std::to_string(k));
          Tensor values = Tensor::empty(DType::kF32, {2, k}), ids = Tensor::empty(DType::kI32, {2, k}),
                 lse = Tensor::empty(DType::kF32, {2});
          qt::poison(values.view());
          qt::poison(ids.view(), -1);
          qt::poison(lse.view());
          qhead::topk(t, a.x.view(), k, values.view(), ids.view(), lse.view(), b);
          const int32_t* id = ids.ptr<int32_t>();  // row 0: x row 0 aligns with the duplicated rows
          const float* val = values.ptr<float>();
          for (int64_t j = 0; j < std::min<int64_t>(k, 6); ++j) {
            EXPECT_EQ(id[j], dup[j]) << "position " << j;
            EXPECT_EQ(qhead::f32_to_bits(val[j]), qhead::f32_to_bits(val[0])) << "tied values differ";
          }
          if (k > 6) {
            EXPECT_LT(val[6], val[5]);
          }
          EXPECT_EQ(qt::count_nan(values.view()) + qt::count_nan(lse.view()), 0);
        }
      }
    }
  }
}

TEST(Ops, TopkKOutOfRangeThrows) {
  const Table t = Table::packed(qt::random_packed(11, 64, QuantScheme::parse("w4g32"), 1), "t");
  const Acts a = make_acts(DType::kF32, 2, 64, 2);
  for (int64_t k : {int64_t{0}, int64_t{-1}, int64_t{12}, int64_t{1000}}) {
    SCOPED_TRACE(k);
    const int64_t kk = std::max<int64_t>(k, 1);
    Tensor values = Tensor::empty(DType::kF32, {2, kk}), ids = Tensor::empty(DType::kI32, {2, kk}),
           lse = Tensor::empty(DType::kF32, {2});
    std::string msg = qt::expect_error(
        [&] { qhead::topk(t, a.x.view(), k, values.view(), ids.view(), lse.view()); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find("k = " + std::to_string(k)), std::string::npos) << msg;
    qt::expect_error([&] { qhead::topk(t, a.x.view(), k); }, ErrorCode::kInvalidArgument);
  }
  EXPECT_NO_THROW(qhead::topk(t, a.x.view(), 11));  // k = V is allowed
}

// ---- embed specifics ------------------------------------------------------------------------------------------

TEST(Ops, EmbedIdsOutOfRangeThrowsAndWritesNothing) {
  const int64_t v = 29, h = 96;
  const Table t = Table::packed(qt::random_packed(v, h, QuantScheme::parse("w4g32a"), 3), "emb");
  for (DType idt : {DType::kI32, DType::kI64}) {
    for (int64_t bad : {int64_t{-1}, v, v + 1000, int64_t{-2147483648LL}}) {
      SCOPED_TRACE(std::string(qhead::dtype_name(idt)) + " id " + std::to_string(bad));
      // The bad id last, so an op that gathered before checking would have
      // written the earlier rows (and read out of bounds, which ASan reports).
      const Tensor ids = make_ids({0, 5, v - 1, bad}, idt);
      Tensor out = Tensor::empty(DType::kF32, {4, h});
      qt::poison(out.view());
      const std::string msg =
          qt::expect_error([&] { qhead::embed(t, ids.view(), out.view()); }, ErrorCode::kInvalidArgument);
      EXPECT_NE(msg.find("ids[3]"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::to_string(bad)), std::string::npos) << msg;
      EXPECT_EQ(qt::count_nan(out.view()), out.numel()) << "out was written before the ids were checked";
      qt::expect_error([&] { qhead::embed(t, ids.view(), DType::kF16); }, ErrorCode::kInvalidArgument);
    }
  }
  if (sizeof(void*) == 8) {
    // An I64 id that would alias a valid one if truncated to 32 bits.
    const Tensor ids = make_ids({(int64_t{1} << 32) + 3}, DType::kI64);
    Tensor out = Tensor::empty(DType::kF32, {1, h});
    qt::expect_error([&] { qhead::embed(t, ids.view(), out.view()); }, ErrorCode::kInvalidArgument);
  }
}

// ---- rescore --------------------------------------------------------------------------------------------------

// Rescore the quantized top-k candidates with the dense table: values are the
// dense table's logits (oracle bound), ids a permutation of the candidates,
// sorted descending with ties lower id first.
TEST(Ops, RescoreMatchesDenseOracle) {
  const int64_t v = 301, h = 192, m = 5, k = 10;
  int n = 0;
  for (DType wt : kDtypes) {
    for (DType idt : {DType::kI32, DType::kI64}) {
      const DType xt = kDtypes[n++ % 3];
      SCOPED_TRACE(std::string("dense ") + qhead::dtype_name(wt) + ", candidates " + qhead::dtype_name(idt) + ", x " +
                   qhead::dtype_name(xt));
      const Table dense = Table::dense(qt::random_tensor(wt, v, h, 600 + static_cast<uint64_t>(n)));
      const Table packed = qhead::quantize_table(dense, QuantScheme::parse("w4g64"), 0, "head");
      const Acts a = make_acts(xt, m, h, 700 + static_cast<uint64_t>(n));
      const qhead::TopK cand32 = qhead::topk(packed, a.x.view(), k);
      Tensor cand = Tensor::empty(idt, {m, k});
      for (int64_t i = 0; i < m * k; ++i) {
        if (idt == DType::kI64) cand.ptr<int64_t>()[i] = cand32.ids.ptr<int32_t>()[i];
        else cand.ptr<int32_t>()[i] = cand32.ids.ptr<int32_t>()[i];
      }
      const Oracle o = cpu_oracle(dense, a);
      // Every CPU path rescore can take (the reference, and the fused dot of
      // each ISA this CPU has).
      for (qhead::CpuIsa isa : qhead::available_cpu_isas()) {
        SCOPED_TRACE(std::string("cpu path ") + qhead::cpu_isa_name(isa));
        IsaGuard guard(isa);
        Tensor values = Tensor::empty(DType::kF32, {m, k}), ids = Tensor::empty(DType::kI32, {m, k});
        qt::poison(values.view());
        qt::poison(ids.view(), -1);
        qhead::rescore(dense, a.x.view(), cand.view(), values.view(), ids.view());
        EXPECT_EQ(qt::count_nan(values.view()), 0);
        for (int64_t mi = 0; mi < m; ++mi) {
          const int32_t* id = ids.ptr<int32_t>() + mi * k;
          const float* val = values.ptr<float>() + mi * k;
          std::vector<int32_t> got(id, id + k),
              want(cand32.ids.ptr<int32_t>() + mi * k, cand32.ids.ptr<int32_t>() + (mi + 1) * k);
          std::sort(got.begin(), got.end());
          std::sort(want.begin(), want.end());
          EXPECT_EQ(got, want) << "row " << mi << ": ids are not a permutation of the candidates";
          for (int64_t j = 0; j < k; ++j) {
            if (id[j] < 0 || id[j] >= v) continue;  // reported above
            EXPECT_LE(std::fabs(val[j] - o.val(mi, id[j])), o.tl(mi, id[j])) << "row " << mi << " id " << id[j];
            if (j > 0) {
              EXPECT_TRUE(val[j - 1] > val[j] || (val[j - 1] == val[j] && id[j - 1] < id[j]))
                  << "row " << mi << " not sorted at " << j;
            }
          }
        }
        // The convenience form agrees bit for bit.
        const qhead::Rescored r2 = qhead::rescore(dense, a.x.view(), cand.view());
        EXPECT_EQ(std::memcmp(r2.values.data(), values.data(), values.nbytes()), 0);
        EXPECT_EQ(std::memcmp(r2.ids.data(), ids.data(), ids.nbytes()), 0);
      }
    }
  }
}

TEST(Ops, RescoreTiesAndErrors) {
  const int64_t v = 20, h = 64;
  Tensor w = qt::random_tensor(DType::kF32, v, h, 31);
  for (int64_t r : {4, 9, 13})
    std::memcpy(w.ptr<float>() + r * h, w.ptr<float>() + 2 * h, static_cast<size_t>(h) * 4);  // rows 2, 4, 9, 13 equal
  const Table dense = Table::dense(w);
  const Acts a = make_acts(DType::kF32, 1, h, 32);
  const Tensor cand = make_ids({13, 0, 9, 2, 17, 4}, DType::kI32);
  const TensorView cv(cand.data(), DType::kI32, {1, 6});
  for (qhead::CpuIsa isa : qhead::available_cpu_isas()) {
    SCOPED_TRACE(std::string("cpu path ") + qhead::cpu_isa_name(isa));
    IsaGuard guard(isa);
    const qhead::Rescored r = qhead::rescore(dense, a.x.view(), cv);
    const int32_t* id = r.ids.ptr<int32_t>();
    std::vector<int32_t> tied;
    for (int j = 0; j < 6; ++j)
      if (id[j] == 2 || id[j] == 4 || id[j] == 9 || id[j] == 13) tied.push_back(id[j]);
    EXPECT_EQ(tied, (std::vector<int32_t>{2, 4, 9, 13})) << "equal logits: lower id first";
    // The tied ids sit next to each other with bitwise equal values.
    const auto first = std::find(id, id + 6, 2) - id;
    ASSERT_LE(first, 2);
    for (int j = 1; j < 4; ++j) EXPECT_EQ(r.values.ptr<float>()[first + j], r.values.ptr<float>()[first]);
  }

  // A packed table is not the full-precision table rescore needs.
  const Table packed = qhead::quantize_table(dense, QuantScheme::parse("w4g32"));
  std::string msg = qt::expect_error([&] { qhead::rescore(packed, a.x.view(), cv); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("dense"), std::string::npos) << msg;
  // Candidates out of range, of the wrong dtype, or disagreeing on M.
  Tensor values = Tensor::empty(DType::kF32, {1, 6}), ids = Tensor::empty(DType::kI32, {1, 6});
  qt::poison(values.view());
  const Tensor bad = make_ids({1, 2, 3, 4, 5, v}, DType::kI64);
  const TensorView bv(bad.data(), DType::kI64, {1, 6});
  msg = qt::expect_error([&] { qhead::rescore(dense, a.x.view(), bv, values.view(), ids.view()); },
                         ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("candidates"), std::string::npos) << msg;
  EXPECT_EQ(qt::count_nan(values.view()), 6) << "values written before the candidates were checked";
  const Tensor fl = qt::random_tensor(DType::kF32, 1, 6, 1);
  msg = qt::expect_error([&] { qhead::rescore(dense, a.x.view(), fl.view()); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("candidates"), std::string::npos) << msg;
  const Tensor two = make_ids({1, 2, 3, 4}, DType::kI32);
  const TensorView tv(two.data(), DType::kI32, {2, 2});  // M = 2, x has M = 1
  msg = qt::expect_error([&] { qhead::rescore(dense, a.x.view(), tv); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("candidates"), std::string::npos) << msg;
  Tensor wrong_ids = Tensor::empty(DType::kI64, {1, 6});
  msg = qt::expect_error([&] { qhead::rescore(dense, a.x.view(), cv, values.view(), wrong_ids.view()); },
                         ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("ids"), std::string::npos) << msg;
}

// ---- argument errors ---------------------------------------------------------------------------------------------

// Expects kInvalidArgument whose message names the op and contains `needle`
// (the tensor name as it appears, e.g. "x has", "out must").
void expect_arg_error(const std::function<void()>& fn, const std::string& op, const std::string& needle) {
  const std::string msg = qt::expect_error(fn, ErrorCode::kInvalidArgument);
  EXPECT_EQ(msg.rfind(op + ":", 0), 0u) << "message should start with the op: " << msg;
  EXPECT_NE(msg.find(needle), std::string::npos) << "message should mention '" << needle << "': " << msg;
}

TEST(Ops, ArgumentErrors) {
  const int64_t v = 37, h = 64, m = 3;
  const Table t = Table::packed(qt::random_packed(v, h, QuantScheme::parse("w4g32"), 9), "t");
  const Acts a = make_acts(DType::kF32, m, h, 10);
  Tensor out = Tensor::empty(DType::kF32, {m, v});

  // x: wrong H, wrong dtype, wrong rank, non-contiguous, not on the CPU, no data.
  const Tensor x65 = qt::random_tensor(DType::kF32, m, h + 1, 11);
  expect_arg_error([&] { qhead::logits(t, x65.view(), out.view()); }, "logits", "x has shape");
  Tensor xi = Tensor::empty(DType::kI32, {m, h});
  expect_arg_error([&] { qhead::logits(t, xi.view(), out.view()); }, "logits", "x must be F32/F16/BF16");
  const TensorView x1(a.x.data(), DType::kF32, {m * h});
  expect_arg_error([&] { qhead::logits(t, x1, out.view()); }, "logits", "x must have 2 dims");
  const Tensor wide = qt::random_tensor(DType::kF32, m, 2 * h, 12);
  TensorView xs(wide.data(), DType::kF32, {m, h});
  xs.strides = {2 * h, 1};  // every other block of h: a strided view
  expect_arg_error([&] { qhead::logits(t, xs, out.view()); }, "logits", "x must be contiguous");
  TensorView xt = a.x.view();
  xt.strides = {1, m};  // a transposed view
  expect_arg_error([&] { qhead::logits(t, xt, out.view()); }, "logits", "x must be contiguous");
  TensorView xg = a.x.view();
  xg.device = qhead::Device::kCUDA;
  expect_arg_error([&] { qhead::logits(t, xg, out.view()); }, "logits", "x is on cuda");
  const TensorView xn(nullptr, DType::kF32, {m, h});
  expect_arg_error([&] { qhead::logits(t, xn, out.view()); }, "logits", "x has no data");

  // out: wrong shape, wrong dtype, non-contiguous — on both backends.
  for (Backend b : {Backend::kReference, Backend::kFallbackBlas}) {
    SCOPED_TRACE(backend_name(b));
    Tensor o1 = Tensor::empty(DType::kF32, {m, v + 1});
    expect_arg_error([&] { qhead::logits(t, a.x.view(), o1.view(), b); }, "logits", "out must have shape");
    Tensor o2 = Tensor::empty(DType::kF32, {v, m});
    expect_arg_error([&] { qhead::logits(t, a.x.view(), o2.view(), b); }, "logits", "out must have shape");
    Tensor o3 = Tensor::empty(DType::kI32, {m, v});
    expect_arg_error([&] { qhead::logits(t, a.x.view(), o3.view(), b); }, "logits", "out must be F32/F16/BF16");
    Tensor big = Tensor::empty(DType::kF32, {m, 2 * v});
    TensorView o4(big.data(), DType::kF32, {m, v});
    o4.strides = {2 * v, 1};
    expect_arg_error([&] { qhead::logits(t, a.x.view(), o4, b); }, "logits", "out must be contiguous");
  }
  expect_arg_error([&] { qhead::logits(t, x65.view()); }, "logits", "x has shape");
  expect_arg_error([&] { qhead::logits(t, a.x.view(), DType::kI8); }, "logits", "out_dtype must be F32/F16/BF16");
  expect_arg_error([&] { qhead::logits(Table(), a.x.view(), out.view()); }, "logits", "table is empty");

  // topk: x and every output named.
  Tensor tv = Tensor::empty(DType::kF32, {m, 5}), ti = Tensor::empty(DType::kI32, {m, 5}),
         tl = Tensor::empty(DType::kF32, {m});
  expect_arg_error([&] { qhead::topk(t, x65.view(), 5, tv.view(), ti.view(), tl.view()); }, "topk", "x has shape");
  expect_arg_error([&] { qhead::topk(t, xi.view(), 5, tv.view(), ti.view(), tl.view()); }, "topk", "x must be");
  expect_arg_error([&] { qhead::topk(t, xs, 5, tv.view(), ti.view(), tl.view()); }, "topk", "x must be contiguous");
  Tensor tv_bad = Tensor::empty(DType::kF32, {m, 4});
  expect_arg_error([&] { qhead::topk(t, a.x.view(), 5, tv_bad.view(), ti.view(), tl.view()); }, "topk",
                   "values must have shape");
  Tensor ti_bad = Tensor::empty(DType::kI64, {m, 5});
  expect_arg_error([&] { qhead::topk(t, a.x.view(), 5, tv.view(), ti_bad.view(), tl.view()); }, "topk",
                   "ids must be I32");
  Tensor tl_bad = Tensor::empty(DType::kF32, {m, 1});
  expect_arg_error([&] { qhead::topk(t, a.x.view(), 5, tv.view(), ti.view(), tl_bad.view()); }, "topk",
                   "logsumexp must have shape");
  Tensor tl_f16 = Tensor::empty(DType::kF16, {m});
  expect_arg_error([&] { qhead::topk(t, a.x.view(), 5, tv.view(), ti.view(), tl_f16.view()); }, "topk",
                   "logsumexp must be F32");

  // embed: ids dtype / rank, out shape / dtype.
  const Tensor ids = make_ids({0, 1, 2}, DType::kI32);
  Tensor eo = Tensor::empty(DType::kF32, {3, h});
  Tensor fids = Tensor::empty(DType::kF32, {3});
  expect_arg_error([&] { qhead::embed(t, fids.view(), eo.view()); }, "embed", "ids must be I32 or I64");
  const TensorView ids2(ids.data(), DType::kI32, {3, 1});
  expect_arg_error([&] { qhead::embed(t, ids2, eo.view()); }, "embed", "ids must have 1 dims");
  Tensor eo_bad = Tensor::empty(DType::kF32, {3, h + 1});
  expect_arg_error([&] { qhead::embed(t, ids.view(), eo_bad.view()); }, "embed", "out must have shape");
  Tensor eo_int = Tensor::empty(DType::kI32, {3, h});
  expect_arg_error([&] { qhead::embed(t, ids.view(), eo_int.view()); }, "embed", "out must be F32/F16/BF16");
  expect_arg_error([&] { qhead::embed(t, ids.view(), DType::kI8); }, "embed", "out must be F32/F16/BF16");

  // rescore: x named too.
  const Table dense = Table::dense(qt::random_tensor(DType::kF32, v, h, 13));
  const Tensor cand = make_ids({0, 1, 2, 3, 4, 5}, DType::kI32);
  const TensorView cv(cand.data(), DType::kI32, {m, 2});
  expect_arg_error([&] { qhead::rescore(dense, x65.view(), cv); }, "rescore", "x has shape");
  expect_arg_error([&] { qhead::rescore(dense, xi.view(), cv); }, "rescore", "x must be");
}

// ---- tied tables ----------------------------------------------------------------------------------------------------

// One packed copy serves both roles: embed through .embedding and logits
// through .head read the same storage, and logits[m, v] is the dot of x with
// the embedded row v within the f32 bound.
TEST(Ops, TiedTableServesEmbedAndLogits) {
  const int64_t v = 211, h = 576, m = 3;
  const Table emb = Table::dense(qt::random_tensor(DType::kBF16, v, h, 41));
  const qhead::TokenTables tt = qhead::quantize_roles(emb, nullptr, QuantScheme::parse("w4g64", DType::kBF16), std::nullopt);
  ASSERT_TRUE(tt.tied());
  ASSERT_TRUE(tt.embedding.same_storage(tt.head));
  ASSERT_TRUE(tt.head.is_packed());
  EXPECT_EQ(tt.embedding.nbytes(), tt.head.nbytes());

  std::vector<int64_t> all(static_cast<size_t>(v));
  std::iota(all.begin(), all.end(), 0);
  const Tensor ids = make_ids(all, DType::kI64);
  Tensor rows = Tensor::empty(DType::kF32, {v, h});
  qt::poison(rows.view());
  qhead::embed(tt.embedding, ids.view(), rows.view());
  ASSERT_EQ(qt::count_nan(rows.view()), 0);

  const Acts a = make_acts(DType::kF16, m, h, 42);
  for (Backend b : {Backend::kReference, Backend::kFallbackBlas, Backend::kAuto}) {
    SCOPED_TRACE(backend_name(b));
    Tensor out = Tensor::empty(DType::kF32, {m, v});
    qt::poison(out.view());
    qhead::logits(tt.head, a.x.view(), out.view(), b);
    ASSERT_EQ(qt::count_nan(out.view()), 0);
    int64_t bad = 0;
    for (int64_t mi = 0; mi < m; ++mi)
      for (int64_t r = 0; r < v; ++r) {
        const qt::Dot d = qt::dot_f64(a.f.data() + mi * h, rows.ptr<float>() + r * h, h);
        const double got = out.ptr<float>()[mi * v + r];
        if (!(std::fabs(got - d.value) <= qt::logit_tol(d, h)) && bad++ < 5)
          ADD_FAILURE() << "logits[" << mi << ", " << r << "] = " << got << " vs x·embed(" << r << ") = " << d.value;
      }
    EXPECT_EQ(bad, 0);
  }
}

// ---- small edge cases -----------------------------------------------------------------------------------------

// M = 0 activations and N = 0 ids are valid, empty calls.
TEST(Ops, EmptyBatches) {
  const Table t = Table::packed(qt::random_packed(13, 64, QuantScheme::parse("w8g32a"), 5), "t");
  for (DType xt : kDtypes) {
    const Tensor x = Tensor::empty(xt, {0, 64});
    for (Backend b : {Backend::kReference, Backend::kAuto}) {
      Tensor out = Tensor::empty(DType::kF32, {0, 13});
      EXPECT_NO_THROW(qhead::logits(t, x.view(), out.view(), b)) << backend_name(b);
    }
    const qhead::TopK r = qhead::topk(t, x.view(), 3);
    EXPECT_EQ(r.values.shape(), (Shape{0, 3}));
    EXPECT_EQ(r.logsumexp.shape(), (Shape{0}));
  }
  const Tensor ids = Tensor::empty(DType::kI32, {0});
  const Tensor e = qhead::embed(t, ids.view(), DType::kBF16);
  EXPECT_EQ(e.shape(), (Shape{0, 64}));
}

// The BLAS fallback with M = 0 activations: it returns before converting
// into its empty buffers (a memcpy from or to a null pointer, even of 0
// bytes, is undefined behaviour, which UBSan reports).
TEST(Ops, EmptyBatchFallbackBlas) {
  const Table t = Table::packed(qt::random_packed(13, 64, QuantScheme::parse("w8g32a"), 5), "t");
  for (DType xt : kDtypes) {
    SCOPED_TRACE(qhead::dtype_name(xt));
    const Tensor x = Tensor::empty(xt, {0, 64});
    Tensor out = Tensor::empty(DType::kF32, {0, 13});
    EXPECT_NO_THROW(qhead::logits(t, x.view(), out.view(), Backend::kFallbackBlas));
  }
}

// Several user threads calling the CPU ops at once, on the same tables
// (ops.h, "Threads"): every call returns exactly what it returns alone.
// (Also run under ThreadSanitizer: docs/architecture.md, "Ops and dispatch".)
TEST(Ops, ConcurrentCallsFromSeveralThreads) {
  const Table t4 = Table::packed(qt::random_packed(5003, 256, QuantScheme::parse("w4g64a", DType::kBF16), 31), "t4");
  const Table t8 = Table::packed(qt::random_packed(3001, 256, QuantScheme::parse("w8g128", DType::kF16), 32), "t8");
  const Table* tables[2] = {&t4, &t8};
  const Acts a = make_acts(DType::kF32, 5, 256, 33);
  const std::vector<int64_t> id_list = {0, 3000, 17, 17, 2999, 1};
  const Tensor ids = make_ids(id_list, DType::kI32);
  struct Want {
    Tensor logits;
    qhead::TopK top;
    Tensor rows;
  } want[2];
  for (int i = 0; i < 2; ++i) {
    want[i].logits = qhead::logits(*tables[i], a.x.view());
    want[i].top = qhead::topk(*tables[i], a.x.view(), 9);
    want[i].rows = qhead::embed(*tables[i], ids.view());
  }
  constexpr int kThreads = 4, kRounds = 6;
  std::atomic<int> mismatches{0}, calls{0};
  qt::run_concurrently(kThreads, kRounds, [&](int u, int r) {
    const int i = (u + r) % 2;
    const Table& t = *tables[i];
    Tensor l = Tensor::empty(DType::kF32, {a.m, t.vocab()});
    qt::poison(l.view());
    qhead::logits(t, a.x.view(), l.view());
    const qhead::TopK top = qhead::topk(t, a.x.view(), 9);
    const Tensor rows = qhead::embed(t, ids.view());
    if (!qt::same_bytes(l, want[i].logits)) ++mismatches;
    if (!qt::same_bytes(top.values, want[i].top.values) || !qt::same_bytes(top.ids, want[i].top.ids) ||
        !qt::same_bytes(top.logsumexp, want[i].top.logsumexp))
      ++mismatches;
    if (!qt::same_bytes(rows, want[i].rows)) ++mismatches;
    calls += 3;
  });
  EXPECT_EQ(calls.load(), 3 * kThreads * kRounds);
  EXPECT_EQ(mismatches.load(), 0);
}

// The convenience overloads allocate the documented shapes and agree with the
// out-parameter forms on the auto backend (what they run); logits_fallback is
// the BLAS backend.
// A 16-bit out holds the f32 logits rounded to nearest even, bit for bit, on
// every CPU backend whose f32 logits of a row do not depend on M; M = 130
// crosses the 64-row blocks the rounding goes by, so for OpenBLAS (whose
// SGEMM blocking, hence rounding, follows M) one ulp of the 16-bit dtype.
TEST(Ops, LogitsStoredIn16Bit) {
  const int64_t v = 301, h = 128, m = 130;
  for (const char* scheme : {"w4g32a", "w8g64"}) {
    Table t = Table::packed(qt::random_packed(v, h, QuantScheme::parse(scheme, DType::kBF16), 8), "t");
    const Acts a = make_acts(DType::kF16, m, h, 9);
    for (Backend b : {Backend::kAuto, Backend::kFused, Backend::kFallbackBlas, Backend::kReference}) {
      SCOPED_TRACE(std::string(scheme) + " " + backend_name(b));
      Tensor f = Tensor::empty(DType::kF32, {m, v});
      qt::poison(f.view());
      qhead::logits(t, a.x.view(), f.view(), b);
      for (DType out : {DType::kF16, DType::kBF16}) {
        Tensor o = Tensor::empty(out, {m, v});
        qt::poison(o.view());
        qhead::logits(t, a.x.view(), o.view(), b);
        int bad = 0;
        for (int64_t i = 0; i < m * v; ++i) {
          const float x = f.ptr<float>()[i];
          const uint16_t want = out == DType::kF16 ? qhead::f32_to_f16(x) : qhead::f32_to_bf16(x);
          const uint16_t got = o.ptr<uint16_t>()[i];
          const int ulps = b == Backend::kFallbackBlas ? 1 : 0;
          if (std::abs(int(got) - int(want)) > ulps && bad++ < 5)
            ADD_FAILURE() << qhead::dtype_name(out) << " [" << i / v << ", " << i % v << "] from " << x << ": 0x"
                          << std::hex << got << " want 0x" << want << std::dec;
        }
        EXPECT_EQ(bad, 0);
      }
    }
    const Tensor a16 = qhead::logits(t, a.x.view(), DType::kBF16);
    ASSERT_EQ(a16.dtype(), DType::kBF16);
    ASSERT_EQ(a16.shape(), (Shape{m, v}));
  }
  // Values at the edges of f16: past its range (±inf), at the rounding to 65504 / inf, subnormal,
  // below its smallest subnormal; 19 rows, so the 8-wide conversion has a tail. Row r of the dense
  // table is val[r] / 32 in every column and x is ones: each logit is val[r] exactly.
  const float val[19] = {1e5f, -1e5f, 65504.0f, 65519.0f, 65520.0f, -65520.0f, 6e-8f, 3e-5f, 1e-9f, -2.5f,
                         0.1f, 1.0f / 3.0f, -7e-6f, 2049.0f, 2051.0f, 0.0f, -1e-9f, 5.96e-8f, 1e30f};
  Tensor w = Tensor::empty(DType::kF32, {19, 32}), ones = Tensor::empty(DType::kF32, {1, 32});
  for (int r = 0; r < 19; ++r)
    for (int j = 0; j < 32; ++j) w.ptr<float>()[r * 32 + j] = val[r] / 32.0f;
  for (int j = 0; j < 32; ++j) ones.ptr<float>()[j] = 1.0f;
  const Table d = Table::dense(std::move(w));
  const Tensor l16 = qhead::logits(d, ones.view(), DType::kF16), lb = qhead::logits(d, ones.view(), DType::kBF16);
  for (int r = 0; r < 19; ++r) {
    EXPECT_EQ(l16.ptr<uint16_t>()[r], qhead::f32_to_f16(val[r])) << "logit " << val[r];
    EXPECT_EQ(lb.ptr<uint16_t>()[r], qhead::f32_to_bf16(val[r])) << "logit " << val[r];
  }
  EXPECT_EQ(l16.ptr<uint16_t>()[0], 0x7c00);  // +inf
  EXPECT_EQ(l16.ptr<uint16_t>()[4], 0x7c00);  // 65520 rounds to inf
  EXPECT_EQ(l16.ptr<uint16_t>()[3], 0x7bff);  // 65519 to 65504
}

TEST(Ops, ConvenienceFormsAgree) {
  const Table t = Table::packed(qt::random_packed(300, 128, QuantScheme::parse("w4g32a", DType::kBF16), 6), "t");
  const Acts a = make_acts(DType::kBF16, 4, 128, 7);
  const Tensor l = qhead::logits(t, a.x.view());
  ASSERT_EQ(l.shape(), (Shape{4, 300}));
  ASSERT_EQ(l.dtype(), DType::kF32);
  Tensor l2 = Tensor::empty(DType::kF32, {4, 300});
  qt::poison(l2.view());
  qhead::logits(t, a.x.view(), l2.view(), Backend::kAuto);
  EXPECT_EQ(std::memcmp(l.data(), l2.data(), l.nbytes()), 0);
  Tensor l3 = Tensor::empty(DType::kF32, {4, 300}), l4 = Tensor::empty(DType::kF32, {4, 300});
  qt::poison(l3.view());
  qhead::logits_fallback(t, a.x.view(), l3.view());
  qhead::logits(t, a.x.view(), l4.view(), Backend::kFallbackBlas);
  EXPECT_EQ(std::memcmp(l3.data(), l4.data(), l3.nbytes()), 0);
  const qhead::TopK r = qhead::topk(t, a.x.view(), 7);
  ASSERT_EQ(r.values.shape(), (Shape{4, 7}));
  ASSERT_EQ(r.ids.shape(), (Shape{4, 7}));
  ASSERT_EQ(r.ids.dtype(), DType::kI32);
  ASSERT_EQ(r.logsumexp.shape(), (Shape{4}));
  Tensor v = Tensor::empty(DType::kF32, {4, 7}), i = Tensor::empty(DType::kI32, {4, 7}),
         s = Tensor::empty(DType::kF32, {4});
  qhead::topk(t, a.x.view(), 7, v.view(), i.view(), s.view(), Backend::kAuto);
  EXPECT_EQ(std::memcmp(r.values.data(), v.data(), v.nbytes()), 0);
  EXPECT_EQ(std::memcmp(r.ids.data(), i.data(), i.nbytes()), 0);
  EXPECT_EQ(std::memcmp(r.logsumexp.data(), s.data(), s.nbytes()), 0);
}

}  // namespace
