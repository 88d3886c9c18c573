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
// (permute_x in ops_cuda.cu) instead of repacking the weights.
//
// Integer → f16/bf16: the "magic number" trick — OR a code into the
// mantissa of 1024.0 (f16) or 128.0 (bf16) and subtract (magic + offset +
// z): two instructions for two values, exact. 8-bit codes do not fit bf16's
// 7-bit mantissa, so 8-bit/bf16 goes through f32 (exact, a few more ops).
#pragma once

#include <cstdint>

#include "common.cuh"

namespace qhead::cuda_detail {

struct LogitsArgs {
  const uint32_t* packed;  // [V, H·b/32] codes, pack-quantized
  const void* scale;       // [V, groups] in scale_type
  int scale_type;          // ScaleType
  const uint32_t* zp;      // [ceil(V·b/32), groups] packed along V; nullptr = symmetric
  const void* x_perm;      // [M, H] activations (f16/bf16), k-permuted per word
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

// Pair p (0/1) of k-block j (0/1 for 4-bit, 0 for 8-bit) of word w, as
// (q − z) values in T.
template <int BITS, class T>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t w, int j, int p, uint32_t bias, int z) {
  if constexpr (BITS == 4) {
    const uint32_t v = ((w >> (8 * j + 4 * p)) & 0x000F000Fu) | Magic<T>::k4;
    return sub2<T>(v, bias);
  } else if constexpr (std::is_same_v<T, __half>) {
    const uint32_t v = __byte_perm(w, 0x64646464u, p == 0 ? 0x4240u : 0x4341u);  // (1024 + c0, 1024 + c2)
    return sub2<T>(v, bias);
  } else {
    // 8-bit, bf16: f32 magic 2^23 + c, exact subtraction, exact narrowing.
    const float off = 8388608.0f + 128.0f + float(z);
    const float lo = __uint_as_float(0x4B000000u | ((w >> (8 * p)) & 0xFFu)) - off;
    const float hi = __uint_as_float(0x4B000000u | ((w >> (8 * p + 16)) & 0xFFu)) - off;
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

template <int L>
__device__ __forceinline__ void load_piece(const uint32_t* p, uint32_t (&w)[L / 4]) {
  if constexpr (L == 16) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
  } else if constexpr (L == 8) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(p));
    w[0] = v.x; w[1] = v.y;
  } else {
    w[0] = __ldg(p);
  }
}

// One warp = 16 vocab rows × (8·NT) activations. BITS: 4 or 8. T: __half or
// __nv_bfloat16. L: bytes each lane loads per row per chunk (4, 8, 16; the
// quad's 4·L bytes lie in one group). NT: 8-wide activation tiles per warp.
template <int BITS, class T, int L, int NT>
__global__ void __launch_bounds__(256) logits_mma_kernel(const LogitsArgs a) {
  constexpr int WORDS = L / 4;              // words per lane per row per chunk
  constexpr int HW = 32 / BITS;             // h per word
  constexpr int KB = HW / 4;                // k-blocks (4 h per lane) per word
  constexpr int S = 4 * WORDS * HW;         // h per chunk (one quad)
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int64_t tile = int64_t(blockIdx.x) * (blockDim.x / 32) + (threadIdx.x >> 5);
  if (tile * 16 >= a.V) return;
  const int64_t ra = tile * 16 + g, rb = ra + 8;
  const int64_t rac = ra < a.V ? ra : a.V - 1, rbc = rb < a.V ? rb : a.V - 1;  // clamp tail rows (not stored)
  const int W = a.H * BITS / 32;
  const uint32_t* pa = a.packed + rac * W + t * WORDS;
  const uint32_t* pb = a.packed + rbc * W + t * WORDS;
  const T* x = static_cast<const T*>(a.x_perm);
  const int m0 = blockIdx.y * (8 * NT);
  const int chunks_per_group = a.group / S;
  const int nchunks = a.H / S;

  float acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  float cacc[NT][4];

  // Software pipeline: chunk c+1's words are in flight while c computes.
  uint32_t na[WORDS], nb[WORDS];
  load_piece<L>(pa, na);
  load_piece<L>(pb, nb);
  int za = 0, zb = 0;
  uint32_t bias_a = 0, bias_b = 0;
  float sa = 0.0f, sb = 0.0f;
  for (int c = 0; c < nchunks; ++c) {
    uint32_t wa[WORDS], wb[WORDS];
#pragma unroll
    for (int i = 0; i < WORDS; ++i) { wa[i] = na[i]; wb[i] = nb[i]; }
    if (c + 1 < nchunks) {
      load_piece<L>(pa + (c + 1) * 4 * WORDS, na);
      load_piece<L>(pb + (c + 1) * 4 * WORDS, nb);
    }
    const int grp = c / chunks_per_group;
    if (c % chunks_per_group == 0) {  // a group starts: its scale, zero point, fresh partial sums
      sa = load_scale(a.scale, a.scale_type, rac * a.groups + grp);
      sb = load_scale(a.scale, a.scale_type, rbc * a.groups + grp);
      if (a.zp) {
        za = zero_point(a.zp, a.groups, rac, grp, BITS);
        zb = zero_point(a.zp, a.groups, rbc, grp, BITS);
      }
      bias_a = make_bias<BITS, T>(za);
      bias_b = make_bias<BITS, T>(zb);
#pragma unroll
      for (int n = 0; n < NT; ++n) cacc[n][0] = cacc[n][1] = cacc[n][2] = cacc[n][3] = 0.0f;
    }
    const int h0 = c * S + t * WORDS * HW;
#pragma unroll
    for (int i = 0; i < WORDS; ++i) {
#pragma unroll
      for (int j = 0; j < KB; ++j) {
        uint32_t A[4];
        A[0] = dequant_pair<BITS, T>(wa[i], j, 0, bias_a, za);
        A[1] = dequant_pair<BITS, T>(wb[i], j, 0, bias_b, zb);
        A[2] = dequant_pair<BITS, T>(wa[i], j, 1, bias_a, za);
        A[3] = dequant_pair<BITS, T>(wb[i], j, 1, bias_b, zb);
        const int hx = h0 + i * HW + j * 4;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const int m = m0 + n * 8 + g;
          uint2 B = make_uint2(0u, 0u);
          if (m < a.M) B = __ldg(reinterpret_cast<const uint2*>(x + int64_t(m) * a.H + hx));
          mma16816<T>(cacc[n], A, B.x, B.y);
        }
      }
    }
    if ((c + 1) % chunks_per_group == 0) {  // the group ends: scale its f32 partial sums once
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        acc[n][0] = fmaf(sa, cacc[n][0], acc[n][0]);
        acc[n][1] = fmaf(sa, cacc[n][1], acc[n][1]);
        acc[n][2] = fmaf(sb, cacc[n][2], acc[n][2]);
        acc[n][3] = fmaf(sb, cacc[n][3], acc[n][3]);
      }
    }
  }
  // C fragment: (row g, cols 2t, 2t+1) and (row g+8, same cols).
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const int m = m0 + n * 8 + 2 * t;
    if (ra < a.V) {
      if (m < a.M) a.out[int64_t(m) * a.ldo + ra] = acc[n][0];
      if (m + 1 < a.M) a.out[int64_t(m + 1) * a.ldo + ra] = acc[n][1];
    }
    if (rb < a.V) {
      if (m < a.M) a.out[int64_t(m) * a.ldo + rb] = acc[n][2];
      if (m + 1 < a.M) a.out[int64_t(m + 1) * a.ldo + rb] = acc[n][3];
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

template <int BITS, class T, int L, int NT>
void launch_logits_cfg(const LogitsArgs& a, cudaStream_t s) {
  constexpr int kWarps = 8;
  const int64_t tiles = (a.V + 15) / 16;
  dim3 grid(static_cast<unsigned>((tiles + kWarps - 1) / kWarps), static_cast<unsigned>((a.M + 8 * NT - 1) / (8 * NT)));
  logits_mma_kernel<BITS, T, L, NT><<<grid, kWarps * 32, 0, s>>>(a);
  QHEAD_CUDA_CHECK_LAUNCH("logits_mma_kernel");
}

template <int BITS, class T, int L>
void launch_logits_l(const LogitsArgs& a, cudaStream_t s) {
  if (a.M <= 8) launch_logits_cfg<BITS, T, L, 1>(a, s);
  else if (a.M <= 16) launch_logits_cfg<BITS, T, L, 2>(a, s);
  else if (a.M <= 32) launch_logits_cfg<BITS, T, L, 4>(a, s);
  else launch_logits_cfg<BITS, T, L, 8>(a, s);
}

// The launcher one .cu instantiates per (BITS, T). Returns false when the
// shape has no fast path (the caller falls back).
template <int BITS, class T>
bool launch_logits(const LogitsArgs& a, cudaStream_t s) {
  switch (pick_piece_bytes(BITS, a.group)) {
    case 16: launch_logits_l<BITS, T, 16>(a, s); return true;
    case 8: launch_logits_l<BITS, T, 8>(a, s); return true;
    case 4: launch_logits_l<BITS, T, 4>(a, s); return true;
    default: return false;
  }
}

// Declared here, defined in logits_w{4,8}_{f16,bf16}.cu (one configuration each).
bool launch_logits_w4_f16(const LogitsArgs& a, cudaStream_t s);
bool launch_logits_w4_bf16(const LogitsArgs& a, cudaStream_t s);
bool launch_logits_w8_f16(const LogitsArgs& a, cudaStream_t s);
bool launch_logits_w8_bf16(const LogitsArgs& a, cudaStream_t s);

}  // namespace qhead::cuda_detail
