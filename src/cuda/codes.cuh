// Fused dequant + logits on the pack-quantized table, with tensor cores.
//
//   out[m, v] = Σ_g s[v, g] · Σ_{h ∈ g} (q[v, h] − z[v, g]) · x[m, h]
//
// Why this shape. The packed rows are streamed once from HBM with no
// repacked copy (docs/architecture.md, Decisions); the inner products run on mma.sync
// m16n8k16 (f16/bf16 in, f32 accumulate): the vocab rows are the MMA's M
// dimension (16 rows per warp), the activations its N dimension (8 per
// tile), H its K dimension.
//
// Exactness. The A operand is the integer q − z (|q − z| ≤ 255), exact in
// f16 and bf16, and a product of it with an f16/bf16 activation is exact, so
// each group's partial sum is accumulated in f32 like the reference; the
// scale multiplies the f32 partial sum once per group. Nothing is rounded to
// 16 bits except the activations, which already are.
//
// The k permutation. In m16n8k16, the lane with (groupID g, threadID t)
// holds A's k-slots {2t, 2t+1, 2t+8, 2t+9} for rows g and g+8 and B's
// k-slots {2t, 2t+1, 2t+8, 2t+9} for column g. A dot product does not care
// which h each k-slot stands for, as long as A and B agree. So each lane
// loads L contiguous bytes of its own two rows (the four lanes of a quad
// cover 4·L contiguous bytes, one group or part of one), and the k-slots
// take the h order that the cheapest nibble extraction produces:
//   4-bit word (8 codes c0..c7): (w >> s) & 0x000F000F gives the pair
//        (c_s/4, c_s/4+4) → slot order 0,4,1,5,2,6,3,7 per 8 h
//   8-bit word (4 codes):        byte_perm gives (c0, c2), (c1, c3)
//        → slot order 0,2,1,3 per 4 h
// and the activations are permuted the same way once per call
// (permute_x_kernel, below: it also lays them out in B-fragment order)
// instead of repacking the weights.
//
// Integer → f16/bf16: the "magic number" trick — OR a code into the
// mantissa of 1024.0 (f16) or 128.0 (bf16) and subtract (magic + offset +
// z): two instructions for two values, exact. 8-bit codes do not fit bf16's
// 7-bit mantissa, so 8-bit/bf16 goes through f32 (exact, a few more ops).
//
// This file: the integer → f16/bf16 conversions and the per-lane geometry.
#pragma once

#include "ptx.cuh"

namespace qhead::cuda_detail {

// ---- integer → 16-bit pairs ---------------------------------------------------

template <class T> struct Magic;
template <> struct Magic<__half> {
  static constexpr uint32_t k4 = 0x64006400u;  // f16 1024.0 pair
  static constexpr float base = 1024.0f;
};
template <> struct Magic<__nv_bfloat16> {
  static constexpr uint32_t k4 = 0x43004300u;  // bf16 128.0 pair
  static constexpr float base = 128.0f;
};

template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

template <class T>
__device__ __forceinline__ uint32_t sub2(uint32_t a, uint32_t b) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 r = __hsub2(*reinterpret_cast<__half2*>(&a), *reinterpret_cast<__half2*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
  } else {
    __nv_bfloat162 r = __hsub2(*reinterpret_cast<__nv_bfloat162*>(&a), *reinterpret_cast<__nv_bfloat162*>(&b));
    return *reinterpret_cast<uint32_t*>(&r);
  }
}

// The per-(row, group) subtrahend: magic + 2^(b-1) + z, as a pair (16-bit
// paths) — exact: at most 1024 + 255 in f16, 128 + 15 in bf16.
template <int BITS, class T>
__device__ __forceinline__ uint32_t make_bias(int z) {
  const float b = Magic<T>::base + float(1 << (BITS - 1)) + float(z);
  return pack2<T>(b, b);
}

__device__ __forceinline__ uint32_t lop3_and_or(uint32_t a, uint32_t b, uint32_t c) {  // (a & b) | c, one LOP3
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

__device__ __forceinline__ uint32_t hfma2_u32(uint32_t a, uint32_t b, uint32_t c) {
  __half2 r = __hfma2(*reinterpret_cast<__half2*>(&a), *reinterpret_cast<__half2*>(&b), *reinterpret_cast<__half2*>(&c));
  return *reinterpret_cast<uint32_t*>(&r);
}

// Pair p (0/1) of k-block j (0/1 for 4-bit, 0 for 8-bit) of word w, as
// (q − z) values in T. `bias` = magic + 2^(b-1) + z as a pair; for f16 4-bit
// `bias16` = −(64 + 8 + z) as a pair, used for the odd nibbles, which are
// taken in place (bits 4–7 of a byte → 1024 + 16·c, then ·1/16 − 72 − z by one
// HFMA2, exact) instead of being shifted down first.
template <int BITS, class T>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t w, int j, int p, uint32_t bias, uint32_t bias16, float zoff) {
  if constexpr (BITS == 4 && std::is_same_v<T, __half>) {
    const uint32_t ws = j ? (w >> 8) : w;
    if (p == 0) return sub2<T>(lop3_and_or(ws, 0x000F000Fu, Magic<T>::k4), bias);
    return hfma2_u32(lop3_and_or(ws, 0x00F000F0u, Magic<T>::k4), 0x2C002C00u /* 1/16 */, bias16);
  } else if constexpr (BITS == 4) {
    return sub2<T>(lop3_and_or(w >> (8 * j + 4 * p), 0x000F000Fu, Magic<T>::k4), bias);
  } else if constexpr (std::is_same_v<T, __half>) {
    const uint32_t v = __byte_perm(w, 0x64646464u, p == 0 ? 0x4240u : 0x4341u);  // (1024 + c0, 1024 + c2)
    return sub2<T>(v, bias);
  } else {
    // 8-bit, bf16 (7 mantissa bits: no bf16 magic holds a byte): f32 magic 2^23 + c, the byte
    // placed by one PRMT (0x4B0000cc), minus zoff = 2^23 + 128 +
    // z: exact, then one exact narrowing of the pair (|c − 128 − z| ≤ 255 needs 8 bits).
    const float lo = __uint_as_float(__byte_perm(w, 0x4B000000u, p == 0 ? 0x7650u : 0x7651u)) - zoff;
    const float hi = __uint_as_float(__byte_perm(w, 0x4B000000u, p == 0 ? 0x7652u : 0x7653u)) - zoff;
    return pack2<T>(lo, hi);
  }
}


// Geometry of one configuration: L bytes per lane per row per chunk.
template <int BITS, int L>
struct Geometry {
  static constexpr int WORDS = L / 4;        // words per lane per row per chunk
  static constexpr int HW = 32 / BITS;       // h per word
  static constexpr int KB = HW / 4;          // k-blocks (4 h per lane) per word
  static constexpr int KBC = WORDS * KB;     // k-blocks per chunk
  static constexpr int S = 4 * WORDS * HW;   // h per chunk (the quad's span)
  // h offset inside a word of value e (0..3) of the B fragment of k-block j:
  // the order dequant_pair produces (4-bit: 0,4,1,5 | 2,6,3,7; 8-bit: 0,2,1,3).
  static __device__ __forceinline__ int h_of(int j, int e) {
    if constexpr (BITS == 4) return (e & 1) * 4 + (e >> 1) + 2 * j;
    else return (e & 1) * 2 + (e >> 1);
  }
};

}  // namespace qhead::cuda_detail
