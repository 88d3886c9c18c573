// The pieces of the sample op that every path shares (internal), on the host
// and, compiled by nvcc, on the device: the random numbers and the draw from
// sorted candidates. The contract is in qhead/ops.h (sample); the paths are
// ops.cc (CPU and reference), src/ops/cuda/sample.cu (CUDA).
//
// Random numbers: Philox4x32-10 (Salmon et al., SC'11; the Random123 known
// answers are in tests/test_sample.cc), key = the seed's two words, counter
// = (c0, row, offset low word, offset high word with the top bit saying
// which stream):
//   Gumbel stream (top bit 0): c0 = column / 4, one block of four words for
//     four consecutive columns; word column % 4 makes that column's uniform.
//   Draw stream (top bit 1): c0 = 0; words 0 and 1 make the row's uniform of
//     the inverse CDF.
// So every column's noise and every row's uniform depend on nothing but
// (seed, offset, row, column): not on the thread count, the block split or
// the device.
#pragma once

#include <cmath>
#include <cstdint>

#include "cuda/geometry.h"  // QHEAD_HD

namespace qhead::sampling {

struct Philox4 {
  uint32_t v[4];
};

QHEAD_HD inline uint32_t mulhi32(uint32_t a, uint32_t b) {
  return static_cast<uint32_t>((static_cast<uint64_t>(a) * b) >> 32);
}

// Philox4x32 with 10 rounds.
QHEAD_HD inline Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    const uint32_t hi0 = mulhi32(kM0, c0), lo0 = kM0 * c0;
    const uint32_t hi1 = mulhi32(kM1, c2), lo1 = kM1 * c2;
    const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return {{c0, c1, c2, c3}};
}

constexpr uint32_t kDrawStream = 0x80000000u;

// Four columns' words of the Gumbel stream: columns 4·c0 .. 4·c0 + 3 of `row`.
QHEAD_HD inline Philox4 gumbel_words(uint64_t seed, uint64_t offset, uint32_t row, uint32_t c0) {
  return philox4x32_10(c0, row, static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32) & ~kDrawStream,
                       static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

// A word as a uniform in (0, 1): (w >> 9 + 1/2) / 2^23, every step exact in
// f32, so u is in [2^-24, 1 - 2^-24] and never 0 or 1.
QHEAD_HD inline float uniform23(uint32_t w) { return (static_cast<float>(w >> 9) + 0.5f) * 0x1p-23f; }

// Standard Gumbel noise -log(-log u). Its largest value (u = 1 - 2^-24) is
// about 16.64; kGumbelBound is above every value it can take, so a column
// whose l/T + kGumbelBound is below the best so far cannot win (f32 rounding
// is monotone) and needs no noise.
QHEAD_HD inline float gumbel(uint32_t w) { return -logf(-logf(uniform23(w))); }
constexpr float kGumbelBound = 16.75f;

// The row's uniform of the inverse CDF, in (0, 1) with 53 bits.
QHEAD_HD inline double draw_uniform(uint64_t seed, uint64_t offset, uint32_t row) {
  const Philox4 r = philox4x32_10(0u, row, static_cast<uint32_t>(offset),
                                  (static_cast<uint32_t>(offset >> 32) & ~kDrawStream) | kDrawStream,
                                  static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const uint64_t bits = ((static_cast<uint64_t>(r.v[0]) << 32) | r.v[1]) >> 11;  // 53 bits
  return (static_cast<double>(bits) + 0.5) * 0x1p-53;
}

// The truncation settings as the draw sees them.
struct Cut {
  bool top_k = false;  // the candidates are the whole top-k set (top_k > 0)
  double top_p = 1.0;
  double min_p = 0.0;
};

// Draws from K candidates of one row, sorted descending (ties: lower id
// first): z their logits at the temperature (l / T), lse the log-sum-exp of
// the whole row at the temperature. `whole`: the candidates are every token
// the cut can keep (the top-k set, or K = V). Returns the index of the drawn
// candidate, or -1 where the candidates may not hold every token the cut
// keeps (then the caller takes more candidates).
//   weights w_i = exp(z_i - z_0) (w_0 = 1), in f64;
//   min-p keeps w_i >= min_p (p_i >= min_p · p_max);
//   top-p keeps the shortest prefix whose weight reaches top_p · W, W = Σ w
//     over the top-k set with top_k, else exp(lse - z_0) (the whole row);
//   the kept prefix of n candidates is drawn from by the inverse CDF at u.
// Every sum over the candidates is taken in kDrawChunks chunks of
// draw_chunk(K) consecutive candidates: a prefix is the chunks before it,
// added in order, then its own chunk's weights in order. That is the
// arithmetic of the GPU's one-warp draw (one lane per chunk, draw_sorted_warp
// in src/ops/cuda/sample.cu), so both draw the same candidate from the same
// weights.
constexpr int kDrawChunks = 32;
QHEAD_HD inline int64_t draw_chunk(int64_t K) { return (K + kDrawChunks - 1) / kDrawChunks; }

QHEAD_HD inline int draw_sorted(const float* z, int64_t K, double lse, bool whole, const Cut& cut, double u) {
  const double z0 = z[0];
  const int64_t C = draw_chunk(K);
  const auto w = [&](int64_t i) { return exp(static_cast<double>(z[i]) - z0); };
  const auto chunk_end = [&](int c) { return (c + 1) * C < K ? (c + 1) * C : K; };
  double base[kDrawChunks + 1];  // base[c]: the weight of the chunks before c
  base[0] = 0.0;
  for (int c = 0; c < kDrawChunks; ++c) {
    double s = 0.0;
    for (int64_t i = c * C; i < chunk_end(c); ++i) s += w(i);
    base[c + 1] = base[c] + s;
  }
  const double total = cut.top_k ? base[kDrawChunks] : exp(lse - z0);
  const double need = cut.top_p * total;
  int64_t n = -1;
  for (int c = 0; c < kDrawChunks && n < 0; ++c) {
    double acc = base[c];
    for (int64_t i = c * C; i < chunk_end(c); ++i) {
      const double wi = w(i);
      if (i > 0 && wi < cut.min_p) {  // min-p cut: i and everything after it is dropped
        n = i;
        break;
      }
      acc += wi;
      if (cut.top_p < 1.0 && acc >= need) {  // top-p cut: the prefix up to i reaches top_p
        n = i + 1;
        break;
      }
    }
  }
  if (n < 0) {
    if (!whole) return -1;  // the cut may lie past the candidates
    n = K;
  }
  // Inverse CDF over the kept prefix 0 .. n - 1.
  const int last = static_cast<int>((n - 1) / C);
  double kept = base[last];
  for (int64_t i = last * C; i < n; ++i) kept += w(i);
  const double target = u * kept;
  for (int c = 0; c <= last; ++c) {
    double acc = base[c];
    for (int64_t i = c * C; i < chunk_end(c) && i < n; ++i) {
      acc += w(i);
      if (target < acc) return static_cast<int>(i);
    }
  }
  return static_cast<int>(n - 1);  // u·kept rounded up to kept
}

}  // namespace qhead::sampling
