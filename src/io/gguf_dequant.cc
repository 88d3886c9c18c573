// gguf_dequant.cc — exact dequantization of the common ggml types.
//
// Each kernel reproduces ggml's reference dequantize_row_* (ggml-quants.c)
// and the gguf Python package's numpy port of it, operation for operation in
// f32: the block scale is widened from f16, multiplied by the (integer) code,
// and the min is added or subtracted afterwards — never fused: this file alone
// is compiled with -ffp-contract=off (CMakeLists.txt), so the results are
// bit-identical to the references.
//
// A block kernel takes `nb` consecutive blocks at `x` and writes
// nb × block_size values to y. Block layouts (ggml-common.h), all little-endian:
//   Q4_0  {f16 d; u8 qs[16]}                 32 values: (q - 8)·d
//   Q4_1  {f16 d, m; u8 qs[16]}              32 values: q·d + m
//   Q5_0  {f16 d; u8 qh[4]; u8 qs[16]}       32 values: (q - 16)·d, q 5 bits
//   Q5_1  {f16 d, m; u8 qh[4]; u8 qs[16]}    32 values: q·d + m
//   Q8_0  {f16 d; i8 qs[32]}                 32 values: q·d
// In the 32-value blocks byte j holds value j (low nibble) and value j + 16
// (high nibble); the fifth bit of value j is bit j of qh (a u32).
//   Q4_K  {f16 d, dmin; u8 scales[12]; u8 qs[128]}           256 values
//   Q5_K  {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]} 256 values
//   Q6_K  {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}       256 values
// Q4_K/Q5_K: 8 sub-blocks of 32, each with a 6-bit scale and min packed into
// `scales` (see scale_min_k4); value = (d·sc)·q − (dmin·m). Q6_K: 16
// sub-blocks of 16 with an int8 scale; value = (d·sc)·(q − 32).

#include "io/gguf_dequant.h"

#include <cstring>

#include "qhead/dtype.h"

namespace qhead::io {

namespace {

uint16_t rd16(const unsigned char* p) { return uint16_t(p[0] | (p[1] << 8)); }
uint32_t rd32(const unsigned char* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

float h2f(const unsigned char* p) { return f16_to_f32(rd16(p)); }

// Scale and min of sub-block j (0..7) from the 12 packed bytes of a Q4_K/Q5_K
// block: sub-blocks 0..3 keep 6 bits in bytes j (scale) and j + 4 (min);
// sub-blocks 4..7 keep their low 4 bits in byte j + 4 (scale low nibble, min
// high nibble) and their top 2 bits in the top bits of bytes j − 4 (scale)
// and j (min).
void scale_min_k4(int j, const unsigned char* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace


void deq_q4_0(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 18, y += 32) {
    const float d = h2f(x);
    const unsigned char* qs = x + 2;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void deq_q4_1(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 20, y += 32) {
    const float d = h2f(x), m = h2f(x + 2);
    const unsigned char* qs = x + 4;
    for (int j = 0; j < 16; ++j) {
      y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

void deq_q5_0(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 22, y += 32) {
    const float d = h2f(x);
    const uint32_t qh = rd32(x + 2);
    const unsigned char* qs = x + 6;
    for (int j = 0; j < 16; ++j) {
      const int hi0 = static_cast<int>((qh >> j) & 1u) << 4;
      const int hi1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      y[j] = static_cast<float>(((qs[j] & 0x0F) | hi0) - 16) * d;
      y[j + 16] = static_cast<float>(((qs[j] >> 4) | hi1) - 16) * d;
    }
  }
}

void deq_q5_1(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 24, y += 32) {
    const float d = h2f(x), m = h2f(x + 2);
    const uint32_t qh = rd32(x + 4);
    const unsigned char* qs = x + 8;
    for (int j = 0; j < 16; ++j) {
      const int hi0 = static_cast<int>((qh >> j) & 1u) << 4;
      const int hi1 = static_cast<int>((qh >> (j + 16)) & 1u) << 4;
      y[j] = static_cast<float>((qs[j] & 0x0F) | hi0) * d + m;
      y[j + 16] = static_cast<float>((qs[j] >> 4) | hi1) * d + m;
    }
  }
}

void deq_q8_0(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 34, y += 32) {
    const float d = h2f(x);
    for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(x[2 + j])) * d;
  }
}

void deq_q4_k(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 144) {
    const float d = h2f(x), dmin = h2f(x + 2);
    const unsigned char* scales = x + 4;
    const unsigned char* q = x + 16;
    // Four 64-value chunks; chunk c uses 32 bytes of qs: low nibbles are
    // sub-block 2c, high nibbles sub-block 2c + 1.
    for (int c = 0; c < 4; ++c, q += 32) {
      int sc, m;
      scale_min_k4(2 * c, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      scale_min_k4(2 * c + 1, scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0F) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void deq_q5_k(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 176) {
    const float d = h2f(x), dmin = h2f(x + 2);
    const unsigned char* scales = x + 4;
    const unsigned char* qh = x + 16;
    const unsigned char* ql = x + 48;
    // As Q4_K; the fifth bit of value l of sub-block s is bit s of qh[l].
    for (int c = 0; c < 4; ++c, ql += 32) {
      int sc, m;
      scale_min_k4(2 * c, scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
      scale_min_k4(2 * c + 1, scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = dmin * static_cast<float>(m);
      const int s1 = 2 * c, s2 = 2 * c + 1;
      for (int l = 0; l < 32; ++l)
        *y++ = d1 * static_cast<float>((ql[l] & 0x0F) | (((qh[l] >> s1) & 1) << 4)) - m1;
      for (int l = 0; l < 32; ++l)
        *y++ = d2 * static_cast<float>((ql[l] >> 4) | (((qh[l] >> s2) & 1) << 4)) - m2;
    }
  }
}

void deq_q6_k(const unsigned char* x, float* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += 210) {
    const float d = h2f(x + 208);
    const unsigned char* ql = x;
    const unsigned char* qh = x + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(x + 192);
    // Two 128-value halves, each from 64 bytes of ql and 32 of qh: value
    // l + 32·k (k = 0..3) takes nibble (k / 2) of ql[l + 32·(k % 2)] and bits
    // 2k..2k+1 of qh[l]; sub-block of 16 values → scale sc[l / 16 + 2k].
    for (int h = 0; h < 2; ++h, ql += 64, qh += 32, sc += 8, y += 128) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void deq_f32(const unsigned char* x, float* y, int64_t n) { std::memcpy(y, x, static_cast<size_t>(n) * 4); }
void deq_f16(const unsigned char* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = f16_to_f32(rd16(x + 2 * i));
}
void deq_bf16(const unsigned char* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(rd16(x + 2 * i));
}

}  // namespace qhead::io
