// Tests for the pack-quantized bit layout (qhead/table.h: pack_codes,
// unpack_codes, stored_code_at, pack_zero_points, zero_point_at) and for
// QuantScheme (qhead/scheme.h): names, parsing, validation, check_hidden.

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "qhead/error.h"
#include "qhead/scheme.h"
#include "qhead/table.h"
#include "test_util.h"

namespace {

using qhead::DType;
using qhead::ErrorCode;
using qhead::QuantScheme;
using qhead::test::expect_error;
using qhead::test::stream_code;

constexpr int32_t kCanary = static_cast<int32_t>(0xdeadbeefu);

int64_t words_for(int64_t n, int bits) { return (n * bits + 31) / 32; }

std::vector<int8_t> random_codes(int64_t n, int bits, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-(1 << (bits - 1)), (1 << (bits - 1)) - 1);
  std::vector<int8_t> q(static_cast<size_t>(n));
  for (auto& c : q) c = static_cast<int8_t>(d(rng));
  return q;
}

// ---- pack_codes / unpack_codes ---------------------------------------------------

TEST(Pack, RoundTripAllBitWidths) {
  for (int bits = 2; bits <= 8; ++bits) {
    for (int64_t n : {1, 3, 7, 31, 32, 33, 100, 1024}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + ", n " + std::to_string(n));
      const auto q = random_codes(n, bits, static_cast<uint64_t>(bits * 10007 + n));
      const int64_t words = words_for(n, bits);
      // Two canary words on each side catch writes outside [0, words).
      std::vector<int32_t> buf(static_cast<size_t>(words + 4), kCanary);
      int32_t* out = buf.data() + 2;
      qhead::pack_codes(q.data(), n, bits, out);
      EXPECT_EQ(buf[0], kCanary);
      EXPECT_EQ(buf[1], kCanary);
      EXPECT_EQ(buf[static_cast<size_t>(words + 2)], kCanary) << "wrote past ceil(n·b/32) words";
      EXPECT_EQ(buf[static_cast<size_t>(words + 3)], kCanary);
      // Padding bits after the last code are zero (pack_to_int32 pads with zeros).
      const int64_t used = n * bits - (words - 1) * 32;  // bits used in the last word, 1..32
      if (used < 32) {
        const uint32_t last = static_cast<uint32_t>(out[words - 1]);
        EXPECT_EQ(last >> used, 0u) << "padding bits of the last word are not zero";
      }
      std::vector<int8_t> back(static_cast<size_t>(n), 99);
      qhead::unpack_codes(out, n, bits, back.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(back[static_cast<size_t>(i)], q[static_cast<size_t>(i)]) << "code " << i;
        // The layout, read bit by bit independently: code i at stream bit i·b.
        ASSERT_EQ(static_cast<int>(stream_code(out, i, bits)), q[static_cast<size_t>(i)] + (1 << (bits - 1)))
            << "code " << i;
        ASSERT_EQ(static_cast<int>(qhead::stored_code_at(out, i, bits)), q[static_cast<size_t>(i)] + (1 << (bits - 1)));
        ASSERT_EQ(qhead::code_at(out, i, bits), q[static_cast<size_t>(i)]);
      }
    }
  }
}

// Codes -8..7 at 4 bits are stored 0..15, nibble i of the stream = code i,
// low nibble first.
TEST(Pack, ExactLayout4Bit) {
  std::vector<int8_t> q(16);
  for (int i = 0; i < 16; ++i) q[static_cast<size_t>(i)] = static_cast<int8_t>(i - 8);
  int32_t w[2] = {0, 0};
  qhead::pack_codes(q.data(), 16, 4, w);
  EXPECT_EQ(static_cast<uint32_t>(w[0]), 0x76543210u);
  EXPECT_EQ(static_cast<uint32_t>(w[1]), 0xfedcba98u);
  // 9 codes: the second word holds one nibble.
  int32_t w9[2] = {-1, -1};
  qhead::pack_codes(q.data() + 7, 9, 4, w9);  // codes -1..7 → stored 7..15
  EXPECT_EQ(static_cast<uint32_t>(w9[0]), 0xedcba987u);
  EXPECT_EQ(static_cast<uint32_t>(w9[1]), 0x0000000fu);
}

// 8 bits: one byte per code, little-endian within the word.
TEST(Pack, ExactLayout8Bit) {
  const int8_t q[5] = {-128, -1, 0, 127, 5};  // stored 0x00, 0x7f, 0x80, 0xff, 0x85
  int32_t w[2] = {-1, -1};
  qhead::pack_codes(q, 5, 8, w);
  EXPECT_EQ(static_cast<uint32_t>(w[0]), 0xff807f00u);
  EXPECT_EQ(static_cast<uint32_t>(w[1]), 0x00000085u);
}

// 3 bits: code i at stream bits [3i, 3i+3); code 10 occupies bits 30..32, so
// its low two bits end word 0 and its high bit starts word 1.
//   stored s = 0,1,2,3,4,5,6,7,0,1,5 (q = s - 4)
//   word 0 = Σ_{i<10} s_i << 3i  |  (5 & 3) << 30 = 0x48fac688
//   word 1 = 5 >> 2              = 0x1
TEST(Pack, ExactLayout3BitStraddle) {
  const int stored[11] = {0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 5};
  int8_t q[11];
  for (int i = 0; i < 11; ++i) q[i] = static_cast<int8_t>(stored[i] - 4);
  int32_t w[2] = {-1, -1};
  qhead::pack_codes(q, 11, 3, w);
  EXPECT_EQ(static_cast<uint32_t>(w[0]), 0x48fac688u);
  EXPECT_EQ(static_cast<uint32_t>(w[1]), 0x00000001u);
  EXPECT_EQ(qhead::code_at(w, 10, 3), 1);  // 5 - 4, read across the boundary
  // A single straddling code, all others at stored 0.
  int8_t z[11];
  for (auto& c : z) c = -4;
  z[10] = 3;  // stored 7 = 0b111: bits 30, 31 of word 0 and bit 0 of word 1
  qhead::pack_codes(z, 11, 3, w);
  EXPECT_EQ(static_cast<uint32_t>(w[0]), 0xc0000000u);
  EXPECT_EQ(static_cast<uint32_t>(w[1]), 0x00000001u);
}

// 5 bits: code 6 occupies bits 30..34 (2 bits in word 0, 3 in word 1).
TEST(Pack, ExactLayout5BitStraddle) {
  int8_t q[7];
  for (auto& c : q) c = -16;  // stored 0
  q[6] = 15;                  // stored 31 = 0b11111
  int32_t w[2] = {0, 0};
  qhead::pack_codes(q, 7, 5, w);
  EXPECT_EQ(static_cast<uint32_t>(w[0]), 0xc0000000u);
  EXPECT_EQ(static_cast<uint32_t>(w[1]), 0x00000007u);
  EXPECT_EQ(qhead::code_at(w, 6, 5), 15);
}

// ---- zero points: packed along V, per group column -------------------------------------

TEST(Pack, ZeroPointsRoundTrip) {
  struct Case {
    int64_t v, g;
    int bits;
  };
  // V not a multiple of 32/b (4: 8 per word; 8: 4 per word; 3, 5, 6, 7: straddling).
  const Case cases[] = {{1, 1, 4},  {3, 2, 4},  {37, 5, 4},  {9, 1, 2},   {257, 3, 8},
                        {33, 4, 3}, {100, 7, 5}, {65, 2, 6}, {11, 3, 7}, {50, 18, 8}};
  for (const auto& c : cases) {
    SCOPED_TRACE("V " + std::to_string(c.v) + ", G " + std::to_string(c.g) + ", bits " + std::to_string(c.bits));
    std::vector<int8_t> z = random_codes(c.v * c.g, c.bits, static_cast<uint64_t>(c.v * 131 + c.g * 7 + c.bits));
    const int64_t rows = words_for(c.v, c.bits);
    std::vector<int32_t> buf(static_cast<size_t>(rows * c.g + 2), kCanary);
    qhead::pack_zero_points(z.data(), c.v, c.g, c.bits, buf.data());
    EXPECT_EQ(buf[static_cast<size_t>(rows * c.g)], kCanary) << "wrote past [ceil(V·b/32), G]";
    EXPECT_EQ(buf[static_cast<size_t>(rows * c.g + 1)], kCanary);
    for (int64_t r = 0; r < c.v; ++r)
      for (int64_t k = 0; k < c.g; ++k) {
        const int want = z[static_cast<size_t>(r * c.g + k)];
        ASSERT_EQ(qhead::zero_point_at(buf.data(), c.g, r, k, c.bits), want) << "row " << r << " group " << k;
        // Independent read: column k is a bit stream whose words are G apart.
        ASSERT_EQ(static_cast<int>(stream_code(buf.data() + k, r, c.bits, c.g)), want + (1 << (c.bits - 1)));
      }
  }
}

// V = 9, G = 2, 4 bits: column 0 stores r (z = r - 8), column 1 stores 15 - r.
// Word row 0 holds V rows 0..7 of each column, word row 1 holds row 8.
TEST(Pack, ZeroPointsExactLayout) {
  int8_t z[18];
  for (int r = 0; r < 9; ++r) {
    z[r * 2 + 0] = static_cast<int8_t>(r - 8);
    z[r * 2 + 1] = static_cast<int8_t>(15 - r - 8);
  }
  int32_t out[4] = {-1, -1, -1, -1};
  qhead::pack_zero_points(z, 9, 2, 4, out);
  EXPECT_EQ(static_cast<uint32_t>(out[0]), 0x76543210u);  // [0, 0]
  EXPECT_EQ(static_cast<uint32_t>(out[1]), 0x89abcdefu);  // [0, 1]
  EXPECT_EQ(static_cast<uint32_t>(out[2]), 0x00000008u);  // [1, 0]
  EXPECT_EQ(static_cast<uint32_t>(out[3]), 0x00000007u);  // [1, 1]
}

// The tests' own dequantizer (test_util.h, used as the oracle's source of
// weights) reads codes through a 64-bit window; it must agree with the
// bit-by-bit reader above for every bit width, including straddling codes.
TEST(Pack, TestDequantizerAgreesWithBitReader) {
  for (int bits = 2; bits <= 8; ++bits) {
    for (bool sym : {true, false}) {
      const QuantScheme s{bits, bits % 2 ? 32 : -1, sym, DType::kBF16};
      const int64_t v = 13, h = 96;
      const qhead::PackedTable p = qhead::test::random_packed(v, h, s, static_cast<uint64_t>(bits * 2 + sym));
      const int64_t g = s.groups(h), gl = s.group_len(h), cols = s.packed_cols(h);
      std::vector<double> got(static_cast<size_t>(h));
      for (int64_t r = 0; r < v; ++r) {
        qhead::test::dequant_row_expected(p, r, got.data());
        for (int64_t j = 0; j < h; ++j) {
          const int64_t k = j / gl;
          const int q = static_cast<int>(stream_code(p.packed.ptr<int32_t>() + r * cols, j, bits)) - s.offset();
          const int z = sym ? 0 : static_cast<int>(stream_code(p.zero_point.ptr<int32_t>() + k, r, bits, g)) - s.offset();
          const double sc = qhead::load_as_f32(p.scale.data(), DType::kBF16, r * g + k);
          ASSERT_EQ(got[static_cast<size_t>(j)], (q - z) * sc) << "bits " << bits << " row " << r << " col " << j;
        }
      }
    }
  }
}

// ---- QuantScheme -----------------------------------------------------------------------

TEST(Scheme, ParseNameRoundTrip) {
  struct Case {
    const char* name;
    int bits, group;
    bool sym;
  };
  const Case cases[] = {{"w4g64", 4, 64, true},    {"w8", 8, -1, true},      {"w4g128a", 4, 128, false},
                        {"w8g32a", 8, 32, false},  {"w2g256", 2, 256, true}, {"w3g32", 3, 32, true},
                        {"w5a", 5, -1, false},     {"w7g64", 7, 64, true},   {"w6g128a", 6, 128, false}};
  for (const auto& c : cases) {
    for (DType st : {DType::kF16, DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(std::string(c.name) + " / " + qhead::dtype_name(st));
      const QuantScheme s = QuantScheme::parse(c.name, st);
      EXPECT_EQ(s.bits, c.bits);
      EXPECT_EQ(s.group_size, c.group);
      EXPECT_EQ(s.symmetric, c.sym);
      EXPECT_EQ(s.scale_dtype, st);
      EXPECT_EQ(s.name(), c.name);
      EXPECT_EQ(QuantScheme::parse(s.name(), st), s);
    }
  }
  EXPECT_EQ(QuantScheme::parse("w4g64").scale_dtype, DType::kF16) << "default scale dtype";
}

TEST(Scheme, ParseRejectsBadNames) {
  for (const char* bad : {"x4", "w9", "w4g48", "w4g", "w4g64b", "", "w", "w1", "w0g32", "W4g64", "w4 g64",
                          "w4g64aa", "w4a g64", "w4g-64", "w-4", "w4g0", "w4g64 "}) {
    SCOPED_TRACE(std::string("'") + bad + "'");
    const std::string msg = expect_error([&] { QuantScheme::parse(bad); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << "message should quote the name: " << msg;
  }
}

TEST(Scheme, ValidateAndHelpers) {
  QuantScheme s;
  for (int bits : {2, 3, 4, 5, 6, 7, 8}) {
    s.bits = bits;
    EXPECT_NO_THROW(s.validate());
    EXPECT_EQ(s.qmin(), -(1 << (bits - 1)));
    EXPECT_EQ(s.qmax(), (1 << (bits - 1)) - 1);
    EXPECT_EQ(s.offset(), 1 << (bits - 1));
    for (int64_t n : {1, 7, 31, 32, 33, 576, 1000})
      EXPECT_EQ(s.packed_cols(n), (n * bits + 31) / 32) << "bits " << bits << " n " << n;
  }
  s = QuantScheme{};
  for (int bits : {0, 1, 9, 16, -4}) {
    s.bits = bits;
    expect_error([&] { s.validate(); }, ErrorCode::kInvalidArgument);
  }
  s = QuantScheme{};
  for (int g : {0, -2, -64}) {
    s.group_size = g;
    expect_error([&] { s.validate(); }, ErrorCode::kInvalidArgument);
  }
  s = QuantScheme{};
  for (DType t : {DType::kI32, DType::kF64, DType::kU8}) {
    s.scale_dtype = t;
    expect_error([&] { s.validate(); }, ErrorCode::kInvalidArgument);
  }
  s = QuantScheme{4, 64, true, DType::kF16};
  EXPECT_EQ(s.groups(576), 9);
  EXPECT_EQ(s.group_len(576), 64);
  s.group_size = -1;
  EXPECT_EQ(s.groups(576), 1);
  EXPECT_EQ(s.group_len(576), 576);
}

TEST(Scheme, CheckHidden) {
  const QuantScheme g128 = QuantScheme::parse("w4g128");
  EXPECT_NO_THROW(g128.check_hidden(1024, "op", "t"));
  EXPECT_NO_THROW(g128.check_hidden(128, "op", "t"));
  const std::string msg = expect_error([&] { g128.check_hidden(576, "myop", "lm_head"); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("myop"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lm_head"), std::string::npos) << msg;
  EXPECT_NE(msg.find("576"), std::string::npos) << msg;
  EXPECT_NE(msg.find("128"), std::string::npos) << msg;
  expect_error([&] { g128.check_hidden(64, "op", "t"); }, ErrorCode::kInvalidArgument);  // smaller than a group
  expect_error([&] { g128.check_hidden(0, "op", "t"); }, ErrorCode::kInvalidArgument);
  expect_error([&] { g128.check_hidden(-128, "op", "t"); }, ErrorCode::kInvalidArgument);
  const QuantScheme per_row = QuantScheme::parse("w8");
  EXPECT_NO_THROW(per_row.check_hidden(577, "op", "t"));
  EXPECT_NO_THROW(per_row.check_hidden(1, "op", "t"));
  expect_error([&] { per_row.check_hidden(0, "op", "t"); }, ErrorCode::kInvalidArgument);
}

}  // namespace
