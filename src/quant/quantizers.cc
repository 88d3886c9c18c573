// The quantizers beside RTN (qhead/quantize.h): the per-group MSE search and
// GPTQ, and the quantize() entry point that picks one. Every one of them
// fills the same PackedTable (codes, scales, zero points of the scheme).
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "qhead/error.h"
#include "core/parallel.h"
#include "qhead/quantize.h"
#include "quant/quant_internal.h"

// LAPACK (OpenBLAS carries it): Cholesky factorization and the inverse from it,
// column-major.
extern "C" {
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);
void dpotri_(const char* uplo, const int* n, double* a, const int* lda, int* info);
}

namespace qhead {

using quant::GroupParams;

const char* quantizer_name(Quantizer q) {
  switch (q) {
    case Quantizer::kRtn: return "rtn";
    case Quantizer::kMse: return "mse";
    case Quantizer::kGptq: return "gptq";
    case Quantizer::kGptqMse: return "gptq-mse";
  }
  return "?";
}

Quantizer parse_quantizer(std::string_view name) {
  for (Quantizer q : {Quantizer::kRtn, Quantizer::kMse, Quantizer::kGptq, Quantizer::kGptqMse})
    if (name == quantizer_name(q)) return q;
  throw Error(ErrorCode::kInvalidArgument, "quantize",
              "unknown quantizer '" + std::string(name) + "' (one of rtn, mse, gptq, gptq-mse)");
}

namespace {

// ---- the MSE search -------------------------------------------------------

// Squared error of a group under (s, z), codes by nearest rounding: q =
// clamp(round(x / s) + z, qmin, qmax); weights w (nullptr: 1). Also returns
// the sums a least-squares refit needs (kFull: those of the affine refit too).
// Rounding by adding and subtracting 1.5·2^23 (round half to even for
// |t| < 2^22; t is clamped first). Eight partial sums per quantity, so that
// the loop vectorizes without reassociating float additions.
struct CandStats {
  double err = 0, sxq = 0, sqq = 0, sq = 0, sx = 0, sw = 0;  // q here is (code - z)
};

template <bool kFull>
CandStats cand_stats(const float* x, const float* w, int64_t n, float s, int z, int qmin, int qmax) {
  constexpr int L = 8;
  const float inv = 1.0f / s;
  const float lo = static_cast<float>(qmin - z), hi = static_cast<float>(qmax - z);
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  float err[L] = {}, sxq[L] = {}, sqq[L] = {}, sq[L] = {}, sx[L] = {}, sw[L] = {};
  int64_t j = 0;
  auto lane = [&](int l, int64_t i) {
    const float t = std::min(std::max(x[i] * inv, lo), hi);
    const float r = (t + kMagic) - kMagic;
    const float e = x[i] - r * s;
    const float wj = w ? w[i] : 1.0f;
    err[l] += wj * e * e;
    sxq[l] += wj * x[i] * r;
    sqq[l] += wj * r * r;
    if (kFull) {
      sq[l] += wj * r;
      sx[l] += wj * x[i];
      sw[l] += wj;
    }
  };
  if (w) {
    for (; j + L <= n; j += L)
      for (int l = 0; l < L; ++l) {
        const float t = std::min(std::max(x[j + l] * inv, lo), hi);
        const float r = (t + kMagic) - kMagic;
        const float e = x[j + l] - r * s;
        const float wj = w[j + l];
        err[l] += wj * e * e;
        sxq[l] += wj * x[j + l] * r;
        sqq[l] += wj * r * r;
        if (kFull) {
          sq[l] += wj * r;
          sx[l] += wj * x[j + l];
          sw[l] += wj;
        }
      }
  } else {
    for (; j + L <= n; j += L)
      for (int l = 0; l < L; ++l) {
        const float t = std::min(std::max(x[j + l] * inv, lo), hi);
        const float r = (t + kMagic) - kMagic;
        const float e = x[j + l] - r * s;
        err[l] += e * e;
        sxq[l] += x[j + l] * r;
        sqq[l] += r * r;
        if (kFull) {
          sq[l] += r;
          sx[l] += x[j + l];
          sw[l] += 1.0f;
        }
      }
  }
  for (; j < n; ++j) lane(0, j);
  CandStats c;
  for (int l = 0; l < L; ++l) {
    c.err += err[l];
    c.sxq += sxq[l];
    c.sqq += sqq[l];
    c.sq += sq[l];
    c.sx += sx[l];
    c.sw += sw[l];
  }
  return c;
}

// The codes of the same rounding.
void cand_codes(const float* x, int64_t n, float s, int z, int qmin, int qmax, int8_t* q) {
  const float inv = 1.0f / s;
  const float lo = static_cast<float>(qmin - z), hi = static_cast<float>(qmax - z);
  constexpr float kMagic = 12582912.0f;
  for (int64_t j = 0; j < n; ++j) {
    float t = std::min(std::max(x[j] * inv, lo), hi);
    const float r = (t + kMagic) - kMagic;
    q[j] = static_cast<int8_t>(static_cast<int>(r) + z);
  }
}

double rtn_error(const float* x, const float* w, int64_t n, const GroupParams& p, const int8_t* q) {
  double err = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float e = x[j] - static_cast<float>(q[j] - p.zero) * p.scale;
    err += static_cast<double>((w ? w[j] : 1.0f) * e * e);
  }
  return err;
}

// Chooses one group's parameters and codes: the RTN choice (computed exactly
// as quantize_rtn does, input dtype xt) or a searched one with a smaller
// weighted squared error. Writes the codes to q.
GroupParams mse_group(const float* x, const float* w, int64_t n, const QuantScheme& scheme, DType xt, int8_t* q) {
  const DType st = scheme.scale_dtype;
  const int qmin = scheme.qmin(), qmax = scheme.qmax();
  GroupParams best = quant::rtn_params(x, n, scheme, xt);
  quant::rtn_codes(x, n, best, scheme, quant::promote(xt, st), q);
  double best_err = rtn_error(x, w, n, best, q);
  if (best_err == 0.0) return best;

  // Candidates are ranked by their float sums; the winner's error is then
  // recomputed exactly (double, from its codes) against RTN's, so the result
  // is never worse than RTN's.
  double cand_err = std::numeric_limits<double>::infinity();
  GroupParams cand;
  auto consider = [&](float s_raw, int z, auto full) -> CandStats {
    const float s = round_through(s_raw, st);
    if (!(std::isfinite(s) && s != 0.0f) || !std::isfinite(1.0f / s)) return {};
    const CandStats c = cand_stats<decltype(full)::value>(x, w, n, s, z, qmin, qmax);
    if (c.err < cand_err) {
      cand_err = c.err;
      cand = GroupParams{s, z};
    }
    return c;
  };
  using Sym = std::false_type;
  using Asym = std::true_type;

  if (scheme.symmetric) {
    // The largest magnitude, with its sign: mapped to either end of the code
    // range, [qmin, qmax] = [-2^(b-1), 2^(b-1) - 1]. Positive scales map it to
    // about +-(qmax + 1/2) (RTN's choice), negative ones to qmin's side.
    float m = 0.0f;
    for (int64_t j = 0; j < n; ++j)
      if (std::fabs(x[j]) > std::fabs(m)) m = x[j];
    if (m == 0.0f) return best;
    const float nmax = static_cast<float>(-qmin), pmax = static_cast<float>(qmax) + 0.5f;
    for (int i = -5; i <= 2; ++i) {
      const float step = 0.2f * static_cast<float>(i);
      for (float end : {pmax + step, -(nmax + step)}) {
        // s = m / end: m lands on `end`, near the top of the code range
        // (end > 0) or its bottom (end < 0), whatever m's sign.
        const float s0 = m / end;
        const CandStats c = consider(s0, 0, Sym{});
        if (c.sqq > 0) consider(static_cast<float>(c.sxq / c.sqq), 0, Sym{});  // least-squares refit
      }
    }
  } else {
    float mn = 0.0f, mx = 0.0f;
    for (int64_t j = 0; j < n; ++j) {
      mn = std::min(mn, x[j]);
      mx = std::max(mx, x[j]);
    }
    const float range = static_cast<float>((1 << scheme.bits) - 1);
    static constexpr float kShrink[] = {1.0f, 0.95f, 0.9f, 0.85f, 0.8f, 0.7f};
    for (float a : kShrink) {
      for (float b : kShrink) {
        const float lo = mn * a, hi = mx * b;
        if (!(hi > lo)) continue;
        const float s0 = (hi - lo) / range;
        const float s = round_through(s0, st);
        if (!(s > 0.0f)) continue;
        const int z = static_cast<int>(std::clamp(std::nearbyint(static_cast<float>(qmin) - lo / s),
                                                  static_cast<float>(qmin), static_cast<float>(qmax)));
        const CandStats c = consider(s0, z, Asym{});
        // Least-squares refit of x ≈ s·r + c over the same codes r = code - z,
        // then z = round(-c / s).
        const double det = c.sw * c.sqq - c.sq * c.sq;
        if (c.sw > 0 && det > 0) {
          const double s1 = (c.sw * c.sxq - c.sq * c.sx) / det;
          const double c1 = (c.sx - s1 * c.sq) / c.sw;
          if (s1 > 0) {
            const float s1r = round_through(static_cast<float>(s1), st);
            if (s1r > 0.0f) {
              // r = code - z and x ≈ s1 r + c1 = s1 (code - (z - c1 / s1)): the new zero point.
              const int z2 = static_cast<int>(std::clamp(static_cast<double>(z) - std::nearbyint(c1 / s1r),
                                                         static_cast<double>(qmin), static_cast<double>(qmax)));
              consider(s1r, z2, Asym{});
            }
          }
        }
      }
    }
  }
  if (cand.scale != 0.0f && cand_err < best_err * (1.0 + 1e-4)) {
    thread_local std::vector<int8_t> cq;
    cq.resize(static_cast<size_t>(n));
    cand_codes(x, n, cand.scale, cand.zero, qmin, qmax, cq.data());
    if (rtn_error(x, w, n, cand, cq.data()) < best_err) {
      best = cand;
      std::copy(cq.begin(), cq.begin() + n, q);
    }
  }
  return best;
}

// ---- shared plumbing ------------------------------------------------------


PackedTable empty_packed(const QuantScheme& scheme, int64_t v, int64_t h) {
  PackedTable out;
  out.scheme = scheme;
  out.vocab = v;
  out.hidden = h;
  out.packed = Tensor::empty(DType::kI32, {v, scheme.packed_cols(h)});
  out.scale = Tensor::empty(scheme.scale_dtype, {v, scheme.groups(h)});
  return out;
}

void finish_zero_points(PackedTable& out, const std::vector<int8_t>& zps) {
  if (out.scheme.symmetric) return;
  const int64_t g = out.scheme.groups(out.hidden);
  out.zero_point = Tensor::empty(DType::kI32, {out.scheme.zero_point_rows(out.vocab), g});
  pack_zero_points(zps.data(), out.vocab, g, out.scheme.bits, out.zero_point.ptr<int32_t>());
}

// Progress over rows, as quantize_rtn reports it: monotone, the last call
// reports done == total.
class RowProgress {
 public:
  RowProgress(const QuantizeProgress& p, int64_t total) : p_(p), total_(total) {}
  void add(int64_t n) {
    done_.fetch_add(n);
    if (!p_ || !mu_.try_lock()) return;
    const int64_t d = done_.load();
    if (d > reported_ && d < total_) {
      p_(d, total_);
      reported_ = d;
    }
    mu_.unlock();
  }
  void finish() {
    if (p_) p_(total_, total_);
  }

 private:
  const QuantizeProgress& p_;
  int64_t total_;
  std::atomic<int64_t> done_{0};
  std::mutex mu_;
  int64_t reported_ = 0;
};

[[noreturn]] void bad_row(const char* op, const std::string& name, int64_t r) {
  throw Error(ErrorCode::kInvalidArgument, op,
              name + ": row " + std::to_string(r) + " holds a NaN or Inf; cannot quantize");
}

// Per-column mean square of the calibration rows, and (gram) the Gram matrix
// XᵀX / N in double, row-major [H, H] (full, symmetric).
struct Calib {
  std::vector<double> gram;  // empty unless asked for
  std::vector<double> diag;  // [H]
};

Calib calibration_stats(const TensorView& x, int64_t h, bool gram, const char* op, const std::string& name,
                        int threads) {
  const std::string cname = name + " calibration";
  check_dims(x, 2, op, cname.c_str());
  check_contiguous(x, op, cname.c_str());
  if (x.device != Device::kCPU)
    throw Error(ErrorCode::kUnsupported, op, cname + ": must be a CPU array");
  if (!is_float_dtype(x.dtype))
    throw Error(ErrorCode::kInvalidArgument, op,
                cname + ": must be F32/F16/BF16, got " + dtype_name(x.dtype));
  const int64_t n = x.size(0);
  if (x.size(1) != h)
    throw Error(ErrorCode::kInvalidArgument, op,
                cname + ": [" + std::to_string(n) + ", " + std::to_string(x.size(1)) +
                    "] activations for a table of hidden size " + std::to_string(h) + " (expected [N, " +
                    std::to_string(h) + "])");
  if (n < 1) throw Error(ErrorCode::kInvalidArgument, op, cname + ": no rows (N = 0)");
  Calib c;
  c.diag.assign(static_cast<size_t>(h), 0.0);
  if (gram) c.gram.assign(static_cast<size_t>(h * h), 0.0);
  constexpr int64_t kChunk = 2048;
  std::vector<double> buf(static_cast<size_t>(std::min(n, kChunk) * h));
  std::vector<float> row(static_cast<size_t>(h));
  for (int64_t r0 = 0; r0 < n; r0 += kChunk) {
    const int64_t rn = std::min(kChunk, n - r0);
    for (int64_t r = 0; r < rn; ++r) {
      convert(static_cast<const char*>(x.data) + (r0 + r) * h * dtype_size(x.dtype), x.dtype, row.data(),
              DType::kF32, h);
      for (int64_t j = 0; j < h; ++j) {
        const float f = row[static_cast<size_t>(j)];
        if (!std::isfinite(f))
          throw Error(ErrorCode::kInvalidArgument, op,
                      cname + ": row " + std::to_string(r0 + r) + " column " + std::to_string(j) +
                          " is not finite (NaN or Inf)");
        buf[static_cast<size_t>(r * h + j)] = f;
        c.diag[static_cast<size_t>(j)] += static_cast<double>(f) * f;
      }
    }
    if (gram)  // upper triangle of XᵀX (row-major)
      cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(h), static_cast<int>(rn), 1.0, buf.data(),
                  static_cast<int>(h), 1.0, c.gram.data(), static_cast<int>(h));
  }
  (void)threads;
  const double inv = 1.0 / static_cast<double>(n);
  for (auto& d : c.diag) d *= inv;
  if (gram) {
    for (int64_t i = 0; i < h; ++i)
      for (int64_t j = i; j < h; ++j) {
        const double v = c.gram[static_cast<size_t>(i * h + j)] * inv;
        c.gram[static_cast<size_t>(i * h + j)] = v;
        c.gram[static_cast<size_t>(j * h + i)] = v;
      }
  }
  return c;
}

// QuantizeOptions::damp where calibration is read: finite and >= 0.
void check_damp(const QuantizeOptions& o, const char* op) {
  if (!(o.damp >= 0.0) || !std::isfinite(o.damp))
    throw Error(ErrorCode::kInvalidArgument, op, o.name + ": damp must be finite and >= 0, got " + std::to_string(o.damp));
}

// Column weights for the MSE objective: mean square + damp · its mean (so no
// column is ignored outright).
std::vector<float> column_weights(const std::vector<double>& diag, double damp) {
  double mean = 0;
  for (double d : diag) mean += d;
  mean /= static_cast<double>(std::max<size_t>(diag.size(), 1));
  std::vector<float> w(diag.size());
  for (size_t j = 0; j < diag.size(); ++j) w[j] = static_cast<float>(diag[j] + damp * mean);
  return w;
}

PackedTable quantize_mse(const TensorView& dense, const QuantScheme& scheme, const QuantizeOptions& o) {
  const char* op = "quantize_mse";
  quant::check_table(dense, scheme, op, o.name);
  const int64_t v = dense.size(0), h = dense.size(1);
  std::vector<float> wcol;
  if (o.calibration) check_damp(o, op);
  if (o.calibration) wcol = column_weights(calibration_stats(*o.calibration, h, false, op, o.name, o.threads).diag,
                                           o.damp);
  const DType xt = dense.dtype, st = scheme.scale_dtype;
  const int64_t g = scheme.groups(h), gl = scheme.group_len(h);
  PackedTable out = empty_packed(scheme, v, h);
  std::vector<int8_t> zps;
  if (!scheme.symmetric) zps.assign(static_cast<size_t>(v * g), 0);
  std::atomic<int64_t> bad{-1};
  RowProgress prog(o.progress, v);
  parallel_for(v, 64, [&](int64_t rb, int64_t re) {
    std::vector<float> x(static_cast<size_t>(h));
    std::vector<int8_t> q(static_cast<size_t>(h));
    int64_t pending = 0;
    for (int64_t r = rb; r < re; ++r) {
      convert(static_cast<const char*>(dense.data) + r * h * dtype_size(xt), xt, x.data(), DType::kF32, h);
      if (!std::all_of(x.begin(), x.end(), [](float f) { return std::isfinite(f); })) {
        int64_t e = -1;
        bad.compare_exchange_strong(e, r);
        continue;
      }
      for (int64_t k = 0; k < g; ++k) {
        const GroupParams p = mse_group(x.data() + k * gl, wcol.empty() ? nullptr : wcol.data() + k * gl, gl, scheme,
                                        xt, q.data() + k * gl);
        store_from_f32(out.scale.data(), st, r * g + k, p.scale);
        if (!scheme.symmetric) zps[static_cast<size_t>(r * g + k)] = static_cast<int8_t>(p.zero);
      }
      pack_codes(q.data(), h, scheme.bits, out.packed.ptr<int32_t>() + r * scheme.packed_cols(h));
      if (++pending == 256) {
        prog.add(pending);
        pending = 0;
      }
    }
    if (pending) prog.add(pending);
  }, o.threads);
  if (bad.load() >= 0) bad_row(op, o.name, bad.load());
  finish_zero_points(out, zps);
  prog.finish();
  return out;
}

// ---- GPTQ -----------------------------------------------------------------

// U, upper triangular with H⁻¹ = UᵀU, row-major float [H, H] (zeros below the
// diagonal), from the damped Gram matrix. Dead columns (diag 0) get 1 on the
// diagonal, as GPTQ does. When the factorization fails the damping grows
// tenfold, up to three times.
std::vector<float> inverse_cholesky_upper(std::vector<double> hm, int64_t h, double damp, const char* op,
                                          const std::string& name) {
  double mean = 0;
  for (int64_t i = 0; i < h; ++i) {
    double& d = hm[static_cast<size_t>(i * h + i)];
    if (d == 0.0) d = 1.0;
    mean += d;
  }
  mean /= static_cast<double>(h);
  const int n = static_cast<int>(h);
  int info = 0;
  std::vector<double> a;
  for (int attempt = 0; attempt < 4; ++attempt, damp *= 10.0) {
    a = hm;
    for (int64_t i = 0; i < h; ++i) a[static_cast<size_t>(i * h + i)] += damp * mean;
    // Symmetric: the row-major matrix is its own column-major transpose.
    dpotrf_("L", &n, a.data(), &n, &info);
    if (info != 0) continue;
    dpotri_("L", &n, a.data(), &n, &info);  // H⁻¹, lower triangle (column-major)
    if (info != 0) continue;
    for (int64_t j = 0; j < h; ++j)  // mirror to the upper triangle (column-major)
      for (int64_t i = j + 1; i < h; ++i) a[static_cast<size_t>(j + i * h)] = a[static_cast<size_t>(i + j * h)];
    dpotrf_("U", &n, a.data(), &n, &info);  // H⁻¹ = UᵀU, U in the upper triangle (column-major)
    if (info == 0) break;
  }
  if (info != 0)
    throw Error(ErrorCode::kInvalidArgument, op,
                name + ": the calibration Hessian is not positive definite even with damping " +
                    std::to_string(damp / 10.0) + " (LAPACK info " + std::to_string(info) + ")");
  std::vector<float> u(static_cast<size_t>(h * h), 0.0f);
  for (int64_t i = 0; i < h; ++i)
    for (int64_t j = i; j < h; ++j) u[static_cast<size_t>(i * h + j)] = static_cast<float>(a[static_cast<size_t>(i + j * h)]);
  return u;
}

// Given the codes, the symmetric scales s (one per group) minimising
// (w - ŵ)ᵀ H (w - ŵ), ŵ = Σ_g s_g d_g (d_g: the row's codes in group g, zero
// elsewhere): the normal equations A s = b, A[g1][g2] = d_g1ᵀ H d_g2,
// b[g] = d_gᵀ H w, solved per row (G × G, Cholesky in double). H d_g comes
// from one SGEMM per group over a block of rows. A row keeps its scales
// unless the refit (rounded to the scale dtype) lowers its objective.
void refit_scales(const float* w, const int8_t* codes, GroupParams* params, int64_t rn, int64_t h, int64_t g,
                  int64_t gl, const std::vector<float>& hm, DType st, int threads, double* obj_out) {
  const int64_t sub = std::max<int64_t>(1, std::min<int64_t>(rn, (int64_t{1} << 23) / std::max<int64_t>(h * g, 1)));
  std::vector<float> qf(static_cast<size_t>(sub * h));
  std::vector<float> y(static_cast<size_t>(g * sub * h));  // y[k][r][:] = (H d_k) of row r
  for (int64_t s0 = 0; s0 < rn; s0 += sub) {
    const int64_t sn = std::min(sub, rn - s0);
    for (int64_t i = 0; i < sn * h; ++i) qf[static_cast<size_t>(i)] = static_cast<float>(codes[s0 * h + i]);
    for (int64_t k = 0; k < g; ++k)  // Y_k = Q[:, group k] · H[group k, :]
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(sn), static_cast<int>(h),
                  static_cast<int>(gl), 1.0f, qf.data() + k * gl, static_cast<int>(h), hm.data() + k * gl * h,
                  static_cast<int>(h), 0.0f, y.data() + k * sub * h, static_cast<int>(h));
    parallel_for(sn, 16, [&](int64_t rb, int64_t re) {
      std::vector<double> a(static_cast<size_t>(g * g)), b(static_cast<size_t>(g)), l(static_cast<size_t>(g * g)),
          sv(static_cast<size_t>(g)), s_old(static_cast<size_t>(g));
      for (int64_t r = rb; r < re; ++r) {
        const float* q = qf.data() + r * h;
        const float* wr = w + (s0 + r) * h;
        GroupParams* pr = params + (s0 + r) * g;
        for (int64_t k2 = 0; k2 < g; ++k2) {
          const float* yk = y.data() + k2 * sub * h + r * h;
          double bb = 0;
          for (int64_t i = 0; i < h; ++i) bb += static_cast<double>(yk[i]) * wr[i];
          b[static_cast<size_t>(k2)] = bb;
          for (int64_t k1 = 0; k1 < g; ++k1) {
            double acc = 0;
            for (int64_t i = k1 * gl; i < (k1 + 1) * gl; ++i) acc += static_cast<double>(q[i]) * yk[i];
            a[static_cast<size_t>(k1 * g + k2)] = acc;
          }
        }
        // Groups whose codes are all zero: their scale is free; keep it.
        for (int64_t k = 0; k < g; ++k) {
          s_old[static_cast<size_t>(k)] = pr[k].scale;
          if (a[static_cast<size_t>(k * g + k)] <= 0.0) {
            for (int64_t j = 0; j < g; ++j) a[static_cast<size_t>(k * g + j)] = a[static_cast<size_t>(j * g + k)] = 0.0;
            a[static_cast<size_t>(k * g + k)] = 1.0;
            b[static_cast<size_t>(k)] = pr[k].scale;
          }
        }
        // Cholesky A = L Lᵀ, then L Lᵀ s = b.
        bool ok = true;
        for (int64_t i = 0; i < g && ok; ++i)
          for (int64_t j = 0; j <= i; ++j) {
            double v = a[static_cast<size_t>(i * g + j)];
            for (int64_t k = 0; k < j; ++k) v -= l[static_cast<size_t>(i * g + k)] * l[static_cast<size_t>(j * g + k)];
            if (i == j) {
              if (!(v > 0.0)) {
                ok = false;
                break;
              }
              l[static_cast<size_t>(i * g + i)] = std::sqrt(v);
            } else {
              l[static_cast<size_t>(i * g + j)] = v / l[static_cast<size_t>(j * g + j)];
            }
          }
        // Objective sᵀAs - 2bᵀs (the constant wᵀHw dropped), old against new.
        auto objective = [&](const std::vector<double>& sc) {
          double f = 0;
          for (int64_t i = 0; i < g; ++i) {
            double as = 0;
            for (int64_t j = 0; j < g; ++j) as += a[static_cast<size_t>(i * g + j)] * sc[static_cast<size_t>(j)];
            f += sc[static_cast<size_t>(i)] * (as - 2.0 * b[static_cast<size_t>(i)]);
          }
          return f;
        };
        const double f_old = objective(s_old);
        obj_out[s0 + r] = f_old;
        if (!ok) continue;
        for (int64_t i = 0; i < g; ++i) {
          double v = b[static_cast<size_t>(i)];
          for (int64_t k = 0; k < i; ++k) v -= l[static_cast<size_t>(i * g + k)] * sv[static_cast<size_t>(k)];
          sv[static_cast<size_t>(i)] = v / l[static_cast<size_t>(i * g + i)];
        }
        for (int64_t i = g - 1; i >= 0; --i) {
          double v = sv[static_cast<size_t>(i)];
          for (int64_t k = i + 1; k < g; ++k) v -= l[static_cast<size_t>(k * g + i)] * sv[static_cast<size_t>(k)];
          sv[static_cast<size_t>(i)] = v / l[static_cast<size_t>(i * g + i)];
        }
        bool finite = true;
        for (int64_t k = 0; k < g; ++k) {
          const float sr = round_through(static_cast<float>(sv[static_cast<size_t>(k)]), st);
          if (!std::isfinite(sr) || sr == 0.0f) finite = false;
          sv[static_cast<size_t>(k)] = sr;
        }
        if (finite) {
          const double f_new = objective(sv);
          if (f_new < f_old) {
            for (int64_t k = 0; k < g; ++k) pr[k].scale = static_cast<float>(sv[static_cast<size_t>(k)]);
            obj_out[s0 + r] = f_new;
          }
        }
      }
    }, threads);
  }
}

PackedTable quantize_gptq(const TensorView& dense, const QuantScheme& scheme, const QuantizeOptions& o) {
  const bool mse = o.quantizer == Quantizer::kGptqMse;
  const char* op = mse ? "quantize_gptq_mse" : "quantize_gptq";
  quant::check_table(dense, scheme, op, o.name);
  const int64_t v = dense.size(0), h = dense.size(1);
  if (!o.calibration)
    throw Error(ErrorCode::kInvalidArgument, op,
                o.name + ": GPTQ needs calibration activations ([N, " + std::to_string(h) +
                    "] inputs of the head, e.g. decode states)");
  check_damp(o, op);
  if (o.block < 1) throw Error(ErrorCode::kInvalidArgument, op, o.name + ": block must be >= 1, got " + std::to_string(o.block));
  Calib c = calibration_stats(*o.calibration, h, true, op, o.name, o.threads);
  std::vector<float> wdiag;  // the MSE search's weights: diag of the damped Hessian
  if (mse) wdiag = column_weights(c.diag, o.damp);
  // The damped Hessian (float) for the scale refit: GPTQ's objective.
  std::vector<float> hf;
  if (o.refit_scales && scheme.symmetric) {
    double mean = 0;
    for (int64_t i = 0; i < h; ++i) mean += c.gram[static_cast<size_t>(i * h + i)];
    mean /= static_cast<double>(h);
    hf.resize(static_cast<size_t>(h * h));
    for (int64_t i = 0; i < h * h; ++i) hf[static_cast<size_t>(i)] = static_cast<float>(c.gram[static_cast<size_t>(i)]);
    for (int64_t i = 0; i < h; ++i) hf[static_cast<size_t>(i * h + i)] += static_cast<float>(o.damp * mean);
  }
  const std::vector<float> u = inverse_cholesky_upper(std::move(c.gram), h, o.damp, op, o.name);

  const DType xt = dense.dtype, st = scheme.scale_dtype;
  const int64_t g = scheme.groups(h), gl = scheme.group_len(h);
  const int64_t bsz = std::min<int64_t>(o.block, h);
  const int qmin = scheme.qmin(), qmax = scheme.qmax();
  PackedTable out = empty_packed(scheme, v, h);
  std::vector<int8_t> zps;
  if (!scheme.symmetric) zps.assign(static_cast<size_t>(v * g), 0);

  // Rows are independent given U: chunks of rows, each through the column
  // loop; within a block the rows are split over threads, the lazy update of
  // the columns after the block is one SGEMM per block.
  const int64_t chunk = std::min<int64_t>(v, 1024);
  std::vector<float> wk(static_cast<size_t>(chunk * h));
  std::vector<float> err(static_cast<size_t>(chunk * bsz));
  std::vector<int8_t> codes(static_cast<size_t>(chunk * h));
  std::vector<GroupParams> params(static_cast<size_t>(chunk * g));
  std::atomic<int64_t> bad{-1};
  RowProgress prog(o.progress, v);
  const int passes = hf.empty() ? 1 : std::max(1, o.passes);
  std::vector<int8_t> best_codes;
  std::vector<GroupParams> best_params;
  std::vector<double> obj(static_cast<size_t>(chunk)), best_obj;
  if (passes > 1) {
    best_codes.resize(codes.size());
    best_params.resize(params.size());
    best_obj.resize(static_cast<size_t>(chunk));
  }
  for (int64_t r0 = 0; r0 < v; r0 += chunk) {
    const int64_t rn = std::min(chunk, v - r0);
    convert(static_cast<const char*>(dense.data) + r0 * h * dtype_size(xt), xt, wk.data(), DType::kF32, rn * h);
    for (int64_t i = 0; i < rn * h; ++i)
      if (!std::isfinite(wk[static_cast<size_t>(i)])) bad_row(op, o.name, r0 + i / h);
   for (int pass = 0; pass < passes; ++pass) {
    const bool fixed = pass > 0;  // later passes: GPTQ with the refit scales held fixed
    if (fixed)
      convert(static_cast<const char*>(dense.data) + r0 * h * dtype_size(xt), xt, wk.data(), DType::kF32, rn * h);
    for (int64_t b1 = 0; b1 < h; b1 += bsz) {
      const int64_t b2 = std::min(b1 + bsz, h), bn = b2 - b1;
      parallel_for(rn, 32, [&](int64_t rb, int64_t re) {
        std::vector<int8_t> tmp(static_cast<size_t>(gl));
        for (int64_t r = rb; r < re; ++r) {
          float* w = wk.data() + r * h;
          float* e = err.data() + r * bsz;
          int8_t* q = codes.data() + r * h;
          for (int64_t j = b1; j < b2; ++j) {
            GroupParams& p = params[static_cast<size_t>(r * g + j / gl)];
            if (j % gl == 0 && !fixed) {
              // The group's parameters from the current (error-compensated) weights.
              p = mse ? mse_group(w + j, wdiag.data() + j, gl, scheme, DType::kF32, tmp.data())
                      : quant::rtn_params(w + j, gl, scheme, DType::kF32);
            }
            const float x = w[j];
            float t = x / p.scale;
            if (!scheme.symmetric) t += static_cast<float>(p.zero);
            const int8_t qq = static_cast<int8_t>(quant::round_even(std::clamp(t, static_cast<float>(qmin),
                                                                                static_cast<float>(qmax))));
            q[j] = qq;
            const float dq = static_cast<float>(qq - p.zero) * p.scale;
            const float ej = (x - dq) / u[static_cast<size_t>(j * h + j)];
            e[j - b1] = ej;
            const float* uj = u.data() + j * h;
            for (int64_t k = j + 1; k < b2; ++k) w[k] -= ej * uj[k];
          }
        }
      }, o.threads);
      if (b2 < h)  // W[:, b2:] -= E · U[b1:b2, b2:]
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rn), static_cast<int>(h - b2),
                    static_cast<int>(bn), -1.0f, err.data(), static_cast<int>(bsz), u.data() + b1 * h + b2,
                    static_cast<int>(h), 1.0f, wk.data() + b2, static_cast<int>(h));
    }
    if (!hf.empty()) {
      // The original rows (wk holds the error-compensated ones).
      convert(static_cast<const char*>(dense.data) + r0 * h * dtype_size(xt), xt, wk.data(), DType::kF32, rn * h);
      refit_scales(wk.data(), codes.data(), params.data(), rn, h, g, gl, hf, st, o.threads, obj.data());
    }
    if (passes > 1) {  // each row keeps the pass with the lowest objective
      for (int64_t r = 0; r < rn; ++r) {
        if (pass > 0 && !(obj[static_cast<size_t>(r)] < best_obj[static_cast<size_t>(r)])) {
          std::copy(best_codes.begin() + r * h, best_codes.begin() + (r + 1) * h, codes.begin() + r * h);
          std::copy(best_params.begin() + r * g, best_params.begin() + (r + 1) * g, params.begin() + r * g);
          continue;
        }
        best_obj[static_cast<size_t>(r)] = obj[static_cast<size_t>(r)];
        std::copy(codes.begin() + r * h, codes.begin() + (r + 1) * h, best_codes.begin() + r * h);
        std::copy(params.begin() + r * g, params.begin() + (r + 1) * g, best_params.begin() + r * g);
      }
    }
   }
    for (int64_t r = 0; r < rn; ++r) {
      for (int64_t k = 0; k < g; ++k) {
        const GroupParams& p = params[static_cast<size_t>(r * g + k)];
        store_from_f32(out.scale.data(), st, (r0 + r) * g + k, p.scale);
        if (!scheme.symmetric) zps[static_cast<size_t>((r0 + r) * g + k)] = static_cast<int8_t>(p.zero);
      }
      pack_codes(codes.data() + r * h, h, scheme.bits, out.packed.ptr<int32_t>() + (r0 + r) * scheme.packed_cols(h));
    }
    prog.add(rn);
  }
  (void)bad;
  finish_zero_points(out, zps);
  prog.finish();
  return out;
}

}  // namespace

PackedTable quantize(const TensorView& dense, const QuantScheme& scheme, const QuantizeOptions& o) {
  switch (o.quantizer) {
    case Quantizer::kRtn: return quantize_rtn(dense, scheme, o.threads, o.name, o.progress);
    case Quantizer::kMse: return quantize_mse(dense, scheme, o);
    case Quantizer::kGptq:
    case Quantizer::kGptqMse: return quantize_gptq(dense, scheme, o);
  }
  throw Error(ErrorCode::kInvalidArgument, "quantize", o.name + ": unknown quantizer");
}

}  // namespace qhead
