// Tests for qhead/dtype.h: the f32 <-> f16 / bf16 conversions every path
// shares. Exhaustive over all 16-bit patterns, exhaustive over every exact
// halfway case, and a million seeded random f32 values against an
// independent reference that picks the nearest representable value by
// enumerating candidates in double arithmetic.

#include "qhead/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace {

using qhead::DType;
using qhead::ErrorCode;
using qhead::test::expect_error;

// ---- independent decoders / encoders (no library code) ------------------------

// Value of an f16 bit pattern, decoded from the IEEE binary16 fields.
double f16_value(uint16_t h) {
  const int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0x1f) v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exp == 0) v = std::ldexp(static_cast<double>(man), -24);  // subnormal: man · 2^-24
  else v = std::ldexp(static_cast<double>(man + 1024), exp - 25);      // (1024 + man) · 2^(e-15-10)
  return sign ? -v : v;
}

// Value of a bf16 bit pattern: the top half of an f32.
double bf16_value(uint16_t b) {
  const int sign = (b >> 15) & 1, exp = (b >> 7) & 0xff, man = b & 0x7f;
  double v;
  if (exp == 0xff) v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exp == 0) v = std::ldexp(static_cast<double>(man), -133);  // man · 2^(-126-7)
  else v = std::ldexp(static_cast<double>(man + 128), exp - 134);     // (128 + man) · 2^(e-127-7)
  return sign ? -v : v;
}

// Round-to-nearest-even of a finite, non-NaN double into a 16-bit format,
// by bisection over the ordered positive patterns [0, inf_pattern]. The
// pattern inf_pattern stands for the value `overflow_value` (2^16 for f16,
// 2^128 for bf16): IEEE rounds to Inf exactly when the value would round to
// the (unbounded-exponent) number one ulp above the largest finite one, so
// treating Inf as that number gives the overflow threshold and its tie
// (65520 → Inf, since 65504's mantissa is odd) for free.
template <class Decode>
uint16_t nearest_even(double x, uint16_t inf_pattern, double overflow_value, Decode decode) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  auto val = [&](uint32_t p) { return p == inf_pattern ? overflow_value : decode(static_cast<uint16_t>(p)); };
  if (a >= overflow_value) return sign | inf_pattern;
  // Largest pattern lo with val(lo) <= a.
  uint32_t lo = 0, hi = inf_pattern;  // val(lo) <= a < val(hi)
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (val(mid) <= a ? lo : hi) = mid;
  }
  if (val(lo) == a) return static_cast<uint16_t>(sign | lo);
  const double dlo = a - val(lo), dhi = val(hi) - a;
  uint32_t pick;
  if (dlo < dhi) pick = lo;
  else if (dhi < dlo) pick = hi;
  else pick = (lo & 1u) ? hi : lo;  // tie: even mantissa (last bit of the pattern)
  return static_cast<uint16_t>(sign | pick);
}

uint16_t ref_f16(float f) { return nearest_even(f, 0x7c00, 65536.0, f16_value); }
uint16_t ref_bf16(float f) { return nearest_even(f, 0x7f80, std::ldexp(1.0, 128), bf16_value); }

bool f16_is_nan(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool bf16_is_nan(uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

float from_bits(uint32_t b) { return qhead::bits_to_f32(b); }

// ---- widening: every 16-bit pattern --------------------------------------------------

TEST(DType, F16ToF32ExhaustiveMatchesFieldDecode) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const auto h = static_cast<uint16_t>(p);
    const float f = qhead::f16_to_f32(h);
    const double want = f16_value(h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << "pattern 0x" << std::hex << p;
      ASSERT_EQ(std::signbit(f), (p & 0x8000) != 0) << "NaN sign, pattern 0x" << std::hex << p;
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << "pattern 0x" << std::hex << p;
      ASSERT_EQ(std::signbit(f), (p & 0x8000) != 0) << "sign (incl. -0), pattern 0x" << std::hex << p;
    }
  }
}

TEST(DType, BF16ToF32ExhaustiveMatchesFieldDecode) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const auto b = static_cast<uint16_t>(p);
    const float f = qhead::bf16_to_f32(b);
    const double want = bf16_value(b);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(f)) << "pattern 0x" << std::hex << p;
      ASSERT_EQ(std::signbit(f), (p & 0x8000) != 0) << "pattern 0x" << std::hex << p;
    } else {
      ASSERT_EQ(static_cast<double>(f), want) << "pattern 0x" << std::hex << p;
      ASSERT_EQ(std::signbit(f), (p & 0x8000) != 0) << "pattern 0x" << std::hex << p;
    }
  }
}

// ---- round trips: every 16-bit pattern ------------------------------------------------

TEST(DType, F16RoundTripExhaustive) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const auto h = static_cast<uint16_t>(p);
    const uint16_t back = qhead::f32_to_f16(qhead::f16_to_f32(h));
    if (f16_is_nan(h)) {
      // NaN stays a NaN, sign kept, and quiet (bit 9 set).
      ASSERT_TRUE(f16_is_nan(back)) << std::hex << p << " -> " << back;
      ASSERT_EQ(back & 0x8000, h & 0x8000) << std::hex << p;
      ASSERT_NE(back & 0x0200, 0) << "NaN not quiet: " << std::hex << p << " -> " << back;
    } else {
      ASSERT_EQ(back, h) << "pattern 0x" << std::hex << p;
    }
  }
}

TEST(DType, BF16RoundTripExhaustive) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const auto b = static_cast<uint16_t>(p);
    const uint16_t back = qhead::f32_to_bf16(qhead::bf16_to_f32(b));
    if (bf16_is_nan(b)) {
      ASSERT_TRUE(bf16_is_nan(back)) << std::hex << p << " -> " << back;
      ASSERT_EQ(back & 0x8000, b & 0x8000) << std::hex << p;
      ASSERT_NE(back & 0x0040, 0) << "NaN not quiet: " << std::hex << p << " -> " << back;
    } else {
      ASSERT_EQ(back, b) << "pattern 0x" << std::hex << p;
    }
  }
}

// ---- ties: every exact halfway point ---------------------------------------------------

// For every pair of consecutive non-negative f16 values (a, b) — subnormal,
// normal, and the last pair (65504, Inf ≙ 65536) — the midpoint (a + b) / 2
// is exact in f32 (12 significant bits) and must round to whichever of a, b
// has an even mantissa; the midpoint nudged by one f32 ulp must go to the
// nearer one. Both signs.
TEST(DType, F16TiesToEvenExhaustive) {
  for (uint32_t p = 0; p < 0x7c00; ++p) {
    const uint32_t q = p + 1;
    const double a = f16_value(static_cast<uint16_t>(p));
    const double b = q == 0x7c00 ? 65536.0 : f16_value(static_cast<uint16_t>(q));
    const float mid = static_cast<float>((a + b) / 2);
    ASSERT_EQ(static_cast<double>(mid), (a + b) / 2) << "midpoint not exact in f32";
    const uint32_t even = (p & 1u) ? q : p;
    for (int s = 0; s < 2; ++s) {
      const float m = s ? -mid : mid;
      const uint16_t sb = s ? 0x8000 : 0;
      ASSERT_EQ(qhead::f32_to_f16(m), sb | even) << "tie between 0x" << std::hex << p << " and 0x" << q;
      const float below = std::nextafter(m, 0.0f), above = std::nextafter(m, s ? -INFINITY : INFINITY);
      ASSERT_EQ(qhead::f32_to_f16(below), sb | p) << "just below midpoint of 0x" << std::hex << p;
      ASSERT_EQ(qhead::f32_to_f16(above), sb | q) << "just above midpoint of 0x" << std::hex << p;
    }
  }
}

// The same for bf16: the midpoint of consecutive bf16 patterns p, p+1 is the
// f32 with bits (p << 16) | 0x8000, including the last pair (max, Inf).
TEST(DType, BF16TiesToEvenExhaustive) {
  for (uint32_t p = 0; p < 0x7f80; ++p) {
    const uint32_t q = p + 1;
    const uint32_t even = (p & 1u) ? q : p;
    for (uint32_t s = 0; s < 2; ++s) {
      const uint32_t sb = s << 15;
      const uint32_t mid_bits = (s << 31) | (p << 16) | 0x8000u;
      ASSERT_EQ(qhead::f32_to_bf16(from_bits(mid_bits)), sb | even) << "tie above 0x" << std::hex << p;
      ASSERT_EQ(qhead::f32_to_bf16(from_bits(mid_bits - 1)), sb | p) << "below midpoint, 0x" << std::hex << p;
      ASSERT_EQ(qhead::f32_to_bf16(from_bits(mid_bits + 1)), sb | q) << "above midpoint, 0x" << std::hex << p;
    }
  }
}

// Named boundary cases, spelled out so a failure reads directly.
TEST(DType, F16Boundaries) {
  using qhead::f32_to_f16;
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);                             // largest finite
  EXPECT_EQ(f32_to_f16(65519.99609375f), 0x7bff);                      // just below the tie
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                             // tie, 0x7bff odd → Inf
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xfc00);
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7c00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xfc00);
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  const float tiny = std::ldexp(1.0f, -24);                            // smallest subnormal
  EXPECT_EQ(f32_to_f16(tiny), 0x0001);
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);                // tie 0 / tiny → 0 (even)
  EXPECT_EQ(f32_to_f16(std::nextafter(std::ldexp(1.0f, -25), 1.0f)), 0x0001);
  EXPECT_EQ(f32_to_f16(-std::ldexp(1.0f, -25)), 0x8000);               // -0 keeps its sign
  EXPECT_EQ(f32_to_f16(3 * std::ldexp(1.0f, -25)), 0x0002);            // tie 1 / 2 → 2
  EXPECT_EQ(f32_to_f16(5 * std::ldexp(1.0f, -25)), 0x0002);            // tie 2 / 3 → 2
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -14)), 0x0400);                // smallest normal
  EXPECT_EQ(f32_to_f16(std::ldexp(1023.5f, -24)), 0x0400);             // tie 0x3ff / 0x400 → 0x400
  EXPECT_EQ(f32_to_f16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);         // tie → even (1.0)
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);     // tie → even (1 + 2^-9)
}

TEST(DType, NaNAndInfKeepSign) {
  const float qnan = std::numeric_limits<float>::quiet_NaN();
  const float neg_nan = -qnan;
  const float snan = from_bits(0x7f800001u);                // signalling, payload only in low bits
  const float neg_snan = from_bits(0xff800001u);
  for (float f : {qnan, neg_nan, snan, neg_snan, from_bits(0x7fffffffu), from_bits(0xffc00000u)}) {
    const bool neg = std::signbit(f);
    const uint16_t h = qhead::f32_to_f16(f), b = qhead::f32_to_bf16(f);
    EXPECT_TRUE(f16_is_nan(h)) << std::hex << qhead::f32_to_bits(f) << " -> " << h;
    EXPECT_TRUE(bf16_is_nan(b)) << std::hex << qhead::f32_to_bits(f) << " -> " << b;
    EXPECT_EQ((h & 0x8000) != 0, neg);
    EXPECT_EQ((b & 0x8000) != 0, neg);
    EXPECT_NE(h & 0x0200, 0) << "f16 NaN must be quiet";
    EXPECT_NE(b & 0x0040, 0) << "bf16 NaN must be quiet";
    EXPECT_TRUE(std::isnan(qhead::round_through(f, DType::kF16)));
    EXPECT_TRUE(std::isnan(qhead::round_through(f, DType::kBF16)));
  }
  EXPECT_EQ(qhead::f32_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(qhead::f32_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(qhead::f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // rounds past the max
  EXPECT_EQ(qhead::f32_to_bf16(from_bits(0x7f7f7fffu)), 0x7f7f);            // just below the tie
  EXPECT_EQ(qhead::f32_to_bf16(-0.0f), 0x8000);
}

// ---- a million random values against the enumerating reference ---------------------

// Seeded f32 inputs: 3/4 with exponents spread over the f16 range and beyond
// (2^-27 .. 2^17, so subnormal f16 results, normals and overflow all occur),
// 1/4 fully random bit patterns (every f32 class, NaN included).
std::vector<float> random_f32_inputs(uint64_t seed, int n, int min_exp, int max_exp) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> e(min_exp, max_exp);
  std::vector<float> out(static_cast<size_t>(n));
  for (auto& f : out) {
    const uint64_t r = rng();
    if (r % 4 == 0) {
      f = from_bits(static_cast<uint32_t>(r >> 32));
    } else {
      const float mant = 1.0f + static_cast<float>((r >> 8) & 0x7fffff) * std::ldexp(1.0f, -23);
      f = std::ldexp(mant, e(rng)) * ((r >> 40) & 1 ? -1.0f : 1.0f);
    }
  }
  return out;
}

TEST(DType, F32ToF16RandomMatchesReference) {
  const auto xs = random_f32_inputs(0xf16, 1000000, -27, 17);
  int64_t bad = 0;
  for (float f : xs) {
    const uint16_t got = qhead::f32_to_f16(f);
    if (std::isnan(f)) {
      if (!f16_is_nan(got) || ((got & 0x8000) != 0) != std::signbit(f)) ++bad;
      continue;
    }
    const uint16_t want = ref_f16(f);
    if (got != want && bad++ < 5)
      ADD_FAILURE() << "f32_to_f16(" << f << " = 0x" << std::hex << qhead::f32_to_bits(f) << ") = 0x" << got
                    << ", nearest-even is 0x" << want;
  }
  EXPECT_EQ(bad, 0);
}

TEST(DType, F32ToBF16RandomMatchesReference) {
  // bf16 shares f32's exponent range: cover it all, subnormals included.
  const auto xs = random_f32_inputs(0xbf16, 1000000, -140, 127);
  int64_t bad = 0;
  for (float f : xs) {
    const uint16_t got = qhead::f32_to_bf16(f);
    if (std::isnan(f)) {
      if (!bf16_is_nan(got) || ((got & 0x8000) != 0) != std::signbit(f)) ++bad;
      continue;
    }
    const uint16_t want = ref_bf16(f);
    if (got != want && bad++ < 5)
      ADD_FAILURE() << "f32_to_bf16(" << f << " = 0x" << std::hex << qhead::f32_to_bits(f) << ") = 0x" << got
                    << ", nearest-even is 0x" << want;
  }
  EXPECT_EQ(bad, 0);
}

// ---- convert() and the element accessors ---------------------------------------------------

TEST(DType, ConvertMatchesScalarConversions) {
  const auto xs = random_f32_inputs(0xc0, 4099, -20, 10);
  const int64_t n = static_cast<int64_t>(xs.size());
  std::vector<uint16_t> h(xs.size()), b(xs.size()), hb(xs.size()), bh(xs.size());
  std::vector<float> hf(xs.size()), bf(xs.size()), ff(xs.size());
  qhead::convert(xs.data(), DType::kF32, h.data(), DType::kF16, n);
  qhead::convert(xs.data(), DType::kF32, b.data(), DType::kBF16, n);
  qhead::convert(h.data(), DType::kF16, hf.data(), DType::kF32, n);
  qhead::convert(b.data(), DType::kBF16, bf.data(), DType::kF32, n);
  qhead::convert(h.data(), DType::kF16, hb.data(), DType::kBF16, n);
  qhead::convert(b.data(), DType::kBF16, bh.data(), DType::kF16, n);
  qhead::convert(xs.data(), DType::kF32, ff.data(), DType::kF32, n);
  for (size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    ASSERT_EQ(h[i], qhead::f32_to_f16(x)) << i;
    ASSERT_EQ(b[i], qhead::f32_to_bf16(x)) << i;
    ASSERT_EQ(qhead::f32_to_bits(hf[i]), qhead::f32_to_bits(qhead::f16_to_f32(h[i]))) << i;
    ASSERT_EQ(qhead::f32_to_bits(bf[i]), qhead::f32_to_bits(qhead::bf16_to_f32(b[i]))) << i;
    // f16 → bf16 widens exactly to f32 first, then rounds once.
    ASSERT_EQ(hb[i], qhead::f32_to_bf16(qhead::f16_to_f32(h[i]))) << i;
    ASSERT_EQ(bh[i], qhead::f32_to_f16(qhead::bf16_to_f32(b[i]))) << i;
    ASSERT_EQ(qhead::f32_to_bits(ff[i]), qhead::f32_to_bits(x)) << i;
    // round_through / load / store agree with the scalar functions.
    ASSERT_EQ(qhead::f32_to_bits(qhead::round_through(x, DType::kF16)), qhead::f32_to_bits(hf[i])) << i;
    ASSERT_EQ(qhead::f32_to_bits(qhead::round_through(x, DType::kBF16)), qhead::f32_to_bits(bf[i])) << i;
    ASSERT_EQ(qhead::f32_to_bits(qhead::load_as_f32(h.data(), DType::kF16, static_cast<int64_t>(i))),
              qhead::f32_to_bits(hf[i]));
  }
  uint16_t st[3] = {0, 0, 0};
  qhead::store_from_f32(st, DType::kF16, 1, 1.5f);
  qhead::store_from_f32(st, DType::kBF16, 2, -2.0f);
  EXPECT_EQ(st[0], 0);
  EXPECT_EQ(st[1], 0x3e00);
  EXPECT_EQ(st[2], 0xc000);
}

TEST(DType, ConvertRejectsNonFloatDtypes) {
  int32_t src[4] = {1, 2, 3, 4};
  float dst[4] = {0, 0, 0, 0};
  for (DType bad : {DType::kI32, DType::kI64, DType::kI8, DType::kU8, DType::kBool, DType::kF64,
                    DType::kF8E4M3, DType::kF8E5M2}) {
    SCOPED_TRACE(qhead::dtype_name(bad));
    const std::string m1 =
        expect_error([&] { qhead::convert(src, bad, dst, DType::kF32, 4); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(m1.find(qhead::dtype_name(bad)), std::string::npos) << m1;
    expect_error([&] { qhead::convert(dst, DType::kF32, src, bad, 1); }, ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(dst[0], 0.0f) << "nothing written on error";
}

TEST(DType, NamesSizesAndParse) {
  struct Row {
    DType t;
    const char* name;
    size_t size;
  };
  const Row rows[] = {{DType::kF64, "F64", 8},  {DType::kF32, "F32", 4},          {DType::kF16, "F16", 2},
                      {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8},          {DType::kI32, "I32", 4},
                      {DType::kI16, "I16", 2},  {DType::kI8, "I8", 1},            {DType::kU64, "U64", 8},
                      {DType::kU32, "U32", 4},  {DType::kU16, "U16", 2},          {DType::kU8, "U8", 1},
                      {DType::kBool, "BOOL", 1}, {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1}};
  for (const auto& r : rows) {
    EXPECT_STREQ(qhead::dtype_name(r.t), r.name);
    EXPECT_EQ(qhead::dtype_size(r.t), r.size) << r.name;
    ASSERT_TRUE(qhead::parse_dtype(r.name).has_value()) << r.name;
    EXPECT_EQ(*qhead::parse_dtype(r.name), r.t) << r.name;
    EXPECT_EQ(qhead::is_float_dtype(r.t), r.t == DType::kF32 || r.t == DType::kF16 || r.t == DType::kBF16);
  }
  EXPECT_FALSE(qhead::parse_dtype("f32").has_value());
  EXPECT_FALSE(qhead::parse_dtype("").has_value());
  EXPECT_FALSE(qhead::parse_dtype("F32 ").has_value());
}

}  // namespace
