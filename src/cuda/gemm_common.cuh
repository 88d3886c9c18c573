// What the GEMMs share: the stage geometry, the copy side, the walk through
// a persistent grid's units, the scale and zero-point reads.
#pragma once

#include "epilogue.cuh"
#include "x_layout.cuh"

namespace qhead::cuda_detail {

// ---- the tensor-core GEMMs (M > 16) ------------------------------------------------
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
        cp_async<4>(sd, scale + al, sok ? int(s_end - al < 4 ? s_end - al : 4) : 0);
        break;
      }
      case 4: cp_async<4>(sd, scale + off, sok ? 4 : 0); break;
      case 8: cp_async<8>(sd, scale + off, sok ? 8 : 0); break;
      default: cp_async<16>(sd, scale + off, sok ? 16 : 0); break;
    }
  }
  if constexpr (ASYM) {
    if (tid < BV * BITS / 32) {
      const uint32_t zd = ss + BV * 16 + tid * 16;
      if constexpr (GPS == 4) cp_async<16>(zd, z + g0, zok ? 16 : 0);
      else if constexpr (GPS == 2) cp_async<8>(zd, z + g0, zok ? 8 : 0);
      else cp_async<4>(zd, z + g0, zok ? 4 : 0);
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
      cp_async<16>(st + wdst[j], w[j], wn[j]);
      w[j] += kGemmC;
    }
#pragma unroll
    for (int j = 0; j < XJ; ++j)
      if ((KBST * BM * 2) % kGemmThreads == 0 || tid + kGemmThreads * j < KBST * BM * 2)
        cp_async<16>(st + Gg::W_BYTES + (tid + kGemmThreads * j) * 16, x + xoff[j], 16);
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

}  // namespace qhead::cuda_detail
