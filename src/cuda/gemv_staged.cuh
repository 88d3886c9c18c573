// The staged GEMV (LogitsKernel::kGemvStaged), with its optional pool epilogue.
#pragma once

#include "epilogue.cuh"
#include "epilogue_topk_pool.cuh"
#include "x_layout.cuh"

namespace qhead::cuda_detail {

// ---- the shared-memory staged GEMV (M <= 32) ----------------------------------
//
// Why. ncu on the register-ring GEMV showed it latency- and
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
// Up to a plan's threshold (select.cc, kStagedCtaX) a CTA builds them from x itself (16-byte loads,
// eight in flight per thread, byte permutes); larger ones (M >= 15 at
// H = 2560, M >= 9 at H = 4096) staged_x_kernel builds once per call and each
// CTA copies them flat with cp.async.
//
// Stage size (docs/tuning-notes.md, "The staged GEMV"). With 64-byte stages a warp reads 16·RT
// separate 64-byte pieces per stage; a pure copy with that pattern reached
// only ~2.5 TB/s on the H200 (half cache lines per row and stage), with
// 128-byte pieces ~3.7 TB/s. So rows take 128-byte stages where their length
// allows, 64-byte ones otherwise (select.cc, staged_stage_bytes).
//
//   BITS 4|8 · T · C bytes per row per stage (64|128) · RT row tiles per warp ·
//   NS stages · GS 16-byte segments per group when a group fits a stage (1, 2,
//   4), 0 when a group spans stages (a.st_spg stages) · ASYM · TOPK · CH
//   accumulator chains per group (1|2: the two k-blocks of a segment alternate,
//   halving the dependent MMA chain; with NT > 1 the tiles' MMAs are the
//   independent chains) · NW warps per CTA (8; 16 for 8-bit with NT = 4) · NT
//   8-column activation tiles per warp (1|2|4), sharing each A fragment · WG
//   the warpgroup form (below).
//
// The warpgroup form (WG, sm_90a, NT = 4). With four column tiles a
// warp issued NT mma.sync per k-block and loaded 16 bytes of B per column
// tile and k-block pair from shared memory (16 KB per 2 KB stage of codes).
// Here the four warps of a warpgroup take four consecutive row tiles, and
// per k-block one wgmma m64n32k16 multiplies their A fragments (each
// warp's registers: the m16n8k16 fragment of its 16 rows, dequantized
// exactly as above) by the activations, which the tensor cores read from
// shared memory in the wgmma B layout of one 32-column tile (K-major, no
// swizzle; built per CTA, or once per call by permute_x_wg_kernel when
// large). A group's k-blocks in the stage go out as one
// batch (at most 8 k-blocks) into cacc, scale-d = 0 at the group's first;
// wgmma.wait_group 0, then the group's f32 fold: the same arithmetic.
// The four warps' tile counts are their warpgroup's (tiles rounded up to
// four, rows past V zero-filled and never stored), so they reach every
// wgmma together; each keeps its own stage ring.


template <int BITS, class T, int C, int RT, int NS, int GS, bool ASYM, bool TOPK, int CH, int NW, int NT, bool WG>
__device__ __forceinline__ void logits_gemv_staged(const LogitsArgs& a) {
  static_assert(!TOPK || NT == 1, "the top-k epilogue keeps pools for 8 columns");
  static_assert(!WG || (!TOPK && RT == 1 && CH == 1 && NT == 4 && NW % 4 == 0),
                "the warpgroup form: one row tile, four column tiles, whole warpgroups");
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
  // WG: a warpgroup's four warps take tiles 4q .. 4q + 3 (warp ≡ its place mod 4, nwarps a
  // multiple of 4), so counting whole groups of four gives the four warps one count.
  const int64_t ctiles = WG ? (tiles + 3) / 4 * 4 : tiles;
  const int my_tiles = warp < ctiles ? int((ctiles - warp + nwarps - 1) / nwarps) : 0;
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
  const int xs = WG ? staged_wg_x_bytes(a.H, NT) : staged_x_bytes(BITS, C, a.H, a.M);
  const int wbytes = staged_warp_bytes(BITS, C, RT, NS, ASYM, a.groups, sbytes);
  unsigned char* bsm = st_smem;
  unsigned char* wsm = st_smem + xs + wic * wbytes;
  if (a.x_stage) {
    // Prebuilt (staged_x_kernel, or permute_x_wg_kernel for WG): a flat copy, all of it in flight at once.
    const char* xg = static_cast<const char*>(a.x_stage);
    const uint32_t xb = smem_u32(bsm);
    for (int f = threadIdx.x; f < xs / 16; f += blockDim.x) cp_async<16>(xb + f * 16, xg + f * 16, 16);
    cp_async_commit();
    cp_async_wait<0>();
  } else if constexpr (WG) {
    staged_wg_x_build<BITS, T, NT * 8>(static_cast<const T*>(a.x), a.M, a.H, bsm);
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
    for (int f = threadIdx.x; f < staged_zero_bytes(BITS, C) / 16; f += blockDim.x)
      reinterpret_cast<uint4*>(bsm + a.M * staged_col_bytes(a.H))[f] = make_uint4(0u, 0u, 0u, 0u);
  }
  // WG: written through the generic proxy, read by the wgmmas through the async one.
  if constexpr (WG) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
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
  // A lane's copy j is segment lane % SPS of row lane / SPS + j·RPC: one
  // source pointer, one destination and a mask of the rows inside V (copies
  // of rows past V read nothing: a source size of 0 zero-fills them).
  constexpr int RPC = 32 / SPS;  // rows apart of a lane's copies
  static_assert(32 % SPS == 0, "a lane's copies are whole rows apart");
  int it = 0, ist = 0;  // tile (of this warp's) and stage being copied
  const char* src = packed;
  const int64_t src_step = RPC * row_bytes;
  unsigned inside = 0;  // bit j: copy j's row is inside V
  const uint32_t dst = uint32_t((lane / SPS) * P + (lane % SPS) * 16);
  auto point = [&]() {  // tile `it`: code pointers, then its scale and zero-point blocks
    const int64_t row0 = (warp + int64_t(it) * nwarps) * ROWS;
    const int64_t r = row0 + lane / SPS;
    src = packed + r * row_bytes + (lane % SPS) * 16;
    inside = 0;
#pragma unroll
    for (int j = 0; j < CPL; ++j) inside |= (r + j * RPC < a.V ? 1u : 0u) << j;
    const uint32_t sb = smem_u32(sbuf0 + (it & 1) * sblk);
    const int64_t s0 = row0 * a.groups * sbytes;
    for (int p = lane; p < sblk / 16; p += 32) {
      const int64_t o = s0 + int64_t(p) * 16;
      const int n = int(o >= s_end ? 0 : (s_end - o < 16 ? s_end - o : 16));
      cp_async<16>(sb + p * 16, n ? scale + o : scale, n);
    }
    if constexpr (ASYM) {
      const uint32_t zb = smem_u32(zbuf0 + (it & 1) * zblk);
      const int64_t z0 = (row0 * BITS / 32) * a.groups;
      for (int p = lane; p < zw; p += 32) {
        const int64_t o = z0 + p;
        cp_async<4>(zb + p * 4, o < z_end ? a.zp + o : a.zp, o < z_end ? 4 : 0);
      }
    }
  };
  int issued = 0;
  auto issue = [&](int slot) {  // the next stage into ring slot `slot`; one commit group per stage
    if (issued < total) {
      if (ist == 0) point();
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        const bool in = (inside >> j) & 1u;
        cp_async<16>(code_s + slot * STAGE + dst + j * RPC * P, in ? src + j * src_step : packed, in ? 16 : 0);
      }
      src += C;
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
  // The mma.sync form's B fragments: this lane's of k-blocks 0 and 1; lanes of columns >= M read
  // the zero block and never move. Activation tile n (columns 8n..8n+7) of this lane: column g + 8n.
  // (The warpgroup form's wgmmas read B from shared memory through descriptors.)
  const unsigned char* bp0[NT];
  int bstep[NT];  // bytes per stage
  if constexpr (!WG) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const bool has_b = g + 8 * n < a.M;
      bp0[n] = bsm + (has_b ? (g + 8 * n) * staged_col_bytes(a.H) : a.M * staged_col_bytes(a.H)) + t * 16;
      bstep[n] = has_b ? SPS * KBS * 32 : 0;
    }
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
  if constexpr (!WG) {
#pragma unroll
    for (int n = 0; n < NT; ++n) bp[n] = bp0[n];
  }
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
      // A group's start: its zero points into the dequant biases.
      auto group_bias = [&](int grp) {
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
      };
      // The scale of row tile r's row g + 8h in group grp, the stage's group gi when GS > 0.
      auto group_scale = [&](int r, int h, int gi, int grp) {
        if constexpr (GS > 0) return scv[r][gi][h];
        else return load_scale(sbuf, a.scale_type, (r * 16 + h * 8 + g) * a.groups + grp);
      };
      if constexpr (WG) {
        // Batches of SB segments: a group's part of the stage (GS > 0), else 8 k-blocks; each
        // batch's wgmmas are waited for before the next batch is dequantized (dequantizing the
        // next batch while they ran, from a second A buffer, measured no faster).
        constexpr int SB = GS > 0 ? GS1 : 8 / KBS;
        static_assert(SB * KBS <= 8 && SPS % SB == 0, "a batch is at most 8 k-blocks and tiles the stage");
        constexpr int XKB = NT * 8 * 32;  // bytes of B per k-block
        // B descriptor without the start address: LBO = 8·NT·16 bytes (the k-halves), SBO = 128.
        constexpr uint64_t kDescHi = (uint64_t(NT * 8 * 16 >> 4) << 16) | (uint64_t(128 >> 4) << 32);
        const uint32_t xst = smem_u32(bsm) + uint32_t(cst * SPS * KBS * XKB);
#pragma unroll
        for (int b0 = 0; b0 < SPS; b0 += SB) {
          const bool gstart = GS > 0 ? (b0 % GS1 == 0) : (b0 == 0 && cgs == 0);
          const bool gend = GS > 0 ? ((b0 + SB) % GS1 == 0) : (b0 + SB == SPS && cgs == a.st_spg - 1);
          const int grp = GS > 0 ? cst * (SPS / GS1) + b0 / GS1 : cgrp;
          if (gstart) group_bias(grp);
          uint32_t A[SB * KBS][4];
#pragma unroll
          for (int sl = 0; sl < SB; ++sl)
#pragma unroll
            for (int j = 0; j < KBS; ++j) {
              uint32_t* Ak = A[sl * KBS + j];
              const uint32_t w0 = w[0][b0 + sl][0], w1 = w[0][b0 + sl][1];
              Ak[0] = dequant_pair<BITS, T>(w0, j, 0, bias[0][0], bias16[0][0], zoff[0][0]);
              Ak[1] = dequant_pair<BITS, T>(w1, j, 0, bias[0][1], bias16[0][1], zoff[0][1]);
              Ak[2] = dequant_pair<BITS, T>(w0, j, 1, bias[0][0], bias16[0][0], zoff[0][0]);
              Ak[3] = dequant_pair<BITS, T>(w1, j, 1, bias[0][1], bias16[0][1], zoff[0][1]);
            }
          fence_regs<NT>(cacc[0]);
          wgmma_fence();
#pragma unroll
          for (int kk = 0; kk < SB * KBS; ++kk) {
            const uint64_t desc = kDescHi | uint64_t(((xst + (b0 * KBS + kk) * XKB) & 0x3FFFF) >> 4);
            wgmma_n32<T>(cacc[0], A[kk], desc, (kk > 0 || !gstart) ? 1 : 0);
          }
          wgmma_commit();
          wgmma_wait0();  // the batch's A registers free, cacc final
          fence_regs<NT>(cacc[0]);
          if (gend) fold_group<NT>(acc[0], cacc[0], group_scale(0, 0, b0 / GS1, grp), group_scale(0, 1, b0 / GS1, grp));
        }
      } else {
        // B fragments are loaded where they are used, one 16-byte load per column
        // tile for two k-blocks (Bq): loading a whole stage's up front held
        // NT·SPS·KBS·2 registers (128 at NT = 4, 4-bit).
        uint4 Bq[NT];
#pragma unroll
        for (int sg = 0; sg < SPS; ++sg) {
          const bool gstart = GS > 0 ? (sg % GS1 == 0) : (sg == 0 && cgs == 0);
          const bool gend = GS > 0 ? (sg % GS1 == GS1 - 1) : (sg == SPS - 1 && cgs == a.st_spg - 1);
          const int grp = GS > 0 ? cst * (SPS / GS1) + sg / GS1 : cgrp;
          if (gstart) {
            zero(cacc);
            if constexpr (CH == 2) zero(cacc2);
            group_bias(grp);
          }
#pragma unroll
          for (int j = 0; j < KBS; ++j) {
            const int f = sg * KBS + j;  // k-block of the stage; load f / 2 holds f and f + 1
            if (f % 2 == 0) {
#pragma unroll
              for (int n = 0; n < NT; ++n) Bq[n] = *reinterpret_cast<const uint4*>(bp[n] + (f / 2) * 64);
            }
#pragma unroll
            for (int r = 0; r < RT; ++r) {
              uint32_t A[4];
              A[0] = dequant_pair<BITS, T>(w[r][sg][0], j, 0, bias[r][0], bias16[r][0], zoff[r][0]);
              A[1] = dequant_pair<BITS, T>(w[r][sg][1], j, 0, bias[r][1], bias16[r][1], zoff[r][1]);
              A[2] = dequant_pair<BITS, T>(w[r][sg][0], j, 1, bias[r][0], bias16[r][0], zoff[r][0]);
              A[3] = dequant_pair<BITS, T>(w[r][sg][1], j, 1, bias[r][1], bias16[r][1], zoff[r][1]);
#pragma unroll
              for (int n = 0; n < NT; ++n) {
                const uint32_t b0 = f % 2 ? Bq[n].z : Bq[n].x, b1 = f % 2 ? Bq[n].w : Bq[n].y;
                if (CH == 2 && (f & 1)) mma16816<T>(cacc2[r][n], A, b0, b1);
                else mma16816<T>(cacc[r][n], A, b0, b1);
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
              fold_group<NT>(acc[r], cacc[r], group_scale(r, 0, sg / GS1, grp), group_scale(r, 1, sg / GS1, grp));
            }
          }
        }
      }
      __syncwarp();  // every lane is done with slot d before a later issue() refills it
      if constexpr (!WG) {
#pragma unroll
        for (int n = 0; n < NT; ++n) bp[n] += bstep[n];
      }
      if constexpr (GS == 0) {
        if (++cgs == a.st_spg) { cgs = 0; ++cgrp; }
      }
      if (++cst == nst) {  // the tile is done
        if constexpr (TOPK) tk.append(a, acc, ct * ROWS, g, t);
        else {
          store_tile<RT, NT>(a, acc, ct * ROWS, 0, g, t);
          // (WG: tiles past V, which the rounding to warpgroups adds, have no summary.)
          if (a.tile_part && (!WG || ct * ROWS < a.V)) store_tile_summary<RT, NT>(a, acc, ct * ROWS, g, t);
        }
        zero(acc);
        cst = 0;
        cb ^= 1;
        cgs = 0;
        cgrp = 0;
        ct += nwarps;
        if constexpr (!WG) {
#pragma unroll
          for (int n = 0; n < NT; ++n) bp[n] = bp0[n];
        }
      }
    }
  }
  cp_async_wait<0>();  // no copy outlives the kernel (the trailing empty groups)
  if constexpr (TOPK) tk.finish(a, st_smem + xs, g, t);  // the stage rings are free now
}

// The kernels: the mma.sync form under its plain bound (a minimum of one CTA
// per SM changes ptxas's register choice: the two-tile instance took 163
// registers instead of 128), the warpgroup form held to two CTAs per SM
// (<= 128 registers; 8-bit bf16 rows took 129 without).
template <int BITS, class T, int C, int RT, int NS, int GS, bool ASYM, bool TOPK, int CH, int NW, int NT>
__global__ void __launch_bounds__(NW * 32) logits_gemv_staged_kernel(const LogitsArgs a) {
  logits_gemv_staged<BITS, T, C, RT, NS, GS, ASYM, TOPK, CH, NW, NT, false>(a);
}

template <int BITS, class T, int C, int NS, int GS, bool ASYM, int NW>
__global__ void __launch_bounds__(NW * 32, 2) logits_gemv_staged_wg_kernel(const LogitsArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)  // sm_90a only: the selector never plans it elsewhere
  logits_gemv_staged<BITS, T, C, 1, NS, GS, ASYM, false, 1, NW, 4, true>(a);
#endif
}

}  // namespace qhead::cuda_detail
