// Tests for qhead/quantize.h: quantize_rtn over bits × group × symmetry ×
// input dtype × scale dtype on seeded random tables of awkward shapes, with an
// element-wise error bound derived from the arithmetic the quantizer does;
// zero rows, NaN/Inf rows, thread-count independence, argument errors; and
// quantize_roles for tied and untied tables.

#include "qhead/quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "qhead/error.h"
#include "test_util.h"

namespace {

using qhead::DType;
using qhead::ErrorCode;
using qhead::PackedTable;
using qhead::QuantScheme;
using qhead::Table;
using qhead::Tensor;
using qhead::test::expect_error;
using qhead::test::kU32;
using qhead::test::stream_code;
using qhead::test::unit_roundoff;

// A [v, h] table in dtype t whose rows have different centres and spreads
// (c + r·U(-1, 1), c ∈ [-1, 1], r ∈ [0.05, 1]), so that all-positive,
// all-negative and mixed groups all occur — the cases where the asymmetric
// range [min(x, 0), max(x, 0)] differs most from the data range.
Tensor random_table(DType t, int64_t v, int64_t h, uint64_t seed) {
  Tensor out = Tensor::empty(t, {v, h});
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> cd(-1.0f, 1.0f), rd(0.05f, 1.0f), ud(-1.0f, 1.0f);
  for (int64_t r = 0; r < v; ++r) {
    const float c = cd(rng), rad = rd(rng);
    for (int64_t j = 0; j < h; ++j) qhead::store_from_f32(out.data(), t, r * h + j, c + rad * ud(rng));
  }
  return out;
}

// Rounding of one op result into dtype t when the library calls
// round_through(·, t): none for F32 (round_through is the identity there).
double r_of(DType t) { return t == DType::kF32 ? 0.0 : unit_roundoff(t); }

// ---- the error bound --------------------------------------------------------------------
//
// Notation: x an input element (exact in f32), s the stored scale, z the stored
// zero point, y = x/s + z the exact real-valued code, q the stored code,
// ŵ = (q - z)·s the dequantized value, so |x - ŵ| = s·|y - q|. Unit roundoffs:
// u32 = 2^-24 for an f32 operation, r_x / r_s / r_p for a round_through into
// the input, scale and promoted dtype (0 when that dtype is F32, or when the
// value is already representable there). The quantizer computes (quantize.h):
//
//   t = rnd_p(rnd_p(x / s) + z)      x/s in f32 then rounded to the promoted dtype
//   q = round_half_even(clamp(t, qmin, qmax))
//
// (1) Rounding of t.  |t - y| <= Δ_t(x) with
//       Δ_t = |x/s|·e_p                             (division + rounding)
//           + [asym] (|x/s|(1 + e_p) + |z|)·e_p     (the addition of z, rounded again)
//     where e_p = (1 + u32)(1 + r_p) - 1.
// (2) Coverage of the clamp range.  Ideally y ∈ [qmin - 1/2, qmax + 1/2] for every
//     x of the group; the rounding of s and z lets y overshoot by at most Δ_c:
//     symmetric:  s = rnd_s(rnd_x(amax / hr)), hr = (2^b - 1)/2, so
//                 amax/s <= hr / ((1 - u32)(1 - r_x)(1 - r_s)) =: hr·(1 + e_s),
//                 y <= hr(1 + e_s) = qmax + 1/2 + hr·e_s:          Δ_c = hr·e_s
//     asymmetric: s = rnd_s(rnd_x(rnd_x(mx - mn) / R)), R = 2^b - 1, so
//                 (mx - mn)/s <= R / ((1-u32)²(1-r_x)²(1-r_s)) =: R(1 + e_s) =: A;
//                 z = round(clamp(rnd_x(qmin - rnd_x(mn / s_x)))) with s_x the scale
//                 before its rounding into the scale dtype (|s_x/s - 1| <= δ_s =
//                 r_s/(1 - r_s)); the two roundings inside z are off by at most
//                 ε_z = A·e_x + (2^(b-1) + A(1 + e_x))·e_x, e_x = (1+u32)(1+r_x) - 1,
//                 the clamp of z moves it by at most R·e_s + ε_z, and
//                 y = (x - mn)/s + qmin + (mn/s - mn/s_x) + (z - (qmin - mn/s_x)) gives
//                                                      Δ_c = R·e_s + A·δ_s + 2·ε_z
// (3) Combining: if t ∈ [qmin, qmax], |q - y| <= 1/2 + Δ_t. If t > qmax then
//     q = qmax and either y <= qmax (|q - y| < Δ_t) or y - qmax <= 1/2 + Δ_c; the
//     same below qmin. Hence
//
//       |x - ŵ| <= s · (1/2 + max(Δ_t(x), Δ_c))
//
// For an all-f32 pipeline Δ_t, Δ_c are ~1e-6: the bound is s/2 to six digits, and
// for symmetric int4 it is met with equality in the limit (+amax → 7.5 → clamped
// to 7, error s/2). With f16/bf16 the slack is what those dtypes cost: e.g. int4
// from bf16, Δ ≈ 0.1; int8 from bf16 the codes x/s ~ 128 are themselves rounded
// to 8 significant bits, Δ_t reaches ~1 and Δ_c several units — compressed-tensors
// computes in bf16 there, and so must qhead to give the same codes.
//
// The premise of relative-error rounding is that s is a normal number of the
// scale dtype (no subnormal scale); the test asserts it rather than assumes it.
struct ErrorModel {
  bool sym;
  double e_p, delta_c;

  ErrorModel(const QuantScheme& s, DType xt) : sym(s.symmetric) {
    const DType st = s.scale_dtype, pt = xt == st ? xt : DType::kF32;
    const double rx = r_of(xt);
    const double rs = (st == xt) ? 0.0 : r_of(st);
    e_p = (1 + kU32) * (1 + r_of(pt)) - 1;
    if (sym) {
      const double hr = ((1 << s.bits) - 1) / 2.0;
      const double e_s = 1 / ((1 - kU32) * (1 - rx) * (1 - rs)) - 1;
      delta_c = hr * e_s;
    } else {
      const double R = (1 << s.bits) - 1;
      const double e_s = 1 / ((1 - kU32) * (1 - kU32) * (1 - rx) * (1 - rx) * (1 - rs)) - 1;
      const double A = R * (1 + e_s);
      const double d_s = rs / (1 - rs);
      const double e_x = (1 + kU32) * (1 + rx) - 1;
      const double eps_z = A * e_x + ((1 << (s.bits - 1)) + A * (1 + e_x)) * e_x;
      delta_c = R * e_s + A * d_s + 2 * eps_z;
    }
  }
  // Largest allowed |x - ŵ| for element x with stored scale s and zero point z.
  double bound(double x, double s, int z) const {
    const double xs = std::fabs(x / s);
    double dt = xs * e_p;
    if (!sym) dt += (xs * (1 + e_p) + std::abs(z)) * e_p;
    return s * (0.5 + std::max(dt, delta_c)) * (1 + 1e-12);  // 1e-12: this double arithmetic
  }
};

// Smallest normal number of a scale dtype.
double min_normal(DType t) {
  switch (t) {
    case DType::kF16: return std::ldexp(1.0, -14);
    default: return std::ldexp(1.0, -126);
  }
}
float eps_of(DType t) {
  switch (t) {
    case DType::kF16: return std::ldexp(1.0f, -10);
    case DType::kBF16: return std::ldexp(1.0f, -7);
    default: return std::ldexp(1.0f, -23);
  }
}

struct QCase {
  QuantScheme scheme;
  DType xt;
  std::string label() const {
    return scheme.name() + " x:" + qhead::dtype_name(xt) + " s:" + qhead::dtype_name(scheme.scale_dtype);
  }
};

std::vector<QCase> quantize_cases() {
  std::vector<QCase> cases;
  for (int bits : {4, 8})
    for (int group : {32, 64, 128, -1})
      for (bool sym : {true, false})
        for (DType xt : {DType::kF32, DType::kF16, DType::kBF16})
          cases.push_back({QuantScheme{bits, group, sym, xt}, xt});
  // Odd bit widths (codes straddle words) and mixed input / scale dtypes.
  cases.push_back({QuantScheme{3, 32, true, DType::kF32}, DType::kF32});
  cases.push_back({QuantScheme{3, -1, false, DType::kF16}, DType::kF16});
  cases.push_back({QuantScheme{2, 64, false, DType::kBF16}, DType::kBF16});
  cases.push_back({QuantScheme{2, 32, true, DType::kF16}, DType::kF16});
  cases.push_back({QuantScheme{4, 64, true, DType::kF32}, DType::kBF16});   // F32 scale from BF16 input
  cases.push_back({QuantScheme{8, -1, false, DType::kF32}, DType::kBF16});  // F32 scale from BF16 input
  cases.push_back({QuantScheme{4, 32, false, DType::kF16}, DType::kF32});   // F16 scale from F32 input
  cases.push_back({QuantScheme{8, 128, true, DType::kBF16}, DType::kF16});  // BF16 scale from F16 input
  return cases;
}

// Checks every element of a quantized table against the bound; returns the
// number of violations (reporting the first few).
int64_t check_quantized(const Tensor& dense, const PackedTable& p, const QCase& c) {
  const QuantScheme& s = c.scheme;
  const int64_t v = p.vocab, h = p.hidden, g = s.groups(h), gl = s.group_len(h), cols = s.packed_cols(h);
  const ErrorModel model(s, c.xt);
  int64_t bad = 0;
  auto report = [&](const std::string& what) {
    if (bad++ < 5) ADD_FAILURE() << c.label() << ": " << what;
  };
  for (int64_t r = 0; r < v; ++r) {
    const int32_t* row = p.packed.ptr<int32_t>() + r * cols;
    // Padding bits after the last code are zero.
    const int64_t used = h * s.bits - (cols - 1) * 32;
    if (used < 32 && (static_cast<uint32_t>(row[cols - 1]) >> used) != 0) report("nonzero padding bits, row " + std::to_string(r));
    for (int64_t k = 0; k < g; ++k) {
      const double sc = qhead::load_as_f32(p.scale.data(), p.scale.dtype(), r * g + k);
      if (!(std::isfinite(sc) && sc >= min_normal(s.scale_dtype))) {
        report("scale[" + std::to_string(r) + ", " + std::to_string(k) + "] = " + std::to_string(sc) +
               " is not a positive normal number (premise of the bound)");
        continue;
      }
      int z = 0;
      if (!s.symmetric) z = static_cast<int>(stream_code(p.zero_point.ptr<int32_t>() + k, r, s.bits, g)) - s.offset();
      if (z < s.qmin() || z > s.qmax()) report("zero point out of range");
      int64_t jmin = k * gl, jmax = k * gl;
      for (int64_t j = k * gl; j < (k + 1) * gl; ++j) {
        const double x = qhead::load_as_f32(dense.data(), dense.dtype(), r * h + j);
        const int q = static_cast<int>(stream_code(row, j, s.bits)) - s.offset();
        if (q < s.qmin() || q > s.qmax()) report("code out of range");
        const double w_hat = static_cast<double>(q - z) * sc;  // exact in double
        const double err = std::fabs(x - w_hat), lim = model.bound(x, sc, z);
        if (!(err <= lim))
          report("row " + std::to_string(r) + " col " + std::to_string(j) + ": x = " + std::to_string(x) +
                 ", q = " + std::to_string(q) + ", z = " + std::to_string(z) + ", s = " + std::to_string(sc) +
                 ", |x - ŵ| = " + std::to_string(err) + " > bound " + std::to_string(lim) + " (" +
                 std::to_string(err / sc) + " s)");
        const double xmin = qhead::load_as_f32(dense.data(), dense.dtype(), r * h + jmin);
        const double xmax = qhead::load_as_f32(dense.data(), dense.dtype(), r * h + jmax);
        if (x < xmin) jmin = j;
        if (x > xmax) jmax = j;
      }
      // Asymmetric: the extremes of the group are representable within the bound
      // (the zero point places [min, max] inside the code range). Already part of
      // the sweep above; checked by name so a failure says which end is lost.
      if (!s.symmetric) {
        for (int64_t j : {jmin, jmax}) {
          const double x = qhead::load_as_f32(dense.data(), dense.dtype(), r * h + j);
          const int q = static_cast<int>(stream_code(row, j, s.bits)) - s.offset();
          const double err = std::fabs(x - static_cast<double>(q - z) * sc);
          if (!(err <= model.bound(x, sc, z)))
            report(std::string(j == jmin ? "group minimum" : "group maximum") + " not within bound, row " +
                   std::to_string(r) + " group " + std::to_string(k));
        }
      }
    }
  }
  return bad;
}

TEST(QuantizeRtn, ErrorBoundSweep) {
  const auto cases = quantize_cases();
  uint64_t seed = 1;
  int checked = 0;
  for (const auto& c : cases) {
    for (int64_t v : {1, 3, 257}) {
      for (int64_t h : {64, 576}) {
        SCOPED_TRACE(c.label() + " V=" + std::to_string(v) + " H=" + std::to_string(h));
        const Tensor dense = random_table(c.xt, v, h, ++seed);
        if (!c.scheme.per_row() && h % c.scheme.group_size != 0) {
          const std::string msg = expect_error([&] { qhead::quantize_rtn(dense.view(), c.scheme, 0, "tbl"); },
                                               ErrorCode::kInvalidArgument);
          EXPECT_NE(msg.find(std::to_string(h)), std::string::npos) << msg;
          EXPECT_NE(msg.find("tbl"), std::string::npos) << msg;
          continue;
        }
        const PackedTable p = qhead::quantize_rtn(dense.view(), c.scheme, 0, "tbl");
        ASSERT_EQ(p.scheme, c.scheme);
        ASSERT_EQ(p.vocab, v);
        ASSERT_EQ(p.hidden, h);
        ASSERT_EQ(p.packed.shape(), (qhead::Shape{v, c.scheme.packed_cols(h)}));
        ASSERT_EQ(p.scale.shape(), (qhead::Shape{v, c.scheme.groups(h)}));
        ASSERT_EQ(p.scale.dtype(), c.scheme.scale_dtype);
        ASSERT_EQ(p.zero_point.defined(), !c.scheme.symmetric);
        if (!c.scheme.symmetric) {
          ASSERT_EQ(p.zero_point.shape(), (qhead::Shape{(v * c.scheme.bits + 31) / 32, c.scheme.groups(h)}));
        }
        EXPECT_NO_THROW(Table::packed(p, "tbl"));  // the result passes the table's own validation
        EXPECT_EQ(check_quantized(dense, p, c), 0);
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 200);
}

// The symmetric int4 corner spelled out, with values chosen so every step is
// exact: amax = 1.875 gives s = 1.875 / 7.5 = 0.25; +amax maps to 7.5 → clamped
// to 7, an error of exactly s/2; -amax maps to -7.5 → -8 (half to even), also
// s/2 off, on the other side; multiples of s in between are exact.
TEST(QuantizeRtn, SymmetricInt4Extremes) {
  Tensor dense = Tensor::empty(DType::kF32, {2, 32});
  for (int j = 0; j < 32; ++j) {
    dense.ptr<float>()[j] = (j == 5) ? 1.875f : 0.25f * static_cast<float>((j % 7) - 3);
    dense.ptr<float>()[32 + j] = (j == 9) ? -1.875f : 0.25f * static_cast<float>((j % 5) - 2);
  }
  const QuantScheme s{4, 32, true, DType::kF32};
  const PackedTable p = qhead::quantize_rtn(dense.view(), s, 1);
  std::vector<float> w(32);
  p.dequantize_row(0, w.data());
  EXPECT_EQ(p.scale.ptr<float>()[0], 0.25f);
  EXPECT_EQ(qhead::code_at(p.packed.ptr<int32_t>(), 5, 4), 7);
  EXPECT_EQ(1.875f - w[5], 0.125f);
  for (int j = 0; j < 32; ++j)
    if (j != 5) {
      EXPECT_EQ(w[static_cast<size_t>(j)], dense.ptr<float>()[j]) << "multiples of s are exact, col " << j;
    }
  p.dequantize_row(1, w.data());
  EXPECT_EQ(p.scale.ptr<float>()[1], 0.25f);
  EXPECT_EQ(qhead::code_at(p.packed.ptr<int32_t>() + s.packed_cols(32), 9, 4), -8);
  EXPECT_EQ(w[9], -2.0f);
  for (int j = 0; j < 32; ++j)
    if (j != 9) {
      EXPECT_EQ(w[static_cast<size_t>(j)], dense.ptr<float>()[32 + j]) << "col " << j;
    }
}

// Codes round half to even (torch.round), as compressed-tensors does: with
// s = 0.25 exactly, x = 0.125·k lands on k/2, so odd k are exact ties.
TEST(QuantizeRtn, RoundsHalfToEven) {
  Tensor dense = Tensor::empty(DType::kF32, {1, 32});
  const int k[8] = {1, 3, 5, -1, -3, -5, 7, 15};  // x/s = 0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, 7.5
  const int want[8] = {0, 2, 2, 0, -2, -2, 4, 7};  // 7.5 → 8 → clamped to 7 (qmax)
  for (int j = 0; j < 32; ++j) dense.ptr<float>()[j] = j < 8 ? 0.125f * static_cast<float>(k[j]) : 0.0f;
  const PackedTable p = qhead::quantize_rtn(dense.view(), QuantScheme{4, 32, true, DType::kF32}, 1);
  ASSERT_EQ(p.scale.ptr<float>()[0], 0.25f);  // amax 1.875 / 7.5
  for (int j = 0; j < 8; ++j) EXPECT_EQ(qhead::code_at(p.packed.ptr<int32_t>(), j, 4), want[j]) << "x/s = " << k[j] / 2.0;
}

// Codes are computed with the scale as stored (rounded to the scale dtype),
// so that (q - z)·s_stored reproduces x to within s/2: with F32 input and F16
// scales, s_x = 1/7.5 is not an f16 number (s16 = 1092·2^-13 is 0.024% smaller),
// and x = 6.5·s16·(1 + 2^-12) sits just above the 6.5 tie for s16 but just
// below it for s_x. The stored scale gives code 7; the unrounded one would
// give 6, 0.5002·s16 away from x instead of 0.4998·s16.
TEST(QuantizeRtn, CodesUseTheStoredScale) {
  const float s_x = 1.0f / 7.5f;
  const float s16 = qhead::round_through(s_x, DType::kF16);
  const float x = 6.5f * s16 * (1.0f + std::ldexp(1.0f, -12));
  ASSERT_NE(s16, s_x);
  ASSERT_GT(x / s16, 6.5f);  // premises of the construction
  ASSERT_LT(x / s_x, 6.5f);
  Tensor dense = Tensor::empty(DType::kF32, {1, 32});
  for (int j = 0; j < 32; ++j) dense.ptr<float>()[j] = j == 0 ? 1.0f : j == 1 ? x : -0.25f;
  const PackedTable p = qhead::quantize_rtn(dense.view(), QuantScheme{4, 32, true, DType::kF16}, 1);
  EXPECT_EQ(qhead::load_as_f32(p.scale.data(), DType::kF16, 0), s16);
  EXPECT_EQ(qhead::code_at(p.packed.ptr<int32_t>(), 1, 4), 7);
}

// An all-zero row (and an all-zero group inside a non-zero row) dequantizes to
// exact zeros, with the documented scale eps and, asymmetric, z = qmin.
TEST(QuantizeRtn, ZeroRowsAndGroups) {
  for (const char* name : {"w4g32", "w4g32a", "w8", "w8a", "w3g64a", "w2g32"}) {
    for (DType xt : {DType::kF32, DType::kF16, DType::kBF16}) {
      const QuantScheme s = QuantScheme::parse(name, xt);
      SCOPED_TRACE(std::string(name) + " " + qhead::dtype_name(xt));
      Tensor dense = random_table(xt, 4, 128, 99);
      for (int j = 0; j < 128; ++j) qhead::store_from_f32(dense.data(), xt, 1 * 128 + j, 0.0f);  // row 1
      for (int j = 0; j < 32; ++j) qhead::store_from_f32(dense.data(), xt, 3 * 128 + j, 0.0f);   // row 3, group 0
      const PackedTable p = qhead::quantize_rtn(dense.view(), s, 1);
      std::vector<float> w(128);
      p.dequantize_row(1, w.data());
      for (int j = 0; j < 128; ++j) ASSERT_EQ(w[static_cast<size_t>(j)], 0.0f) << "row 1 col " << j;
      EXPECT_EQ(qhead::load_as_f32(p.scale.data(), s.scale_dtype, 1 * s.groups(128)), eps_of(s.scale_dtype));
      if (!s.symmetric) {
        EXPECT_EQ(qhead::zero_point_at(p.zero_point.ptr<int32_t>(), s.groups(128), 1, 0, s.bits), s.qmin());
      }
      if (!s.per_row()) {
        p.dequantize_row(3, w.data());
        for (int j = 0; j < 32; ++j) ASSERT_EQ(w[static_cast<size_t>(j)], 0.0f) << "row 3 col " << j;
        bool nonzero = false;
        for (int j = 32; j < 128; ++j) nonzero |= w[static_cast<size_t>(j)] != 0.0f;
        EXPECT_TRUE(nonzero) << "the rest of row 3 is data";
      }
    }
  }
}

TEST(QuantizeRtn, NonFiniteInputThrowsNamingRow) {
  struct Bad {
    int64_t v, row, col;
    float value;
    int threads;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const Bad& b : {Bad{9, 5, 17, nan, 1}, Bad{9, 2, 0, inf, 1}, Bad{257, 200, 63, -nan, 3},
                       Bad{257, 0, 575, -inf, 2}, Bad{3, 2, 575, nan, 0}}) {
    for (DType xt : {DType::kF32, DType::kBF16}) {
      for (const char* name : {"w4g64", "w8a"}) {
        SCOPED_TRACE(std::string(name) + " row " + std::to_string(b.row));
        Tensor dense = random_table(xt, b.v, 576, 7);
        qhead::store_from_f32(dense.data(), xt, b.row * 576 + b.col, b.value);
        const std::string msg = expect_error(
            [&] { qhead::quantize_rtn(dense.view(), QuantScheme::parse(name, xt), b.threads, "lm_head"); },
            ErrorCode::kInvalidArgument);
        EXPECT_NE(msg.find("row " + std::to_string(b.row)), std::string::npos) << msg;
        EXPECT_NE(msg.find("lm_head"), std::string::npos) << msg;
      }
    }
  }
}

TEST(QuantizeRtn, IdenticalAcrossThreadCounts) {
  for (const char* name : {"w4g64a", "w8g32", "w3g64a", "w4"}) {
    for (DType xt : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(std::string(name) + " " + qhead::dtype_name(xt));
      const QuantScheme s = QuantScheme::parse(name, xt == DType::kF32 ? DType::kF16 : xt);
      const Tensor dense = random_table(xt, 257, 576, 4242);  // 257 rows: 64-row chunks split unevenly
      const PackedTable a = qhead::quantize_rtn(dense.view(), s, 1);
      for (int threads : {2, 3, 0}) {
        const PackedTable b = qhead::quantize_rtn(dense.view(), s, threads);
        ASSERT_EQ(a.packed.nbytes(), b.packed.nbytes());
        EXPECT_EQ(std::memcmp(a.packed.data(), b.packed.data(), a.packed.nbytes()), 0) << "packed, threads " << threads;
        EXPECT_EQ(std::memcmp(a.scale.data(), b.scale.data(), a.scale.nbytes()), 0) << "scale, threads " << threads;
        if (!s.symmetric) {
          EXPECT_EQ(std::memcmp(a.zero_point.data(), b.zero_point.data(), a.zero_point.nbytes()), 0)
              << "zero point, threads " << threads;
        }
      }
    }
  }
}

TEST(QuantizeRtn, ArgumentErrors) {
  const Tensor dense = random_table(DType::kF32, 5, 576, 3);
  const QuantScheme g128 = QuantScheme::parse("w4g128");
  std::string msg = expect_error([&] { qhead::quantize_rtn(dense.view(), g128, 0, "emb"); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("576"), std::string::npos) << msg;
  EXPECT_NE(msg.find("128"), std::string::npos) << msg;

  Tensor ints = Tensor::empty(DType::kI32, {5, 64});
  msg = expect_error([&] { qhead::quantize_rtn(ints.view(), QuantScheme::parse("w4g32"), 0, "emb"); },
                     ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("I32"), std::string::npos) << msg;

  qhead::TensorView flat(dense.data(), DType::kF32, {5 * 576});
  expect_error([&] { qhead::quantize_rtn(flat, QuantScheme::parse("w4g32"), 0, "emb"); }, ErrorCode::kInvalidArgument);

  qhead::TensorView strided(dense.data(), DType::kF32, {5, 64});
  strided.strides = {576, 1};  // every 9th 64-wide block: not contiguous
  msg = expect_error([&] { qhead::quantize_rtn(strided, QuantScheme::parse("w4g32"), 0, "emb"); },
                     ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("contiguous"), std::string::npos) << msg;

  QuantScheme bad{9, 32, true, DType::kF16};
  expect_error([&] { qhead::quantize_rtn(dense.view(), bad, 0, "emb"); }, ErrorCode::kInvalidArgument);
}

// ---- quantize_roles ---------------------------------------------------------------------------

TEST(QuantizeRoles, TiedSharesOneTable) {
  const Table emb = Table::dense(random_table(DType::kBF16, 300, 128, 11));
  const QuantScheme s = QuantScheme::parse("w4g64", DType::kBF16);
  for (int variant = 0; variant < 3; ++variant) {
    SCOPED_TRACE(variant);
    qhead::TokenTables t;
    if (variant == 0) t = qhead::quantize_roles(emb, nullptr, s, s);
    if (variant == 1) t = qhead::quantize_roles(emb, nullptr, std::nullopt, s);  // scheme from the head role
    if (variant == 2) t = qhead::quantize_roles(emb, &emb, s, std::nullopt);     // head is the same storage
    EXPECT_TRUE(t.tied());
    EXPECT_TRUE(t.embedding.same_storage(t.head));
    ASSERT_TRUE(t.embedding.is_packed());
    EXPECT_EQ(t.embedding.packed().scheme, s);
    EXPECT_EQ(&t.embedding.packed(), &t.head.packed()) << "one packed copy";
    // It is the quantization of the embedding.
    const PackedTable want = qhead::quantize_rtn(emb.dense().view(), s, 1);
    EXPECT_EQ(std::memcmp(want.packed.data(), t.embedding.packed().packed.data(), want.packed.nbytes()), 0);
    EXPECT_EQ(std::memcmp(want.scale.data(), t.embedding.packed().scale.data(), want.scale.nbytes()), 0);
  }
  // No scheme at all: both roles are the dense table itself.
  const qhead::TokenTables d = qhead::quantize_roles(emb, nullptr, std::nullopt, std::nullopt);
  EXPECT_TRUE(d.tied());
  EXPECT_FALSE(d.embedding.is_packed());
  EXPECT_TRUE(d.embedding.same_storage(emb));
}

TEST(QuantizeRoles, TiedWithDifferentSchemesThrows) {
  const Table emb = Table::dense(random_table(DType::kF32, 10, 128, 12));
  const QuantScheme a = QuantScheme::parse("w4g64"), b = QuantScheme::parse("w8");
  std::string msg = expect_error([&] { qhead::quantize_roles(emb, nullptr, a, b); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("w4g64"), std::string::npos) << msg;
  EXPECT_NE(msg.find("w8"), std::string::npos) << msg;
  expect_error([&] { qhead::quantize_roles(emb, &emb, a, b); }, ErrorCode::kInvalidArgument);
  // Same name, different scale dtype: still two schemes.
  expect_error([&] { qhead::quantize_roles(emb, nullptr, a, QuantScheme::parse("w4g64", DType::kBF16)); },
               ErrorCode::kInvalidArgument);
}

TEST(QuantizeRoles, UntiedGivesTwoTables) {
  const Table emb = Table::dense(random_table(DType::kF16, 70, 192, 13));
  const Table head = Table::dense(random_table(DType::kF16, 70, 192, 14));
  const QuantScheme se = QuantScheme::parse("w8g64a"), sh = QuantScheme::parse("w4g32");
  const qhead::TokenTables t = qhead::quantize_roles(emb, &head, se, sh);
  EXPECT_FALSE(t.tied());
  EXPECT_FALSE(t.embedding.same_storage(t.head));
  ASSERT_TRUE(t.embedding.is_packed());
  ASSERT_TRUE(t.head.is_packed());
  EXPECT_EQ(t.embedding.packed().scheme, se);
  EXPECT_EQ(t.head.packed().scheme, sh);
  const PackedTable we = qhead::quantize_rtn(emb.dense().view(), se, 1);
  const PackedTable wh = qhead::quantize_rtn(head.dense().view(), sh, 1);
  EXPECT_EQ(std::memcmp(we.packed.data(), t.embedding.packed().packed.data(), we.packed.nbytes()), 0);
  EXPECT_EQ(std::memcmp(wh.packed.data(), t.head.packed().packed.data(), wh.packed.nbytes()), 0);
  // A role without a scheme stays dense (the caller's table).
  const qhead::TokenTables half = qhead::quantize_roles(emb, &head, std::nullopt, sh);
  EXPECT_FALSE(half.tied());
  EXPECT_FALSE(half.embedding.is_packed());
  EXPECT_TRUE(half.embedding.same_storage(emb));
  EXPECT_TRUE(half.head.is_packed());
}

}  // namespace
