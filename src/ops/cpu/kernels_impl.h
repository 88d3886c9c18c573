// The CPU kernels, written once and compiled per ISA: kernels_avx2.cc defines
// QHEAD_ISA_AVX2 (8 f32 lanes, -mavx2 -mfma -mf16c), kernels_avx512.cc defines
// QHEAD_ISA_AVX512 (16 lanes, + -mavx512f/bw/vl/dq). Everything is in an
// anonymous namespace inside qhead::cpu::QHEAD_ISA_NS, so the two copies
// never share a symbol (see kernels.h for why that matters).
//
// The fused logits kernel, per vocab row r and activation row m:
//
//   logit[m, r] = Σ_g Σ_{j in group g} x[m, j] · w[r, j],   w = float(q - z) · s
//
// w is computed exactly as the reference computes it (the integer q - z is
// exact in f32, then ONE rounding of the product by the f32 scale), so the
// kernel's operands are the reference's and the only difference is the
// summation order: the f32 bound γ_H Σ|x·w| of the tests holds for any order.
// Two exceptions, 8-bit with M = 1 (micro_w8_m1) and the AVX2 4-bit
// nibble-plane form (micro_w4_m1_planes, micro_w4_planes_sym): there the
// scale is applied once per group, Σ_g s_g · Σ_j float(q_j - z_g) · x_j,
// because the per-weight multiply made those kernels compute-bound. The
// operands are still exact integers times x; the extra roundings (one per
// group, plus, for F32 scales, the reference's own rounding of (q - z)·s,
// ≤ u·|w|) stay far inside γ_H.
// (The "Σ c·x over UNSIGNED stored codes, minus offset·Σx" trick is NOT
// used anywhere: it cancels catastrophically.)
//
// How w is produced from the packed bytes, per ISA and bit width:
//   AVX-512, 4-bit: 16 bytes → 32 codes. vpmovzxbd widens the bytes to 16
//     dwords; byte i holds code 2i (low nibble) and 2i+1 (high nibble).
//     vpermps looks up only the low 4 bits of each index, so
//     permutexvar(bytes, T) and permutexvar(bytes >> 4, T) dequantize the even
//     and the odd codes against a per-group 16-entry table
//     T[c] = float(c - zc) · s (zc = stored zero point, or 2^(b-1) when
//     symmetric) built once per group: 4 vector ops per 32 weights.
//     The activations are permuted to match (x[2i] then x[2i+1] per 32-chunk)
//     once per call, instead of reordering the weights (docs/architecture.md,
//     Decisions: the checkpoint's packed bytes are used as they are).
//   AVX2, 4-bit: 8 bytes → 16 codes, mask/shift, subtract zc, convert,
//     multiply by s (vpermps has only 8 entries at 256 bits); with groups
//     of whole 64-element chunks, at M = 1 and for every block of a
//     symmetric table, the nibble-plane form instead (micro_w4_m1_planes,
//     micro_w4_planes_sym: and, or, subtract, then the FMAs, per 8 weights).
//   8-bit: widen, subtract zc, convert, multiply.
//
// Blocking: a call handles up to kBlockRows vocab rows. For each block of MB
// activation rows (8, 4, 2 or 1) it walks the rows in tiles of RT, keeping
// RT × MB vector accumulators in registers: each dequantized chunk of a row
// is used for MB FMAs, each activation vector for RT. The packed block (≤ 64
// rows) stays in L1/L2 across the activation blocks, so the table is read
// from memory once per call for any M.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/cpu/kernels.h"

#if !defined(QHEAD_ISA_NS)
#error "define QHEAD_ISA_NS (and QHEAD_ISA_AVX2 or QHEAD_ISA_AVX512) before including kernels_impl.h"
#endif

namespace qhead::cpu::QHEAD_ISA_NS {
namespace {

#define QHEAD_UNROLL _Pragma("GCC unroll 16")

// ---- vector primitives --------------------------------------------------------

#if defined(QHEAD_ISA_AVX512)
using VF = __m512;
using VI = __m512i;
constexpr int W = 16;  // f32 lanes
inline VF vzero() { return _mm512_setzero_ps(); }
inline VF vset(float v) { return _mm512_set1_ps(v); }
inline VF vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, VF v) { _mm512_storeu_ps(p, v); }
inline VF vfma(VF a, VF b, VF c) { return _mm512_fmadd_ps(a, b, c); }
inline VF vmul(VF a, VF b) { return _mm512_mul_ps(a, b); }
inline VF vadd(VF a, VF b) { return _mm512_add_ps(a, b); }
inline VF vsub(VF a, VF b) { return _mm512_sub_ps(a, b); }
inline VF vmax(VF a, VF b) { return _mm512_max_ps(a, b); }
inline float vsum(VF a) { return _mm512_reduce_add_ps(a); }
inline float vhmax(VF a) { return _mm512_reduce_max_ps(a); }
inline VF vcvt(VI a) { return _mm512_cvtepi32_ps(a); }
inline VI vset_i(int v) { return _mm512_set1_epi32(v); }
inline VI vzero_i() { return _mm512_setzero_si512(); }
inline VI vsub_i(VI a, VI b) { return _mm512_sub_epi32(a, b); }
// W bytes widened to W dwords.
inline VI widen_bytes(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
// W f16 / bf16 values to f32.
inline VF load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline VF load_bf16(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
// exp(x) for x <= 0 (Cephes expf polynomial; < 2 ulp on [-87, 0]).
inline VF vexp(VF x) {
  x = _mm512_max_ps(x, vset(-87.0f));
  const VF n = _mm512_roundscale_ps(vmul(x, vset(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  VF r = _mm512_fnmadd_ps(n, vset(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, vset(-2.12194440e-4f), r);
  VF p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  p = vfma(vmul(p, r), r, _mm512_add_ps(r, vset(1.0f)));
  return _mm512_scalef_ps(p, n);
}
// Lanes [0, n) of p (n < W), the others `fill`.
inline VF vload_partial(const float* p, int64_t n, float fill) {
  const __mmask16 k = static_cast<__mmask16>((1u << n) - 1u);
  return _mm512_mask_loadu_ps(vset(fill), k, p);
}
// Dequantizers: setup(s, zf) once per group (s the f32 scale, zf the stored
// zero-point code as a float — an exact small integer, so float(c) - zf is
// exactly float(q - z)), unpack(p, w) per chunk of CE weights (BYTES packed
// bytes) into NV vectors, in the chunk's lane order.
struct Deq4 {
  static constexpr int NV = 2, CE = 32, BYTES = 16;
  VF tbl;
  void setup(float s, float zf) {  // 2 vector ops (sub, mul), broadcasts folded into the operands
    const VF iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    tbl = vmul(_mm512_sub_ps(iota, vset(zf)), vset(s));
  }
  void unpack(const uint8_t* p, VF* w) const {
    const VI v = widen_bytes(p);
    w[0] = _mm512_permutexvar_ps(v, tbl);                       // codes 0, 2, ..., 30
    w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tbl);  // codes 1, 3, ..., 31
  }
};
// Even/odd halves back to natural order (dequant_row).
inline void interleave(VF even, VF odd, float* out) {
  const VI lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const VI hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  vstore(out, _mm512_permutex2var_ps(even, lo, odd));
  vstore(out + W, _mm512_permutex2var_ps(even, hi, odd));
}
#else  // AVX2
using VF = __m256;
using VI = __m256i;
constexpr int W = 8;
inline VF vzero() { return _mm256_setzero_ps(); }
inline VF vset(float v) { return _mm256_set1_ps(v); }
inline VF vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, VF v) { _mm256_storeu_ps(p, v); }
inline VF vfma(VF a, VF b, VF c) { return _mm256_fmadd_ps(a, b, c); }
inline VF vmul(VF a, VF b) { return _mm256_mul_ps(a, b); }
inline VF vadd(VF a, VF b) { return _mm256_add_ps(a, b); }
inline VF vsub(VF a, VF b) { return _mm256_sub_ps(a, b); }
inline VF vmax(VF a, VF b) { return _mm256_max_ps(a, b); }
inline float vsum(VF a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float vhmax(VF a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline VF vcvt(VI a) { return _mm256_cvtepi32_ps(a); }
inline VI vset_i(int v) { return _mm256_set1_epi32(v); }
inline VI vzero_i() { return _mm256_setzero_si256(); }
inline VI vsub_i(VI a, VI b) { return _mm256_sub_epi32(a, b); }
inline VI widen_bytes(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
inline VF load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
inline VF load_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline VF vexp(VF x) {
  x = _mm256_max_ps(x, vset(-87.0f));
  const VF n = _mm256_round_ps(vmul(x, vset(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  VF r = _mm256_fnmadd_ps(n, vset(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, vset(-2.12194440e-4f), r);
  VF p = vset(1.9875691500e-4f);
  p = vfma(p, r, vset(1.3981999507e-3f));
  p = vfma(p, r, vset(8.3334519073e-3f));
  p = vfma(p, r, vset(4.1665795894e-2f));
  p = vfma(p, r, vset(1.6666665459e-1f));
  p = vfma(p, r, vset(5.0000001201e-1f));
  p = vfma(vmul(p, r), r, _mm256_add_ps(r, vset(1.0f)));
  // 2^n: n >= -126 after the clamp, so the biased exponent stays normal.
  const VI e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), vset_i(127)), 23);
  return vmul(p, _mm256_castsi256_ps(e));
}
inline VF vload_partial(const float* p, int64_t n, float fill) {
  alignas(32) float tmp[W];
  for (int i = 0; i < W; ++i) tmp[i] = i < n ? p[i] : fill;
  return _mm256_load_ps(tmp);
}
struct Deq4 {
  static constexpr int NV = 2, CE = 16, BYTES = 8;
  VF s, zf;
  void setup(float sc, float z) { s = vset(sc); zf = vset(z); }
  void unpack(const uint8_t* p, VF* w) const {
    const VI v = widen_bytes(p);
    w[0] = vmul(vsub(vcvt(_mm256_and_si256(v, vset_i(15))), zf), s);  // codes 0, 2, ..., 14
    w[1] = vmul(vsub(vcvt(_mm256_srli_epi32(v, 4)), zf), s);          // codes 1, 3, ..., 15
  }
};
inline void interleave(VF even, VF odd, float* out) {
  const VF a = _mm256_unpacklo_ps(even, odd);  // e0 o0 e1 o1 | e4 o4 e5 o5
  const VF b = _mm256_unpackhi_ps(even, odd);  // e2 o2 e3 o3 | e6 o6 e7 o7
  vstore(out, _mm256_permute2f128_ps(a, b, 0x20));
  vstore(out + W, _mm256_permute2f128_ps(a, b, 0x31));
}
#endif

struct Deq8 {
  static constexpr int NV = 1, CE = W, BYTES = W;
  VF s, zf;
  void setup(float sc, float z) { s = vset(sc); zf = vset(z); }
  void unpack(const uint8_t* p, VF* w) const { w[0] = vmul(vsub(vcvt(widen_bytes(p)), zf), s); }
};

template <class D> constexpr int kBits = 0;
template <> constexpr int kBits<Deq4> = 4;
template <> constexpr int kBits<Deq8> = 8;

// Row tile height per activation block MB: RT × MB accumulators plus the
// dequantized row chunks must fit the register file (32 zmm / 16 ymm).
#if defined(QHEAD_ISA_AVX512)
template <int MB> constexpr int kRowTile = MB == 1 ? 4 : MB == 2 ? 4 : MB == 4 ? 3 : 2;
#else
template <int MB> constexpr int kRowTile = MB == 1 ? 4 : MB == 2 ? 2 : MB == 4 ? 2 : 1;
#endif

// ---- scales and zero points of a row block -------------------------------------

// sc[i] = scale i of rows [r0, r0 + n) as f32 (n·G contiguous values).
void load_scales(const PackedArgs& a, int64_t r0, int64_t n, float* sc) {
  const int64_t cnt = n * a.groups, base = r0 * a.groups;
  int64_t i = 0;
  switch (a.scale_kind) {
    case 0:
      std::memcpy(sc, static_cast<const float*>(a.scale) + base, static_cast<size_t>(cnt) * sizeof(float));
      return;
    case 1: {
      const uint16_t* p = static_cast<const uint16_t*>(a.scale) + base;
      for (; i + W <= cnt; i += W) vstore(sc + i, load_f16(p + i));
      for (; i < cnt; ++i) sc[i] = _cvtsh_ss(p[i]);
      return;
    }
    default: {
      const uint16_t* p = static_cast<const uint16_t*>(a.scale) + base;
      for (; i + W <= cnt; i += W) vstore(sc + i, load_bf16(p + i));
      for (; i < cnt; ++i) {
        const uint32_t b = static_cast<uint32_t>(p[i]) << 16;
        std::memcpy(sc + i, &b, 4);
      }
      return;
    }
  }
}

// With software prefetch on, the scales of the block after [.., r1) (with
// the contiguous schedule usually this thread's next task): a separate
// stream from the packed rows, small enough to fetch at once.
void prefetch_next_scales(const PackedArgs& a, int64_t r1) {
  if (a.prefetch_bytes <= 0 || r1 >= a.vocab) return;
  const int64_t esz = a.scale_kind == 0 ? 4 : 2;
  const char* p = static_cast<const char*>(a.scale) + r1 * a.groups * esz;
  const int64_t bytes = (a.vocab - r1 < kBlockRows ? a.vocab - r1 : kBlockRows) * a.groups * esz;
  for (int64_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

// zc[i·G + g] = stored zero-point code of row r0 + i, group g (the offset
// 2^(b-1) when symmetric), as a float: q - z = stored_code - zc. Bits 4 and
// 8 never straddle a word of the dim-0-packed zero-point tensor.
void load_zero_codes(const PackedArgs& a, int64_t r0, int64_t n, float* zc) {
  const int64_t g_cols = a.groups;
  if (a.zero_point == nullptr) {
    for (int64_t i = 0; i < n * g_cols; ++i) zc[i] = static_cast<float>(1 << (a.bits - 1));
    return;
  }
  const uint32_t mask = (1u << a.bits) - 1u;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t bit = (r0 + i) * a.bits;
    const uint32_t* words = reinterpret_cast<const uint32_t*>(a.zero_point) + (bit >> 5) * g_cols;
    const int sh = static_cast<int>(bit & 31);
    for (int64_t g = 0; g < g_cols; ++g) zc[i * g_cols + g] = static_cast<float>((words[g] >> sh) & mask);
  }
}

// ---- the fused logits micro-kernel -------------------------------------------------

// Two compile-time specializations matter at M = 1, where the per-group
// work is not shared by several activation rows (measured in-cache, one
// thread, 4-bit g64: 6.2 -> 4.1 cycles per 32 weights):
//   CH   chunks per group (group_len / CE) when it is 1, 2 or 4, so the chunk
//        loop unrolls completely and the group loop carries no inner loop
//        (0: the count is read at run time);
//   SYM  symmetric: the zero code is the constant 2^(b-1), so the 4-bit
//        table is one multiply of a constant vector by the scale.
template <class D>
constexpr float kHalf = static_cast<float>(1 << (kBits<D> - 1));

// Calls body(c) for c in [0, chunks): unrolled when CH > 0.
template <int CH, class F>
inline void for_chunks(int64_t chunks, F&& body) {
  if constexpr (CH > 0) {
    QHEAD_UNROLL for (int c = 0; c < CH; ++c) body(c);
  } else {
    for (int64_t c = 0; c < chunks; ++c) body(c);
  }
}

// res[r·MB + m] = logit of tile row r (rows[r]: its packed bytes) and
// activation row m (xp + m·h). sc / zc: the tile's scales and zero codes,
// row stride g_cols.
// pf: null, or where to software-prefetch: chunk k of the tile prefetches
// pf + k·RT·BYTES, so the tile's chunks together cover a tile-sized range
// (the tile's rows are consecutive) that far ahead (PackedArgs::prefetch_bytes).
template <class D, int RT, int MB, int CH, bool SYM>
inline void micro(const uint8_t* const* rows, const float* sc, const float* zc, int64_t g_cols,
                  int64_t gl, const float* xp, float* res, const uint8_t* pf) {
  VF acc[RT][MB];
  QHEAD_UNROLL for (int r = 0; r < RT; ++r)
    QHEAD_UNROLL for (int m = 0; m < MB; ++m) acc[r][m] = vzero();
  const int64_t chunks = gl / D::CE;  // per group
  const uint8_t* p = rows[0];         // row r of the tile at p + (rows[r] - rows[0])
  int64_t off[RT];
  QHEAD_UNROLL for (int r = 0; r < RT; ++r) off[r] = rows[r] - rows[0];
  const float* x = xp;                // the activation panel of the current group: [chunks][MB][CE]
  for (int64_t g = 0; g < g_cols; ++g, p += chunks * D::BYTES, x += chunks * MB * D::CE) {
    D d[RT];
    QHEAD_UNROLL for (int r = 0; r < RT; ++r) d[r].setup(sc[r * g_cols + g], SYM ? kHalf<D> : zc[r * g_cols + g]);
    if (pf) {
      for_chunks<CH>(chunks, [&](int64_t c) {
        _mm_prefetch(reinterpret_cast<const char*>(pf + ((p - rows[0]) + c * D::BYTES) * RT), _MM_HINT_T0);
      });
    }
    for_chunks<CH>(chunks, [&](int64_t c) {
      // Dequantize the chunk of every tile row first, then load each
      // activation vector once and use it for all RT rows: with x read from
      // memory per FMA, the M = 8 tile was bound by L1/L2 load bandwidth.
      VF w[RT][D::NV];
      QHEAD_UNROLL for (int r = 0; r < RT; ++r) d[r].unpack(p + off[r] + c * D::BYTES, w[r]);
      const float* xc = x + c * MB * D::CE;
      QHEAD_UNROLL for (int m = 0; m < MB; ++m)
        QHEAD_UNROLL for (int v = 0; v < D::NV; ++v) {
          VF xv = vload(xc + m * D::CE + v * W);
          __asm__("" : "+v"(xv));  // keep it in a register: GCC would otherwise reload it per FMA
          QHEAD_UNROLL for (int r = 0; r < RT; ++r) acc[r][m] = vfma(w[r][v], xv, acc[r][m]);
        }
    });
  }
  QHEAD_UNROLL for (int r = 0; r < RT; ++r)
    QHEAD_UNROLL for (int m = 0; m < MB; ++m) res[r * MB + m] = vsum(acc[r][m]);
}

// 8-bit codes minus the symmetric offset 128, as W dwords: c - 128 is the
// signed byte c ^ 0x80, so a byte-wide xor (which any vector port runs) and a
// sign-extending widen replace the dword subtract.
inline VI widen_bytes_sym8(const uint8_t* p) {
#if defined(QHEAD_ISA_AVX512)
  return _mm512_cvtepi8_epi32(_mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), _mm_set1_epi8(-128)));
#else
  return _mm256_cvtepi8_epi32(_mm_xor_si128(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), _mm_set1_epi8(-128)));
#endif
}

// M = 1, 8-bit: per group, the exact integers float(q - z) times x summed in
// f32 lanes, then scaled once (see the top of this file). RT rows at a time.
template <int RT, int CH, bool SYM>
inline void micro_w8_m1(const uint8_t* const* rows, const float* sc, const float* zc, int64_t g_cols,
                        int64_t gl, const float* xp, float* res, const uint8_t* pf) {
  VF acc[RT];
  QHEAD_UNROLL for (int r = 0; r < RT; ++r) acc[r] = vzero();
  const int64_t chunks = gl / W;
  const uint8_t* p = rows[0];
  int64_t off[RT];
  QHEAD_UNROLL for (int r = 0; r < RT; ++r) off[r] = rows[r] - rows[0];
  const float* x = xp;
  for (int64_t g = 0; g < g_cols; ++g, p += chunks * W, x += chunks * W) {
    VI zi[RT];
    VF ag[RT];
    QHEAD_UNROLL for (int r = 0; r < RT; ++r) {
      if constexpr (!SYM) zi[r] = vset_i(static_cast<int>(zc[r * g_cols + g]));
      ag[r] = vzero();
    }
    if (pf) {
      for_chunks<CH>(chunks, [&](int64_t c) {
        _mm_prefetch(reinterpret_cast<const char*>(pf + ((p - rows[0]) + c * W) * RT), _MM_HINT_T0);
      });
    }
    for_chunks<CH>(chunks, [&](int64_t c) {
      VF xv = vload(x + c * W);
      __asm__("" : "+v"(xv));
      QHEAD_UNROLL for (int r = 0; r < RT; ++r) {
        const uint8_t* q = p + off[r] + c * W;
        const VI qi = SYM ? widen_bytes_sym8(q) : vsub_i(widen_bytes(q), zi[r]);
        ag[r] = vfma(vcvt(qi), xv, ag[r]);
      }
    });
    QHEAD_UNROLL for (int r = 0; r < RT; ++r) acc[r] = vfma(ag[r], vset(sc[r * g_cols + g]), acc[r]);
  }
  QHEAD_UNROLL for (int r = 0; r < RT; ++r) res[r] = vsum(acc[r]);
}

#if defined(QHEAD_ISA_AVX2)
// 4-bit, AVX2, groups of whole 64-element chunks: the nibble-plane form.
// A chunk is 32 packed bytes, 8 dwords; dword l holds elements 8l ..
// 8l+7 of the chunk, element 8l + j in nibble j. Nibble j' of a dword (j' =
// j for j < 4, j - 4 of the dword shifted right by 16) is put into the
// mantissa of 2^(23 - 4j') by an and and an or: that float is exactly
// 2^(23-4j') + c (a mantissa unit is worth 2^-4j' there and the nibble sits
// 4j' bits up), and subtracting 2^(23-4j') + zc leaves c - zc exactly.
// These exact integers times x are summed per group in f32 lanes and scaled
// once, as micro_w8_m1 does: 4 vector instructions per 8 weights where the
// shift / convert / subtract / multiply form needs 5.5 (docs/tuning-notes.md,
// "The AVX2 nibble-plane form"). The activations come in plane order
// (KernelTable::plane4; cpu_ops.cc prepare_x). At 512 bits the form gained
// nothing on Zen 4, so the AVX-512 path keeps its table form. Two kernels:
// micro_w4_m1_planes for single activation rows of tables with zero points,
// micro_w4_planes_sym for symmetric tables at every block size.
constexpr int kPlane4 = 8 * W;
// Per nibble position j' = 0..3: its mask and the bits of 2^(23 - 4j'), read
// from memory (GCC otherwise rebuilt them per group for want of registers).
alignas(32) constexpr uint32_t kPlaneMask[4][W] = {
    {0xFu, 0xFu, 0xFu, 0xFu, 0xFu, 0xFu, 0xFu, 0xFu},
    {0xF0u, 0xF0u, 0xF0u, 0xF0u, 0xF0u, 0xF0u, 0xF0u, 0xF0u},
    {0xF00u, 0xF00u, 0xF00u, 0xF00u, 0xF00u, 0xF00u, 0xF00u, 0xF00u},
    {0xF000u, 0xF000u, 0xF000u, 0xF000u, 0xF000u, 0xF000u, 0xF000u, 0xF000u}};
alignas(32) constexpr uint32_t kPlaneExp[4][W] = {
    {150u << 23, 150u << 23, 150u << 23, 150u << 23, 150u << 23, 150u << 23, 150u << 23, 150u << 23},
    {146u << 23, 146u << 23, 146u << 23, 146u << 23, 146u << 23, 146u << 23, 146u << 23, 146u << 23},
    {142u << 23, 142u << 23, 142u << 23, 142u << 23, 142u << 23, 142u << 23, 142u << 23, 142u << 23},
    {138u << 23, 138u << 23, 138u << 23, 138u << 23, 138u << 23, 138u << 23, 138u << 23, 138u << 23}};
// One activation row, zero points: RT rows, two FMA chains per row.
template <int RT, int CH>
inline void micro_w4_m1_planes(const uint8_t* const* rows, const float* sc, const float* zc, int64_t g_cols,
                               int64_t gl, const float* xp, float* res, const uint8_t* pf) {
  constexpr int64_t BYTES = kPlane4 / 2;
  VF acc[RT];
  QHEAD_UNROLL for (int r = 0; r < RT; ++r) acc[r] = vzero();
  const int64_t chunks = gl / kPlane4;
  const uint8_t* p = rows[0];
  int64_t off[RT];
  QHEAD_UNROLL for (int r = 0; r < RT; ++r) off[r] = rows[r] - rows[0];
  const float* x = xp;
  for (int64_t g = 0; g < g_cols; ++g, p += chunks * BYTES, x += chunks * kPlane4) {
    float z[RT];  // the zero-point code: 2^(23 - 4j') + z leaves c - zc
    VF ag[RT][2];
    QHEAD_UNROLL for (int r = 0; r < RT; ++r) {
      z[r] = zc[r * g_cols + g];
      ag[r][0] = ag[r][1] = vzero();
    }
    for_chunks<CH>(chunks, [&](int64_t c) {
      if (pf) {  // a chunk of the RT rows is RT·32 bytes: one prefetch per 64 of them
        const uint8_t* q = pf + ((p - rows[0]) + c * BYTES) * RT;
        QHEAD_UNROLL for (int o = 0; o < RT * BYTES; o += 64) _mm_prefetch(reinterpret_cast<const char*>(q + o), _MM_HINT_T0);
      }
      const float* xc = x + c * kPlane4;
      QHEAD_UNROLL for (int r = 0; r < RT; ++r) {
        const VI d0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + off[r] + c * BYTES));
        const VI d1 = _mm256_srli_epi32(d0, 16);
        QHEAD_UNROLL for (int j = 0; j < 8; ++j) {
          const int jj = j & 3;
          const VI t = _mm256_or_si256(
              _mm256_and_si256(j < 4 ? d0 : d1, _mm256_load_si256(reinterpret_cast<const __m256i*>(kPlaneMask[jj]))),
              _mm256_load_si256(reinterpret_cast<const __m256i*>(kPlaneExp[jj])));
          const VF f = vsub(_mm256_castsi256_ps(t), vset(static_cast<float>(1 << (23 - 4 * jj)) + z[r]));
          ag[r][j & 1] = vfma(f, vload(xc + j * W), ag[r][j & 1]);
        }
      }
    });
    QHEAD_UNROLL for (int r = 0; r < RT; ++r) acc[r] = vfma(vadd(ag[r][0], ag[r][1]), vset(sc[r * g_cols + g]), acc[r]);
  }
  QHEAD_UNROLL for (int r = 0; r < RT; ++r) res[r] = vsum(acc[r]);
}

// Tag type: rows_for_mblock_t<Planes4, ..> runs the plane form (CE: the
// elements of one plane chunk, BYTES: its packed bytes).
struct Planes4 {
  static constexpr int CE = kPlane4, BYTES = kPlane4 / 2;
};

// Symmetric tables, RT rows × MB activation rows per tile (4 × 1, 2 × 2,
// 2 × 4). Per chunk and nibble position the plane's constants are loaded
// once for the RT rows' exact integers c - 8, and each activation vector
// once for the RT rows. The scaled sums stay in memory (one load and store
// per group and pair), so that the RT·MB chains, the rows' packed dwords,
// the constants and the integers fit the 16 ymm registers. With zero points
// at MB > 1 a second subtract per 8 weights made it slower than the table
// form (docs/tuning-notes.md), which they keep.
template <int RT, int MB, int CH>
inline void micro_w4_planes_sym(const uint8_t* const* rows, const float* sc, int64_t g_cols, int64_t gl,
                                const float* xp, float* res, const uint8_t* pf) {
  constexpr int64_t BYTES = Planes4::BYTES;
  alignas(32) float acc[RT * MB][W] = {};
  const int64_t chunks = gl / kPlane4;
  const uint8_t* p = rows[0];
  int64_t off[RT];
  QHEAD_UNROLL for (int r = 0; r < RT; ++r) off[r] = rows[r] - rows[0];
  const float* x = xp;  // the group's activations: [chunks][MB][kPlane4]
  for (int64_t g = 0; g < g_cols; ++g, p += chunks * BYTES, x += chunks * MB * kPlane4) {
    VF ag[RT][MB];
    QHEAD_UNROLL for (int r = 0; r < RT; ++r)
      QHEAD_UNROLL for (int m = 0; m < MB; ++m) ag[r][m] = vzero();
    for_chunks<CH>(chunks, [&](int64_t c) {
      if (pf) {  // a chunk of the RT rows is RT·32 bytes: one prefetch per 64 of them
        const uint8_t* q = pf + ((p - rows[0]) + c * BYTES) * RT;
        QHEAD_UNROLL for (int o = 0; o < RT * BYTES; o += 64) _mm_prefetch(reinterpret_cast<const char*>(q + o), _MM_HINT_T0);
      }
      const float* xc = x + c * MB * kPlane4;
      VI d[RT];
      QHEAD_UNROLL for (int r = 0; r < RT; ++r) d[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + off[r] + c * BYTES));
      QHEAD_UNROLL for (int j = 0; j < 8; ++j) {
        const int jj = j & 3;
        if (j == 4) QHEAD_UNROLL for (int r = 0; r < RT; ++r) d[r] = _mm256_srli_epi32(d[r], 16);
        VI mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPlaneMask[jj]));
        VI ex = _mm256_load_si256(reinterpret_cast<const __m256i*>(kPlaneExp[jj]));
        VF sub = vset(static_cast<float>(1 << (23 - 4 * jj)) + 8.0f);
        if constexpr (MB == 1) {
          // One activation row: the plane's constants and x in registers,
          // loaded once for the RT rows, each row's integers used at once.
          VF xv = vload(xc + j * W);
          __asm__("" : "+v"(mask), "+v"(ex), "+v"(sub), "+v"(xv));
          QHEAD_UNROLL for (int r = 0; r < RT; ++r) {
            const VF f = vsub(_mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(d[r], mask), ex)), sub);
            ag[r][0] = vfma(f, xv, ag[r][0]);
          }
        } else {
          // The rows' integers first, then each activation vector once for them.
          VF f[RT];
          QHEAD_UNROLL for (int r = 0; r < RT; ++r)
            f[r] = vsub(_mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(d[r], mask), ex)), sub);
          QHEAD_UNROLL for (int m = 0; m < MB; ++m) {
            VF xv = vload(xc + m * kPlane4 + j * W);
            __asm__("" : "+v"(xv));
            QHEAD_UNROLL for (int r = 0; r < RT; ++r) ag[r][m] = vfma(f[r], xv, ag[r][m]);
          }
        }
      }
    });
    QHEAD_UNROLL for (int r = 0; r < RT; ++r) {
      const VF s = vset(sc[r * g_cols + g]);
      QHEAD_UNROLL for (int m = 0; m < MB; ++m)
        vstore(acc[r * MB + m], vfma(ag[r][m], s, vload(acc[r * MB + m])));
    }
  }
  QHEAD_UNROLL for (int i = 0; i < RT * MB; ++i) res[i] = vsum(vload(acc[i]));
}

template <> constexpr int kBits<Planes4> = 4;
#else
constexpr int kPlane4 = 0;
struct Planes4;  // no such kernel on this ISA
#endif

// The row tile of kernel D for MB activation rows.
template <class D, int MB> constexpr int kTileRows = kRowTile<MB>;
#if defined(QHEAD_ISA_AVX2)
template <int MB> constexpr int kTileRows<Planes4, MB> = MB == 1 ? 4 : 2;
#endif

template <class D, int RT, int MB, int CH, bool SYM>
inline void micro_dispatch(const uint8_t* const* rows, const float* sc, const float* zc, int64_t g_cols,
                           int64_t gl, const float* xp, float* res, const uint8_t* pf) {
#if defined(QHEAD_ISA_AVX2)
  if constexpr (std::is_same_v<D, Planes4>) {
    static_assert(SYM || MB == 1, "the plane form takes zero points at single activation rows only");
    if constexpr (SYM)
      micro_w4_planes_sym<RT, MB, CH>(rows, sc, g_cols, gl, xp, res, pf);
    else if constexpr (MB == 1)
      micro_w4_m1_planes<RT, CH>(rows, sc, zc, g_cols, gl, xp, res, pf);
    return;
  }
#endif
  if constexpr (MB == 1 && kBits<D> == 8)
    micro_w8_m1<RT, CH, SYM>(rows, sc, zc, g_cols, gl, xp, res, pf);
  else if constexpr (!std::is_same_v<D, Planes4>)
    micro<D, RT, MB, CH, SYM>(rows, sc, zc, g_cols, gl, xp, res, pf);
}

// Rows [0, n) of the block (first row r0) for activation rows [m0, m0 + MB).
template <class D, int MB, int CH, bool SYM>
void rows_for_mblock_t(const PackedArgs& a, const float* xp, int64_t m0, int64_t r0, int64_t n,
                       const float* sc, const float* zc, float* out, int64_t ldo) {
  constexpr int RT = kTileRows<D, MB>;
  const int64_t g_cols = a.groups;
  const float* x = xp + m0 * a.hidden;  // this m-block's panel
  // Only the first m-block's pass reads the block from memory; the later
  // ones find it in L1/L2 and need no prefetch.
  const int64_t pf = m0 == 0 ? a.prefetch_bytes : 0;
  float res[RT * MB];
  int64_t i = 0;
  for (; i + RT <= n; i += RT) {
    const uint8_t* rows[RT];
    for (int r = 0; r < RT; ++r) rows[r] = a.packed + (r0 + i + r) * a.row_bytes;
    micro_dispatch<D, RT, MB, CH, SYM>(rows, sc + i * g_cols, zc + i * g_cols, g_cols, a.group_len, x, res,
                                       pf ? rows[0] + pf : nullptr);
    for (int r = 0; r < RT; ++r)
      for (int m = 0; m < MB; ++m) out[(m0 + m) * ldo + i + r] = res[r * MB + m];
  }
  for (; i < n; ++i) {  // the last rows of the block, one at a time
    const uint8_t* rows[1] = {a.packed + (r0 + i) * a.row_bytes};
    micro_dispatch<D, 1, MB, CH, SYM>(rows, sc + i * g_cols, zc + i * g_cols, g_cols, a.group_len, x, res,
                                      pf ? rows[0] + pf : nullptr);
    for (int m = 0; m < MB; ++m) out[(m0 + m) * ldo + i] = res[m];
  }
}

// The specializations for the group's chunk count: 1, 2 or 4 unrolled, else
// read at run time. Always inlined: as a function of its own it changed
// what GCC inlined into logits_block_t, and the AVX-512 M = 1 kernel took
// 19.2-21.4 cycles per 128 weights and row instead of 18.6.
template <class D, int MB, bool SYM>
__attribute__((always_inline)) inline void rows_by_chunks_t(const PackedArgs& a, const float* xp, int64_t m0,
                                                            int64_t r0, int64_t n, const float* sc,
                                                            const float* zc, float* out, int64_t ldo) {
  switch (a.group_len / D::CE) {
    case 1: rows_for_mblock_t<D, MB, 1, SYM>(a, xp, m0, r0, n, sc, zc, out, ldo); return;
    case 2: rows_for_mblock_t<D, MB, 2, SYM>(a, xp, m0, r0, n, sc, zc, out, ldo); return;
    case 4: rows_for_mblock_t<D, MB, 4, SYM>(a, xp, m0, r0, n, sc, zc, out, ldo); return;
    default: rows_for_mblock_t<D, MB, 0, SYM>(a, xp, m0, r0, n, sc, zc, out, ldo); return;
  }
}

// M = 1 takes the chunk-count specializations (rows_by_chunks_t), and so
// does the AVX2 plane form at every MB; the table forms' larger m-blocks
// share the per-group work among MB rows and take the generic chunk loop.
// Symmetric kernels never load the zero codes.
template <class D, int MB>
void rows_for_mblock(const PackedArgs& a, const float* xp, int64_t m0, int64_t r0, int64_t n, const float* sc,
                     const float* zc, float* out, int64_t ldo) {
  const bool sym = a.zero_point == nullptr;
#if defined(QHEAD_ISA_AVX2)
  if (plane4_layout(kBits<D>, MB, a.group_len, sym, kPlane4)) {
    if constexpr (MB > 1)  // symmetric only (plane4_layout)
      rows_by_chunks_t<Planes4, MB, true>(a, xp, m0, r0, n, sc, zc, out, ldo);
    else if (sym)
      rows_by_chunks_t<Planes4, 1, true>(a, xp, m0, r0, n, sc, zc, out, ldo);
    else
      rows_by_chunks_t<Planes4, 1, false>(a, xp, m0, r0, n, sc, zc, out, ldo);
    return;
  }
#endif
  if constexpr (MB == 1) {
    if (sym)
      rows_by_chunks_t<D, 1, true>(a, xp, m0, r0, n, sc, zc, out, ldo);
    else
      rows_by_chunks_t<D, 1, false>(a, xp, m0, r0, n, sc, zc, out, ldo);
  } else if (sym) {
    rows_for_mblock_t<D, MB, 0, true>(a, xp, m0, r0, n, sc, zc, out, ldo);
  } else {
    rows_for_mblock_t<D, MB, 0, false>(a, xp, m0, r0, n, sc, zc, out, ldo);
  }
}

// The largest activation block of the exact kernels (KernelTable::mb_max). On
// AVX2 (Zen 4, in cache, cycles per 128 weights, row and activation row) the
// 2-row × 4-column tile takes 14.4 / 14.1 / 13.5 (w4g64 / w4g128 / w8g128)
// where the 1-row × 8-column one took 16.7 / 16.6 / 17.2.
#if defined(QHEAD_ISA_AVX512)
constexpr int kMbMax = 8;
#else
constexpr int kMbMax = 4;
#endif

template <class D>
void logits_block_t(const PackedArgs& a, const float* xp, int64_t m_total, int64_t r0, int64_t r1, float* out,
                    int64_t ldo, float* scratch) {
  const int64_t n = r1 - r0;
  float* sc = scratch;
  float* zc = scratch + kBlockRows * a.groups;
  prefetch_next_scales(a, r1);
  load_scales(a, r0, n, sc);
  if (a.zero_point != nullptr) load_zero_codes(a, r0, n, zc);  // symmetric kernels use the constant
  for (int64_t m = 0; m < m_total;) {
    const int64_t mb = m_block(m_total - m, kMbMax);
    switch (mb) {
      case 8:
        if constexpr (kMbMax >= 8) rows_for_mblock<D, 8>(a, xp, m, r0, n, sc, zc, out, ldo);
        break;
      case 4: rows_for_mblock<D, 4>(a, xp, m, r0, n, sc, zc, out, ldo); break;
      case 2: rows_for_mblock<D, 2>(a, xp, m, r0, n, sc, zc, out, ldo); break;
      default: rows_for_mblock<D, 1>(a, xp, m, r0, n, sc, zc, out, ldo); break;
    }
    m += mb;
  }
}

void logits_block(const PackedArgs& a, const float* xp, int64_t m, int64_t r0, int64_t r1, float* out, int64_t ldo,
                  float* scratch) {
  if (a.bits == 4)
    logits_block_t<Deq4>(a, xp, m, r0, r1, out, ldo, scratch);
  else
    logits_block_t<Deq8>(a, xp, m, r0, r1, out, ldo, scratch);
}

// ---- the int8-activation mode (opt-in: qhead::CpuActivations::kInt8) -------------------
//
// x is quantized per block of 32 elements to int8 (cpu_ops.cc
// prepare_x_int8: s_b = max|x|/127, q = rint(x/s_b), so |x - s_b·q| <= s_b/2);
// the packed codes c (unsigned, as stored) are multiplied by q in integers,
// four products summed into each int32 lane with no saturation, and the
// zero point is taken off in the same integers: each lane's accumulator
// starts at -zc·Σq (Σq per lane is prepared with x), so the lane holds
// Σ (c - zc)·q EXACTLY (|.| < 2^19). Only then does f32 arithmetic start:
// acc += float(lane) · (s_b · s_g). The result is Σ_j x̂_j · w_j with
// x̂ = s_b·q, computed with a handful of roundings per term — the f32 bound
// γ_H Σ|x̂·w| holds — so the extra error of this mode is exactly that of
// replacing x by x̂: Σ_j |w_j|·|x_j - x̂_j| <= Σ_j |w_j| · s_b(j)/2
// (tests/test_cpu_kernels.cc checks this bound).
//
// Two integer dot products, the same integers and so the same results bit
// for bit (tests/test_cpu_kernels.cc, Int8DotProductsAgree):
//   int8_vnni  VNNI vpdpbusd (AVX512_VNNI on the avx512 path, AVX-VNNI on the
//              avx2 path), where CPUID reports it;
//   int8_madd  vpmaddubsw (pairs of u8·s8 products into int16) + vpmaddwd
//              (pairs of those into int32), on every AVX2 / AVX-512BW CPU.
//              4-bit codes are < 16, so a pair sum is at most 2·15·127 = 3810:
//              no saturation; a chunk's low- and high-nibble pair sums are
//              added in int16 (at most 7620) before the one vpmaddwd.
//              8-bit codes are split into nibbles, c = 16·hi + lo, each
//              nibble's pairs summed as above and the high ones weighted by
//              16 in vpmaddwd (int32, exact).
// The VNNI instructions are enabled per function (target attribute), not
// for the TU: the other kernels of this file must still run on CPUs
// without VNNI. Everything an int8 kernel calls is inlined into it.
#if defined(QHEAD_ISA_AVX512)
inline VI vload_i(const void* p) { return _mm512_loadu_si512(p); }
// The first n bytes at p (n a multiple of 4, <= 4·W), zeros after; reads nothing past them.
inline VI vload_bytes_partial(const uint8_t* p, int64_t n) {
  return _mm512_maskz_loadu_epi8(n >= 64 ? ~0ull : (1ull << n) - 1ull, p);
}
inline VI vand_i(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI vor_i(VI a, VI b) { return _mm512_or_si512(a, b); }
inline VI vadd_i(VI a, VI b) { return _mm512_add_epi32(a, b); }
inline VI vadd_i16(VI a, VI b) { return _mm512_add_epi16(a, b); }
inline VI vsrl16_4(VI a) { return _mm512_srli_epi16(a, 4); }
inline VI vset_i8(char c) { return _mm512_set1_epi8(c); }
inline VI vset_i16(short c) { return _mm512_set1_epi16(c); }
inline VI vmadd16(VI a, VI b) { return _mm512_madd_epi16(a, b); }
inline VI vmaddubs(VI u, VI s) { return _mm512_maddubs_epi16(u, s); }
inline VF vperm_f(VF v, VI idx) { return _mm512_permutexvar_ps(idx, v); }
inline VI vperm_i(VI v, VI idx) { return _mm512_permutexvar_epi32(idx, v); }
inline VI vcvt_i(VF v) { return _mm512_cvtps_epi32(v); }
// The int8 kernels' quad form (kernels_int8.h): dword J of each 128-bit lane
// into the lane's four dwords.
template <int J> inline VI spread_dword(VI v) { return _mm512_shuffle_epi32(v, static_cast<_MM_PERM_ENUM>(J * 0x55)); }
// Lane 4s + i = Σ of the four dwords of 128-bit lane s of d_i (i = 0..3).
inline VI sum_spans4(VI d0, VI d1, VI d2, VI d3) {
  const VI p01 = _mm512_add_epi32(_mm512_unpacklo_epi32(d0, d1), _mm512_unpackhi_epi32(d0, d1));
  const VI p23 = _mm512_add_epi32(_mm512_unpacklo_epi32(d2, d3), _mm512_unpackhi_epi32(d2, d3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(p01, p23), _mm512_unpackhi_epi64(p01, p23));
}
// The row-quad form's weight scales, lane 4s + i = row i's scale of span s's
// group, from the four rows' own scales (s_i, each at the chunk's first
// group; a chunk of 4-bit codes is 128 elements, at most four groups of
// >= 32): each row's first four in 128-bit lane i, then one permute by
// Int8X::gidxr (the span's group + 4·i). Four 16-byte loads, not 64-byte
// ones: at s_i + g0 those split a cache line on most chunks, and with them
// and two two-source permutes the pick took 20 % of an M = 1 call in cache.
// (The transposed per-quad copy the AVX2 path reads, one 64-byte load and one
// permute here, measured no better: in cache, 4096x1024, one thread, M = 1
// w4g64 64-65 against 62 µs, w8g128 77 against 79, M = 2 w8g128 122 against
// 114.)
constexpr bool kRowQuadScalesT = false;
inline VF rowquad_scales(const float* const (&s)[4], const float*, int64_t g0, VI idx) {
  __m512 z = _mm512_castps128_ps512(_mm_loadu_ps(s[0] + g0));
  z = _mm512_insertf32x4(z, _mm_loadu_ps(s[1] + g0), 1);
  z = _mm512_insertf32x4(z, _mm_loadu_ps(s[2] + g0), 2);
  z = _mm512_insertf32x4(z, _mm_loadu_ps(s[3] + g0), 3);
  return _mm512_permutexvar_ps(idx, z);
}
// A row's first four (-zc) words of the chunk (gidx, their index, is at most
// 3); the lanes above are undefined. A 16-byte load, for the same reason.
inline VI load_chunk_groups(const int32_t* p) {
  return _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// i = 0..3: Σ over the spans s of lane 4s + i, in a fixed order.
inline __m128 sum_quads(VF v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}
#define QHEAD_VNNI_TARGET __attribute__((target("avx512vnni")))
#define QHEAD_VNNI_DPBUSD _mm512_dpbusd_epi32
constexpr int kInt8Vnni = 1;  // AVX512_VNNI
#else
inline VI vload_i(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline VI vload_bytes_partial(const uint8_t* p, int64_t n) {
  const VI lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_epi32(reinterpret_cast<const int*>(p), _mm256_cmpgt_epi32(vset_i(static_cast<int>(n / 4)), lane));
}
inline VI vand_i(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI vor_i(VI a, VI b) { return _mm256_or_si256(a, b); }
inline VI vadd_i(VI a, VI b) { return _mm256_add_epi32(a, b); }
inline VI vadd_i16(VI a, VI b) { return _mm256_add_epi16(a, b); }
inline VI vsrl16_4(VI a) { return _mm256_srli_epi16(a, 4); }
inline VI vset_i8(char c) { return _mm256_set1_epi8(c); }
inline VI vset_i16(short c) { return _mm256_set1_epi16(c); }
inline VI vmadd16(VI a, VI b) { return _mm256_madd_epi16(a, b); }
inline VI vmaddubs(VI u, VI s) { return _mm256_maddubs_epi16(u, s); }
inline VF vperm_f(VF v, VI idx) { return _mm256_permutevar8x32_ps(v, idx); }
inline VI vperm_i(VI v, VI idx) { return _mm256_permutevar8x32_epi32(v, idx); }
inline VI vcvt_i(VF v) { return _mm256_cvtps_epi32(v); }
template <int J> inline VI spread_dword(VI v) { return _mm256_shuffle_epi32(v, J * 0x55); }
inline VI sum_spans4(VI d0, VI d1, VI d2, VI d3) {
  const VI p01 = _mm256_add_epi32(_mm256_unpacklo_epi32(d0, d1), _mm256_unpackhi_epi32(d0, d1));
  const VI p23 = _mm256_add_epi32(_mm256_unpacklo_epi32(d2, d3), _mm256_unpackhi_epi32(d2, d3));
  return _mm256_add_epi32(_mm256_unpacklo_epi64(p01, p23), _mm256_unpackhi_epi64(p01, p23));
}
// The row-quad form's weight scales from the block's per-quad transposed
// copy (t: the quad's scales as [group][row], build_quad_scales; a chunk of
// 4-bit codes is 64 elements, at most two groups): the chunk's first two
// groups' eight scales are one load, lane 4s + i picked by one vpermps
// (Int8X::gidxr: the span's group · 4 + i). Against picking from the four
// rows' own scales (four loads, four vpermps, three blends), in cache
// 4096x1024, one thread: M = 1 w4g64 91 against 99 µs, w8g128 165 against
// 178, zero points 119 against 124; M = 2 3-5 % faster.
constexpr bool kRowQuadScalesT = true;
inline VF rowquad_scales(const float* const (&)[4], const float* t, int64_t g0, VI idx) {
  return _mm256_permutevar8x32_ps(_mm256_loadu_ps(t + 4 * g0), idx);
}
inline VI load_chunk_groups(const int32_t* p) { return vload_i(p); }
inline __m128 sum_quads(VF v) { return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); }
#if (defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11)
#define QHEAD_VNNI_TARGET __attribute__((target("avxvnni")))
#define QHEAD_VNNI_DPBUSD _mm256_dpbusd_avx_epi32
constexpr int kInt8Vnni = 2;  // AVX_VNNI (the VEX form)
#else
constexpr int kInt8Vnni = 0;  // a compiler without AVX-VNNI intrinsics: the avx2 path has int8_madd only
#endif
#endif

#if defined(QHEAD_VNNI_TARGET)
namespace int8_vnni {
#define QHEAD_INT8_TARGET QHEAD_VNNI_TARGET
QHEAD_INT8_TARGET __attribute__((always_inline)) inline VI dot4x2(VI acc, VI u0, VI s0, VI u1, VI s1) {
  return QHEAD_VNNI_DPBUSD(QHEAD_VNNI_DPBUSD(acc, u0, s0), u1, s1);
}
QHEAD_INT8_TARGET __attribute__((always_inline)) inline VI dot8(VI acc, VI u, VI s) { return QHEAD_VNNI_DPBUSD(acc, u, s); }
// The quad form's sum of one lane set: start(t), then add(v, u, x) for the
// NV x vectors, then finish(). 8-bit codes stay whole.
constexpr bool kQuadSplit8 = false;
template <int BITS>
struct QuadSum {
  VI d;
  QHEAD_INT8_TARGET __attribute__((always_inline)) void start(VI t) { d = t; }
  QHEAD_INT8_TARGET __attribute__((always_inline)) void add(int v, const VI (&u)[8], VI x) {
    d = QHEAD_VNNI_DPBUSD(d, u[v], x);
  }
  QHEAD_INT8_TARGET __attribute__((always_inline)) VI finish() const { return d; }
};
#include "ops/cpu/kernels_int8.h"
#undef QHEAD_INT8_TARGET
}  // namespace int8_vnni
#endif

namespace int8_madd {
#define QHEAD_INT8_TARGET
// Both halves' pair sums added in int16 before one vpmaddwd: each is at most
// 2·15·127 = 3810, their sum 7620 (5 instructions for two vpdpbusd, not 6).
__attribute__((always_inline)) inline VI dot4x2(VI acc, VI u0, VI s0, VI u1, VI s1) {
  return vadd_i(acc, vmadd16(vadd_i16(vmaddubs(u0, s0), vmaddubs(u1, s1)), vset_i16(1)));
}
__attribute__((always_inline)) inline VI dot8(VI acc, VI u, VI s) {
  const VI nib = vset_i8(0x0F);
  const VI lo = vand_i(u, nib), hi = vand_i(vsrl16_4(u), nib);
  return vadd_i(vadd_i(acc, vmadd16(vmaddubs(lo, s), vset_i16(1))), vmadd16(vmaddubs(hi, s), vset_i16(16)));
}
// The quad form: 8-bit codes split into nibbles once per chunk (u[j] the
// low, u[4 + j] the high ones of packed dword j). A lane's int16 pair sums
// are added before one vpmaddwd: 4-bit, eight of at most 2·15·127 = 3810
// (30480 < 2^15); 8-bit, four per nibble half (15240), the high half
// weighted by 16 in vpmaddwd.
constexpr bool kQuadSplit8 = true;
template <int BITS>
struct QuadSum {
  VI d, lo, hi;
  __attribute__((always_inline)) void start(VI t) { d = t; }
  __attribute__((always_inline)) void add(int v, const VI (&u)[8], VI x) {
    const VI p = vmaddubs(u[v], x);
    lo = v == 0 ? p : vadd_i16(lo, p);
    if constexpr (BITS == 8) {
      const VI ph = vmaddubs(u[4 + v], x);
      hi = v == 0 ? ph : vadd_i16(hi, ph);
    }
  }
  __attribute__((always_inline)) VI finish() const {
    if constexpr (BITS == 4) return vadd_i(d, vmadd16(lo, vset_i16(1)));
    return vadd_i(vadd_i(d, vmadd16(lo, vset_i16(1))), vmadd16(hi, vset_i16(16)));
  }
};
#include "ops/cpu/kernels_int8.h"
#undef QHEAD_INT8_TARGET
}  // namespace int8_madd

// ---- the sample op's Gumbel noise ------------------------------------------------------
//
// The noise of src/ops/sample.h for `groups` consecutive groups of four
// columns (group g: Philox4x32-10 of counter (g, row, c2, c3) and key
// (k0, k1), word e for column 4g + e), into out[4 · groups] in column order:
// -log(-log u), u = ((w >> 9) + 1/2) / 2^23. Philox runs on W groups per
// vector (32-bit lanes; the high half of each product from two vpmuludq on
// even and odd lanes); the logarithm is Cephes' logf polynomial (< 2 ulp on
// normal numbers, which every argument here is: u >= 2^-24, -log u >= 2^-24).
#if defined(QHEAD_ISA_AVX512)
inline VI vmullo_u32(VI a, VI b) { return _mm512_mullo_epi32(a, b); }
inline VI vmulhi_u32(VI a, VI b) {
  const VI even = _mm512_srli_epi64(_mm512_mul_epu32(a, b), 32);
  const VI odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), _mm512_srli_epi64(b, 32));
  return _mm512_mask_blend_epi32(static_cast<__mmask16>(0xAAAA), even, odd);
}
inline VI vxor_i(VI a, VI b) { return _mm512_xor_si512(a, b); }
inline VI vsrl_i(VI a, int n) { return _mm512_srli_epi32(a, static_cast<unsigned>(n)); }
inline VI vsetr_seq(int base) {
  return _mm512_add_epi32(vset_i(base), _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
}
inline VF vcast_f(VI a) { return _mm512_castsi512_ps(a); }
inline VI vcast_i(VF a) { return _mm512_castps_si512(a); }
inline VF vselect(VF a, VF b, VF lt_l, VF lt_r) {  // lt_l < lt_r ? b : a
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(lt_l, lt_r, _CMP_LT_OQ), a, b);
}
inline void vstore_i(uint32_t* p, VI v) { _mm512_storeu_si512(p, v); }
#else
inline VI vmullo_u32(VI a, VI b) { return _mm256_mullo_epi32(a, b); }
inline VI vmulhi_u32(VI a, VI b) {
  const VI even = _mm256_srli_epi64(_mm256_mul_epu32(a, b), 32);
  const VI odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32));
  return _mm256_blend_epi32(even, odd, 0xAA);
}
inline VI vxor_i(VI a, VI b) { return _mm256_xor_si256(a, b); }
inline VI vsrl_i(VI a, int n) { return _mm256_srli_epi32(a, n); }
inline VI vsetr_seq(int base) { return _mm256_add_epi32(vset_i(base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }
inline VF vcast_f(VI a) { return _mm256_castsi256_ps(a); }
inline VI vcast_i(VF a) { return _mm256_castps_si256(a); }
inline VF vselect(VF a, VF b, VF lt_l, VF lt_r) { return _mm256_blendv_ps(a, b, _mm256_cmp_ps(lt_l, lt_r, _CMP_LT_OQ)); }
inline void vstore_i(uint32_t* p, VI v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), v); }
#endif

// log(x) for normal x > 0 (Cephes logf).
inline VF vlog(VF x) {
  const VI bits = vcast_i(x);
  const VF ef0 = vcvt(vsub_i(vsrl_i(bits, 23), vset_i(126)));
  const VF m0 = vcast_f(vor_i(vand_i(bits, vset_i(0x007FFFFF)), vset_i(0x3F000000)));  // [0.5, 1)
  const VF one = vset(1.0f);
  // m0 < sqrt(1/2): m = 2·m0 - 1 and e - 1; else m = m0 - 1 and e.
  const VF sqrth = vset(0.707106781186547524f);
  const VF m = vselect(vsub(m0, one), vsub(vadd(m0, m0), one), m0, sqrth);
  const VF ef = vselect(ef0, vsub(ef0, one), m0, sqrth);
  const VF z = vmul(m, m);
  VF p = vset(7.0376836292e-2f);
  p = vfma(p, m, vset(-1.1514610310e-1f));
  p = vfma(p, m, vset(1.1676998740e-1f));
  p = vfma(p, m, vset(-1.2420140846e-1f));
  p = vfma(p, m, vset(1.4249322787e-1f));
  p = vfma(p, m, vset(-1.6668057665e-1f));
  p = vfma(p, m, vset(2.0000714765e-1f));
  p = vfma(p, m, vset(-2.4999993993e-1f));
  p = vfma(p, m, vset(3.3333331174e-1f));
  VF y = vmul(vmul(p, m), z);
  y = vfma(ef, vset(-2.12194440e-4f), y);
  y = vfma(z, vset(-0.5f), y);
  return vfma(ef, vset(0.693359375f), vadd(m, y));
}

void gumbel_noise(uint32_t k0, uint32_t k1, uint32_t row, uint32_t c2, uint32_t c3, uint32_t g0, int64_t groups,
                  float* out) {
  alignas(64) uint32_t words[4][W];
  for (int64_t gb = 0; gb < groups; gb += W) {
    VI x0 = vsetr_seq(static_cast<int>(g0 + static_cast<uint32_t>(gb))), x1 = vset_i(static_cast<int>(row)),
       x2 = vset_i(static_cast<int>(c2)), x3 = vset_i(static_cast<int>(c3));
    VI key0 = vset_i(static_cast<int>(k0)), key1 = vset_i(static_cast<int>(k1));
    const VI m0 = vset_i(static_cast<int>(0xD2511F53u)), m1 = vset_i(static_cast<int>(0xCD9E8D57u));
    const VI w0 = vset_i(static_cast<int>(0x9E3779B9u)), w1 = vset_i(static_cast<int>(0xBB67AE85u));
    for (int r = 0; r < 10; ++r) {
      const VI hi0 = vmulhi_u32(m0, x0), lo0 = vmullo_u32(m0, x0);
      const VI hi1 = vmulhi_u32(m1, x2), lo1 = vmullo_u32(m1, x2);
      const VI n0 = vxor_i(vxor_i(hi1, x1), key0), n2 = vxor_i(vxor_i(hi0, x3), key1);
      x0 = n0;
      x1 = lo1;
      x2 = n2;
      x3 = lo0;
      key0 = vadd_i(key0, w0);
      key1 = vadd_i(key1, w1);
    }
    const VI xs[4] = {x0, x1, x2, x3};
    for (int e = 0; e < 4; ++e) {
      // u = ((w >> 9) + 1/2) · 2^-23, then -log(-log u).
      const VF u = vmul(vadd(vcvt(vsrl_i(xs[e], 9)), vset(0.5f)), vset(0x1p-23f));
      const VF g = vsub(vzero(), vlog(vsub(vzero(), vlog(u))));
      vstore_i(words[e], vcast_i(g));
    }
    const int64_t n = groups - gb < W ? groups - gb : W;
    for (int64_t q = 0; q < n; ++q)
      for (int e = 0; e < 4; ++e) std::memcpy(out + 4 * (gb + q) + e, &words[e][q], 4);
  }
}

// ---- gather ------------------------------------------------------------------------

void dequant_row(const PackedArgs& a, int64_t r, float* out) {
  const uint8_t* row = a.packed + r * a.row_bytes;
  const int64_t g_cols = a.groups, gl = a.group_len;
  for (int64_t g = 0; g < g_cols; ++g) {
    float s;  // scale (r, g) as f32
    float z;  // stored zero-point code of (r, g), or 2^(b-1)
    {
      const int64_t idx = r * g_cols + g;
      if (a.scale_kind == 0) {
        s = static_cast<const float*>(a.scale)[idx];
      } else if (a.scale_kind == 1) {
        s = _cvtsh_ss(static_cast<const uint16_t*>(a.scale)[idx]);
      } else {
        const uint32_t b = static_cast<uint32_t>(static_cast<const uint16_t*>(a.scale)[idx]) << 16;
        std::memcpy(&s, &b, 4);
      }
      if (a.zero_point == nullptr) {
        z = static_cast<float>(1 << (a.bits - 1));
      } else {
        const int64_t bit = r * a.bits;
        const uint32_t word = reinterpret_cast<const uint32_t*>(a.zero_point)[(bit >> 5) * g_cols + g];
        z = static_cast<float>((word >> (bit & 31)) & ((1u << a.bits) - 1u));
      }
    }
    if (a.bits == 4) {
      Deq4 d;
      d.setup(s, z);
      for (int64_t j = g * gl; j < (g + 1) * gl; j += Deq4::CE) {
        VF w[2];
        d.unpack(row + (j / Deq4::CE) * Deq4::BYTES, w);
        interleave(w[0], w[1], out + j);
      }
    } else {
      Deq8 d;
      d.setup(s, z);
      for (int64_t j = g * gl; j < (g + 1) * gl; j += Deq8::CE) {
        VF w[1];
        d.unpack(row + j, w);
        vstore(out + j, w[0]);
      }
    }
  }
}

// ---- top-k / log-sum-exp helpers and the dense dot ------------------------------------------

// max_i l[i] (n >= 1).
float max_of(const float* l, int64_t n) {
  VF mx = vset(-INFINITY);
  int64_t i = 0;
  for (; i + W <= n; i += W) mx = vmax(mx, vload(l + i));
  if (i < n) mx = vmax(mx, vload_partial(l + i, n - i, -INFINITY));
  return vhmax(mx);
}

// The top-k epilogue of one block of n <= 64 logits (one activation row),
// KernelTable::topk_block. One pass compares each vector with thr (the
// heap's bitmask) and with the running max; only a block that raises the
// max pays for a horizontal max and the rescaling of what was summed (a few
// times per row). The exps go into per-lane sums, reduced every kLseFlush
// blocks: no horizontal reduction in the common block.
void topk_block(const float* l, int64_t n, float thr, LseState* st, uint64_t* ge) {
  const VF vt = vset(thr), vmx = vset(st->mx);
  uint64_t mask = 0;
  bool above = false;
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    const VF v = vload(l + i);
#if defined(QHEAD_ISA_AVX512)
    mask |= static_cast<uint64_t>(_mm512_cmp_ps_mask(v, vt, _CMP_GE_OQ)) << i;
    above |= _mm512_cmp_ps_mask(v, vmx, _CMP_GT_OQ) != 0;
#else
    mask |= static_cast<uint64_t>(static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(v, vt, _CMP_GE_OQ)))) << i;
    above |= _mm256_movemask_ps(_mm256_cmp_ps(v, vmx, _CMP_GT_OQ)) != 0;
#endif
  }
  for (; i < n; ++i) {
    if (l[i] >= thr) mask |= uint64_t{1} << i;
    above |= l[i] > st->mx;
  }
  *ge = mask;
  if (above) {  // the running max rises: what was summed is rescaled to the new one
    const float b = max_of(l, n);
    st->sum = st->mx > -INFINITY ? st->total() * std::exp(static_cast<double>(st->mx) - static_cast<double>(b)) : 0.0;
    vstore(st->acc, vzero());
    st->pending = 0;
    st->mx = b;
  }
  if (st->mx == -INFINITY) return;  // every logit so far is -inf: nothing to sum
  const VF vm = vset(st->mx);
  VF s0 = vload(st->acc), s1 = vzero();
  for (i = 0; i + 2 * W <= n; i += 2 * W) {
    s0 = vadd(s0, vexp(vsub(vload(l + i), vm)));
    s1 = vadd(s1, vexp(vsub(vload(l + i + W), vm)));
  }
  for (; i + W <= n; i += W) s0 = vadd(s0, vexp(vsub(vload(l + i), vm)));
  for (; i < n; ++i) st->sum += static_cast<double>(::expf(l[i] - st->mx));
  s0 = vadd(s0, s1);
  if (++st->pending == kLseFlush) {
    st->sum += static_cast<double>(vsum(s0));
    s0 = vzero();
    st->pending = 0;
  }
  vstore(st->acc, s0);
}

float dot_dense(const float* x, const void* row, int kind, int64_t h) {
  VF a0 = vzero(), a1 = vzero();
  int64_t j = 0;
  float tail = 0.0f;
  if (kind == 0) {
    const float* p = static_cast<const float*>(row);
    for (; j + 2 * W <= h; j += 2 * W) {
      a0 = vfma(vload(x + j), vload(p + j), a0);
      a1 = vfma(vload(x + j + W), vload(p + j + W), a1);
    }
    for (; j < h; ++j) tail += x[j] * p[j];
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(row);
    for (; j + W <= h; j += W) a0 = vfma(vload(x + j), kind == 1 ? load_f16(p + j) : load_bf16(p + j), a0);
    for (; j < h; ++j) {
      float w;
      if (kind == 1) {
        w = _cvtsh_ss(p[j]);
      } else {
        const uint32_t b = static_cast<uint32_t>(p[j]) << 16;
        std::memcpy(&w, &b, 4);
      }
      tail += x[j] * w;
    }
  }
  return vsum(vadd(a0, a1)) + tail;
}

float fma_burn(int64_t iters) {
  VF a[12];
  for (int k = 0; k < 12; ++k) a[k] = vset(static_cast<float>(k));
  const VF b = vset(0.999f), c = vset(1e-3f);
  for (int64_t i = 0; i < iters; ++i) {
    QHEAD_UNROLL for (int k = 0; k < 12; ++k) a[k] = vfma(a[k], b, c);
  }
  VF s = a[0];
  for (int k = 1; k < 12; ++k) s = vadd(s, a[k]);
  return vsum(s);
}

uint64_t read_sum(const void* p, int64_t bytes, int64_t prefetch) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  constexpr int64_t V = 4 * W;  // bytes per vector
  VI a0 = vzero_i(), a1 = vzero_i(), a2 = vzero_i(), a3 = vzero_i();
  for (int64_t i = 0; i + 4 * V <= bytes; i += 4 * V) {
    if (prefetch > 0)
      for (int64_t o = 0; o < 4 * V; o += 64) _mm_prefetch(reinterpret_cast<const char*>(b + i + prefetch + o), _MM_HINT_T0);
#if defined(QHEAD_ISA_AVX512)
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(b + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(b + i + V));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(b + i + 2 * V));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(b + i + 3 * V));
#else
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i + V)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i + 2 * V)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i + 3 * V)));
#endif
  }
  alignas(64) uint64_t lanes[4 * W / 8];
#if defined(QHEAD_ISA_AVX512)
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
#else
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3)));
#endif
  uint64_t sum = 0;
  for (uint64_t v : lanes) sum += v;
  return sum;
}

}  // namespace

#if defined(QHEAD_VNNI_TARGET)
constexpr auto* kLogitsInt8 = &int8_vnni::logits_block_int8;
#else
constexpr auto* kLogitsInt8 = static_cast<decltype(KernelTable::logits_block_int8)>(nullptr);
#endif

const KernelTable kTable = {
    QHEAD_ISA_NAME, Deq4::CE, Deq8::CE, 8 * W, 4 * W, kPlane4, kMbMax, &logits_block, kLogitsInt8, kInt8Vnni,
    &int8_madd::logits_block_int8, &gumbel_noise,
    &dequant_row, &topk_block, &dot_dense, &fma_burn, &read_sum, W,
};

}  // namespace qhead::cpu::QHEAD_ISA_NS
