// Shared helpers of the unit tests: seeded random tables and activations, an
// independent dequantizer, the float64 oracle of a dot product with its
// rounding-error bound, NaN poisoning, and an error-code matcher.
//
// Everything here is deliberately independent of the code under test where
// it can be: the dequantizer reads codes with its own bit arithmetic, and the
// oracle accumulates in double.
#pragma once

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "qhead/dtype.h"
#include "qhead/error.h"
#include "qhead/scheme.h"
#include "qhead/table.h"
#include "qhead/tensor.h"

namespace qhead::test {

using Rng = std::mt19937_64;

// Unit roundoff u = 2^-p of a float dtype with p significant bits: the
// largest relative error of one round-to-nearest into that dtype.
inline double unit_roundoff(DType t) {
  switch (t) {
    case DType::kF16: return std::ldexp(1.0, -11);
    case DType::kBF16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}
constexpr double kU32 = 5.9604644775390625e-08;   // 2^-24
constexpr double kU64 = 1.1102230246251565e-16;   // 2^-53

// Higham's γ_n = n·u / (1 - n·u): |fl(Σ_j a_j b_j) - Σ_j a_j b_j| <= γ_n Σ_j |a_j b_j|
// for any summation order (recursive, pairwise, blocked, with or without FMA).
inline double gamma_n(int64_t n, double u) {
  const double nu = static_cast<double>(n) * u;
  return nu / (1.0 - nu);
}

// ---- random data --------------------------------------------------------------

// A contiguous [rows, cols] tensor of dtype t with values uniform in [lo, hi),
// rounded into t. Seeded; never all zeros.
inline Tensor random_tensor(DType t, int64_t rows, int64_t cols, uint64_t seed, double lo = -1.0,
                            double hi = 1.0) {
  Tensor out = Tensor::empty(t, {rows, cols});
  Rng rng(seed);
  std::uniform_real_distribution<float> dist(static_cast<float>(lo), static_cast<float>(hi));
  const int64_t n = rows * cols;
  for (int64_t i = 0; i < n; ++i) store_from_f32(out.data(), t, i, dist(rng));
  return out;
}

// All elements of a float tensor as f32 (exact: f16/bf16 widen exactly).
inline std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); ++i) out[static_cast<size_t>(i)] = load_as_f32(v.data, v.dtype, i);
  return out;
}

// A random packed table built directly from random codes, scales and zero
// points (every bit pattern of a code is a valid code, so this covers the
// whole code range). Scales are positive, in [2^-6, 2^-4), rounded into the
// scale dtype; they are normal numbers in every scale dtype. Padding bits of
// the last word of a row are zero, as pack_codes writes them.
inline PackedTable random_packed(int64_t v, int64_t h, const QuantScheme& s, uint64_t seed) {
  PackedTable p;
  p.scheme = s;
  p.vocab = v;
  p.hidden = h;
  const int64_t cols = s.packed_cols(h), g = s.groups(h);
  p.packed = Tensor::empty(DType::kI32, {v, cols});
  p.scale = Tensor::empty(s.scale_dtype, {v, g});
  Rng rng(seed);
  auto* w = p.packed.ptr<uint32_t>();
  const int64_t tail_bits = (h * s.bits) % 32;
  const uint32_t tail_mask = tail_bits == 0 ? 0xffffffffu : ((1u << tail_bits) - 1u);
  for (int64_t r = 0; r < v; ++r) {
    for (int64_t c = 0; c < cols; ++c) w[r * cols + c] = static_cast<uint32_t>(rng());
    w[r * cols + cols - 1] &= tail_mask;
  }
  std::uniform_real_distribution<float> sd(1.0f / 64, 1.0f / 16);
  for (int64_t i = 0; i < v * g; ++i) store_from_f32(p.scale.data(), s.scale_dtype, i, sd(rng));
  if (!s.symmetric) {
    std::vector<int8_t> z(static_cast<size_t>(v * g));
    std::uniform_int_distribution<int> zd(s.qmin(), s.qmax());
    for (auto& zi : z) zi = static_cast<int8_t>(zd(rng));
    p.zero_point = Tensor::empty(DType::kI32, {(v * s.bits + 31) / 32, g});
    pack_zero_points(z.data(), v, g, s.bits, p.zero_point.ptr<int32_t>());
  }
  return p;
}

// ---- an independent dequantizer -------------------------------------------------

// Stored code i (0 .. 2^b - 1) of a bit stream whose consecutive 32-bit words
// are `stride` words apart, read bit by bit (no shared code with the library).
inline uint32_t stream_code(const int32_t* words, int64_t i, int bits, int64_t stride = 1) {
  uint32_t code = 0;
  for (int b = 0; b < bits; ++b) {
    const int64_t bit = i * bits + b;
    const uint32_t word = static_cast<uint32_t>(words[(bit / 32) * stride]);
    code |= ((word >> (bit % 32)) & 1u) << b;
  }
  return code;
}

// Row v of a packed table, dequantized as the library contract says:
// w = (q - z) · s. (q - z) is an integer of at most 9 bits and s has at most
// 24 significant bits, so the double product is exact; rounding it once to
// f32 gives exactly what a correctly rounded f32 multiply gives.
// Codes are read through a 64-bit window over the row's little-endian bit
// stream (the layout stream_code() reads bit by bit; Pack.TestDequantizer-
// AgreesWithBitReader checks the two agree).
inline void dequant_row_expected(const PackedTable& p, int64_t v, double* out) {
  const QuantScheme& s = p.scheme;
  const int64_t cols = s.packed_cols(p.hidden), g = s.groups(p.hidden), gl = s.group_len(p.hidden);
  const auto* row = reinterpret_cast<const uint32_t*>(p.packed.ptr<int32_t>() + v * cols);
  const uint64_t mask = (uint64_t{1} << s.bits) - 1;
  for (int64_t k = 0; k < g; ++k) {
    const double sc = load_as_f32(p.scale.data(), p.scale.dtype(), v * g + k);
    int z = 0;
    if (!s.symmetric)
      z = static_cast<int>(stream_code(p.zero_point.ptr<int32_t>() + k, v, s.bits, g)) - s.offset();
    for (int64_t j = k * gl; j < (k + 1) * gl; ++j) {
      const int64_t bit = j * s.bits, word = bit / 32;
      uint64_t window = row[word];
      if (word + 1 < cols) window |= static_cast<uint64_t>(row[word + 1]) << 32;
      const int q = static_cast<int>((window >> (bit % 32)) & mask) - s.offset();
      out[j] = static_cast<double>(q - z) * sc;
    }
  }
}

// ---- the float64 oracle ------------------------------------------------------------

// A row dot product in double plus Σ|a_j b_j|, the quantity error bounds scale with.
struct Dot {
  double value = 0.0;
  double abs_sum = 0.0;
};
inline Dot dot_f64(const float* a, const float* b, int64_t n) {
  // Four partial sums only to keep the oracle fast (they vectorize); its own
  // error is covered by the γ_n(2^-53) term of logit_tol().
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0, t0 = 0, t1 = 0, t2 = 0, t3 = 0;
  const int64_t n4 = n - n % 4;
  for (int64_t j = 0; j < n4; j += 4) {
    const double p0 = static_cast<double>(a[j]) * b[j], p1 = static_cast<double>(a[j + 1]) * b[j + 1];
    const double p2 = static_cast<double>(a[j + 2]) * b[j + 2], p3 = static_cast<double>(a[j + 3]) * b[j + 3];
    s0 += p0;
    s1 += p1;
    s2 += p2;
    s3 += p3;
    t0 += std::fabs(p0);
    t1 += std::fabs(p1);
    t2 += std::fabs(p2);
    t3 += std::fabs(p3);
  }
  for (int64_t j = n4; j < n; ++j) {
    const double p = static_cast<double>(a[j]) * b[j];
    s0 += p;
    t0 += std::fabs(p);
  }
  return {(s0 + s1) + (s2 + s3), (t0 + t1) + (t2 + t3)};
}

// The error model of a computed logit, a length-H dot product x·w of f32
// operands (f16/bf16 activations widen exactly; w the dequantized row):
//   |computed - oracle| <= (γ_{H + extra_adds}(u_add) + u_weights + γ_{H + 4}(2^-53)) · Σ_j |x_j w_j| + floor
//   - γ_{H + extra_adds}(u_add): the accumulation, any order (Higham §3.1), with
//     unit roundoff u_add per addition and extra_adds additions beyond the H
//     products' (the CUDA kernels add `groups` scaled partial sums and one more);
//   - u_weights: each weight rounded once before the products (the cuBLAS
//     fallback dequantizes into the activation dtype);
//   - γ_{H + 4}(2^-53): the oracle's own double error (≈ 1e-13 relative; listed
//     for honesty);
//   - floor: an absolute floor, for bounds that may be 0.
// Each test file derives its own parameters in its header comment.
struct LogitBound {
  double u_add = kU32;
  int64_t extra_adds = 0;
  double u_weights = 0.0;
  double floor = 0.0;

  double tol(const Dot& d, int64_t h) const {
    return (gamma_n(h + extra_adds, u_add) + u_weights + gamma_n(h + 4, kU64)) * d.abs_sum + floor;
  }
};

// Bound on |computed f32 dot - oracle| for a length-h dot product accumulated
// in f32 with round-to-nearest (the CPU paths): γ_h(2^-24) · Σ|x_j w_j| plus
// the oracle's own error. The products x_j·w_j are of f32 inputs, so the
// oracle sees the same operands as the code under test; nothing else enters.
inline double logit_tol(const Dot& d, int64_t h) { return LogitBound{}.tol(d, h); }

// Row v of any host table as f32, computed independently of Table::row_f32:
// for a packed table with the dequantizer above, rounded once to f32 (exact:
// (q - z)·s has at most 24 significant bits); for a dense one by widening the
// stored element.
inline void expected_row(const Table& t, int64_t v, float* out) {
  const int64_t h = t.hidden();
  if (t.is_packed()) {
    std::vector<double> d(static_cast<size_t>(h));
    dequant_row_expected(t.packed(), v, d.data());
    for (int64_t j = 0; j < h; ++j) out[j] = static_cast<float>(d[static_cast<size_t>(j)]);  // one rounding
  } else {
    const Tensor& w = t.dense();
    for (int64_t j = 0; j < h; ++j) out[j] = load_as_f32(w.data(), w.dtype(), v * h + j);
  }
}

// The float64 oracle: the logits of rows `rows` of a host table for every
// activation row, with the bound of each under a LogitBound.
struct Oracle {
  int64_t m = 0;               // activation rows
  std::vector<int64_t> rows;   // the table rows, in order
  std::vector<double> value;   // [m, rows.size()]
  std::vector<double> tol;     // [m, rows.size()]

  // Index of (activation row mi, position ri in `rows`).
  size_t at(int64_t mi, int64_t ri) const {
    return static_cast<size_t>(mi) * rows.size() + static_cast<size_t>(ri);
  }
  double val(int64_t mi, int64_t ri) const { return value[at(mi, ri)]; }
  double tl(int64_t mi, int64_t ri) const { return tol[at(mi, ri)]; }
  double max_tol(int64_t mi) const {
    return *std::max_element(tol.begin() + static_cast<std::ptrdiff_t>(at(mi, 0)),
                             tol.begin() + static_cast<std::ptrdiff_t>(at(mi + 1, 0)));
  }
};

// Every row 0 .. V-1 of the table.
inline std::vector<int64_t> all_rows(int64_t v) {
  std::vector<int64_t> r(static_cast<size_t>(v));
  for (int64_t i = 0; i < v; ++i) r[static_cast<size_t>(i)] = i;
  return r;
}

// Dots of R activation rows a[0..R) with one weight row w, all in double,
// each row in two independent partial sums per lane pair (they vectorize, and
// w is loaded once for all R rows; the bound's γ_{H + 4}(2^-53) covers any
// summation order).
template <int R>
inline void dots_f64(const double* const* a, const double* w, int64_t n, Dot* d) {
  double s[R][2] = {}, t[R][2] = {};
  const int64_t n2 = n - n % 2;
  for (int64_t j = 0; j < n2; j += 2)
    for (int r = 0; r < R; ++r)
      for (int l = 0; l < 2; ++l) {
        const double p = a[r][j + l] * w[j + l];
        s[r][l] += p;
        t[r][l] += std::fabs(p);
      }
  for (int r = 0; r < R; ++r) {
    if (n2 < n) {
      const double p = a[r][n2] * w[n2];
      s[r][0] += p;
      t[r][0] += std::fabs(p);
    }
    d[r] = {s[r][0] + s[r][1], t[r][0] + t[r][1]};
  }
}

// x: [m, H] activations as f32 (what every op sees after the exact widening).
inline Oracle make_oracle(const Table& t, const float* x, int64_t m, std::vector<int64_t> rows,
                          const LogitBound& bound) {
  Oracle o;
  o.m = m;
  o.rows = std::move(rows);
  const int64_t h = t.hidden(), n = static_cast<int64_t>(o.rows.size());
  o.value.resize(static_cast<size_t>(m) * o.rows.size());
  o.tol.resize(o.value.size());
  const std::vector<double> xd(x, x + m * h);  // exact
  auto part = [&](int64_t begin, int64_t end) {
    std::vector<float> w(static_cast<size_t>(h));
    std::vector<double> wd(static_cast<size_t>(h));
    for (int64_t ri = begin; ri < end; ++ri) {
      expected_row(t, o.rows[static_cast<size_t>(ri)], w.data());
      std::copy(w.begin(), w.end(), wd.begin());  // exact
      for (int64_t mi = 0; mi < m; mi += 4) {
        const double* a[4];
        for (int r = 0; r < 4; ++r) a[r] = xd.data() + std::min<int64_t>(mi + r, m - 1) * h;  // the last rows repeat
        Dot d[4];
        dots_f64<4>(a, wd.data(), h, d);
        for (int64_t r = 0; r < 4 && mi + r < m; ++r) {
          o.value[o.at(mi + r, ri)] = d[r].value;
          o.tol[o.at(mi + r, ri)] = bound.tol(d[r], h);
        }
      }
    }
  };
  part(0, n);
  return o;
}

// An ids tensor (I32 or I64) on the host from a list.
inline Tensor make_ids(const std::vector<int64_t>& v, DType t) {
  Tensor ids = Tensor::empty(t, {static_cast<int64_t>(v.size())});
  for (size_t i = 0; i < v.size(); ++i) {
    if (t == DType::kI64) ids.ptr<int64_t>()[i] = v[i];
    else ids.ptr<int32_t>()[i] = static_cast<int32_t>(v[i]);
  }
  return ids;
}

// The same dtype, shape and bytes.
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// Runs body(u, r) for r in [0, rounds) on each of `threads` threads u at
// once (the ops' thread-safety tests), then joins them.
template <class Body>
void run_concurrently(int threads, int rounds, Body&& body) {
  std::vector<std::thread> users;
  for (int u = 0; u < threads; ++u)
    users.emplace_back([&body, u, rounds] {
      for (int r = 0; r < rounds; ++r) body(u, r);
    });
  for (auto& th : users) th.join();
}

// ---- poisoning ---------------------------------------------------------------------------

// Fills a float tensor with quiet NaN and an integer one with `int_poison`
// (a value no op may write, e.g. -1 for ids).
inline void poison(const TensorView& v, int64_t int_poison = std::numeric_limits<int32_t>::min()) {
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i) {
    switch (v.dtype) {
      case DType::kF32: v.ptr<float>()[i] = std::numeric_limits<float>::quiet_NaN(); break;
      case DType::kF16: v.ptr<uint16_t>()[i] = 0x7e00; break;
      case DType::kBF16: v.ptr<uint16_t>()[i] = 0x7fc0; break;
      case DType::kI32: v.ptr<int32_t>()[i] = static_cast<int32_t>(int_poison); break;
      case DType::kI64: v.ptr<int64_t>()[i] = int_poison; break;
      default: FAIL() << "poison: unsupported dtype";
    }
  }
}

// Number of NaN elements left in a float tensor.
inline int64_t count_nan(const TensorView& v) {
  int64_t n = 0;
  for (int64_t i = 0; i < v.numel(); ++i) n += std::isnan(load_as_f32(v.data, v.dtype, i)) ? 1 : 0;
  return n;
}

// ---- errors --------------------------------------------------------------------------------

// Runs fn, expects qhead::Error with `code`, returns its message ("" if it did
// not throw or threw something else — the EXPECTs record the failure).
inline std::string expect_error(const std::function<void()>& fn, ErrorCode code) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(static_cast<int>(e.code()), static_cast<int>(code))
        << "wrong error code (" << to_string(e.code()) << "), message: " << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-qhead exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

// A scheme from its four fields (the tests' shorthand).
inline QuantScheme make_scheme(int bits, int group, bool sym, DType scale = DType::kF16) {
  return QuantScheme{bits, group, sym, scale};
}

// The qhead command-line tool (QHEAD_CLI_PATH, a compile definition of the
// test target) run with `args` through the shell: exit status, stdout, and
// stderr (through a file in `scratch`, which must exist).
struct CliRun {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
inline CliRun run_cli(const std::string& args, const std::filesystem::path& scratch) {
  const std::string errf = (scratch / "stderr.txt").string();
  const std::string cmd = std::string(QHEAD_CLI_PATH) + " " + args + " 2>" + errf;
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  FILE* e = std::fopen(errf.c_str(), "r");
  while (e && (n = std::fread(buf.data(), 1, buf.size(), e)) > 0) r.err.append(buf.data(), n);
  if (e) std::fclose(e);
  return r;
}

}  // namespace qhead::test
