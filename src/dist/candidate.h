// The 64-bit candidate word of the top-k exchange (qhead/dist.h), shared by
// the host reference (merge.cc) and the kernels (kernels.cu) so both encode
// the same bits.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QHEAD_DIST_HD __host__ __device__ __forceinline__
#else
#define QHEAD_DIST_HD inline
#endif

namespace qhead::dist::detail {

QHEAD_DIST_HD uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
QHEAD_DIST_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// Larger float → larger key (sign-magnitude flipped into unsigned order).
QHEAD_DIST_HD uint32_t order_key(float f) {
  const uint32_t u = float_bits(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
QHEAD_DIST_HD float key_value(uint32_t k) { return bits_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k); }

QHEAD_DIST_HD uint64_t make_word(float v, int64_t id) {
  return (uint64_t(order_key(v)) << 32) | uint32_t(~uint32_t(id));
}
QHEAD_DIST_HD float word_value(uint64_t w) {
  return w ? key_value(uint32_t(w >> 32)) : bits_float(0xff800000u);  // −inf
}
QHEAD_DIST_HD int32_t word_id(uint64_t w) { return w ? int32_t(~uint32_t(w)) : -1; }

// The log-sum-exp slot: f32 bits in the low half.
QHEAD_DIST_HD uint64_t lse_word(float lse) { return uint64_t(float_bits(lse)); }
QHEAD_DIST_HD float word_lse(uint64_t w) { return bits_float(uint32_t(w)); }

}  // namespace qhead::dist::detail
