// Fused dequant + logits on the pack-quantized table, with tensor cores.
//
//   out[m, v] = Σ_g s[v, g] · Σ_{h ∈ g} (q[v, h] − z[v, g]) · x[m, h]
//
// Why this shape. The packed rows are streamed once from HBM with no
// repacked copy (DESIGN decision 1); the inner products run on mma.sync
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
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "common.cuh"

namespace qhead::cuda_detail {

struct LogitsArgs {
  const uint32_t* packed;  // [V, H·b/32] codes, pack-quantized
  const void* scale;       // [V, groups] in scale_type
  int scale_type;          // ScaleType
  const uint32_t* zp;      // [ceil(V·b/32), groups] packed along V; nullptr = symmetric
  const void* x;           // [M, H] activations (f16/bf16), as given
  void* x_frag;            // workspace, >= Mpad·H elements: x in MMA B-fragment order (permute_x)
  float* out;              // [M, V] logits, row stride ldo
  int64_t ldo;
  int64_t V;
  int H;
  int group;   // group length along H (H for per-row)
  int groups;  // H / group
  int M;
};

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
    // 8-bit, bf16: f32 magic 2^23 + c minus zoff = 2^23 + 128 + z: exact, then exact narrowing.
    const float lo = __uint_as_float(0x4B000000u | ((w >> (8 * p)) & 0xFFu)) - zoff;
    const float hi = __uint_as_float(0x4B000000u | ((w >> (8 * p + 16)) & 0xFFu)) - zoff;
    return pack2<T>(lo, hi);
  }
}

template <class T>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Streaming loads of the packed weights: read once, so keep them out of L1
// (the activation fragments live there).
template <int L>
__device__ __forceinline__ void load_piece(const uint32_t* p, uint32_t (&w)[L / 4]) {
  if constexpr (L == 16) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3]) : "l"(p));
  } else if constexpr (L == 8) {
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(w[0]), "=r"(w[1]) : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(w[0]) : "l"(p));
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

// Activations → B fragments: x_frag[((c·KBC + kb)·Mpad + m)·4 + t] is the
// uint2 (four T values) lane (g = m % 8, t) feeds the MMA for chunk c,
// k-block kb. Rows m >= M are zeros, so the main loop needs no predicates
// and a warp's 32 lanes read 256 contiguous bytes per fragment.
template <int BITS, class T, int L>
__global__ void permute_x_kernel(const T* __restrict__ x, T* __restrict__ xf, int M, int Mpad, int H) {
  using Gm = Geometry<BITS, L>;
  const int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // fragment index
  const int64_t nfrag = int64_t(H / 4) * Mpad;
  if (f >= nfrag) return;
  const int t = int(f & 3);
  const int m = int((f >> 2) % Mpad);
  const int64_t ckb = (f >> 2) / Mpad;  // c·KBC + kb
  const int c = int(ckb / Gm::KBC), kb = int(ckb % Gm::KBC);
  const int i = kb / Gm::KB, j = kb % Gm::KB;
  const int hword = c * Gm::S + t * Gm::WORDS * Gm::HW + i * Gm::HW;
#pragma unroll
  for (int e = 0; e < 4; ++e)
    xf[f * 4 + e] = m < M ? x[int64_t(m) * H + hword + Gm::h_of(j, e)] : Act<T>::from_float(0.0f);
}

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
__global__ void __launch_bounds__(256) logits_mma_kernel(const LogitsArgs a) {
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
  const int sbytes = a.scale_type == kScaleF32 ? 4 : 2;
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
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            acc[r][n][0] = fmaf(sc[0], cacc[r][n][0], acc[r][n][0]);
            acc[r][n][1] = fmaf(sc[0], cacc[r][n][1], acc[r][n][1]);
            acc[r][n][2] = fmaf(sc[1], cacc[r][n][2], acc[r][n][2]);
            acc[r][n][3] = fmaf(sc[1], cacc[r][n][3], acc[r][n][3]);
          }
        }
      }
      if (q0 + d + D < total) fetch(sl);
      xp += xf_chunk;
      if (++cc == nchunks) {  // the tile is done: C fragment → out, (row g | g+8, cols 2t, 2t+1)
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          const int64_t ra = ct * 16 * RT + r * 16 + g, rb = ra + 8;
#pragma unroll
          for (int n = 0; n < NT; ++n) {
            const int m = m0 + n * 8 + 2 * t;
            if (ra < a.V) {
              if (m < a.M) a.out[int64_t(m) * a.ldo + ra] = acc[r][n][0];
              if (m + 1 < a.M) a.out[int64_t(m + 1) * a.ldo + ra] = acc[r][n][1];
            }
            if (rb < a.V) {
              if (m < a.M) a.out[int64_t(m) * a.ldo + rb] = acc[r][n][2];
              if (m + 1 < a.M) a.out[int64_t(m + 1) * a.ldo + rb] = acc[r][n][3];
            }
            acc[r][n][0] = acc[r][n][1] = acc[r][n][2] = acc[r][n][3] = 0.0f;
          }
        }
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

// Bytes per lane per chunk for a group of `group` h: the quad's 4·L bytes
// must lie inside one group and tile it. 0 = no fast path for this shape.
inline int pick_piece_bytes(int bits, int group) {
  const int gbytes = group * bits / 8;
  for (int l : {16, 8, 4})
    if (gbytes % (4 * l) == 0) return l;
  return 0;
}

template <int BITS, class T, int L, int RT, int NT, int D, bool ASYM, int kWarps = 8>
void launch_logits_cfg(const LogitsArgs& a, cudaStream_t s) {
  auto kernel = logits_mma_kernel<BITS, T, L, RT, NT, D, ASYM>;
  static int per_sm = [&] {
    int b = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kWarps * 32, 0);
    return b > 0 ? b : 1;
  }();
  const int Mpad = (a.M + 7) & ~7;
  const int mtiles = (Mpad + 8 * NT - 1) / (8 * NT);
  const int64_t tiles = (a.V + 16 * RT - 1) / (16 * RT);
  const int64_t want = (tiles + kWarps - 1) / kWarps;
  const int64_t room = std::max<int64_t>(1, int64_t(sm_count()) * per_sm / mtiles);
  dim3 grid(static_cast<unsigned>(mtiles), static_cast<unsigned>(std::min(want, room)));
  kernel<<<grid, kWarps * 32, 0, s>>>(a);
  QHEAD_CUDA_CHECK_LAUNCH("logits_mma_kernel");
}

template <int BITS, class T, int L>
void launch_logits_l(const LogitsArgs& a, cudaStream_t s) {
  // B fragments first (one tiny launch), then the fused kernel.
  const int Mpad = (a.M + 7) & ~7;
  const int64_t nfrag = int64_t(a.H / 4) * Mpad;
  permute_x_kernel<BITS, T, L><<<static_cast<unsigned>((nfrag + 255) / 256), 256, 0, s>>>(
      static_cast<const T*>(a.x), static_cast<T*>(a.x_frag), a.M, Mpad, a.H);
  QHEAD_CUDA_CHECK_LAUNCH("permute_x_kernel");
  const bool asym = a.zp != nullptr;
#define QHEAD_LAUNCH(RT, NT, D, W) \
  (asym ? launch_logits_cfg<BITS, T, L, RT, NT, D, true, W>(a, s) : launch_logits_cfg<BITS, T, L, RT, NT, D, false, W>(a, s))
  // Configurations by measurement on the H200 (docs/performance.md):
  //   4-bit, 16-byte pieces (group >= 128, per row): two row tiles x two activation
  //     tiles, 4 warps, up to M = 16 (faster than the one-tile config even at M = 1);
  //   4-bit, smaller pieces: two row tiles up to M = 8, then one;
  //   8-bit: one row tile (the two-tile ring costs occupancy: 61 vs 70 us at M = 1).
  if constexpr (BITS == 4 && L == 16) {
    if (a.M <= 16) return void(QHEAD_LAUNCH(2, 2, 4, 4));
  } else if constexpr (BITS == 4) {
    if (a.M <= 8) return void(QHEAD_LAUNCH(2, 1, 4, 4));
    if (a.M <= 16) return void(QHEAD_LAUNCH(1, 2, 4, 8));
  } else {
    if (a.M <= 8) return void(QHEAD_LAUNCH(1, 1, 4, 8));
    if (a.M <= 16) return void(QHEAD_LAUNCH(1, 2, 4, 8));
  }
  if (a.M <= 32) QHEAD_LAUNCH(1, 4, 4, 8);
  else QHEAD_LAUNCH(1, 8, 2, 8);
#undef QHEAD_LAUNCH
}

// The launcher one .cu instantiates per (BITS, T). Returns false when the
// shape has no fast path (the caller falls back). x_frag must hold
// ((M + 7) / 8 · 8) · H elements.
template <int BITS, class T>
bool launch_logits(const LogitsArgs& a, cudaStream_t s) {
  switch (pick_piece_bytes(BITS, a.group)) {
    case 16: launch_logits_l<BITS, T, 16>(a, s); return true;
    case 8: launch_logits_l<BITS, T, 8>(a, s); return true;
    case 4:
      if constexpr (BITS == 4) {  // 8-bit codes take L = 4 only for groups < 32, which the schemes do not have
        launch_logits_l<BITS, T, 4>(a, s);
        return true;
      }
      return false;
    default: return false;
  }
}

// Declared here, defined in logits_w{4,8}_{f16,bf16}.cu (one configuration each).
bool launch_logits_w4_f16(const LogitsArgs& a, cudaStream_t s);
bool launch_logits_w4_bf16(const LogitsArgs& a, cudaStream_t s);
bool launch_logits_w8_f16(const LogitsArgs& a, cudaStream_t s);
bool launch_logits_w8_bf16(const LogitsArgs& a, cudaStream_t s);

}  // namespace qhead::cuda_detail
