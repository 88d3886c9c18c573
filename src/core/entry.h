// The 64-bit top-k entry, one encoding for every place that selects or
// exchanges candidates: the CUDA selection kernels (src/cuda), the fused
// top-k epilogue, and the vocab-parallel exchange (src/dist: host reference
// and kernels).
//
// A (logit, vocab id) candidate is the logit's order-preserving key in the
// high word and the complemented id in the low word, so that entry order IS
// the reference's top-k order (value descending, ties to the lower id) and a
// selection needs one unsigned compare. Entry 0 is "empty": below every real
// entry (the key of −inf is 0x007FFFFF). The exchange's log-sum-exp slot
// carries the f32 bits in the low word.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QHEAD_ENTRY_HD __host__ __device__ __forceinline__
#else
#define QHEAD_ENTRY_HD inline
#endif

namespace qhead::entry {

// The bits of a float and back (memcpy: defined behaviour on the host, a
// register move on the device).
QHEAD_ENTRY_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
QHEAD_ENTRY_HD float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// Larger float → larger key (sign-magnitude flipped into unsigned order).
QHEAD_ENTRY_HD uint32_t order_key(float f) {
  const uint32_t u = float_bits(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
QHEAD_ENTRY_HD float key_value(uint32_t k) { return bits_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k); }

QHEAD_ENTRY_HD uint64_t make_entry(float v, int64_t id) {
  return (uint64_t(order_key(v)) << 32) | uint32_t(~uint32_t(id));
}
QHEAD_ENTRY_HD float entry_value(uint64_t e) {
  return e ? key_value(uint32_t(e >> 32)) : bits_float(0xff800000u);  // empty: −inf
}
QHEAD_ENTRY_HD int32_t entry_id(uint64_t e) { return e ? int32_t(~uint32_t(e)) : -1; }  // empty: −1

// The log-sum-exp slot of an exchange message.
QHEAD_ENTRY_HD uint64_t lse_entry(float lse) { return uint64_t(float_bits(lse)); }
QHEAD_ENTRY_HD float entry_lse(uint64_t e) { return bits_float(uint32_t(e)); }

}  // namespace qhead::entry
