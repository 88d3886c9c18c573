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
#include <type_traits>

#include "common.cuh"

namespace qhead::cuda_detail {

// The list epilogue's output (logits_wgmma_ws_kernel<..., TOPK = true>), read
// by the merge (topk_lists_kernel, ops_cuda.cu).
struct TopkLists {
  uint64_t* list = nullptr;   // [M, nseg, seg_cap] entries >= the column's threshold
  uint32_t* count = nullptr;  // [M, nseg] entries in each list
  float* sum = nullptr;       // [M, nseg] Σ exp(min(l − threshold, 0)) over the segment's logits
  int nseg = 0, seg_cap = 0;
};

struct LogitsArgs {
  const uint32_t* packed;  // [V, H·b/32] codes, pack-quantized
  const void* scale;       // [V, groups] in scale_type
  int scale_type;          // ScaleType
  const uint32_t* zp;      // [ceil(V·b/32), groups] packed along V; nullptr = symmetric
  const void* x;           // [M, H] activations (f16/bf16), as given
  void* x_frag;            // workspace, >= Mpad·H elements + staged_x_extra(Mpad): x in MMA B-fragment order
                           // (permute_x), or in the staged kernel's shared layout (staged_x_kernel)
  const void* x_stage = nullptr;  // staged kernel: x already in its shared layout (staged_x_bytes), copied
                                  // flat into each CTA; nullptr = each CTA builds it from x
  float* out;              // [M, V] logits, row stride ldo
  int64_t ldo;
  int64_t V;
  int H;
  int group;   // group length along H (H for per-row)
  int groups;  // H / group
  int M;
  // Fused top-k epilogue (logits_staged_kernel<..., TOPK = true>); out is unused then.
  int k = 0;                 // candidates kept per (activation row, CTA), <= kTopkGather
  int tk_cap = 0;            // pool entries per activation row in shared memory (>= the rows a CTA computes)
  int tk_cols = 0;           // activation rows (columns) a CTA keeps pools for: M (<= 8)
  uint64_t* tk_cand = nullptr;  // [M, gridDim.y, k] entries (common.cuh), written
  float2* tk_part = nullptr;    // [M, gridDim.y] (max, Σ exp(l − max)) of the CTA's logits, written
  int tk_nblk = 0;              // gridDim.y of the launch (set by the launcher)
  // Top-k candidate lists (logits_wgmma_ws_kernel<..., TOPK = true>, M > 64): every logit >= its
  // column's threshold goes to the list of its (column, CTA warp); the others are summed.
  bool tk_lists = false;          // launch_logits_topk: run this epilogue
  const float* tk_thr = nullptr;  // [M] column m's threshold (<= its k-th logit, list_threshold_kernel);
                                  // nullptr: no threshold, every logit is a candidate
  TopkLists tk_out;               // the lists and sums it writes (set by the launcher)
  bool x_frag_ready = false;    // v14 kernel: x_frag already holds x in its layout for 128 columns (the list
                                // top-k's sample call, same table, made it): no permute_x_wg_kernel
  int64_t tile_stride = 1;      // v14 kernel only (launch_logits takes no other then): its 128-row tile j reads
                                // the table's tile j·tile_stride, and V counts the tiles read — the list
                                // top-k's threshold sample, computed in place (V ≤ the table's V / tile_stride)
  // The table rows the kernel may read: every bound on the table's arrays (codes, scales, zero points)
  // takes this, not V.
  __host__ __device__ int64_t table_rows() const { return V * tile_stride; }
  int st_spg = 1;               // staged / GEMM kernel, groups longer than a stage: stages per group (set by the launcher)
  bool gemm_only = false;       // launch_logits: take the GEMM or nothing (large M, where the GEMV kernels lose to cuBLAS)
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
    // 8-bit, bf16 (7 mantissa bits: no bf16 magic holds a byte): f32 magic 2^23 + c, the byte
    // placed by one PRMT (0x4B0000cc; was a shift and a LOP3 per value), minus zoff = 2^23 + 128 +
    // z: exact, then one exact narrowing of the pair (|c − 128 − z| ≤ 255 needs 8 bits).
    const float lo = __uint_as_float(__byte_perm(w, 0x4B000000u, p == 0 ? 0x7650u : 0x7651u)) - zoff;
    const float hi = __uint_as_float(__byte_perm(w, 0x4B000000u, p == 0 ? 0x7652u : 0x7653u)) - zoff;
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

// ---- tile epilogues (shared by the kernels below) ----------------------------------
//
// A finished tile: acc[r][n] is the m16n8 C fragment of rows
// row0 + r·16 + {g, g+8} × activation columns m0 + n·8 + {2t, 2t+1}.

// The end of a group: acc += s · cacc for one 16-row tile, s0 the scale of
// the lane's row g, s1 of row g + 8 (the MMA accumulator layout: c0, c1 in
// row g, c2, c3 in row g + 8).
template <int NT>
__device__ __forceinline__ void fold_group(float (&acc)[NT][4], const float (&cacc)[NT][4], float s0, float s1) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    acc[n][0] = fmaf(s0, cacc[n][0], acc[n][0]);
    acc[n][1] = fmaf(s0, cacc[n][1], acc[n][1]);
    acc[n][2] = fmaf(s1, cacc[n][2], acc[n][2]);
    acc[n][3] = fmaf(s1, cacc[n][3], acc[n][3]);
  }
}

template <int NT>
__device__ __forceinline__ void fold_first(float (&acc)[NT][4], const float (&cacc)[NT][4], float s0, float s1) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    acc[n][0] = s0 * cacc[n][0];
    acc[n][1] = s0 * cacc[n][1];
    acc[n][2] = s1 * cacc[n][2];
    acc[n][3] = s1 * cacc[n][3];
  }
}

// Plain logits: the C fragments → out.
template <int RT, int NT>
__device__ __forceinline__ void store_tile(const LogitsArgs& a, const float (&acc)[RT][NT][4], int64_t row0, int m0,
                                           int g, int t) {
  if (row0 + RT * 16 <= a.V && m0 + NT * 8 <= a.M) {  // a whole tile: no bounds, one pointer per column pair
    float* p = a.out + int64_t(m0 + 2 * t) * a.ldo + row0 + g;
#pragma unroll
    for (int n = 0; n < NT; ++n, p += 8 * a.ldo) {
      float* p1 = p + a.ldo;
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        p[r * 16] = acc[r][n][0];
        p1[r * 16] = acc[r][n][1];
        p[r * 16 + 8] = acc[r][n][2];
        p1[r * 16 + 8] = acc[r][n][3];
      }
    }
    return;
  }
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    const int64_t ra = row0 + r * 16 + g, rb = ra + 8;
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
    }
  }
}

// Fused top-k epilogue (staged kernel, M <= 8). Each CTA appends every logit
// it computes, as an entry (common.cuh), to its column's pool in shared
// memory — the launcher sizes the pools for every row the CTA can see, so
// the streaming loop needs no barrier and no compaction — and keeps per-lane
// online log-sum-exps. At the end the whole CTA selects each column's best k
// at once (select_columns) and writes them with the (max, Σ exp) partials.
// Shared memory (dynamic): pool[tk_cols][tk_cap] entries, cnt[tk_cols];
// `scratch` (the kernel's stage ring, free by then) holds the selection's
// histograms, gathers and the lse reduction.
constexpr int kTopkGather = 256;  // gathered candidates per column (>= k)

template <int RT>
struct TopkAll {
  uint64_t* pool;
  unsigned* cnt;
  int ncols;
  float lmx[2], lsm[2];

  __device__ __forceinline__ void init(const LogitsArgs& a, void* base) {
    pool = static_cast<uint64_t*>(base);
    cnt = reinterpret_cast<unsigned*>(pool + a.tk_cols * a.tk_cap);
    ncols = a.tk_cols;  // M <= 8: one activation tile
    lmx[0] = lmx[1] = -INFINITY;
    lsm[0] = lsm[1] = 0.0f;
    for (int i = threadIdx.x; i < a.tk_cols; i += blockDim.x) cnt[i] = 0;
  }
  // A finished tile (rows row0 + r·16 + {g, g+8}, columns 2t, 2t+1).
  __device__ __forceinline__ void append(const LogitsArgs& a, const float (&acc)[RT][1][4], int64_t row0, int g,
                                         int t) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int cl = 2 * t + (e & 1);
        const int64_t row = row0 + r * 16 + g + (e < 2 ? 0 : 8);
        if (cl < ncols && row < a.V) {
          const float v = acc[r][0][e];
          lse_add(lmx[e & 1], lsm[e & 1], v);
          pool[cl * a.tk_cap + atomicAdd(&cnt[cl], 1u)] = make_entry(v, row);
        }
      }
  }
  __device__ __forceinline__ void finish(const LogitsArgs& a, unsigned char* scratch, int g, int t);
};

// The best k entries of each column's pool → tk_cand[m, blockIdx.y, :] (0 =
// none), by the whole CTA: two 8-bit radix passes over all pools at once find
// the 16-bit bin of each column's k-th entry; the entries at or above it
// (k plus that bin's ties) are gathered and sorted by one warp per column.
// When a gather would overflow (heavy ties), six more passes make the bin the
// exact k-th entry, and exactly k are gathered.
struct ColumnSelect {
  unsigned* hist;     // [ncols][256]
  uint64_t* gat;      // [ncols][kTopkGather]
  uint64_t* prefix;   // [ncols]
  unsigned* need;     // [ncols]
  unsigned* gcnt;     // [ncols]
  unsigned* flag;     // [1]
};

__device__ __forceinline__ void select_columns(const LogitsArgs& a, const uint64_t* pool, const unsigned* cnt,
                                               int ncols, ColumnSelect& cs) {
  const int T = blockDim.x, lane = threadIdx.x & 31, wic = threadIdx.x >> 5, nw = T >> 5;
  for (int cl = threadIdx.x; cl < ncols; cl += T) {
    cs.prefix[cl] = cnt[cl] <= unsigned(a.k) ? 1ull : 0ull;  // <= k entries: all of them (every entry is >= 1)
    cs.need[cl] = unsigned(a.k);
  }
  auto pass = [&](int shift) {
    for (int i = threadIdx.x; i < ncols * 256; i += T) cs.hist[i] = 0;
    cta_sync();
    const uint64_t hi = shift >= 56 ? 0ull : (~0ull << (shift + 8));
    for (int cl = 0; cl < ncols; ++cl) {
      if (cs.prefix[cl] == 1ull) continue;
      const uint64_t* p = pool + cl * a.tk_cap;
      for (int i = threadIdx.x; i < int(cnt[cl]); i += T) {
        const uint64_t e = p[i];
        if ((e & hi) == cs.prefix[cl]) atomicAdd(&cs.hist[cl * 256 + int((e >> shift) & 0xFF)], 1u);
      }
    }
    cta_sync();
    for (int cl = wic; cl < ncols; cl += nw) {  // one warp per column: the bin of the need-th largest
      if (cs.prefix[cl] == 1ull) continue;
      unsigned c[8], sum = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) { c[j] = cs.hist[cl * 256 + 8 * lane + j]; sum += c[j]; }
      unsigned suf = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned y = __shfl_down_sync(0xffffffffu, suf, o);
        if (lane + o < 32) suf += y;
      }
      const unsigned need = cs.need[cl], above = suf - sum;
      __syncwarp();
      if (suf >= need && above < need) {
        unsigned cum = above;
        for (int j = 7; j >= 0; --j) {
          if (cum + c[j] >= need) {
            cs.prefix[cl] |= uint64_t(8 * lane + j) << shift;
            cs.need[cl] = need - cum;
            break;
          }
          cum += c[j];
        }
      }
    }
    cta_sync();
  };
  auto gather = [&]() {
    for (int cl = threadIdx.x; cl < ncols; cl += T) cs.gcnt[cl] = 0;
    if (threadIdx.x == 0) *cs.flag = 0;
    cta_sync();
    for (int cl = 0; cl < ncols; ++cl) {
      const uint64_t* p = pool + cl * a.tk_cap;
      const uint64_t tau = cs.prefix[cl];
      for (int i = threadIdx.x; i < int(cnt[cl]); i += T) {
        const uint64_t e = p[i];
        if (e >= tau) {
          const unsigned pos = atomicAdd(&cs.gcnt[cl], 1u);
          if (pos < unsigned(kTopkGather)) cs.gat[cl * kTopkGather + pos] = e;
          else *cs.flag = 1;
        }
      }
    }
    cta_sync();
  };
  pass(56);
  pass(48);
  gather();
  if (*cs.flag) {  // CTA-uniform: exact k-th entries
    for (int shift = 40; shift >= 0; shift -= 8) pass(shift);
    gather();
  }
}

template <int RT>
__device__ __forceinline__ void TopkAll<RT>::finish(const LogitsArgs& a, unsigned char* scratch, int g, int t) {
  const int lane = threadIdx.x & 31, wic = threadIdx.x >> 5, nw = blockDim.x >> 5;
  cta_sync();  // every append is done
  ColumnSelect cs;
  cs.gat = reinterpret_cast<uint64_t*>(scratch);
  cs.prefix = cs.gat + ncols * kTopkGather;
  float2* lred = reinterpret_cast<float2*>(cs.prefix + ncols);  // [warps][ncols]
  cs.hist = reinterpret_cast<unsigned*>(lred + nw * ncols);
  cs.need = cs.hist + ncols * 256;
  cs.gcnt = cs.need + ncols;
  cs.flag = cs.gcnt + ncols;
  select_columns(a, pool, cnt, ncols, cs);
  for (int cl = wic; cl < ncols; cl += nw) {  // sort each column's gather, keep k
    uint64_t* p = cs.gat + cl * kTopkGather;
    const int c = int(min(cs.gcnt[cl], unsigned(kTopkGather)));
    int n2 = 1;
    while (n2 < c) n2 <<= 1;
    for (int i = c + lane; i < n2; i += 32) p[i] = 0;
    __syncwarp();
    warp_sort_desc(p, n2);
    uint64_t* o = a.tk_cand + (int64_t(cl) * gridDim.y + blockIdx.y) * a.k;
    for (int j = lane; j < a.k; j += 32) o[j] = j < c ? p[j] : 0;
  }
  // Log-sum-exp: lanes of one t hold the same columns (xor over g), then warps.
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    float mx = lmx[c], sm = lsm[c];
#pragma unroll
    for (int o = 4; o < 32; o <<= 1) {
      const float mx2 = __shfl_xor_sync(0xffffffffu, mx, o), sm2 = __shfl_xor_sync(0xffffffffu, sm, o);
      lse_combine(mx, sm, mx2, sm2);
    }
    const int cl = 2 * t + c;
    if (g == 0 && cl < ncols) lred[wic * ncols + cl] = make_float2(mx, sm);
  }
  cta_sync();
  for (int cl = threadIdx.x; cl < ncols; cl += blockDim.x) {
    float mx = -INFINITY, sm = 0.0f;
    for (int w = 0; w < nw; ++w) lse_combine(mx, sm, lred[w * ncols + cl].x, lred[w * ncols + cl].y);
    a.tk_part[int64_t(cl) * gridDim.y + blockIdx.y] = make_float2(mx, sm);
  }
}

// Scratch bytes TopkAll::finish needs (inside the staged kernel's stage ring).
inline int topk_finish_scratch(int ncols, int warps) {
  return ncols * (kTopkGather * 8 + 8 + warps * 8 + 256 * 4 + 4 + 4) + 4;
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

// ---- v8/v12: the shared-memory staged kernel (M <= 16) ----------------------------------
//
// Why. ncu on the register-ring kernel (v5–v7) showed it latency- and
// instruction-bound: per 512-byte warp chunk ~180 instructions, most of them
// address, counter and branch work of the per-lane loads, and too few bytes
// in flight (12 warps/SM × a 4-chunk ring ≈ 48 KB). Here each warp streams
// its row tile through a ring of NS shared-memory stages with cp.async
// (16-byte copies, L1 bypassed): a stage is C bytes of each of the warp's
// 16·RT rows, so a lane issues RT·C/32 copies per stage with one pointer add
// each, the bytes in flight do not cost registers, and the dequant side reads
// its A fragments with one ldmatrix.x4 per two 16-byte segments.
//
// The k order. ldmatrix gives lane (g, t) the 4-byte word t of a 16-byte
// row segment (rows g and g+8), so the quad of a k-block covers one whole
// segment: 32 h (4-bit) or 16 h (8-bit), always inside one group — the same
// lane → h map as the register kernel with L = 4, so permute_x_kernel<…, 4>
// lays out the activations. Rows are padded to P = C + 16 bytes in shared
// memory so that the 8 rows of an ldmatrix matrix hit 8 different bank quads.
//
// Scales and zero points. A tile's scales are one contiguous block
// [16·RT rows, groups] (and its zero points [16·RT·b/32 words, groups]):
// copied with the tile's first stage into one of two buffers, so the next
// tile's block lands while this one is read (needs nst >= NS, checked by the
// launcher). Rows past V are zero-filled (cp.async's src-size), never read.
//
// The activations. Each CTA first writes x in B-fragment order into shared
// memory (staged_x_bytes: one padded region per column, then a zero block
// that the lanes of columns >= M read, so B loads carry no predicates), each
// lane's two k-blocks as one 16-byte load at a constant offset per stage.
// Up to kStagedMaxX bytes a CTA builds them from x itself (16-byte loads,
// eight in flight per thread, byte permutes); larger ones (M = 16 at
// H >= 2560: one CTA per SM) staged_x_kernel builds once per call and each
// CTA copies them flat with cp.async.
//
// Stage size (v12, session 4). With 64-byte stages a warp reads 16·RT
// separate 64-byte pieces per stage; a pure copy with that pattern reached
// only ~2.5 TB/s on the H200 (half cache lines per row and stage), with
// 128-byte pieces ~3.7 TB/s. So rows take 128-byte stages where their length
// allows, 64-byte ones otherwise (launch_staged).
//
//   BITS 4|8 · T · C bytes per row per stage (64|128) · RT row tiles per warp ·
//   NS stages · GS 16-byte segments per group when a group fits a stage (1, 2,
//   4), 0 when a group spans stages (a.st_spg stages) · ASYM · TOPK · CH
//   accumulator chains per group (1|2: the two k-blocks of a segment alternate,
//   halving the dependent MMA chain) · NW warps per CTA.

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}

// Bytes of the activations in B-fragment order (M columns, 16-byte aligned).
// Layout: per column m a 2H + 64-byte region (the pad puts consecutive columns
// half a bank row apart: a quarter-warp's 16-byte loads never conflict); in it
// lane t's fragments for k-blocks 2i and 2i+1 are the 16 bytes at (4i + t)·16.
// Then a zero block that lanes of columns >= M read instead (no predicates).
template <int BITS, int C>
__host__ __device__ constexpr int staged_zero_bytes() { return (C / 16) * (BITS == 4 ? 2 : 1) * 32; }
__host__ __device__ inline int staged_col_bytes(int H) { return 2 * H + 64; }
template <int BITS, int C>
__host__ __device__ inline int staged_x_bytes(int H, int M) { return M * staged_col_bytes(H) + staged_zero_bytes<BITS, C>(); }
// Bytes the staged layout of M columns needs beyond M·H 16-bit values (the
// x_frag workspace holds either layout).
__host__ __device__ constexpr int64_t staged_x_extra(int64_t M) { return M * 64 + 512; }

// Fragment f of the staged layout (column m, k-block kb, lane t; f < M·H/4):
// the 4 values lane (g = m, t) feeds k-block kb (permute_x_kernel's map, L = 4)
// → its 8 bytes in dst. Shared by the per-CTA build and staged_x_kernel.
template <int BITS, class T>
__device__ __forceinline__ void staged_x_fragment(const T* __restrict__ x, int H, int f, unsigned char* dst) {
  using Gm = Geometry<BITS, 4>;
  const int kbs = H / 16;
  const int tt = f & 3, kb = (f >> 2) % kbs, m = (f >> 2) / kbs;
  const int hword = (kb / Gm::KBC) * Gm::S + tt * Gm::HW;
  union {
    T v[4];
    uint2 u;
  } w;
#pragma unroll
  for (int e = 0; e < 4; ++e) w.v[e] = x[int64_t(m) * H + hword + Gm::h_of(kb % Gm::KBC, e)];
  *reinterpret_cast<uint2*>(dst + m * staged_col_bytes(H) + ((kb >> 1) * 4 + tt) * 16 + (kb & 1) * 8) = w.u;
}

// The same layout 16 bytes at a time, when x is 16-byte aligned: unit u
// (column m, k-block pair q, lane t; u < M·H/8) reads the 8 values lane t
// feeds k-blocks 2q and 2q+1 with one 16-byte load (4-bit: h = 32q + 8t ..
// +8) or two 8-byte ones (8-bit: h = 32q + 4t .. +4 and 32q + 16 + 4t .. +4),
// puts them in fragment order with byte permutes (4-bit: 0,4,1,5 | 2,6,3,7;
// 8-bit: 0,2,1,3 per k-block, Geometry::h_of) and stores 16 bytes.
template <int BITS>
__device__ __forceinline__ uint4 staged_x_unit_load(const unsigned char* __restrict__ xr, int q, int t) {
  if constexpr (BITS == 4) return *reinterpret_cast<const uint4*>(xr + (q * 32 + 8 * t) * 2);
  const uint2 a = *reinterpret_cast<const uint2*>(xr + (q * 32 + 4 * t) * 2);
  const uint2 b = *reinterpret_cast<const uint2*>(xr + (q * 32 + 16 + 4 * t) * 2);
  return make_uint4(a.x, a.y, b.x, b.y);
}
template <int BITS>
__device__ __forceinline__ uint4 staged_x_unit_order(uint4 w) {
  if constexpr (BITS == 4)  // w = v1:v0, v3:v2, v5:v4, v7:v6 → v4:v0, v5:v1, v6:v2, v7:v3
    return make_uint4(__byte_perm(w.x, w.z, 0x5410), __byte_perm(w.x, w.z, 0x7632), __byte_perm(w.y, w.w, 0x5410),
                      __byte_perm(w.y, w.w, 0x7632));
  // per k-block: a1:a0, a3:a2 → a2:a0, a3:a1
  return make_uint4(__byte_perm(w.x, w.y, 0x5410), __byte_perm(w.x, w.y, 0x7632), __byte_perm(w.z, w.w, 0x5410),
                    __byte_perm(w.z, w.w, 0x7632));
}

// x [M, H] → the staged kernel's shared layout in global memory (xs bytes,
// zero block included), once per call, for activations too large for every
// CTA to build them (launch_staged_cfg). One thread per fragment.
template <int BITS, class T, int C>
__global__ void staged_x_kernel(const T* __restrict__ x, int M, int H, unsigned char* __restrict__ dst) {
  const int nf = M * H / 4, f = int(blockIdx.x) * blockDim.x + threadIdx.x;
  if (f < nf) staged_x_fragment<BITS>(x, H, f, dst);
  const int z = f - nf;
  if (z >= 0 && z < staged_zero_bytes<BITS, C>() / 16)
    reinterpret_cast<uint4*>(dst + M * staged_col_bytes(H))[z] = make_uint4(0u, 0u, 0u, 0u);
}

// Bytes of shared memory one warp of the staged kernel uses.
template <int BITS, int C, int RT, int NS, bool ASYM>
__host__ __device__ inline int staged_warp_bytes(int groups, int sbytes) {
  const int sblk = 16 * RT * groups * sbytes;                              // multiple of 32
  const int zblk = ASYM ? ((16 * RT * BITS / 32) * groups * 4 + 15) / 16 * 16 : 0;
  return NS * 16 * RT * (C + 16) + 2 * sblk + 2 * zblk;
}

template <int BITS, class T, int C, int RT, int NS, int GS, bool ASYM, bool TOPK, int CH, int NW, int NT>
__global__ void __launch_bounds__(NW * 32) logits_staged_kernel(const LogitsArgs a) {
  static_assert(!TOPK || NT == 1, "the top-k epilogue keeps pools for 8 columns");
  constexpr int kWarps = NW;
  constexpr int SPS = C / 16;          // 16-byte segments per row per stage
  constexpr int P = C + 16;            // shared row pitch (bytes)
  constexpr int ROWS = 16 * RT;        // rows per warp tile
  constexpr int STAGE = ROWS * P;      // bytes per stage
  constexpr int CPL = ROWS * SPS / 32; // 16-byte copies per lane per stage
  constexpr int KBS = BITS == 4 ? 2 : 1;  // k-blocks per 4-byte word
  constexpr int GS1 = GS > 0 ? GS : 1;
  static_assert(SPS % 2 == 0 && (ROWS * SPS) % 32 == 0, "stage geometry");
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wic = threadIdx.x >> 5;
  const int64_t warp = int64_t(blockIdx.y) * kWarps + wic;
  const int64_t nwarps = int64_t(gridDim.y) * kWarps;
  const int64_t tiles = (a.V + ROWS - 1) / ROWS;
  const int my_tiles = warp < tiles ? int((tiles - warp + nwarps - 1) / nwarps) : 0;
  const int64_t row_bytes = int64_t(a.H) * BITS / 8;
  const int nst = int(row_bytes / C);  // stages per tile
  const int total = my_tiles * nst;
  const int sbytes = scale_bytes(a.scale_type);
  const int sblk = ROWS * a.groups * sbytes;
  const int zw = ASYM ? (ROWS * BITS / 32) * a.groups : 0;  // zero-point words per tile
  const int zblk = (zw * 4 + 15) / 16 * 16;

  // Shared memory: the activations in B-fragment order (built here: no
  // permute launch), then each warp's region, then the top-k pools.
  extern __shared__ __align__(16) unsigned char st_smem[];
  const int xs = staged_x_bytes<BITS, C>(a.H, a.M);
  const int wbytes = staged_warp_bytes<BITS, C, RT, NS, ASYM>(a.groups, sbytes);
  unsigned char* bsm = st_smem;
  unsigned char* wsm = st_smem + xs + wic * wbytes;
  if (a.x_stage) {
    // Prebuilt (staged_x_kernel): a flat copy, all of it in flight at once.
    const char* xg = static_cast<const char*>(a.x_stage);
    const uint32_t xb = smem_u32(bsm);
    for (int f = threadIdx.x; f < xs / 16; f += blockDim.x) cp_async16(xb + f * 16, xg + f * 16, 16);
    cp_async_commit();
    cp_async_wait<0>();
  } else {
    const T* x = static_cast<const T*>(a.x);
    if ((reinterpret_cast<uintptr_t>(x) & 15) == 0) {
      // 16 bytes per unit, eight units' loads in flight per thread.
      const int qs = a.H / 32, nu = a.M * qs * 4, colb = staged_col_bytes(a.H);
      const unsigned char* xb = static_cast<const unsigned char*>(a.x);
      for (int u0 = 0; u0 < nu; u0 += 8 * int(blockDim.x)) {
        uint4 w[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int u = u0 + i * int(blockDim.x) + int(threadIdx.x);
          if (u < nu) w[i] = staged_x_unit_load<BITS>(xb + int64_t(u / (qs * 4)) * a.H * 2, (u >> 2) % qs, u & 3);
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int u = u0 + i * int(blockDim.x) + int(threadIdx.x);
          if (u < nu)
            *reinterpret_cast<uint4*>(bsm + (u / (qs * 4)) * colb + (((u >> 2) % qs) * 4 + (u & 3)) * 16) =
                staged_x_unit_order<BITS>(w[i]);
        }
      }
    } else {
      for (int f = threadIdx.x; f < a.M * a.H / 4; f += blockDim.x) staged_x_fragment<BITS>(x, a.H, f, bsm);
    }
    for (int f = threadIdx.x; f < staged_zero_bytes<BITS, C>() / 16; f += blockDim.x)
      reinterpret_cast<uint4*>(bsm + a.M * staged_col_bytes(a.H))[f] = make_uint4(0u, 0u, 0u, 0u);
  }
  TopkAll<RT> tk;
  if constexpr (TOPK) tk.init(a, st_smem + xs + kWarps * wbytes);
  cta_sync();
  if constexpr (!TOPK) {
    if (my_tiles == 0) return;
  }
  const uint32_t code_s = smem_u32(wsm);
  unsigned char* sbuf0 = wsm + NS * STAGE;
  unsigned char* zbuf0 = sbuf0 + 2 * sblk;

  // ---- the copy side: cursor (tile, stage) and this lane's CPL copies ----------------
  const char* packed = reinterpret_cast<const char*>(a.packed);
  const char* scale = static_cast<const char*>(a.scale);
  const int64_t s_end = a.V * a.groups * sbytes;                       // bytes of the scale tensor
  const int64_t z_end = ASYM ? ((a.V * BITS + 31) / 32) * a.groups : 0;  // words of the zero points
  int it = 0, ist = 0;  // tile (of this warp's) and stage being copied
  const char* src[CPL];
  int srcb[CPL];
  uint32_t dst[CPL];
#pragma unroll
  for (int j = 0; j < CPL; ++j) {
    const int q = lane + 32 * j;
    dst[j] = uint32_t((q / SPS) * P + (q % SPS) * 16);
  }
  auto point = [&]() {  // tile `it`: code pointers, then its scale and zero-point blocks
    const int64_t row0 = (warp + int64_t(it) * nwarps) * ROWS;
#pragma unroll
    for (int j = 0; j < CPL; ++j) {
      const int q = lane + 32 * j;
      int64_t row = row0 + q / SPS;
      srcb[j] = row < a.V ? 16 : 0;
      row = row < a.V ? row : a.V - 1;
      src[j] = packed + row * row_bytes + (q % SPS) * 16;
    }
    const uint32_t sb = smem_u32(sbuf0 + (it & 1) * sblk);
    const int64_t s0 = row0 * a.groups * sbytes;
    for (int p = lane; p < sblk / 16; p += 32) {
      const int64_t o = s0 + int64_t(p) * 16;
      const int n = int(o >= s_end ? 0 : (s_end - o < 16 ? s_end - o : 16));
      cp_async16(sb + p * 16, n ? scale + o : scale, n);
    }
    if constexpr (ASYM) {
      const uint32_t zb = smem_u32(zbuf0 + (it & 1) * zblk);
      const int64_t z0 = (row0 * BITS / 32) * a.groups;
      for (int p = lane; p < zw; p += 32) {
        const int64_t o = z0 + p;
        cp_async4(zb + p * 4, o < z_end ? a.zp + o : a.zp, o < z_end ? 4 : 0);
      }
    }
  };
  int issued = 0;
  auto issue = [&](int slot) {  // the next stage into ring slot `slot`; one commit group per stage
    if (issued < total) {
      if (ist == 0) point();
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        cp_async16(code_s + slot * STAGE + dst[j], src[j], srcb[j]);
        src[j] += C;
      }
      if (++ist == nst) { ist = 0; ++it; }
    }
    cp_async_commit();
    ++issued;
  };
#pragma unroll
  for (int d = 0; d < NS - 1; ++d) issue(d);

  // ---- the compute side ------------------------------------------------------------------
  // ldmatrix row address of this lane: matrix (lane / 8) = (rows 0-7 | 8-15) × (segment 2s | 2s+1).
  const uint32_t lane_off = uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 16);
  // Lane's B fragments of k-blocks 0 and 1; lanes of columns >= M read the zero block and never move.
  // Activation tile n (columns 8n..8n+7) of this lane: column g + 8n.
  const unsigned char* bp0[NT];
  int bstep[NT];  // bytes per stage
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    const bool has_b = g + 8 * n < a.M;
    bp0[n] = bsm + (has_b ? (g + 8 * n) * staged_col_bytes(a.H) : a.M * staged_col_bytes(a.H)) + t * 16;
    bstep[n] = has_b ? SPS * KBS * 32 : 0;
  }
  float acc[RT][NT][4], cacc[RT][NT][4], cacc2[RT][NT][4];
  auto zero = [](float (&v)[RT][NT][4]) {
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int n = 0; n < NT; ++n) v[r][n][0] = v[r][n][1] = v[r][n][2] = v[r][n][3] = 0.0f;
  };
  zero(acc);
  int64_t ct = warp;  // tile being computed
  int cst = 0, cb = 0;  // its stage, its scale buffer
  int cgs = 0, cgrp = 0;  // GS == 0: stage in group, group
  const unsigned char* bp[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) bp[n] = bp0[n];
  uint32_t bias[RT][2], bias16[RT][2];
  float zoff[RT][2];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      bias[r][h] = make_bias<BITS, T>(0);
      bias16[r][h] = pack2<T>(-72.0f, -72.0f);
      zoff[r][h] = 8388608.0f + float(1 << (BITS - 1));
    }

  for (int q0 = 0; q0 < total; q0 += NS) {
#pragma unroll
    for (int d = 0; d < NS; ++d) {
      if (q0 + d >= total) break;
      issue((d + NS - 1) % NS);
      cp_async_wait<NS - 1>();
      __syncwarp();
      // A words of this stage: w[r][s][h] = word t of segment s of row g (h = 0) / g+8 (h = 1).
      uint32_t w[RT][SPS][2];
#pragma unroll
      for (int r = 0; r < RT; ++r)
#pragma unroll
        for (int sp = 0; sp < SPS / 2; ++sp)
          ldmatrix_x4(code_s + d * STAGE + r * 16 * P + sp * 32 + lane_off, w[r][2 * sp][0], w[r][2 * sp][1],
                      w[r][2 * sp + 1][0], w[r][2 * sp + 1][1]);
      uint2 B[NT][SPS][KBS];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int i = 0; i < SPS * KBS / 2; ++i) {
          const uint4 q = *reinterpret_cast<const uint4*>(bp[n] + i * 64);
          B[n][(2 * i) / KBS][(2 * i) % KBS] = make_uint2(q.x, q.y);
          B[n][(2 * i + 1) / KBS][(2 * i + 1) % KBS] = make_uint2(q.z, q.w);
        }
      const unsigned char* sbuf = sbuf0 + cb * sblk;
      const uint32_t* zbuf = reinterpret_cast<const uint32_t*>(zbuf0 + cb * zblk);
      // GS > 0: the scales of the stage's GPS groups for this lane's rows, read
      // and widened once per stage under one uniform branch on their type (per
      // group, the branchy loads were a quarter of a g64 group's instructions).
      constexpr int GPS = GS > 0 ? SPS / GS1 : 1;
      float scv[RT][GPS][2];
      if constexpr (GS > 0) {
        auto fill = [&](auto ld) {
#pragma unroll
          for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
              for (int i = 0; i < GPS; ++i) scv[r][i][h] = ld((r * 16 + h * 8 + g) * a.groups + cst * GPS + i);
        };
        if (a.scale_type == kScaleF16)
          fill([&](int idx) { return __half2float(reinterpret_cast<const __half*>(sbuf)[idx]); });
        else if (a.scale_type == kScaleBF16)
          fill([&](int idx) { return __uint_as_float(uint32_t(reinterpret_cast<const unsigned short*>(sbuf)[idx]) << 16); });
        else
          fill([&](int idx) { return reinterpret_cast<const float*>(sbuf)[idx]; });
      }
#pragma unroll
      for (int sg = 0; sg < SPS; ++sg) {
        const bool gstart = GS > 0 ? (sg % GS1 == 0) : (sg == 0 && cgs == 0);
        const bool gend = GS > 0 ? (sg % GS1 == GS1 - 1) : (sg == SPS - 1 && cgs == a.st_spg - 1);
        const int grp = GS > 0 ? cst * (SPS / GS1) + sg / GS1 : cgrp;
        if (gstart) {
          zero(cacc);
          if constexpr (CH == 2) zero(cacc2);
          if constexpr (ASYM) {
#pragma unroll
            for (int r = 0; r < RT; ++r)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                const int rr = r * 16 + h * 8 + g;
                const uint32_t word = zbuf[((rr * BITS) >> 5) * a.groups + grp];
                const int z = int((word >> ((rr * BITS) & 31)) & ((1u << BITS) - 1u)) - (1 << (BITS - 1));
                bias[r][h] = make_bias<BITS, T>(z);
                bias16[r][h] = pack2<T>(-(72.0f + float(z)), -(72.0f + float(z)));
                zoff[r][h] = 8388608.0f + float(1 << (BITS - 1)) + float(z);
              }
          }
        }
#pragma unroll
        for (int j = 0; j < KBS; ++j) {
#pragma unroll
          for (int r = 0; r < RT; ++r) {
            uint32_t A[4];
            A[0] = dequant_pair<BITS, T>(w[r][sg][0], j, 0, bias[r][0], bias16[r][0], zoff[r][0]);
            A[1] = dequant_pair<BITS, T>(w[r][sg][1], j, 0, bias[r][1], bias16[r][1], zoff[r][1]);
            A[2] = dequant_pair<BITS, T>(w[r][sg][0], j, 1, bias[r][0], bias16[r][0], zoff[r][0]);
            A[3] = dequant_pair<BITS, T>(w[r][sg][1], j, 1, bias[r][1], bias16[r][1], zoff[r][1]);
#pragma unroll
            for (int n = 0; n < NT; ++n) {
              if (CH == 2 && ((sg * KBS + j) & 1)) mma16816<T>(cacc2[r][n], A, B[n][sg][j].x, B[n][sg][j].y);
              else mma16816<T>(cacc[r][n], A, B[n][sg][j].x, B[n][sg][j].y);
            }
          }
        }
        if (gend) {  // the group ends: scale its f32 partial sums once
#pragma unroll
          for (int r = 0; r < RT; ++r) {
            if constexpr (CH == 2) {
#pragma unroll
              for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) cacc[r][n][e] += cacc2[r][n][e];
            }
            float sc[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              if constexpr (GS > 0) {
                sc[h] = scv[r][sg / GS1][h];
              } else {
                sc[h] = load_scale(sbuf, a.scale_type, (r * 16 + h * 8 + g) * a.groups + grp);
              }
            }
            fold_group<NT>(acc[r], cacc[r], sc[0], sc[1]);
          }
        }
      }
      __syncwarp();  // every lane is done with slot d before a later issue() refills it
#pragma unroll
      for (int n = 0; n < NT; ++n) bp[n] += bstep[n];
      if constexpr (GS == 0) {
        if (++cgs == a.st_spg) { cgs = 0; ++cgrp; }
      }
      if (++cst == nst) {  // the tile is done
        if constexpr (TOPK) tk.append(a, acc, ct * ROWS, g, t);
        else store_tile<RT, NT>(a, acc, ct * ROWS, 0, g, t);
        zero(acc);
        cst = 0;
        cb ^= 1;
        cgs = 0;
        cgrp = 0;
        ct += nwarps;
#pragma unroll
        for (int n = 0; n < NT; ++n) bp[n] = bp0[n];
      }
    }
  }
  cp_async_wait<0>();  // no copy outlives the kernel (the trailing empty groups)
  if constexpr (TOPK) tk.finish(a, st_smem + xs, g, t);  // the stage rings are free now
}

// ---- v10: the tensor-core GEMM (M > 16) ------------------------------------------------
//
// Why. The GEMV kernels above give every warp its own row tile and all M
// activation columns, so above M ≈ 16 each warp's accumulators, B loads and
// dequant per byte grow with M and the table's bytes stop being the cost. A
// GEMM shares the work instead: a CTA of 8 warps owns a [256 rows × BM
// columns] output tile, streams the tile's packed rows AND the activations'
// k-slice through one ring of NS shared-memory stages (cp.async, 16-byte
// copies), and every warp multiplies its 32 rows by all BM columns, so a
// dequantized A fragment feeds BM/8 MMAs and a B fragment 2.
//
// Same bytes, no repack. A stage is 64 bytes of each row (128 h for 4-bit, 64
// for 8-bit): the A words come by ldmatrix exactly as in the staged kernel,
// and the activations come from the global x_frag that permute_x_kernel<…, 4>
// writes (k-block-major, Mpad columns, lane order), so a stage's B slice
// [k-blocks][BM][4 lanes] is KB·BM·32 contiguous bytes per k-block and every
// B fragment is one conflict-free 8-byte shared load.
//
// Exactness as above: per group an f32 partial sum of exact (q − z)·x
// products, scaled once when the group ends (cacc → acc).
//
// Scales and zero points travel with the stage: per row the scales of the
// groups the stage touches (gps·sbytes ≤ 16 bytes; a 2-byte unit is copied as
// its aligned 4-byte word), per zero-point word row its gps words. Rows past
// V are zero-filled and never stored.
//
// Persistent grid: CTA c takes work units c, c + grid, … where a unit is
// (row tile, column tile) with the column tile fastest, so the CTAs sharing
// a row tile run together and its bytes come from L2 after the first read;
// the stage stream runs on across units (no pipeline refill per tile).
//
//   BITS 4|8 · T · NT activation tiles of 8 per warp (BM = 8·NT) · GS 16-byte
//   segments per group when a group fits a stage (1, 2, 4), 0 when it spans
//   a.st_spg stages · ASYM.
template <int N>
__device__ __forceinline__ void cp_async_n(uint32_t dst, const void* src, int src_bytes) {
  if constexpr (N == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(N), "r"(src_bytes) : "memory");
  }
}

constexpr int kGemmThreads = 256;  // 8 warps (two warpgroups) per CTA, one CTA per SM
constexpr int kGemmC = 64;         // bytes per row per stage
constexpr int kGemmNS = 4;         // stages in the ring

// One ring stage: BV rows of codes (C bytes each, padded to P), the
// activations' k-slice for BM columns, the scales (≤ 16 bytes per row) and
// zero points (≤ 4 words per word row) the stage's groups need. C: kGemmC,
// except the warp-specialized kernel's 8-bit stages (ws_c).
template <int BITS, int BV, int BM, bool ASYM, int NS = kGemmNS, int C = kGemmC>
struct GemmGeometry {
  static constexpr int SPS = C / 16;                     // 16-byte segments per row per stage
  static constexpr int KBS = BITS == 4 ? 2 : 1;          // k-blocks (16 h) per segment
  static constexpr int KBST = SPS * KBS;                 // k-blocks per stage
  static constexpr int P = C + 16;                       // shared row pitch of the codes (bytes)
  static constexpr int W_BYTES = BV * P;
  static constexpr int X_BYTES = KBST * BM * 32;         // 32 bytes per (k-block, column)
  static constexpr int S_BYTES = BV * 16;
  static constexpr int ZROWS = BV * BITS / 32;           // zero-point word rows per tile
  static constexpr int Z_BYTES = ASYM ? ZROWS * 16 : 0;
  static constexpr int STAGE = W_BYTES + X_BYTES + S_BYTES + Z_BYTES;
  static constexpr int SMEM = NS * STAGE;
};

// A stage's scales and zero points, copied by threads tid < BV (scales: row
// tid's GPS·sbytes bytes from byte offset soff + g0·sbytes, a 2-byte unit as
// its aligned 4-byte word, into 16 bytes per row at ss) and tid < BV·BITS/32
// (zero points: GPS words of word row tid from z + g0, into 16 bytes per
// word row after the scales). Invalid rows (sok / zok false) zero-fill.
template <int BITS, int BV, int GPS, bool ASYM>
__device__ __forceinline__ void copy_scales_zeros(const LogitsArgs& a, uint32_t ss, int64_t soff, bool sok,
                                                  const uint32_t* z, bool zok, int64_t g0, int tid) {
  if (tid < BV) {
    const char* scale = static_cast<const char*>(a.scale);
    const int sbytes = scale_bytes(a.scale_type);
    const uint32_t sd = ss + tid * 16;
    const int64_t off = soff + g0 * sbytes;
    switch (GPS * sbytes) {
      case 2: {
        const int64_t al = off & ~int64_t(3), s_end = a.table_rows() * a.groups * 2;
        cp_async_n<4>(sd, scale + al, sok ? int(s_end - al < 4 ? s_end - al : 4) : 0);
        break;
      }
      case 4: cp_async_n<4>(sd, scale + off, sok ? 4 : 0); break;
      case 8: cp_async_n<8>(sd, scale + off, sok ? 8 : 0); break;
      default: cp_async_n<16>(sd, scale + off, sok ? 16 : 0); break;
    }
  }
  if constexpr (ASYM) {
    if (tid < BV * BITS / 32) {
      const uint32_t zd = ss + BV * 16 + tid * 16;
      if constexpr (GPS == 4) cp_async_n<16>(zd, z + g0, zok ? 16 : 0);
      else if constexpr (GPS == 2) cp_async_n<8>(zd, z + g0, zok ? 8 : 0);
      else cp_async_n<4>(zd, z + g0, zok ? 4 : 0);
    }
  }
}

// The copy side of both GEMMs: every thread of the CTA holds its share of a
// stage's cp.async sources as pointers, set once per unit (start) and moved
// by constants per stage (copy), so a stage costs each thread ~10 copies and
// a few adds. `xs` is the activations in the kernel's k-block-major layout:
// (kb·Mpad + m)·32 bytes per (k-block, column), a column tile's 32·BM bytes
// contiguous per k-block. Rows past V are zero-filled (src-size 0) from an
// in-range address.
template <int BITS, int BV, int BM, int GS, bool ASYM>
struct GemmCopier {
  using Gg = GemmGeometry<BITS, BV, BM, ASYM>;
  static constexpr int SPS = Gg::SPS, KBST = Gg::KBST, GPS = GS > 0 ? SPS / GS : 1;
  static constexpr int WJ = BV * SPS / kGemmThreads;                      // code copies per thread
  static constexpr int XJ = (KBST * BM * 2 + kGemmThreads - 1) / kGemmThreads;  // activation copies per thread
  const char* w[WJ];
  int wn[WJ];
  uint32_t wdst[WJ];
  const char* x;
  int64_t xoff[XJ];
  int64_t x_stage;  // bytes of xs per stage
  int64_t soff;     // byte offset of this thread's scale row
  bool sok;
  const uint32_t* z;  // this thread's zero-point word row
  bool zok;
  int64_t g0;  // first group of the stage
  int sgs, spg;

  __device__ __forceinline__ void init(const LogitsArgs& a, int Mpad, int spg_) {
    const int tid = threadIdx.x;
    spg = spg_;
#pragma unroll
    for (int j = 0; j < WJ; ++j) {
      const int q = tid + kGemmThreads * j;
      wdst[j] = uint32_t((q / SPS) * Gg::P + (q % SPS) * 16);
    }
#pragma unroll
    for (int j = 0; j < XJ; ++j) {
      const int q = tid + kGemmThreads * j;
      xoff[j] = int64_t(q / (2 * BM)) * Mpad * 32 + (q % (2 * BM)) * 16;
    }
    x_stage = int64_t(KBST) * Mpad * 32;
  }
  __device__ __forceinline__ void start(const LogitsArgs& a, const char* xs, int64_t row0, int m0) {
    const int tid = threadIdx.x;
    const int64_t row_bytes = int64_t(a.H) * BITS / 8;
    const char* packed = reinterpret_cast<const char*>(a.packed);
#pragma unroll
    for (int j = 0; j < WJ; ++j) {
      const int q = tid + kGemmThreads * j;
      const int64_t row = row0 + q / SPS;
      const bool ok = row < a.V;
      w[j] = packed + (ok ? row : 0) * row_bytes + (q % SPS) * 16;
      wn[j] = ok ? 16 : 0;
    }
    x = xs + int64_t(m0) * 32;
    const int sbytes = scale_bytes(a.scale_type);
    sok = row0 + tid < a.V && tid < BV;
    soff = (sok ? row0 + tid : 0) * a.groups * sbytes;
    if constexpr (ASYM) {
      const int64_t wr = row0 * BITS / 32 + tid;
      zok = tid < Gg::ZROWS && wr < (a.V * BITS + 31) / 32;
      z = a.zp + (zok ? wr : 0) * a.groups;
    }
    g0 = 0;
    sgs = 0;
  }
  // This unit's next stage into the ring slot at shared address st.
  __device__ __forceinline__ void copy(const LogitsArgs& a, uint32_t st) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int j = 0; j < WJ; ++j) {
      cp_async16(st + wdst[j], w[j], wn[j]);
      w[j] += kGemmC;
    }
#pragma unroll
    for (int j = 0; j < XJ; ++j)
      if ((KBST * BM * 2) % kGemmThreads == 0 || tid + kGemmThreads * j < KBST * BM * 2)
        cp_async16(st + Gg::W_BYTES + (tid + kGemmThreads * j) * 16, x + xoff[j], 16);
    x += x_stage;
    copy_scales_zeros<BITS, BV, GPS, ASYM>(a, st + Gg::W_BYTES + Gg::X_BYTES, soff, sok, z, zok, g0, tid);
    if constexpr (GS > 0) {
      g0 += GPS;
    } else {
      if (++sgs == spg) { sgs = 0; ++g0; }
    }
  }
};

// The compute side's walk through a CTA's units (row tile, column tile) of
// a persistent grid, column tile fastest: the unit, its first row and
// column, the stage, the stage's first group (GS == 0: the stage's place in
// its group). The warp-specialized GEMM's producer walks the same sequence.
template <int BITS, int BV, int BM, int GS, int C = kGemmC>
struct GemmCursor {
  static constexpr int GPS = GS > 0 ? (C / 16) / GS : 1;  // groups a stage touches
  int nst, nmt, spg;
  int64_t total;        // stages of all the CTA's units
  int64_t u, row0, g0;  // unit, its first row, the stage's first group
  int m0, ks, cgs;      // the unit's first column, stage, place in the group (GS == 0)

  // False when the CTA has no unit.
  __device__ __forceinline__ bool init(const LogitsArgs& a, int Mpad) {
    nst = int(int64_t(a.H) * BITS / 8 / C);
    nmt = Mpad / BM;
    spg = GS > 0 ? 1 : a.st_spg;
    const int64_t units = (a.V + BV - 1) / BV * nmt;
    const int64_t mine = blockIdx.x < units ? (units - blockIdx.x + gridDim.x - 1) / gridDim.x : 0;
    total = mine * nst;
    u = blockIdx.x;
    row0 = (u / nmt) * BV;
    m0 = int(u % nmt) * BM;
    g0 = 0;
    ks = 0;
    cgs = 0;
    return mine > 0;
  }
  __device__ __forceinline__ bool group_starts() const { return GS > 0 || cgs == 0; }     // (GS == 0) at this stage
  __device__ __forceinline__ bool group_ends() const { return GS > 0 || cgs == spg - 1; }  // (GS == 0) in this stage
  // After a stage: true when the unit is done (the caller stores, then next_unit()).
  __device__ __forceinline__ bool end_stage() {
    if constexpr (GS == 0) {
      if (++cgs == spg) { cgs = 0; ++g0; }
    } else {
      g0 += GPS;
    }
    return ++ks == nst;
  }
  __device__ __forceinline__ void next_unit() {
    ks = 0;
    cgs = 0;
    g0 = 0;
    u += gridDim.x;
    row0 = (u / nmt) * BV;
    m0 = int(u % nmt) * BM;
  }
};

// The schedule the two CTA-barrier GEMM kernels share: the cursor, plus the
// copy side NS − 1 stages ahead with one commit group per stage.
template <int BITS, int BV, int BM, int GS, bool ASYM, int NS>
struct GemmStream : GemmCursor<BITS, BV, BM, GS> {
  using Gg = GemmGeometry<BITS, BV, BM, ASYM, NS>;
  int64_t issued;
  int64_t cu;  // copy side: unit, stage
  int cks;
  uint32_t smem0;
  const char* xs;
  GemmCopier<BITS, BV, BM, GS, ASYM> cp;

  // Sets up and issues the first NS − 1 stages; false when the CTA has no unit.
  __device__ __forceinline__ bool init(const LogitsArgs& a, int Mpad, uint32_t smem) {
    if (!GemmCursor<BITS, BV, BM, GS>::init(a, Mpad)) return false;
    issued = 0;
    cu = blockIdx.x;
    cks = 0;
    smem0 = smem;
    xs = static_cast<const char*>(a.x_frag);
    cp.init(a, Mpad, this->spg);
#pragma unroll
    for (int d = 0; d < NS - 1; ++d) issue(a, d);
    return true;
  }
  __device__ __forceinline__ void issue(const LogitsArgs& a, int slot) {
    if (issued < this->total) {
      if (cks == 0) cp.start(a, xs, (cu / this->nmt) * BV, int(cu % this->nmt) * BM);
      cp.copy(a, smem0 + slot * Gg::STAGE);
      if (++cks == this->nst) { cks = 0; cu += gridDim.x; }
    }
    cp_async_commit();
    ++issued;
  }
  // Stage q: waits until it landed for every thread and every warp is done
  // with stage q − 1 (its slot is refilled here); returns q's slot.
  // PROXY_FENCE (the wgmma GEMM): the stage was written by cp.async, the generic proxy, and is
  // read by wgmma, the async proxy: after the barrier every thread orders the two with
  // fence.proxy.async, before it issues the next copies.
  template <bool PROXY_FENCE = false>
  __device__ __forceinline__ int begin(const LogitsArgs& a, int64_t q) {
    cp_async_wait<NS - 2>();
    __syncthreads();
    if constexpr (PROXY_FENCE) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    issue(a, int((q + NS - 1) % NS));
    return int(q % NS);
  }
};

// Scale of tile row rl for group gi of the stage (ks: the stage, for a 2-byte unit's half).
template <int GPS>
__device__ __forceinline__ float gemm_scale(const LogitsArgs& a, const unsigned char* ss, int rl, int gi, int64_t row0,
                                            int64_t g0) {
  const unsigned char* sp = ss + rl * 16;
  if (a.scale_type == kScaleF32) return reinterpret_cast<const float*>(sp)[gi];
  const int idx = GPS == 1 ? int(((row0 + rl) * a.groups + g0) & 1) : gi;
  const unsigned short raw = reinterpret_cast<const unsigned short*>(sp)[idx];
  return a.scale_type == kScaleBF16 ? __uint_as_float(uint32_t(raw) << 16) : __half2float(__ushort_as_half(raw));
}

// Signed zero point of tile row rl for group gi of the stage.
template <int BITS>
__device__ __forceinline__ int gemm_zero(const uint32_t* zs, int rl, int gi) {
  const uint32_t word = zs[((rl * BITS) >> 5) * 4 + gi];
  return int((word >> ((rl * BITS) & 31)) & ((1u << BITS) - 1u)) - (1 << (BITS - 1));
}

template <int BITS, class T>
__device__ __forceinline__ void set_bias(int z, uint32_t& bias, uint32_t& bias16, float& zoff) {
  bias = make_bias<BITS, T>(z);
  bias16 = pack2<T>(-(72.0f + float(z)), -(72.0f + float(z)));
  zoff = 8388608.0f + float(1 << (BITS - 1)) + float(z);
}

// Zeroed accumulators / the symmetric (q − z) subtrahends of R row tiles.
template <int R, int NT>
__device__ __forceinline__ void zero_acc(float (&c)[R][NT][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < NT; ++n) c[r][n][0] = c[r][n][1] = c[r][n][2] = c[r][n][3] = 0.0f;
}
template <int BITS, class T, int R>
__device__ __forceinline__ void init_bias(uint32_t (&bias)[R][2], uint32_t (&bias16)[R][2], float (&zoff)[R][2]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) set_bias<BITS, T>(0, bias[r][h], bias16[r][h], zoff[r][h]);
}

// mma.sync GEMM: warp = 32 rows (two m16 tiles) × all BM = 8·NT columns; 8 warps = 256 rows.
// MINB CTAs per SM (2: ≤ 128 registers, a 3-stage ring), NS stages.
template <int MINB> constexpr int gemm_stages() { return MINB == 2 ? 3 : kGemmNS; }

template <int BITS, class T, int NT, int GS, bool ASYM, int MINB>
__global__ void __launch_bounds__(kGemmThreads, MINB) logits_gemm_kernel(const LogitsArgs a, int Mpad) {
  constexpr int RT = 2, BV = 256, BM = 8 * NT, NS = gemm_stages<MINB>();
  using Gg = GemmGeometry<BITS, BV, BM, ASYM, NS>;
  constexpr int SPS = Gg::SPS, KBS = Gg::KBS, P = Gg::P;
  constexpr int GPS = GS > 0 ? SPS / GS : 1;  // groups a stage touches
  constexpr int GS1 = GS > 0 ? GS : 1;
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3, wic = tid >> 5;
  extern __shared__ __align__(16) unsigned char gm_smem[];
  GemmStream<BITS, BV, BM, GS, ASYM, NS> st;
  if (!st.init(a, Mpad, smem_u32(gm_smem))) return;
  const uint32_t smem0 = st.smem0;

  const uint32_t lane_off = uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 16);
  float acc[RT][NT][4], cacc[RT][NT][4];
  zero_acc(acc);
  uint32_t bias[RT][2], bias16[RT][2];
  float zoff[RT][2];
  init_bias<BITS, T>(bias, bias16, zoff);

  for (int64_t q = 0; q < st.total; ++q) {
    const int slot = st.begin(a, q);
    const unsigned char* stp = gm_smem + slot * Gg::STAGE;
    const uint32_t wb = smem0 + slot * Gg::STAGE + wic * 32 * P;
    uint32_t w[RT][SPS][2];
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int sp = 0; sp < SPS / 2; ++sp)
        ldmatrix_x4(wb + r * 16 * P + sp * 32 + lane_off, w[r][2 * sp][0], w[r][2 * sp][1], w[r][2 * sp + 1][0],
                    w[r][2 * sp + 1][1]);
    const uint2* xsm = reinterpret_cast<const uint2*>(stp + Gg::W_BYTES) + (g * 4 + t);
    const unsigned char* ss = stp + Gg::W_BYTES + Gg::X_BYTES;
    const uint32_t* zs = reinterpret_cast<const uint32_t*>(stp + Gg::W_BYTES + Gg::X_BYTES + Gg::S_BYTES);
    const int64_t row0 = st.row0, g0 = st.g0;
#pragma unroll
    for (int sg = 0; sg < SPS; ++sg) {
      const bool gstart = GS > 0 ? (sg % GS1 == 0) : (sg == 0 && st.group_starts());
      const bool gend = GS > 0 ? (sg % GS1 == GS1 - 1) : (sg == SPS - 1 && st.group_ends());
      const int gi = GS > 0 ? sg / GS1 : 0;
      if (gstart) {
        zero_acc(cacc);
        if constexpr (ASYM) {
#pragma unroll
          for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              set_bias<BITS, T>(gemm_zero<BITS>(zs, wic * 32 + r * 16 + h * 8 + g, gi), bias[r][h], bias16[r][h], zoff[r][h]);
        }
      }
#pragma unroll
      for (int j = 0; j < KBS; ++j) {
        const int kb = sg * KBS + j;
        uint32_t A[RT][4];
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          A[r][0] = dequant_pair<BITS, T>(w[r][sg][0], j, 0, bias[r][0], bias16[r][0], zoff[r][0]);
          A[r][1] = dequant_pair<BITS, T>(w[r][sg][1], j, 0, bias[r][1], bias16[r][1], zoff[r][1]);
          A[r][2] = dequant_pair<BITS, T>(w[r][sg][0], j, 1, bias[r][0], bias16[r][0], zoff[r][0]);
          A[r][3] = dequant_pair<BITS, T>(w[r][sg][1], j, 1, bias[r][1], bias16[r][1], zoff[r][1]);
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const uint2 B = xsm[(kb * BM + n * 8) * 4];
#pragma unroll
          for (int r = 0; r < RT; ++r) mma16816<T>(cacc[r][n], A[r], B.x, B.y);
        }
      }
      if (gend) {  // the group ends: scale its f32 partial sums once
#pragma unroll
        for (int r = 0; r < RT; ++r) {
          const float s0 = gemm_scale<GPS>(a, ss, wic * 32 + r * 16 + g, gi, row0, g0);
          const float s1 = gemm_scale<GPS>(a, ss, wic * 32 + r * 16 + 8 + g, gi, row0, g0);
          fold_group<NT>(acc[r], cacc[r], s0, s1);
        }
      }
    }
    if (st.end_stage()) {  // the unit is done: C fragments → out
      store_tile<RT, NT>(a, acc, row0 + wic * 32, st.m0, g, t);
      zero_acc(acc);
      st.next_unit();
    }
  }
  cp_async_wait<0>();  // no copy outlives the kernel (the trailing empty groups)
}

// ---- v11: the wgmma GEMM (sm_90a, large M) ----------------------------------------------
//
// Why. The mma.sync GEMM reads every B fragment from shared memory once per
// 32 rows (128 bytes per m16n8k16), which caps it near the SM's shared-memory
// bandwidth long before the tensor cores (ncu, M = 32: tensor pipe 23 %,
// 2 warps per scheduler, half the cycles with no eligible warp). wgmma lets
// a warpgroup multiply its 64 rows by up to 128 columns in one instruction,
// with B read by the tensor cores straight from shared memory.
//
// Same bytes, same exactness. The A operand comes from registers: each warp
// of a warpgroup dequantizes its 16 rows exactly as for mma.sync (the
// m64nNk16 register fragment of warp w is the m16n8k16 fragment of rows
// 16w..16w+15). B is the activations, K-major without swizzle: core matrices
// of 8 columns × 8 k (16 bytes each, 128 contiguous bytes), the two k-halves
// of a k-block BM·16 bytes apart (LBO) and consecutive column groups 128
// bytes apart (SBO). permute_x_wg_kernel writes them in that order with the
// k-slots permuted like the codes, so a stage copies them as it is. Per
// group the warpgroup's wgmmas start from zero (scale-d = 0) into cacc and
// the group's scale is applied once to the f32 result (cacc → acc), after
// wgmma.wait_group: the same arithmetic as the kernels above.
//
// CTA: two warpgroups × 64 rows = 128 rows × BN columns (BN = 64 | 128),
// the stage ring, unit order and persistent grid of the mma.sync GEMM.
__device__ __forceinline__ void wgmma_fence() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wgmma_wait0() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
template <int NT>
__device__ __forceinline__ void fence_regs(float (&c)[NT][4]) {  // keep the compiler's hands off c across wgmma
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(c[n][e])::"memory");
}

template <int NB>
__device__ __forceinline__ void keep_regs(uint32_t (&r)[NB][4]) {  // the compiler must keep r allocated up to here
#pragma unroll
  for (int i = 0; i < NB; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(r[i][e])::"memory");
}

template <class T>
__device__ __forceinline__ void wgmma_n64(float (&c)[8][4], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3]), "+f"(c[1][0]), "+f"(c[1][1]), "+f"(c[1][2]), "+f"(c[1][3]), "+f"(c[2][0]), "+f"(c[2][1]), "+f"(c[2][2]), "+f"(c[2][3]), "+f"(c[3][0]), "+f"(c[3][1]), "+f"(c[3][2]), "+f"(c[3][3]), "+f"(c[4][0]), "+f"(c[4][1]), "+f"(c[4][2]), "+f"(c[4][3]), "+f"(c[5][0]), "+f"(c[5][1]), "+f"(c[5][2]), "+f"(c[5][3]), "+f"(c[6][0]), "+f"(c[6][1]), "+f"(c[6][2]), "+f"(c[6][3]), "+f"(c[7][0]), "+f"(c[7][1]), "+f"(c[7][2]), "+f"(c[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3]), "+f"(c[1][0]), "+f"(c[1][1]), "+f"(c[1][2]), "+f"(c[1][3]), "+f"(c[2][0]), "+f"(c[2][1]), "+f"(c[2][2]), "+f"(c[2][3]), "+f"(c[3][0]), "+f"(c[3][1]), "+f"(c[3][2]), "+f"(c[3][3]), "+f"(c[4][0]), "+f"(c[4][1]), "+f"(c[4][2]), "+f"(c[4][3]), "+f"(c[5][0]), "+f"(c[5][1]), "+f"(c[5][2]), "+f"(c[5][3]), "+f"(c[6][0]), "+f"(c[6][1]), "+f"(c[6][2]), "+f"(c[6][3]), "+f"(c[7][0]), "+f"(c[7][1]), "+f"(c[7][2]), "+f"(c[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
  }
#endif
}

template <class T>
__device__ __forceinline__ void wgmma_n128(float (&c)[16][4], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3]), "+f"(c[1][0]), "+f"(c[1][1]), "+f"(c[1][2]), "+f"(c[1][3]), "+f"(c[2][0]), "+f"(c[2][1]), "+f"(c[2][2]), "+f"(c[2][3]), "+f"(c[3][0]), "+f"(c[3][1]), "+f"(c[3][2]), "+f"(c[3][3]), "+f"(c[4][0]), "+f"(c[4][1]), "+f"(c[4][2]), "+f"(c[4][3]), "+f"(c[5][0]), "+f"(c[5][1]), "+f"(c[5][2]), "+f"(c[5][3]), "+f"(c[6][0]), "+f"(c[6][1]), "+f"(c[6][2]), "+f"(c[6][3]), "+f"(c[7][0]), "+f"(c[7][1]), "+f"(c[7][2]), "+f"(c[7][3]), "+f"(c[8][0]), "+f"(c[8][1]), "+f"(c[8][2]), "+f"(c[8][3]), "+f"(c[9][0]), "+f"(c[9][1]), "+f"(c[9][2]), "+f"(c[9][3]), "+f"(c[10][0]), "+f"(c[10][1]), "+f"(c[10][2]), "+f"(c[10][3]), "+f"(c[11][0]), "+f"(c[11][1]), "+f"(c[11][2]), "+f"(c[11][3]), "+f"(c[12][0]), "+f"(c[12][1]), "+f"(c[12][2]), "+f"(c[12][3]), "+f"(c[13][0]), "+f"(c[13][1]), "+f"(c[13][2]), "+f"(c[13][3]), "+f"(c[14][0]), "+f"(c[14][1]), "+f"(c[14][2]), "+f"(c[14][3]), "+f"(c[15][0]), "+f"(c[15][1]), "+f"(c[15][2]), "+f"(c[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
  } else {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
        : "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3]), "+f"(c[1][0]), "+f"(c[1][1]), "+f"(c[1][2]), "+f"(c[1][3]), "+f"(c[2][0]), "+f"(c[2][1]), "+f"(c[2][2]), "+f"(c[2][3]), "+f"(c[3][0]), "+f"(c[3][1]), "+f"(c[3][2]), "+f"(c[3][3]), "+f"(c[4][0]), "+f"(c[4][1]), "+f"(c[4][2]), "+f"(c[4][3]), "+f"(c[5][0]), "+f"(c[5][1]), "+f"(c[5][2]), "+f"(c[5][3]), "+f"(c[6][0]), "+f"(c[6][1]), "+f"(c[6][2]), "+f"(c[6][3]), "+f"(c[7][0]), "+f"(c[7][1]), "+f"(c[7][2]), "+f"(c[7][3]), "+f"(c[8][0]), "+f"(c[8][1]), "+f"(c[8][2]), "+f"(c[8][3]), "+f"(c[9][0]), "+f"(c[9][1]), "+f"(c[9][2]), "+f"(c[9][3]), "+f"(c[10][0]), "+f"(c[10][1]), "+f"(c[10][2]), "+f"(c[10][3]), "+f"(c[11][0]), "+f"(c[11][1]), "+f"(c[11][2]), "+f"(c[11][3]), "+f"(c[12][0]), "+f"(c[12][1]), "+f"(c[12][2]), "+f"(c[12][3]), "+f"(c[13][0]), "+f"(c[13][1]), "+f"(c[13][2]), "+f"(c[13][3]), "+f"(c[14][0]), "+f"(c[14][1]), "+f"(c[14][2]), "+f"(c[14][3]), "+f"(c[15][0]), "+f"(c[15][1]), "+f"(c[15][2]), "+f"(c[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
  }
#endif
}

// Activations → the wgmma B layout: for k-block kb and column m (Mpad columns,
// tiles of BM), 32 bytes at ((kb·Mpad/BM + m/BM)·2 + kc)·BM·16 + (m % BM)·16
// + 2·i hold x[m, h] for k-slot kc·8 + i, with h the k-slot's position in the
// codes (the lane t = i/2 and value e = i%2 + 2·kc of Geometry<BITS, 4>).
// The activations of a stage in the wgmma B layout with 128-byte swizzle,
// K-major: column n's k-slots of k-blocks 4r .. 4r + 3 are one 128-byte row
// (16-byte chunk c = 2·(kb % 4) + k-half), eight columns one 1024-byte atom,
// the chunk index XORed with n % 8 (the hardware's pattern: address bits 4-6
// ^= bits 7-9), the k-regions r BM·128 bytes apart. Byte offset of (k-block
// kb of the stage, k-half kc, column n) from the stage's activation base.
__device__ __forceinline__ uint32_t wgmma_ws_x_offset(int BM, int kb, int kc, int n) {
  return uint32_t((kb / 4) * BM * 128 + (n / 8) * 1024 + (n % 8) * 128 + (((2 * (kb % 4) + kc) ^ (n % 8)) << 4));
}

// SW = KBST > 0 (the warp-specialized kernel): instead, each stage's
// KBST k-blocks of a column tile are one contiguous block of KBST·BM·32 bytes
// at ((kb / KBST)·(Mpad/BM) + mt)·KBST·BM·32, laid out as wgmma_ws_x_offset
// (128-byte swizzle), so that the kernel copies a stage flat.
template <int BITS, class T, int KBST = 0>
__global__ void permute_x_wg_kernel(const T* __restrict__ x, T* __restrict__ xw, int M, int Mpad, int BM, int H) {
  using Gm = Geometry<BITS, 4>;
  const int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // one 16-byte unit
  if (f >= int64_t(H / 16) * Mpad * 2) return;
  const int nl = int(f % BM);
  const int kc = int((f / BM) % 2);
  const int64_t tile = f / (2 * BM);  // kb·(Mpad/BM) + mt
  const int nmt = Mpad / BM;
  const int mt = int(tile % nmt), kb = int(tile / nmt);
  const int m = mt * BM + nl;
  const int hword = (kb / Gm::KBC) * Gm::S;
  union {
    T v[8];
    uint4 u;
  } o;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int tt = i / 2, e = (i % 2) + 2 * kc;
    o.v[i] = m < M ? x[int64_t(m) * H + hword + tt * Gm::HW + Gm::h_of(kb % Gm::KBC, e)] : Act<T>::from_float(0.0f);
  }
  if constexpr (KBST > 0) {
    const int64_t off = (int64_t(kb / KBST) * nmt + mt) * KBST * BM * 32 + wgmma_ws_x_offset(BM, kb % KBST, kc, nl);
    *reinterpret_cast<uint4*>(reinterpret_cast<char*>(xw) + off) = o.u;
  } else {
    reinterpret_cast<uint4*>(xw)[f] = o.u;
  }
}

// The A fragments of group gi's part of a stage (SEGS 16-byte segments of
// KBS k-blocks each) from the warp's ldmatrix'd codes w[SPS][2], with the
// group's bias: A[sl·KBS + j] = the m16n8k16 fragment of k-block j of
// segment gi·SEGS + sl (both wgmma kernels).
template <int BITS, class T, int SEGS, int KBS, int SPS>
__device__ __forceinline__ void dequant_batch(const uint32_t (&w)[SPS][2], int gi, const uint32_t (&bias)[1][2],
                                              const uint32_t (&bias16)[1][2], const float (&zoff)[1][2],
                                              uint32_t (&A)[SEGS * KBS][4]) {
#pragma unroll
  for (int sl = 0; sl < SEGS; ++sl)
#pragma unroll
    for (int j = 0; j < KBS; ++j) {
      const int sg = gi * SEGS + sl;
      uint32_t* Ak = A[sl * KBS + j];
      Ak[0] = dequant_pair<BITS, T>(w[sg][0], j, 0, bias[0][0], bias16[0][0], zoff[0][0]);
      Ak[1] = dequant_pair<BITS, T>(w[sg][1], j, 0, bias[0][1], bias16[0][1], zoff[0][1]);
      Ak[2] = dequant_pair<BITS, T>(w[sg][0], j, 1, bias[0][0], bias16[0][0], zoff[0][0]);
      Ak[3] = dequant_pair<BITS, T>(w[sg][1], j, 1, bias[0][1], bias16[0][1], zoff[0][1]);
    }
}

// One stage of the v11 wgmma GEMM CTA: warp wic (0..7) of the
// consumer warpgroups dequantizes its rows wic·16 + {g, g+8} of the stage at
// shared address stu (generic pointer stp), its warpgroup (wic / 4) issues
// the wgmmas of its 64 rows × BN columns per group into cacc (scale-d = 0 at
// a group's start), waits for them, and folds each finished group into acc
// with the group's scales. On return no wgmma of this stage is in flight and
// the warp has read everything of the slot it will read.
template <int BITS, class T, int BN, int GS, bool ASYM, int NS, class Cursor>
__device__ __forceinline__ void wgmma_stage(const LogitsArgs& a, const Cursor& cur, uint64_t desc_hi, uint32_t stu,
                                            const unsigned char* stp, int wic, int lane, float (&acc)[1][BN / 8][4],
                                            float (&cacc)[1][BN / 8][4], uint32_t (&bias)[1][2], uint32_t (&bias16)[1][2],
                                            float (&zoff)[1][2]) {
  constexpr int BV = 128, BM = BN, NT = BN / 8;
  using Gg = GemmGeometry<BITS, BV, BM, ASYM, NS>;
  constexpr int SPS = Gg::SPS, KBS = Gg::KBS, P = Gg::P;
  constexpr int GPS = GS > 0 ? SPS / GS : 1;
  constexpr int SEGS = GS > 0 ? GS : SPS;  // segments of one group inside a stage
  const int g = lane >> 2;
  const uint32_t lane_off = uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 16);
  uint32_t w[SPS][2];
  {
    const uint32_t wb = stu + (wic * 16) * P;
#pragma unroll
    for (int sp = 0; sp < SPS / 2; ++sp)
      ldmatrix_x4(wb + sp * 32 + lane_off, w[2 * sp][0], w[2 * sp][1], w[2 * sp + 1][0], w[2 * sp + 1][1]);
  }
  const uint32_t xb = stu + Gg::W_BYTES;
  const unsigned char* ss = stp + Gg::W_BYTES + Gg::X_BYTES;
  const uint32_t* zs = reinterpret_cast<const uint32_t*>(stp + Gg::W_BYTES + Gg::X_BYTES + Gg::S_BYTES);
  const int64_t row0 = cur.row0, g0 = cur.g0;
#pragma unroll
  for (int gi = 0; gi < GPS; ++gi) {
    const bool gstart = cur.group_starts();
    const bool gend = cur.group_ends();
    if constexpr (ASYM) {
      if (gstart) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          set_bias<BITS, T>(gemm_zero<BITS>(zs, wic * 16 + h * 8 + g, gi), bias[0][h], bias16[0][h], zoff[0][h]);
      }
    }
    uint32_t A[SEGS * KBS][4];
    dequant_batch<BITS, T, SEGS, KBS>(w, gi, bias, bias16, zoff, A);
    fence_regs<NT>(cacc[0]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < SEGS * KBS; ++kk) {
      const int kb = gi * SEGS * KBS + kk;
      const uint64_t desc = desc_hi | uint64_t(((xb + kb * BM * 32) & 0x3FFFF) >> 4);
      const int scale_d = (kk > 0 || !gstart) ? 1 : 0;
      if constexpr (BN == 128) wgmma_n128<T>(cacc[0], A[kk], desc, scale_d);
      else wgmma_n64<T>(cacc[0], A[kk], desc, scale_d);
    }
    wgmma_commit();
    wgmma_wait0();  // A registers and the stage free; cacc final for this stage
    fence_regs<NT>(cacc[0]);
    if (gend) {
      const float s0 = gemm_scale<GPS>(a, ss, wic * 16 + g, gi, row0, g0);
      const float s1 = gemm_scale<GPS>(a, ss, wic * 16 + 8 + g, gi, row0, g0);
      fold_group<NT>(acc[0], cacc[0], s0, s1);
    }
  }
}

template <int BITS, class T, int BN, int GS, bool ASYM, int MINB>
__global__ void __launch_bounds__(kGemmThreads, MINB) logits_wgmma_kernel(const LogitsArgs a, int Mpad, uint64_t desc_hi) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BV = 128, BM = BN, NT = BN / 8, NS = gemm_stages<MINB>();
  using Gg = GemmGeometry<BITS, BV, BM, ASYM, NS>;
  const int tid = threadIdx.x, lane = tid & 31, g = lane >> 2, t = lane & 3, wic = tid >> 5;
  extern __shared__ __align__(128) unsigned char wg_smem[];
  GemmStream<BITS, BV, BM, GS, ASYM, NS> st;
  if (!st.init(a, Mpad, smem_u32(wg_smem))) return;
  const uint32_t smem0 = st.smem0;

  float acc[1][NT][4], cacc[1][NT][4];  // [1]: the one row tile (the shared helpers take [R][NT][4])
  zero_acc(acc);
  uint32_t bias[1][2], bias16[1][2];
  float zoff[1][2];
  init_bias<BITS, T>(bias, bias16, zoff);

  for (int64_t q = 0; q < st.total; ++q) {
    const int slot = st.template begin<true>(a, q);  // every warpgroup's wgmmas on stage q − 1 completed (waited below)
    wgmma_stage<BITS, T, BN, GS, ASYM, NS>(a, st, desc_hi, smem0 + slot * Gg::STAGE, wg_smem + slot * Gg::STAGE, wic, lane,
                                           acc, cacc, bias, bias16, zoff);
    if (st.end_stage()) {  // the unit is done: accumulators → out
      store_tile<1, NT>(a, acc, st.row0 + wic * 16, st.m0, g, t);
      zero_acc(acc);
      st.next_unit();
    }
  }
  cp_async_wait<0>();
#endif
}

// ---- v14: the warp-specialized wgmma GEMM (sm_90a) -----------------------------------------
//
// Why. The v11 kernel's eight warps meet at a CTA barrier every stage and
// both warpgroups wait for their wgmmas at every group end, so they dequantize,
// multiply and fold in lockstep: at M = 256 the tensor cores were busy
// ~16–25 % of the time (docs/performance.md, session 3). Here one warpgroup
// only copies (cp.async for the codes and scales, one bulk copy for the
// activations; completion signalled on a per-slot "full" mbarrier)
// and the two consumer warpgroups never meet: each waits for a slot to be
// full, computes, and marks it free on the slot's "empty" mbarrier (one
// arrival per consumer warp), so one warpgroup's dequant and fold overlap
// the other's wgmmas. Inside a consumer the work is pipelined by batch (one
// group's part of a stage): the next batch is dequantized into the second A
// set while the current batch's wgmmas run; then wait, fold, issue. The
// arithmetic is v11's (same bytes, exact q − z fragments, the same f32
// per-group fold). The producer gives up registers to the consumers
// (setmaxnreg). CTA: 384 threads, 128 rows × BN columns, one per SM.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}" ::"r"(bar) : "memory");
}
// Waits until the phase with this parity of the barrier completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n}" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// One arrival that also expects `bytes` of bulk-copy transactions on the barrier's current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.expect_tx.shared::cta.b64 st, [%0], %1;\n}" ::"r"(bar), "r"(bytes)
               : "memory");
}
// A bulk copy global → shared through the async proxy (the proxy the wgmmas read shared memory
// through: no proxy fence between them); completes `bytes` transactions on bar. dst, src and
// bytes: multiples of 16.
__device__ __forceinline__ void bulk_copy_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
#endif
}
// Arrives on the barrier once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
template <int R>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
#endif
}
template <int R>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
#endif
}

constexpr int kWsThreads = 384;         // producer warpgroup + two consumer warpgroups
constexpr int kWsSmem = 200 * 1024;     // stage ring budget (of 227 KB per block)
// Code bytes per row per stage: 128 k for both widths. A stage's fixed costs (the two mbarrier
// hand-offs, the scale reads, the batch chain's wait) then buy eight m64nNk16 wgmmas per
// consumer warpgroup, not four: with kGemmC's 64 bytes the 8-bit kernel took 1.45-1.65x
// cuBLAS's time at M = 256 against 1.16-1.31x for 4-bit (docs/performance.md, session 11).
template <int BITS>
constexpr int ws_c() { return BITS == 8 ? 128 : kGemmC; }
template <int BITS, int BN, bool ASYM, int NS = 1>
using WsGeometry = GemmGeometry<BITS, 128, BN, ASYM, NS, ws_c<BITS>()>;
template <int BITS, int BN, bool ASYM>
constexpr int ws_stage_bytes() {  // a WsGeometry stage rounded up to whole 1024-byte swizzle atoms
  return (WsGeometry<BITS, BN, ASYM>::STAGE + 1023) / 1024 * 1024;
}
template <int BITS, int BN, bool ASYM>
constexpr int ws_stages() {
  constexpr int n = kWsSmem / ws_stage_bytes<BITS, BN, ASYM>();
  return n < 6 ? n : 6;
}
template <int BITS, int BN, bool ASYM>
constexpr int ws_smem_bytes() {  // the ring + alignment slack
  return ws_stages<BITS, BN, ASYM>() * ws_stage_bytes<BITS, BN, ASYM>() + 1024;
}

// Scratch for a top-k epilogue's outputs (the caller's grow-only workspace).
using TopkWorkspaceFn = void* (*)(size_t bytes);

// ---- v14's top-k epilogue: candidate lists above a sampled threshold ----------------------
//
// A top-k at M > 64 cannot keep per-column pools in shared memory (the ring
// takes it), and a CTA's own best k is a weak filter (k of its ~2300 rows).
// Instead the caller first computes the logits of a sample of the vocab
// (whole 128-row tiles spread over V) and takes a lower bound of their k-th
// largest (list_threshold_kernel, ops_cuda.cu): any k logits of the row bound
// the row's k-th largest from below, so every logit below it can be
// dropped. The kernel appends each logit >= the threshold, as an entry, to
// the list of its (column, CTA warp) — positions by ballot, no atomics — and
// sums exp(min(l − threshold, 0)) (each term <= 1: no overflow, no running
// max; the listed logits add exactly 1 each, subtracted by the merge). The
// merge (ops_cuda.cu) selects from the lists and adds the candidates' exps to
// the sums. A list holds at most the 16 rows × units its
// warp computes, so the launcher sizes it and it cannot overflow.

// A threshold lowered by a margin, so that a last-bit difference between the
// sample's run and the main run cannot drop a candidate.
__host__ __device__ __forceinline__ float list_margin(float v) { return v - (fabsf(v) * 0x1p-16f + 0x1p-30f); }

// One warp's 16 rows × NT·8 columns of a finished unit (acc: the m64nNk16
// accumulator layout, rows r0 + g and r0 + g + 8, columns n·8 + 2t + {0, 1}).
// thr_s[col] = the column's threshold; phase 1 multiplies it by log2 e where
// it needs it (loading a stored (threshold, product) pair for the thread's
// 32 columns made the TOPK kernels spill 108–156 bytes). Columns >= M have
// +inf, rows >= V take no part. Two phases, so that the common work has no
// branch between columns and its latencies overlap:
//  1. every column: exp(min(l − thr, 0)) added to sum[col · 8 + g] (one slot
//     per lane row: no shuffles; 32 running sums per thread would take
//     registers the consumer does not have) — a logit >= thr adds exactly 1,
//     and the merge subtracts the list's count, so no compare and select per
//     logit — and a bit per column with a logit >= thr;
//  2. only the columns where some lane of the warp has one: the entries
//     appended to list(col) at cnt[col], positions by ballot.
// (ncu, docs/performance.md: with a compare, select and accurate exp2f per
// logit the epilogue took ~1270 instructions per warp and unit, +40 % on the
// kernel.)
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
template <int NT>
__device__ __forceinline__ void topk_lists_tile(const LogitsArgs& a, const float (&acc)[NT][4], int64_t r0, int m0,
                                                int seg, int lane, const float* thr_s, uint32_t* cnt, float* sum) {
  static_assert(NT * 2 <= 32, "one flag bit per column of the thread");
  constexpr float kLog2e = 1.4426950408889634f;
  const int g = lane >> 2, t = lane & 3;
  const int64_t ra = r0 + g, rb = ra + 8;
  const bool va = ra < a.V, vb = rb < a.V;
  unsigned flags = 0;
  auto phase1 = [&](auto partial) {  // partial: the vocab's last tile, rows past V masked
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = n * 8 + 2 * t + c;
        const float thx = thr_s[col], thy = thx * kLog2e;
        float v0 = acc[n][c], v1 = acc[n][c + 2];
        if constexpr (decltype(partial)::value) {
          v0 = va ? v0 : -INFINITY;
          v1 = vb ? v1 : -INFINITY;
        }
        float e0 = ex2_ftz(fminf(fmaf(v0, kLog2e, -thy), 0.0f)), e1 = ex2_ftz(fminf(fmaf(v1, kLog2e, -thy), 0.0f));
        if constexpr (decltype(partial)::value) {  // with thr = −inf, −inf − (−inf) is NaN: no term at all
          e0 = va ? e0 : 0.0f;
          e1 = vb ? e1 : 0.0f;
        }
        sum[col * 8 + g] += e0 + e1;
        flags |= fmaxf(v0, v1) >= thx ? 1u << (2 * n + c) : 0u;
      }
  };
  if (r0 + 16 <= a.V) phase1(std::false_type());  // warp-uniform
  else phase1(std::true_type());
  const unsigned any = __reduce_or_sync(0xffffffffu, flags);
  if (any == 0) return;
  const unsigned same = 0x11111111u << t, below = same & ((1u << lane) - 1u);  // the lanes of my column
  const int64_t col_stride = int64_t(a.tk_out.nseg) * a.tk_out.seg_cap;
  uint64_t* const lists = a.tk_out.list + (int64_t(m0 + 2 * t) * a.tk_out.nseg + seg) * a.tk_out.seg_cap;  // column 2t's list
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      if (!((any >> (2 * n + c)) & 1u)) continue;  // warp-uniform
      const int col = n * 8 + 2 * t + c;
      const float th = thr_s[col], v0 = acc[n][c], v1 = acc[n][c + 2];
      const bool h0 = va && v0 >= th, h1 = vb && v1 >= th;
      const unsigned b0 = __ballot_sync(0xffffffffu, h0), b1 = __ballot_sync(0xffffffffu, h1);
      const unsigned base = cnt[col], n0 = __popc(b0 & same);
      uint64_t* list = lists + (n * 8 + c) * col_stride + base;
      if (h0) list[__popc(b0 & below)] = make_entry(v0, ra);
      if (h1) list[n0 + __popc(b1 & below)] = make_entry(v1, rb);
      __syncwarp();
      if (g == 0) cnt[col] = base + n0 + __popc(b1 & same);
    }
  __syncwarp();
}

template <int BITS, class T, int BN, int GS, bool ASYM, bool TOPK = false>
__global__ void __launch_bounds__(kWsThreads, 1) logits_wgmma_ws_kernel(const LogitsArgs a, int Mpad, uint64_t desc_hi) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BV = 128, BM = BN, NT = BN / 8, NS = ws_stages<BITS, BN, ASYM>(), C = ws_c<BITS>();
  using Gg = WsGeometry<BITS, BN, ASYM, NS>;
  constexpr int SPS = Gg::SPS, KBST = Gg::KBST, P = Gg::P, STAGE = ws_stage_bytes<BITS, BN, ASYM>();
  constexpr int GPS = GS > 0 ? SPS / GS : 1;
  static_assert(NS >= 2 && Gg::X_BYTES % (128 * 16) == 0 && KBST % 4 == 0 && Gg::W_BYTES % 1024 == 0,
                "ring of at least two stages; whole 128-thread activation rounds; 1024-byte swizzle atoms");
  static_assert(!TOPK || ws_smem_bytes<BITS, BN, ASYM>() + BN * (4 + 8 * 4 + 8 * 8 * 4) + 16 * NS <= 227 * 1024,
                "the ring and the top-k arrays fit a block's shared memory");
  extern __shared__ __align__(128) unsigned char ws_smem[];
  __shared__ __align__(8) uint64_t bars[2 * NS];  // full[0, NS), empty[NS, 2·NS)
  // TOPK (topk_lists_tile): the CTA's columns' thresholds; each consumer warp's list lengths, and its
  // sums of exp(min(l − thr, 0)) per column and lane row.
  __shared__ float thr_s[TOPK ? BN : 1];
  __shared__ uint32_t cnt_s[TOPK ? 8 : 1][TOPK ? BN : 1];
  __shared__ float sum_s[TOPK ? 8 : 1][TOPK ? BN * 8 : 1];
  const int tid = threadIdx.x;
  // The ring starts at a 1024-byte boundary (the swizzle pattern is taken from address bits 7-9).
  const uint32_t smem0 = (smem_u32(ws_smem) + 1023u) & ~1023u, full0 = smem_u32(bars), empty0 = full0 + NS * 8;
  unsigned char* const sbase = ws_smem + (smem0 - smem_u32(ws_smem));
  if (tid == 0) {
    for (int i = 0; i < NS; ++i) {
      // The producer's 128 threads, each once its cp.async copies landed, + thread 0's expect_tx
      // arrival (the phase completes when the bulk copy's bytes landed too).
      mbar_init(full0 + i * 8, 129);
      mbar_init(empty0 + i * 8, 8);   // the 8 consumer warps, each once done with the slot
    }
  }
  if constexpr (TOPK) {  // the launcher makes gridDim.x a multiple of the column tiles: one tile per CTA
    const int m0 = int(blockIdx.x % unsigned(Mpad / BM)) * BM;
    for (int i = tid; i < BN; i += kWsThreads) {
      thr_s[i] = m0 + i >= a.M ? INFINITY : a.tk_thr ? a.tk_thr[m0 + i] : -INFINITY;
    }
    for (int i = tid; i < 8 * BN; i += kWsThreads) cnt_s[i / BN][i % BN] = 0;
    for (int i = tid; i < 8 * BN * 8; i += kWsThreads) sum_s[i / (BN * 8)][i % (BN * 8)] = 0.0f;
  }
  __syncthreads();
  GemmCursor<BITS, BV, BM, GS, C> cur;
  if (!cur.init(a, Mpad)) return;

  if (tid < 128) {  // producer warpgroup: thread tid copies code row tid of each stage
    setmaxnreg_dec<40>();
    const int64_t row_bytes = int64_t(a.H) * BITS / 8;
    const int sbytes = scale_bytes(a.scale_type);
    const char* wp = nullptr;
    const char* xp = nullptr;
    int wn = 0;
    int64_t soff = 0;
    bool sok = false, zok = false;
    const uint32_t* z = nullptr;
    int slot = 0;
    uint32_t phase = 0;
    for (int64_t q = 0; q < cur.total; ++q) {
      if (q >= NS) mbar_wait(empty0 + slot * 8, phase ^ 1u);  // the slot's previous use was consumed
      if (cur.ks == 0) {  // a new unit: this thread's row, scale row, zero-point word row, column tile
        // The table row (a.tile_stride: a sample's tiles lie apart; they are whole, inside the table).
        const int64_t trow0 = cur.row0 * a.tile_stride, row = trow0 + tid, tv = a.table_rows();
        sok = row < tv;
        wp = reinterpret_cast<const char*>(a.packed) + (sok ? row : 0) * row_bytes;
        wn = sok ? 16 : 0;  // rows past V: zero-filled from an in-range address
        soff = (sok ? row : 0) * a.groups * sbytes;
        if constexpr (ASYM) {
          const int64_t wr = trow0 * BITS / 32 + tid;
          zok = tid < Gg::ZROWS && wr < (tv * BITS + 31) / 32;
          z = a.zp + (zok ? wr : 0) * a.groups;
        }
        xp = static_cast<const char*>(a.x_frag) + int64_t(cur.m0 / BM) * Gg::X_BYTES;  // permute_x_wg_kernel<.., KBST>
      }
      const uint32_t st = smem0 + slot * STAGE;
#pragma unroll
      for (int sp = 0; sp < SPS; ++sp) cp_async16(st + tid * P + sp * 16, wp + sp * 16, wn);
      wp += C;
      if (tid == 0) {  // the stage's activations: one block, laid out already, in one bulk copy
        mbar_arrive_expect_tx(full0 + slot * 8, Gg::X_BYTES);
        bulk_copy_g2s(st + Gg::W_BYTES, xp, Gg::X_BYTES, full0 + slot * 8);
      }
      xp += int64_t(Mpad / BM) * Gg::X_BYTES;
      copy_scales_zeros<BITS, BV, GPS, ASYM>(a, st + Gg::W_BYTES + Gg::X_BYTES, soff, sok, z, zok, cur.g0, tid);
      cp_async_mbar_arrive(full0 + slot * 8);
      if (cur.end_stage()) cur.next_unit();
      if (++slot == NS) { slot = 0; phase ^= 1u; }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");
  } else {  // consumer warpgroups: warp wic = 0..7 of rows wic·16 + {g, g+8}
    setmaxnreg_inc<232>();
    constexpr int KBS = Gg::KBS, SEGS = GS > 0 ? GS : SPS;  // segments of one group inside a stage
    constexpr int NB = SEGS * KBS;  // k-blocks of a batch: one group's part of a stage
    const int ctid = tid - 128, lane = ctid & 31, g = lane >> 2, t = lane & 3, wic = ctid >> 5;
    const uint32_t lane_off = uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * P + (lane >> 4) * 16);
    float acc[1][NT][4], cacc[1][NT][4];  // acc: set by the unit's first fold
    const int seg = int(blockIdx.x / unsigned(Mpad / BM)) * 8 + wic;  // TOPK: the warp's list segment
    uint32_t bias[1][2], bias16[1][2];
    float zoff[1][2];
    init_bias<BITS, T>(bias, bias16, zoff);
    uint32_t A[2][NB][4];  // two batches' A fragments: one dequantized while the other's wgmmas run
    // The batch in flight and what completing it takes: fold (its group ends; scales read at
    // issue), release its slot (the stage's last batch), store (the unit's last stage).
    bool p_fold = false, p_release = false, p_store = false, store_now = false, fresh = true;
    float p_s0 = 0.0f, p_s1 = 0.0f;
    int p_slot = 0, p_m0 = 0;
    int64_t p_row0 = 0;
    auto complete = [&] {  // wait0 on every path, also with nothing in flight (ptxas tracks the paths)
      wgmma_wait0();
      fence_regs<NT>(cacc[0]);
      keep_regs<NB>(A[0]);  // the in-flight wgmmas read their A registers until here
      keep_regs<NB>(A[1]);
      if (p_fold) {
        if (fresh) {  // the unit's first fold: acc = s · cacc (acc was stored, not zeroed: see store)
          fold_first<NT>(acc[0], cacc[0], p_s0, p_s1);
          fresh = false;
        } else {
          fold_group<NT>(acc[0], cacc[0], p_s0, p_s1);
        }
      }
      if (p_release) {
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + p_slot * 8);
      }
      store_now = p_store;  // stored after the next batch is issued, under its wgmmas
      p_fold = p_release = p_store = false;
    };
    auto store = [&] {
      // No zeroing here: it would wait for the stores to read acc; the next fold assigns instead.
      if constexpr (TOPK) topk_lists_tile<NT>(a, acc[0], p_row0 + wic * 16, p_m0, seg, lane, thr_s, cnt_s[wic], sum_s[wic]);
      else store_tile<1, NT>(a, acc, p_row0 + wic * 16, p_m0, g, t);
      fresh = true;
      store_now = false;
    };
    int slot = 0;
    uint32_t phase = 0;
    // One stage; B0: the A set of its first batch (batches alternate sets across stages).
    auto stage = [&](auto b0) {
      // The wgmmas read only the activations, which the bulk copy wrote through the async proxy, the
      // one they read through: no proxy fence (the codes and scales came by cp.async, the generic
      // proxy, and are read by ldmatrix and ld.shared). The fence cost a MEMBAR.ALL.CTA per stage,
      // which waited for the previous unit's logit stores.
      mbar_wait(full0 + slot * 8, phase);
      const uint32_t stu = smem0 + slot * STAGE;
      const unsigned char* stp = sbase + slot * STAGE;
      uint32_t w[SPS][2];
#pragma unroll
      for (int sp = 0; sp < SPS / 2; ++sp)
        ldmatrix_x4(stu + (wic * 16) * P + sp * 32 + lane_off, w[2 * sp][0], w[2 * sp][1], w[2 * sp + 1][0],
                    w[2 * sp + 1][1]);
      const uint32_t xb = stu + Gg::W_BYTES;
      const unsigned char* ss = stp + Gg::W_BYTES + Gg::X_BYTES;
      [[maybe_unused]] const uint32_t* zs = reinterpret_cast<const uint32_t*>(stp + Gg::W_BYTES + Gg::X_BYTES + Gg::S_BYTES);
#pragma unroll
      for (int gi = 0; gi < GPS; ++gi) {
        uint32_t(&Ab)[NB][4] = A[(decltype(b0)::value + gi) & 1];
        const bool gstart = cur.group_starts(), gend = cur.group_ends();
        float s0 = 0.0f, s1 = 0.0f;  // read before the dequant: their latency hides under it
        if (gend) {
          s0 = gemm_scale<GPS>(a, ss, wic * 16 + g, gi, cur.row0, cur.g0);
          s1 = gemm_scale<GPS>(a, ss, wic * 16 + 8 + g, gi, cur.row0, cur.g0);
        }
        if constexpr (ASYM) {
          if (gstart) {
#pragma unroll
            for (int h = 0; h < 2; ++h)
              set_bias<BITS, T>(gemm_zero<BITS>(zs, wic * 16 + h * 8 + g, gi), bias[0][h], bias16[0][h], zoff[0][h]);
          }
        }
        dequant_batch<BITS, T, SEGS, KBS>(w, gi, bias, bias16, zoff, Ab);
        complete();  // the previous batch (if any): its wgmmas ran while this one was dequantized
        p_s0 = s0;
        p_s1 = s1;
        fence_regs<NT>(cacc[0]);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < NB; ++kk) {
          // k-block kb of the stage: four per 128-byte row of a column, BM·128 bytes per such k-region
          // (wgmma_ws_x_offset: 128-byte swizzle).
          const int kb = gi * NB + kk;
          const uint32_t kaddr = xb + (kb / 4) * BM * 128 + (kb % 4) * 32;
          const uint64_t desc = desc_hi | uint64_t((kaddr & 0x3FFFF) >> 4);
          const int scale_d = (kk > 0 || !gstart) ? 1 : 0;
          if constexpr (BN == 128) wgmma_n128<T>(cacc[0], Ab[kk], desc, scale_d);
          else wgmma_n64<T>(cacc[0], Ab[kk], desc, scale_d);
        }
        wgmma_commit();
        if (store_now) store();  // the finished unit's logits (p_row0/p_m0 change only below)
        p_fold = gend;
        p_release = gi == GPS - 1;
        p_slot = slot;
        p_store = false;
      }
      if (cur.end_stage()) {
        p_store = true;
        p_row0 = cur.row0;
        p_m0 = cur.m0;
        cur.next_unit();
      }
      if (++slot == NS) { slot = 0; phase ^= 1u; }
    };
    // Stages in pairs, so that every path into a stage that dequantizes into set s comes from one
    // whose batch in flight used the other set (else ptxas inserts a wait for the wgmmas, C7517).
    int64_t q = 0;
    for (; q + 1 < cur.total; q += 2) {
      stage(std::integral_constant<int, 0>());
      stage(std::integral_constant<int, GPS & 1>());
    }
    if (q < cur.total) stage(std::integral_constant<int, 0>());
    complete();
    if (store_now) store();
    if constexpr (TOPK) {  // the warp's list lengths and sums
      __syncwarp();
      const int m0 = int(blockIdx.x % unsigned(Mpad / BM)) * BM;
      for (int col = lane; col < BN && m0 + col < a.M; col += 32) {
        float v = 0.0f;
#pragma unroll
        for (int r = 0; r < 8; ++r) v += sum_s[wic][col * 8 + r];
        a.tk_out.sum[int64_t(m0 + col) * a.tk_out.nseg + seg] = v;
        a.tk_out.count[int64_t(m0 + col) * a.tk_out.nseg + seg] = cnt_s[wic][col];
      }
    }
  }
#endif
}

// Which GEMM takes M activation rows. QHEAD_CUDA_GEMM=0 turns the GEMMs off,
// QHEAD_CUDA_GEMM_MIN_M=n moves their threshold, QHEAD_CUDA_WGMMA=0 keeps the
// mma.sync GEMM on sm_90 too and QHEAD_CUDA_WGMMA_MIN_M=n moves the wgmma
// threshold (the benchmark compares the kernels in one run; the tests force
// each at every M).
constexpr int kGemmMinM = 17;   // below: the GEMV kernels (M = 16: 67 vs 69 us mma.sync, 77 us wgmma)
constexpr int kWgmmaMinM = 33;  // below: mma.sync (M = 32: 69-70 vs 78-83 us; M = 64: 80-88 vs 100-104 us)
inline int env_int(const char* name, int fallback) {
  const char* e = std::getenv(name);
  return e && *e ? std::atoi(e) : fallback;
}
inline int gemm_min_m() {
  if (env_int("QHEAD_CUDA_GEMM", 1) == 0) return 1 << 30;
  return std::max(1, env_int("QHEAD_CUDA_GEMM_MIN_M", kGemmMinM));
}
inline bool device_has_wgmma() {
  static bool v = [] {
    int dev = 0, major = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    return major == 9;  // sm_90a code is in the fat binary; later majors run the mma.sync GEMM
  }();
  return v;
}
inline int wgmma_min_m() {
  if (!device_has_wgmma() || env_int("QHEAD_CUDA_WGMMA", 1) == 0) return 1 << 30;
  return std::max(1, env_int("QHEAD_CUDA_WGMMA_MIN_M", kWgmmaMinM));
}

// Lets Kernel use `bytes` of dynamic shared memory; the attribute is set once
// per kernel (the first call's bytes: every launcher passes a constant).
template <auto Kernel>
void allow_dynamic_smem(int bytes) {
  static const bool once = [&] {
    QHEAD_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)once;
}

// x_frag must hold round_up(M, kGemmMaxBM) · H elements.
constexpr int kGemmMaxBM = 128;

template <int BITS, class T, int NT, int GS, bool ASYM>
void launch_gemm_cfg(const LogitsArgs& a, cudaStream_t s) {
  constexpr int BM = 8 * NT, BV = 256, MINB = NT <= 4 ? 2 : 1;
  using Gg = GemmGeometry<BITS, BV, BM, ASYM, gemm_stages<MINB>()>;
  constexpr auto kernel = logits_gemm_kernel<BITS, T, NT, GS, ASYM, MINB>;
  allow_dynamic_smem<kernel>(Gg::SMEM);
  const int Mpad = (a.M + BM - 1) / BM * BM;
  const int64_t nfrag = int64_t(a.H / 4) * Mpad;
  permute_x_kernel<BITS, T, 4><<<static_cast<unsigned>((nfrag + 255) / 256), 256, 0, s>>>(
      static_cast<const T*>(a.x), static_cast<T*>(a.x_frag), a.M, Mpad, a.H);
  QHEAD_CUDA_CHECK_LAUNCH("permute_x_kernel");
  const int64_t units = (a.V + BV - 1) / BV * (Mpad / BM);
  kernel<<<unsigned(std::min<int64_t>(units, int64_t(sm_count()) * MINB)), kGemmThreads, Gg::SMEM, s>>>(a, Mpad);
  QHEAD_CUDA_CHECK_LAUNCH("logits_gemm_kernel");
}

template <int BITS, class T, int BN, int GS, bool ASYM>
void launch_wgmma_cfg(const LogitsArgs& a, cudaStream_t s) {
  constexpr int BV = 128, MINB = BN <= 64 ? 2 : 1;
  using Gg = GemmGeometry<BITS, BV, BN, ASYM, gemm_stages<MINB>()>;
  constexpr auto kernel = logits_wgmma_kernel<BITS, T, BN, GS, ASYM, MINB>;
  allow_dynamic_smem<kernel>(Gg::SMEM);
  const int Mpad = (a.M + BN - 1) / BN * BN;
  const int64_t nunits = int64_t(a.H / 16) * Mpad * 2;
  permute_x_wg_kernel<BITS, T><<<static_cast<unsigned>((nunits + 255) / 256), 256, 0, s>>>(
      static_cast<const T*>(a.x), static_cast<T*>(a.x_frag), a.M, Mpad, BN, a.H);
  QHEAD_CUDA_CHECK_LAUNCH("permute_x_wg_kernel");
  // B descriptor without the start address: LBO = BN·16 bytes (the k-halves), SBO = 128 bytes, no swizzle.
  const uint64_t desc_hi = (uint64_t(BN * 16 >> 4) << 16) | (uint64_t(128 >> 4) << 32);
  const int64_t units = (a.V + BV - 1) / BV * (Mpad / BN);
  kernel<<<unsigned(std::min<int64_t>(units, int64_t(sm_count()) * MINB)), kGemmThreads, Gg::SMEM, s>>>(a, Mpad, desc_hi);
  QHEAD_CUDA_CHECK_LAUNCH("logits_wgmma_kernel");
}

// grid: CTAs (0: one per SM, at most one per unit).
template <int BITS, class T, int BN, int GS, bool ASYM, bool TOPK = false>
void launch_wgmma_ws_cfg(const LogitsArgs& a, cudaStream_t s, int64_t grid = 0) {
  constexpr int BV = 128;
  constexpr int SMEM = ws_smem_bytes<BITS, BN, ASYM>();
  constexpr auto kernel = logits_wgmma_ws_kernel<BITS, T, BN, GS, ASYM, TOPK>;
  allow_dynamic_smem<kernel>(SMEM);
  const int Mpad = (a.M + BN - 1) / BN * BN;
  const int64_t nunits = int64_t(a.H / 16) * Mpad * 2;
  if (!(a.x_frag_ready && BN == 128)) {
    permute_x_wg_kernel<BITS, T, WsGeometry<BITS, BN, ASYM>::KBST><<<static_cast<unsigned>((nunits + 255) / 256), 256, 0, s>>>(
        static_cast<const T*>(a.x), static_cast<T*>(a.x_frag), a.M, Mpad, BN, a.H);
    QHEAD_CUDA_CHECK_LAUNCH("permute_x_wg_kernel");
  }
  // B descriptor without the start address: 128-byte swizzle (layout type 1), SBO = 1024 bytes
  // between 8-column atoms, LBO unused (1).
  const uint64_t desc_hi = (uint64_t(1) << 62) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 16);
  const int64_t units = (a.V + BV - 1) / BV * (Mpad / BN);
  if (grid == 0) grid = std::min<int64_t>(units, int64_t(sm_count()));
  kernel<<<unsigned(grid), kWsThreads, SMEM, s>>>(a, Mpad, desc_hi);
  QHEAD_CUDA_CHECK_LAUNCH("logits_wgmma_ws_kernel");
}

// Which wgmma kernel: the warp-specialized one (v14) from M = kWgmmaWsMinM
// (QHEAD_CUDA_WGMMA_WS=0: never, QHEAD_CUDA_WGMMA_WS_MIN_M=n: from n), else v11.
constexpr int kWgmmaWsMinM = 65;
inline int wgmma_ws_min_m() {
  if (env_int("QHEAD_CUDA_WGMMA_WS", 1) == 0) return 1 << 30;
  return std::max(1, env_int("QHEAD_CUDA_WGMMA_WS_MIN_M", kWgmmaWsMinM));
}
// Whether topk may take the v14 list epilogue for M rows: where logits takes v14.
inline bool topk_lists_apply(int M) { return M >= gemm_min_m() && M >= wgmma_min_m() && M >= wgmma_ws_min_m(); }

// A GEMM for this shape (wgmma on sm_90, else mma.sync), or false (the GEMV
// kernels run then).
// Calls go(std::integral_constant<int, GS>()) for the GEMMs' group layout of
// this shape (GS: 16-byte segments per group; 0: groups of whole stages, with
// a.st_spg set) and returns true, or false when the GEMMs do not take it.
// C: the kernel's code bytes per row per stage (ws_c for the warp-specialized one).
template <int BITS, int C = kGemmC, class Go>
bool gemm_group_layout(LogitsArgs& a, Go&& go) {
  const int64_t row_bytes = int64_t(a.H) * BITS / 8;
  if (row_bytes % C != 0) return false;
  const int gbytes = a.group * BITS / 8;
  if (gbytes % 16 != 0) return false;
  const int segs = gbytes / 16;
  constexpr int SPS = C / 16;
  if constexpr (BITS == 4) {
    if (segs == 1) return go(std::integral_constant<int, 1>()), true;
  }
  if (segs == 2) return go(std::integral_constant<int, 2>()), true;
  if (segs == 4) return go(std::integral_constant<int, 4>()), true;
  if (segs % SPS != 0) return false;
  a.st_spg = segs / SPS;
  return go(std::integral_constant<int, 0>()), true;
}

template <int BITS, class T>
bool launch_gemm(LogitsArgs& a, cudaStream_t s) {
  if (a.M < gemm_min_m()) return false;
  const bool asym = a.zp != nullptr;
  const bool wg = a.M >= wgmma_min_m();
  // 128 rows × 64 columns (two CTAs per SM) up to M = 64, 128 × 128 above. Measured
  // slower on the H200 (docs/performance.md): 256-row tiles (two per warpgroup) at M = 64
  // and 256, and 64-column tiles at M = 256.
  if (wg && a.M >= wgmma_ws_min_m()) {  // v14, with its own stage depth (ws_c); else v11 below
    auto go_ws = [&](auto gs) {
      constexpr int GS = decltype(gs)::value;
      if (a.M <= 64)
        return asym ? launch_wgmma_ws_cfg<BITS, T, 64, GS, true>(a, s) : launch_wgmma_ws_cfg<BITS, T, 64, GS, false>(a, s);
      return asym ? launch_wgmma_ws_cfg<BITS, T, 128, GS, true>(a, s) : launch_wgmma_ws_cfg<BITS, T, 128, GS, false>(a, s);
    };
    if (gemm_group_layout<BITS, ws_c<BITS>()>(a, go_ws)) return true;
  }
  auto go = [&](auto gs) {
    constexpr int GS = decltype(gs)::value;
    if (wg) {
      if (a.M <= 64)
        return asym ? launch_wgmma_cfg<BITS, T, 64, GS, true>(a, s) : launch_wgmma_cfg<BITS, T, 64, GS, false>(a, s);
      return asym ? launch_wgmma_cfg<BITS, T, 128, GS, true>(a, s) : launch_wgmma_cfg<BITS, T, 128, GS, false>(a, s);
    }
    if (a.M <= 32) return asym ? launch_gemm_cfg<BITS, T, 4, GS, true>(a, s) : launch_gemm_cfg<BITS, T, 4, GS, false>(a, s);
    return asym ? launch_gemm_cfg<BITS, T, 8, GS, true>(a, s) : launch_gemm_cfg<BITS, T, 8, GS, false>(a, s);
  };
  return gemm_group_layout<BITS>(a, go);
}

// The top-k lists epilogue (v14, 128 columns per CTA) for a.tk_thr: sets
// a.tk_out from ws and returns its nseg, or 0 when the kernel does not take the shape (no sm_90, a group
// layout the GEMMs do not take, more column tiles than SMs). The grid is C
// CTAs per column tile; CTA c of a column tile takes its vocab tiles c,
// c + C, ...; its 8 consumer warps own segments 8c .. 8c + 7 of each column.
template <int BITS, class T>
int launch_gemm_topk_lists(LogitsArgs& a, cudaStream_t s, TopkWorkspaceFn ws) {
  if (!device_has_wgmma()) return 0;
  constexpr int BV = 128, BN = 128;
  const int64_t nmt = (a.M + BN - 1) / BN, tiles = (a.V + BV - 1) / BV;
  const int64_t C = std::min<int64_t>(tiles, sm_count() / nmt);
  if (C < 1) return 0;
  const int64_t seg_cap = 16 * ((tiles + C - 1) / C), nseg = 8 * C;
  const size_t n = size_t(a.M) * size_t(nseg);
  char* w = static_cast<char*>(ws(n * size_t(seg_cap) * 8 + n * 8));
  a.tk_out.list = reinterpret_cast<uint64_t*>(w);
  a.tk_out.count = reinterpret_cast<uint32_t*>(w + n * size_t(seg_cap) * 8);
  a.tk_out.sum = reinterpret_cast<float*>(a.tk_out.count + n);
  a.tk_out.nseg = int(nseg);
  a.tk_out.seg_cap = int(seg_cap);
  const bool asym = a.zp != nullptr;
  auto go = [&](auto gs) {
    constexpr int GS = decltype(gs)::value;
    if (asym) launch_wgmma_ws_cfg<BITS, T, BN, GS, true, true>(a, s, C * nmt);
    else launch_wgmma_ws_cfg<BITS, T, BN, GS, false, true>(a, s, C * nmt);
  };
  return gemm_group_layout<BITS, ws_c<BITS>()>(a, go) ? int(nseg) : 0;
}

// Bytes per lane per chunk for a group of `group` h: the quad's 4·L bytes
// must lie inside one group and tile it. 0 = no fast path for this shape.
inline int pick_piece_bytes(int bits, int group) {
  const int gbytes = group * bits / 8;
  for (int l : {16, 8, 4})
    if (gbytes % (4 * l) == 0) return l;
  return 0;
}

// Activations → B fragments (one tiny launch before the fused kernel).
template <int BITS, class T, int L>
void permute_x(const LogitsArgs& a, cudaStream_t s) {
  const int Mpad = (a.M + 7) & ~7;
  const int64_t nfrag = int64_t(a.H / 4) * Mpad;
  permute_x_kernel<BITS, T, L><<<static_cast<unsigned>((nfrag + 255) / 256), 256, 0, s>>>(
      static_cast<const T*>(a.x), static_cast<T*>(a.x_frag), a.M, Mpad, a.H);
  QHEAD_CUDA_CHECK_LAUNCH("permute_x_kernel");
}

// The workspace the fused top-k writes: gives the caller's scratch buffer of
// at least `bytes` (device memory, reused between calls).

constexpr int kTopkMaxSmem = 160 * 1024;  // shared memory per CTA above which the fused top-k is not taken

// One configuration of the register-ring kernel: launches it.
template <int BITS, class T, int L, int RT, int NT, int D, bool ASYM, int kWarps>
void launch_logits_cfg(const LogitsArgs& a, cudaStream_t s) {
  auto kernel = logits_mma_kernel<BITS, T, L, RT, NT, D, ASYM>;
  static int per_sm = [&] {
    int b = 0;
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kWarps * 32, 0);
    return b > 0 ? b : 1;
  }();
  permute_x<BITS, T, L>(a, s);
  const int Mpad = (a.M + 7) & ~7;
  const int mtiles = (Mpad + 8 * NT - 1) / (8 * NT);
  const int64_t tiles = (a.V + 16 * RT - 1) / (16 * RT);
  const int64_t want = (tiles + kWarps - 1) / kWarps;
  const int64_t room = std::max<int64_t>(1, int64_t(sm_count()) * per_sm / mtiles);
  dim3 grid(static_cast<unsigned>(mtiles), static_cast<unsigned>(std::min(want, room)));
  kernel<<<grid, kWarps * 32, 0, s>>>(a);
  QHEAD_CUDA_CHECK_LAUNCH("logits_mma_kernel");
}

// The staged kernel (v8/v12) for M <= 16: returns what launch_logits_cfg returns,
// or -1 when the shape does not fit it (the register-ring kernel runs then).
// QHEAD_CUDA_STAGED=0 in the environment turns it off (benchmarks compare
// the two kernels in one run).
inline bool staged_enabled() {
  const char* e = std::getenv("QHEAD_CUDA_STAGED");
  return !(e && e[0] == '0');
}
// Configuration (measured on the H200, docs/performance.md "Session 4"):
// 128-byte row stages (64-byte ones, the v8 choice, read HBM at ~2.5 TB/s in a
// pure copy with the same pattern, 128-byte ones at ~3.7 TB/s), one 16-row
// tile per warp, 3 stages, 8 warps per CTA, two accumulator chains per tile.
// Rows whose bytes are not a multiple of 128 take 64-byte stages (4-bit only:
// for 8-bit the register kernel is faster there).
constexpr int kStagedRT = 1;      // 16-row tiles per warp
constexpr int kStagedNS = 3;      // stages in flight per warp
constexpr int kStagedCH = 2;      // accumulator chains per tile
constexpr int kStagedWarps = 8;   // warps per CTA
constexpr int kStagedMaxScaleBlock = 4096;  // bytes of one tile's scales (two are buffered per warp)
constexpr int kStagedMaxX = 72 * 1024;      // bytes of the activations (staged_x_bytes) each CTA builds from
                                            // x itself; larger ones, up to what fits one CTA, staged_x_kernel
                                            // builds once per call and each CTA copies flat. H200 (session 5):
                                            // the CTA's own build wins at 66 KB (H = 4096, M = 8: 94 vs 95 us),
                                            // the extra launch at 83 KB (H = 2560, M = 16: 144 vs 148 us)

// QHEAD_CUDA_STAGED_MAX_X=<bytes> caps the activations the staged kernel keeps
// in shared memory (above it the register kernel runs; a measurement switch,
// e.g. 34816 restores session 4's choice); default no cap but the shared
// memory.
inline int staged_max_x() { return env_int("QHEAD_CUDA_STAGED_MAX_X", 1 << 30); }
// QHEAD_CUDA_STAGED_CTA_X=<bytes> replaces kStagedMaxX (0: always the
// staged_x_kernel launch; the measurement switch between the two builds).
inline int staged_cta_x() { return env_int("QHEAD_CUDA_STAGED_CTA_X", kStagedMaxX); }

template <int BITS, class T, int C, int GS, bool ASYM, bool TOPK, int NT>
int launch_staged_cfg(LogitsArgs& a, cudaStream_t s, TopkWorkspaceFn ws) {
  constexpr int RT = kStagedRT, NS = kStagedNS, kWarps = kStagedWarps, ROWS = 16 * RT;
  constexpr auto kernel = logits_staged_kernel<BITS, T, C, RT, NS, GS, ASYM, TOPK, kStagedCH, kWarps, NT>;
  static int optin = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    return v;
  }();
  allow_dynamic_smem<kernel>(optin);
  const int sbytes = scale_bytes(a.scale_type);
  const int wbytes = staged_warp_bytes<BITS, C, RT, NS, ASYM>(a.groups, sbytes);
  const int xs = staged_x_bytes<BITS, C>(a.H, a.M);
  const size_t base = size_t(xs) + size_t(kWarps) * wbytes;
  const bool prebuilt = xs > staged_cta_x();
  if (TOPK && prebuilt) return -1;  // the top-k pools need the CTAs that small activations leave
  const int64_t tiles = (a.V + ROWS - 1) / ROWS;
  const int64_t want = (tiles + kWarps - 1) / kWarps;
  auto blocks_per_sm = [&](size_t smem) {
    int b = 0;
    QHEAD_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kWarps * 32, smem));
    return b;
  };
  size_t smem = base;
  int64_t gy = 0;
  if constexpr (TOPK) {
    // The pools hold every logit a CTA computes (no compaction): size them for
    // the grid the occupancy allows with them, which shrinks as they grow.
    if (a.k > kTopkGather || topk_finish_scratch(std::min(8, a.M), kWarps) > kWarps * wbytes) return -1;
    a.tk_cols = std::min(8, a.M);
    gy = std::min<int64_t>(want, int64_t(sm_count()) * std::max(1, blocks_per_sm(base)));
    bool fits = false;
    for (int iter = 0; iter < 4 && !fits; ++iter) {
      const int64_t per_warp = (tiles + gy * kWarps - 1) / (gy * kWarps);
      int cap = 1;
      while (cap < per_warp * kWarps * ROWS) cap <<= 1;
      a.tk_cap = cap;
      smem = base + size_t(a.tk_cols) * (size_t(cap) * 8 + 4);
      if (smem > size_t(std::min(optin, kTopkMaxSmem))) return -1;
      const int b = blocks_per_sm(smem);
      if (b < 1) return -1;
      const int64_t gy2 = std::min<int64_t>(want, int64_t(sm_count()) * b);
      fits = gy2 >= gy;  // the pools fit the grid they were sized for
      if (!fits) gy = gy2;
    }
    if (!fits) return -1;
    a.tk_nblk = int(gy);
    const size_t cand = size_t(a.M) * gy * size_t(a.k) * 8;
    char* w = static_cast<char*>(ws(cand + size_t(a.M) * gy * 8));
    a.tk_cand = reinterpret_cast<uint64_t*>(w);
    a.tk_part = reinterpret_cast<float2*>(w + cand);
  } else {
    if (smem > size_t(optin)) return -1;
    static size_t occ_smem = 0;
    static int occ = 1;
    if (smem != occ_smem) {
      occ = std::max(1, blocks_per_sm(smem));
      occ_smem = smem;
    }
    gy = std::min<int64_t>(want, int64_t(sm_count()) * occ);
  }
  if (prebuilt) {
    const int n = a.M * a.H / 4 + staged_zero_bytes<BITS, C>() / 16;
    staged_x_kernel<BITS, T, C><<<unsigned((n + 255) / 256), 256, 0, s>>>(
        static_cast<const T*>(a.x), a.M, a.H, static_cast<unsigned char*>(a.x_frag));
    QHEAD_CUDA_CHECK_LAUNCH("staged_x_kernel");
    a.x_stage = a.x_frag;
  }
  kernel<<<dim3(1u, unsigned(gy)), kWarps * 32, smem, s>>>(a);
  QHEAD_CUDA_CHECK_LAUNCH("logits_staged_kernel");
  return TOPK ? int(gy) : 1;
}

// Stage bytes per row the staged kernel takes for this shape (0: none).
template <int BITS>
inline int staged_stage_bytes(int64_t row_bytes) {
  if (row_bytes % 128 == 0 && row_bytes / 128 >= kStagedNS) return 128;
  if (BITS == 4 && row_bytes % 64 == 0 && row_bytes / 64 >= kStagedNS) return 64;
  return 0;
}

template <int BITS, class T, bool TOPK>
int launch_staged(LogitsArgs& a, cudaStream_t s, TopkWorkspaceFn ws) {
  if (a.M > (TOPK ? 8 : 16) || !staged_enabled()) return -1;
  const int64_t row_bytes = int64_t(a.H) * BITS / 8;
  const int c = staged_stage_bytes<BITS>(row_bytes);
  if (c == 0) return -1;
  const int gbytes = a.group * BITS / 8;
  if (gbytes % 16 != 0) return -1;
  const int sbytes = scale_bytes(a.scale_type);
  if (16 * kStagedRT * a.groups * sbytes > kStagedMaxScaleBlock) return -1;
  const bool asym = a.zp != nullptr;
  const int segs = gbytes / 16;  // 16-byte segments per group
  auto go = [&](auto cc) {
    constexpr int C = decltype(cc)::value, SPS = C / 16;
    if (staged_x_bytes<BITS, C>(a.H, a.M) > staged_max_x()) return -1;
    auto gs = [&](auto g) {
      constexpr int GS = decltype(g)::value;
      if constexpr (!TOPK) {
        if (a.M > 8)  // two activation tiles
          return asym ? launch_staged_cfg<BITS, T, C, GS, true, false, 2>(a, s, ws)
                      : launch_staged_cfg<BITS, T, C, GS, false, false, 2>(a, s, ws);
      }
      return asym ? launch_staged_cfg<BITS, T, C, GS, true, TOPK, 1>(a, s, ws)
                  : launch_staged_cfg<BITS, T, C, GS, false, TOPK, 1>(a, s, ws);
    };
    switch (segs) {
      case 1: return gs(std::integral_constant<int, 1>());
      case 2: return gs(std::integral_constant<int, 2>());
      case 4: return gs(std::integral_constant<int, 4>());
      default:
        if (segs % SPS != 0) return -1;
        a.st_spg = segs / SPS;
        return gs(std::integral_constant<int, 0>());
    }
  };
  if (c == 128) return go(std::integral_constant<int, 128>());
  if constexpr (BITS == 4 && !TOPK) return go(std::integral_constant<int, 64>());
  return -1;  // 64-byte stages: logits only (the top-k then runs logits + selection)
}

template <int BITS, class T, int L>
void launch_logits_l(const LogitsArgs& a, cudaStream_t s) {
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

// The launchers one .cu instantiates per (BITS, T). launch_logits returns
// false when the shape has no fast path (the caller falls back); x_frag must
// hold ((M + 7) / 8 · 8) · H elements. M <= 16 takes the staged kernel where
// it fits, else the register-ring kernel. launch_logits_topk runs the staged
// kernel with the top-k epilogue and returns the number of partial results
// per activation row it wrote (a.tk_cand, a.tk_part), or 0 when the shape
// has no fused top-k (the caller computes logits, then selects); with
// a.tk_lists it runs the v14 kernel's list epilogue instead and returns the
// segments per activation row (launch_gemm_topk_lists).
// With a.tile_stride > 1 (the list top-k's sample) only the v14 kernel runs
// (128 × 128 tiles), or nothing: false.
template <int BITS, class T>
bool launch_logits(const LogitsArgs& a, cudaStream_t s) {
  const int l = pick_piece_bytes(BITS, a.group);
  if (l == 0 || (BITS == 8 && l == 4)) return false;  // 8-bit codes take L = 4 only for groups < 32
  if (a.tile_stride != 1) {
    if (!device_has_wgmma()) return false;
    LogitsArgs b = a;
    return gemm_group_layout<BITS, ws_c<BITS>()>(b, [&](auto gs) {
      constexpr int GS = decltype(gs)::value;
      if (b.zp) launch_wgmma_ws_cfg<BITS, T, 128, GS, true>(b, s);
      else launch_wgmma_ws_cfg<BITS, T, 128, GS, false>(b, s);
    });
  }
  if (a.M <= 16) {
    LogitsArgs b = a;
    if (launch_staged<BITS, T, false>(b, s, nullptr) >= 0) return true;
  }
  {
    LogitsArgs b = a;
    if (launch_gemm<BITS, T>(b, s)) return true;
    if (a.gemm_only) return false;
  }
  switch (l) {
    case 16: launch_logits_l<BITS, T, 16>(a, s); return true;
    case 8: launch_logits_l<BITS, T, 8>(a, s); return true;
    default:
      if constexpr (BITS == 4) launch_logits_l<BITS, T, 4>(a, s);
      return true;
  }
}
template <int BITS, class T>
int launch_logits_topk(LogitsArgs& a, cudaStream_t s, TopkWorkspaceFn ws) {
  const int l = pick_piece_bytes(BITS, a.group);
  if (a.tk_lists) return l == 0 ? 0 : launch_gemm_topk_lists<BITS, T>(a, s, ws);
  if (l == 0 || a.M > 8) return 0;
  return std::max(0, launch_staged<BITS, T, true>(a, s, ws));
}

// Declared here, defined in logits_w{4,8}_{f16,bf16}.cu (one configuration each).
bool launch_logits_w4_f16(const LogitsArgs& a, cudaStream_t s);
bool launch_logits_w4_bf16(const LogitsArgs& a, cudaStream_t s);
bool launch_logits_w8_f16(const LogitsArgs& a, cudaStream_t s);
bool launch_logits_w8_bf16(const LogitsArgs& a, cudaStream_t s);
int launch_logits_topk_w4_f16(LogitsArgs& a, cudaStream_t s, TopkWorkspaceFn ws);
int launch_logits_topk_w4_bf16(LogitsArgs& a, cudaStream_t s, TopkWorkspaceFn ws);
int launch_logits_topk_w8_f16(LogitsArgs& a, cudaStream_t s, TopkWorkspaceFn ws);
int launch_logits_topk_w8_bf16(LogitsArgs& a, cudaStream_t s, TopkWorkspaceFn ws);

}  // namespace qhead::cuda_detail
