// The activation layouts the kernels read, each written once with its formula:
// the MMA B-fragment order (permute_x_kernel), the staged kernel's shared
// layout (staged_x_*), the wgmma B layouts (permute_x_wg_kernel).
#pragma once

#include "args.cuh"
#include "codes.cuh"

namespace qhead::cuda_detail {

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


// The staged kernel's activations (sizes: geometry.h, staged_x_bytes): per
// column m a 2H + 64-byte region in which lane t's fragments for k-blocks 2i
// and 2i + 1 are the 16 bytes at (4i + t)·16, then a zero block that lanes of
// columns >= M read instead (no predicates).
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
  if constexpr (BITS == 4)  // w = e1:e0, e3:e2, e5:e4, e7:e6 → e4:e0, e5:e1, e6:e2, e7:e3
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
  if (z >= 0 && z < staged_zero_bytes(BITS, C) / 16)
    reinterpret_cast<uint4*>(dst + M * staged_col_bytes(H))[z] = make_uint4(0u, 0u, 0u, 0u);
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
// The 16 bytes of the wgmma B layout for k-block kb, k-half kc, column m
// (zeros for m >= M): x[m, h] for k-slots kc·8 + i, i = 0..7.
template <int BITS, class T>
__device__ __forceinline__ uint4 wg_x_unit(const T* __restrict__ x, int M, int H, int m, int kb, int kc) {
  using Gm = Geometry<BITS, 4>;
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
  return o.u;
}

template <int BITS, class T, int KBST = 0>
__global__ void permute_x_wg_kernel(const T* __restrict__ x, T* __restrict__ xw, int M, int Mpad, int BM, int H) {
  const int64_t f = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // one 16-byte unit
  if (f >= int64_t(H / 16) * Mpad * 2) return;
  const int nl = int(f % BM);
  const int kc = int((f / BM) % 2);
  const int64_t tile = f / (2 * BM);  // kb·(Mpad/BM) + mt
  const int nmt = Mpad / BM;
  const int mt = int(tile % nmt), kb = int(tile / nmt);
  const int m = mt * BM + nl;
  const uint4 u = wg_x_unit<BITS, T>(x, M, H, m, kb, kc);
  if constexpr (KBST > 0) {
    const int64_t off = (int64_t(kb / KBST) * nmt + mt) * KBST * BM * 32 + wgmma_ws_x_offset(BM, kb % KBST, kc, nl);
    *reinterpret_cast<uint4*>(reinterpret_cast<char*>(xw) + off) = u;
  } else {
    reinterpret_cast<uint4*>(xw)[f] = u;
  }
}

// The staged GEMV's warpgroup form builds its activations (staged_wg_x_bytes)
// per CTA in shared memory: the wgmma B layout of one N-column tile, unit
// (k-block kb, k-half kc, column n) at ((2·kb + kc)·N + n)·16 bytes
// (permute_x_wg_kernel with Mpad = BM = N). By Geometry<BITS, 4>::h_of its
// value i is x[n, h] with, for 4-bit, h = 32·(kb / 2) + 4i + 2·(kb % 2) + kc
// (the four units of k-blocks 2q, 2q + 1 take every fourth of the 32 values
// from 32q) and, for 8-bit, h = 16·kb + 2i + kc (the two units of k-block kb
// take the even and the odd of the 16 from 16·kb). So with x 16-byte aligned
// a thread reads those 32 (16) values with four (two) 16-byte loads, four
// items in flight, and writes the units with byte permutes; otherwise one
// unit per thread from 2-byte loads.
template <int BITS, class T, int N>
__device__ __forceinline__ void staged_wg_x_build(const T* __restrict__ x, int M, int H, unsigned char* dst) {
  if ((reinterpret_cast<uintptr_t>(x) & 15) != 0) {
    for (int f = threadIdx.x; f < (H / 16) * 2 * N; f += blockDim.x) {
      const int n = f % N, kc = (f / N) % 2, kb = f / (2 * N);
      *reinterpret_cast<uint4*>(dst + int64_t(f) * 16) = wg_x_unit<BITS, T>(x, M, H, n, kb, kc);
    }
    return;
  }
  constexpr int SPAN = BITS == 4 ? 32 : 16;  // values per item
  constexpr int LD = SPAN / 8;               // 16-byte loads per item
  const int per_col = H / SPAN, items = N * per_col;
  const unsigned char* xb = reinterpret_cast<const unsigned char*>(x);
  for (int i0 = threadIdx.x; i0 < items; i0 += 4 * int(blockDim.x)) {
    uint4 v[4][LD];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int it = i0 + u * int(blockDim.x), n = it / per_col, q = it % per_col;
#pragma unroll
      for (int l = 0; l < LD; ++l)
        v[u][l] = it < items && n < M ? reinterpret_cast<const uint4*>(xb + (int64_t(n) * H + q * SPAN) * 2)[l]
                                      : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int it = i0 + u * int(blockDim.x), n = it / per_col, q = it % per_col;
      if (it >= items) break;
      auto word = [&](int l, int k) { return k == 0 ? v[u][l].x : k == 1 ? v[u][l].y : k == 2 ? v[u][l].z : v[u][l].w; };
      if constexpr (BITS == 4) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {  // c = 2·(kb % 2) + kc; output word w: values 2w, 2w + 1 from load w
          const unsigned sel = c % 2 ? 0x7632u : 0x5410u;
          *reinterpret_cast<uint4*>(dst + ((4 * q + c) * N + n) * 16) =
              make_uint4(__byte_perm(word(0, c / 2), word(0, 2 + c / 2), sel), __byte_perm(word(1, c / 2), word(1, 2 + c / 2), sel),
                         __byte_perm(word(2, c / 2), word(2, 2 + c / 2), sel), __byte_perm(word(3, c / 2), word(3, 2 + c / 2), sel));
        }
      } else {
#pragma unroll
        for (int kc = 0; kc < 2; ++kc) {  // output word w: values 2w, 2w + 1, words 2·(w % 2), +1 of load w / 2
          const unsigned sel = kc ? 0x7632u : 0x5410u;
          *reinterpret_cast<uint4*>(dst + ((2 * q + kc) * N + n) * 16) =
              make_uint4(__byte_perm(word(0, 0), word(0, 1), sel), __byte_perm(word(0, 2), word(0, 3), sel),
                         __byte_perm(word(1, 0), word(1, 1), sel), __byte_perm(word(1, 2), word(1, 3), sel));
        }
      }
    }
  }
}

}  // namespace qhead::cuda_detail
