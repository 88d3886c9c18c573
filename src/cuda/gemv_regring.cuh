// The register-ring GEMV (LogitsKernel::kGemvRegRing).
#pragma once

#include "epilogue.cuh"
#include "x_layout.cuh"

namespace qhead::cuda_detail {

// One warp = (16·RT) vocab rows × (8·NT) activations, looping over the row
// tiles of a persistent grid; blockIdx.x picks the activation tile (fastest,
// so the blocks sharing weights run together and hit L2), blockIdx.y the
// worker. The chunk stream of all the warp's tiles is one software pipeline
// D chunks deep: the weights, scales and zero points of chunk q + D are in
// flight while chunk q computes.
//   BITS 4|8 · T __half|__nv_bfloat16 · L bytes per lane per row per chunk
//   (4, 8, 16; the quad's 4·L bytes lie in one group) · RT row tiles per warp
//   · NT activation tiles per warp · D pipeline depth.
template <int BITS, class T, int L, int RT, int NT, int D, bool ASYM>
__global__ void __launch_bounds__(256) logits_gemv_regring_kernel(const LogitsArgs a) {
  using Gm = Geometry<BITS, L>;
  constexpr int WORDS = Gm::WORDS, KB = Gm::KB, KBC = Gm::KBC, S = Gm::S;
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t warp = int64_t(blockIdx.y) * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int64_t nwarps = int64_t(gridDim.y) * (blockDim.x / 32);
  const int64_t tiles = (a.V + 16 * RT - 1) / (16 * RT);
  if (warp >= tiles) return;
  const int my_tiles = int((tiles - warp + nwarps - 1) / nwarps);
  const int nchunks = a.H / S;
  const int cpg = a.group / S;  // chunks per group
  const int total = my_tiles * nchunks;  // chunks this warp computes (< 2^31)
  const int W = a.H * BITS / 32;
  const int Mpad = (a.M + 7) & ~7;
  const int m0 = blockIdx.x * (8 * NT);
  // Scales are read raw (2 or 4 bytes) and decoded when a group ends.
  const int sbytes = scale_bytes(a.scale_type);
  // Activation fragments of (chunk 0, k-block 0, this lane); a chunk is KBC·Mpad·4 uint2 further.
  const uint2* xf0 = static_cast<const uint2*>(a.x_frag) + (int64_t(m0 + g) * 4 + t);
  const int64_t xf_chunk = int64_t(KBC) * Mpad * 4;

  // What one pipeline stage holds: the lane's code words of its 2·RT rows for
  // one chunk; on the last chunk of a group also the group's scales; for
  // asymmetric tables the zero-point word and bit offset. Nothing fetched is
  // read before the stage is consumed D chunks later, so no load stalls here.
  struct Slot {
    uint32_t w[RT][2][WORDS];
    uint32_t s[RT][2];   // raw scale bits
    uint32_t zw[RT][2];  // zero-point word (ASYM)
  };
  Slot ring[D];

  // ---- load cursor: pointers advance by increments, no divisions --------------
  int64_t lt = warp;            // tile being fetched
  int lc = 0, lgc = 0, lg = 0;  // chunk in tile, chunk in group, group
  const uint32_t* lp[RT][2];  // code words of the next chunk
  const char* ls[RT][2];      // scale of the next group
  const uint32_t* lz[RT][2];  // zero-point word of the next group
  auto point = [&]() {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        int64_t row = lt * 16 * RT + r * 16 + h * 8 + g;
        row = row < a.V ? row : a.V - 1;  // tail rows: valid memory, never stored
        lp[r][h] = a.packed + row * W + t * WORDS;
        ls[r][h] = static_cast<const char*>(a.scale) + row * a.groups * sbytes;
        if constexpr (ASYM) lz[r][h] = a.zp + ((row * BITS) >> 5) * a.groups;
      }
  };
  point();
  // Zero points of rows r0..: for the 2, 4 and 8-bit codes the kernel takes, a
  // code never straddles words: word (row·b/32)·groups + grp, shift (row·b) % 32.
  auto fetch = [&](Slot& sl) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        load_piece<L>(lp[r][h], sl.w[r][h]);
        lp[r][h] += 4 * WORDS;
        if constexpr (ASYM) sl.zw[r][h] = __ldg(lz[r][h] + lg);
        if (lgc == cpg - 1)
          sl.s[r][h] = sbytes == 4 ? __ldg(reinterpret_cast<const uint32_t*>(ls[r][h]) + lg)
                                   : uint32_t(__ldg(reinterpret_cast<const unsigned short*>(ls[r][h]) + lg));
      }
    if (++lgc == cpg) { lgc = 0; ++lg; }
    if (++lc == nchunks) {
      lc = 0;
      lg = 0;
      lt += nwarps;
      if (lt < tiles) point();
    }
  };
#pragma unroll
  for (int d = 0; d < D; ++d)
    if (d < total) fetch(ring[d]);
  // Per-row zero-point shift inside its word (fixed per tile row).
  auto zshift = [&](int64_t tile, int r, int h) {
    int64_t row = tile * 16 * RT + r * 16 + h * 8 + g;
    row = row < a.V ? row : a.V - 1;
    return int((row * BITS) & 31);
  };

  float acc[RT][NT][4], cacc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.0f;
  int64_t ct = warp;  // compute cursor
  int cc = 0, cgc = 0;
  const uint2* xp = xf0;
  int zsh[RT][2];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) zsh[r][h] = zshift(ct, r, h);

  for (int q0 = 0; q0 < total; q0 += D) {
#pragma unroll
    for (int d = 0; d < D; ++d) {
      if (q0 + d >= total) break;
      Slot& sl = ring[d];
      if (cgc == 0) {
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int n = 0; n < NT; ++n) cacc[r][n][0] = cacc[r][n][1] = cacc[r][n][2] = cacc[r][n][3] = 0.0f;
      }
      // The (q − z) subtrahends of this chunk's rows.
      uint32_t bias[RT][2], bias16[RT][2];
      float zoff[RT][2];
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int z = ASYM ? int((sl.zw[r][h] >> zsh[r][h]) & ((1u << BITS) - 1u)) - (1 << (BITS - 1)) : 0;
          bias[r][h] = make_bias<BITS, T>(z);
          bias16[r][h] = pack2<T>(-(64.0f + 8.0f + float(z)), -(64.0f + 8.0f + float(z)));
          zoff[r][h] = 8388608.0f + float(1 << (BITS - 1)) + float(z);
        }
      // All B fragments of the chunk (NT <= 4) or of each k-block, loaded in a batch.
      constexpr int kBatch = NT <= 4 ? KBC : 1;
#pragma unroll
      for (int kb0 = 0; kb0 < KBC; kb0 += kBatch) {
        uint2 B[kBatch][NT];
#pragma unroll
        for (int kk = 0; kk < kBatch; ++kk)
#pragma unroll
          for (int n = 0; n < NT; ++n)
            B[kk][n] = (n == 0 || m0 + n * 8 < Mpad) ? __ldg(xp + (int64_t(kb0 + kk) * Mpad + n * 8) * 4) : make_uint2(0u, 0u);
#pragma unroll
        for (int kk = 0; kk < kBatch; ++kk) {
          const int kb = kb0 + kk, i = kb / KB, j = kb % KB;
          uint32_t A[RT][4];
#pragma unroll
          for (int r = 0; r < RT; ++r) {
            A[r][0] = dequant_pair<BITS, T>(sl.w[r][0][i], j, 0, bias[r][0], bias16[r][0], zoff[r][0]);
            A[r][1] = dequant_pair<BITS, T>(sl.w[r][1][i], j, 0, bias[r][1], bias16[r][1], zoff[r][1]);
            A[r][2] = dequant_pair<BITS, T>(sl.w[r][0][i], j, 1, bias[r][0], bias16[r][0], zoff[r][0]);
            A[r][3] = dequant_pair<BITS, T>(sl.w[r][1][i], j, 1, bias[r][1], bias16[r][1], zoff[r][1]);
          }
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            if (n > 0 && m0 + n * 8 >= Mpad) break;  // warp-uniform; tile 0 always exists (m0 < Mpad)
#pragma unroll
            for (int r = 0; r < RT; ++r) mma16816<T>(cacc[r][n], A[r], B[kk][n].x, B[kk][n].y);
          }
        }
      }
      if (++cgc == cpg) {  // the group ends: scale its f32 partial sums once
        cgc = 0;
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          float sc[2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t raw = sl.s[r][h];
            sc[h] = a.scale_type == kScaleF32    ? __uint_as_float(raw)
                    : a.scale_type == kScaleBF16 ? __uint_as_float(raw << 16)
                                                 : __half2float(__ushort_as_half(static_cast<unsigned short>(raw)));
          }
          fold_group<NT>(acc[r], cacc[r], sc[0], sc[1]);
        }
      }
      if (q0 + d + D < total) fetch(sl);
      xp += xf_chunk;
      if (++cc == nchunks) {  // the tile is done: C fragment → out
        store_tile<RT, NT>(a, acc, ct * 16 * RT, m0, g, t);
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int n = 0; n < NT; ++n) acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.0f;
        cc = 0;
        ct += nwarps;
        xp = xf0;
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
          for (int h = 0; h < 2; ++h) zsh[r][h] = zshift(ct, r, h);
      }
    }
  }
}

}  // namespace qhead::cuda_detail
