// Shared by the quantizers (src/quant/quantize.cc, src/quant/quantizers.cc):
// compressed-tensors' RTN arithmetic for one group, and the helpers around it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include <string>

#include "qhead/dtype.h"
#include "qhead/error.h"
#include "qhead/tensor.h"
#include "qhead/scheme.h"

namespace qhead::quant {

// torch's dtype promotion for a binary op on two float dtypes.
inline DType promote(DType a, DType b) { return a == b ? a : DType::kF32; }

inline float eps_of(DType t) {
  switch (t) {
    case DType::kF16: return 0.0009765625f;   // 2^-10
    case DType::kBF16: return 0.0078125f;     // 2^-7
    default: return 1.1920928955078125e-7f;   // 2^-23
  }
}

// Round half to even, independent of the current rounding mode.
inline float round_even(float v) {
  const float r = std::round(v);  // half away from zero
  if (std::fabs(v - std::trunc(v)) == 0.5f) return 2.0f * std::round(v / 2.0f);
  return r;
}

// A group's dequantization parameters: w = (q - zero) * scale.
struct GroupParams {
  float scale = 0.0f;  // already rounded to the scheme's scale dtype
  int zero = 0;        // 0 when symmetric
};

// compressed-tensors' calculate_qparams for one group of gl values (x in f32,
// holding values of dtype xt): see qhead/quantize.h for the formulas.
inline GroupParams rtn_params(const float* xg, int64_t gl, const QuantScheme& scheme, DType xt) {
  const DType st = scheme.scale_dtype;
  const float qmin = static_cast<float>(scheme.qmin()), qmax = static_cast<float>(scheme.qmax());
  const float range = static_cast<float>((1 << scheme.bits) - 1);
  const float half_range = range / 2.0f;  // exact in f16/bf16 for bits <= 8
  float mn = 0.0f, mx = 0.0f;
  for (int64_t j = 0; j < gl; ++j) {
    mn = std::min(mn, xg[j]);
    mx = std::max(mx, xg[j]);
  }
  float s, zf = 0.0f;
  if (scheme.symmetric) {
    s = round_through(std::max(std::fabs(mn), std::fabs(mx)) / half_range, xt);
  } else {
    s = round_through(round_through(mx - mn, xt) / range, xt);
    zf = round_through(qmin - round_through(mn / s, xt), xt);
    zf = std::clamp(zf, qmin, qmax);  // NaN (0/0 on an all-zero group) handled below
  }
  s = round_through(s, st);
  if (s == 0.0f) s = eps_of(st);
  GroupParams p;
  p.scale = s;
  if (!scheme.symmetric) p.zero = std::isnan(zf) ? scheme.qmin() : static_cast<int>(round_even(zf));
  return p;
}

// compressed-tensors' quantize for one group: q = round(clamp(rnd_p(rnd_p(x / s) + z))),
// pt = promote(input dtype, scale dtype).
inline void rtn_codes(const float* xg, int64_t gl, const GroupParams& p, const QuantScheme& scheme, DType pt,
                      int8_t* q) {
  const float qmin = static_cast<float>(scheme.qmin()), qmax = static_cast<float>(scheme.qmax());
  for (int64_t j = 0; j < gl; ++j) {
    float t = round_through(xg[j] / p.scale, pt);
    if (!scheme.symmetric) t = round_through(t + static_cast<float>(p.zero), pt);
    q[j] = static_cast<int8_t>(round_even(std::clamp(t, qmin, qmax)));
  }
}

// The checks every quantizer applies to its input table (`op` and `name` in the errors).
inline void check_table(const TensorView& dense, const QuantScheme& scheme, const char* op, const std::string& name) {
  scheme.validate();
  check_dims(dense, 2, op, name.c_str());
  check_contiguous(dense, op, name.c_str());
  if (dense.device != Device::kCPU)
    throw Error(ErrorCode::kUnsupported, op, name + ": only CPU tables can be quantized");
  if (!is_float_dtype(dense.dtype))
    throw Error(ErrorCode::kInvalidArgument, op,
                name + ": table must be F32/F16/BF16, got " + dtype_name(dense.dtype));
  scheme.check_hidden(dense.size(1), op, name);
  scheme.table_bytes(dense.size(0), dense.size(1), op, name);
}

}  // namespace qhead::quant
