// Shared CUDA helpers: checked calls, element types, small device utilities.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "core/entry.h"
#include "qhead/error.h"

namespace qhead::cuda_detail {

// Every CUDA runtime call and kernel launch goes through these: an error
// becomes a qhead::Error naming the call and the op.
inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess)
    throw Error(ErrorCode::kInternal, "cuda",
                std::string(what) + " failed: " + cudaGetErrorString(e) + " (" + file + ":" + std::to_string(line) + ")");
}
#define QHEAD_CUDA_CHECK(call) ::qhead::cuda_detail::check((call), #call, __FILE__, __LINE__)
#define QHEAD_CUDA_CHECK_LAUNCH(name) ::qhead::cuda_detail::check(cudaGetLastError(), "launch of " name, __FILE__, __LINE__)

cudaStream_t current_stream();

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

// Multiprocessors of the current device (read once).
inline int sm_count() {
  static int n = [] {
    int dev = 0, c = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&c, cudaDevAttrMultiProcessorCount, dev);
    return c > 0 ? c : 1;
  }();
  return n;
}

// out[M, V] (row stride ldo, dtype ot: f32, f16 or bf16) = x[M, H] · w[V, H]ᵀ: one
// cuBLAS GemmEx on the current stream, f32 accumulation (src/ops/cuda/dequant.cu; the
// fallback and the benchmark's dense baseline both call it).
void gemm_xwt(const void* w, cudaDataType_t wt, const void* x, cudaDataType_t xt, void* out, cudaDataType_t ot, int V,
              int H, int M, int64_t ldo);

// Scale dtype codes passed to kernels (runtime: one load per group).
enum ScaleType : int { kScaleF32 = 0, kScaleF16 = 1, kScaleBF16 = 2 };
// Bytes of one stored scale.
__host__ __device__ __forceinline__ int scale_bytes(int type) { return type == kScaleF32 ? 4 : 2; }

__device__ __forceinline__ float load_scale(const void* p, int type, int64_t i) {
  if (type == kScaleF16) return __half2float(static_cast<const __half*>(p)[i]);
  if (type == kScaleBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

// Unsigned stored code i of a bit stream with `stride` words between
// consecutive words (see qhead/table.h).
__device__ __forceinline__ uint32_t stored_code(const uint32_t* words, int64_t i, int bits, int64_t stride) {
  const int64_t bit = i * bits;
  const int64_t k = bit >> 5;
  const int off = static_cast<int>(bit & 31);
  uint64_t v = words[k * stride];
  if (off + bits > 32) v |= static_cast<uint64_t>(words[(k + 1) * stride]) << 32;
  return static_cast<uint32_t>(v >> off) & ((1u << bits) - 1u);
}

// Signed zero point of (row, group) from the dim-0-packed tensor.
__device__ __forceinline__ int zero_point(const uint32_t* zp, int64_t groups, int64_t row, int64_t group, int bits) {
  return static_cast<int>(stored_code(zp + group, row, bits, groups)) - (1 << (bits - 1));
}

// ---- top-k entries (core/entry.h) ------------------------------------------------

using entry::entry_value;
using entry::key_value;
using entry::make_entry;
using entry::order_key;
// The CUDA selection's id of an entry, with an empty entry as INT_MAX (it sorts after
// every id; entry::entry_id gives −1 for it).
__device__ __forceinline__ int entry_id_or_last(uint64_t e) { return e ? int(~uint32_t(e)) : 0x7fffffff; }

// Sorts p[0, n) descending (n ≤ 32·R) with one warp in registers: entry
// i = r·32 + lane sits in lane's slot r; the bitonic network's exchanges
// across lanes are shuffles, across slots register moves — no shared-memory
// round trip per step. The network's loops stay rolled: a selection block
// runs this once, so its cost is instruction fetch more than instructions
// (docs/tuning-notes.md, "Top-k selection"). Entries past n read as 0 (empty), not written back.
template <int R>
__device__ __forceinline__ void warp_sort_desc_regs(uint64_t* p, int n) {
  const int lane = threadIdx.x & 31;
  uint64_t v[R];
#pragma unroll
  for (int r = 0; r < R; ++r) v[r] = r * 32 + lane < n ? p[r * 32 + lane] : 0ull;
#pragma unroll 1
  for (int size = 2; size <= 32 * R; size <<= 1) {
    int stride = size >> 1;
    // Strides of 64 and 32: the partner is in this lane's slot r ^ (stride / 32).
    auto slots = [&](auto rs_c) {
      constexpr int rs = decltype(rs_c)::value;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r & rs) continue;
        const bool desc = ((r * 32) & size) == 0;  // the pair's block: descending or ascending
        const uint64_t a = v[r], b = v[r | rs];
        const uint64_t hi = a > b ? a : b, lo = a > b ? b : a;
        v[r] = desc ? hi : lo;
        v[r | rs] = desc ? lo : hi;
      }
    };
    if constexpr (R >= 4) {
      if (stride == 64) { slots(std::integral_constant<int, 2>()); stride = 32; }
    }
    if constexpr (R >= 2) {
      if (stride == 32) { slots(std::integral_constant<int, 1>()); stride = 16; }
    }
#pragma unroll 1
    for (; stride > 0; stride >>= 1) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int i = r * 32 + lane;
        const uint64_t o = __shfl_xor_sync(0xffffffffu, v[r], stride);
        const bool keep_max = ((i & stride) == 0) == ((i & size) == 0);
        v[r] = keep_max ? (v[r] > o ? v[r] : o) : (v[r] > o ? o : v[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
    if (r * 32 + lane < n) p[r * 32 + lane] = v[r];
  __syncwarp();
}

// Sorts p[0, n) descending (n a power of two) with one warp: in registers up
// to 128 entries, else the bitonic network in shared memory.
__device__ __forceinline__ void warp_sort_desc(uint64_t* p, int n) {
  if (n <= 32) return warp_sort_desc_regs<1>(p, n);
  if (n <= 64) return warp_sort_desc_regs<2>(p, n);
  if (n <= 128) return warp_sort_desc_regs<4>(p, n);
  const int lane = threadIdx.x & 31;
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = lane; i < (n >> 1); i += 32) {
        const int lo = ((i & ~(stride - 1)) << 1) | (i & (stride - 1)), hi = lo + stride;
        const uint64_t x = p[lo], y = p[hi];
        if ((x < y) == ((lo & size) == 0)) { p[lo] = y; p[hi] = x; }
      }
      __syncwarp();
    }
}

// Online log-sum-exp state (running max, Σ exp(l − max)); combine() merges two.
__device__ __forceinline__ void lse_add(float& mx, float& s, float v) {
  if (v > mx) { s = s * expf(mx - v) + 1.0f; mx = v; }
  else s += expf(v - mx);
}
__device__ __forceinline__ void lse_combine(float& mx, float& s, float mx2, float s2) {
  if (mx2 == -INFINITY) return;
  if (mx == -INFINITY) { mx = mx2; s = s2; return; }
  if (mx2 > mx) { s = s * expf(mx - mx2) + s2; mx = mx2; }
  else s += s2 * expf(mx2 - mx);
}

// A CTA barrier that may be reached from different instructions by different
// warps (bar.sync without .aligned): the fused top-k epilogue syncs at tile
// ends that the unrolled pipeline duplicates.
__device__ __forceinline__ void cta_sync() { asm volatile("barrier.sync 0;" ::: "memory"); }

template <class T> struct Act;
template <> struct Act<__half> {
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};
template <> struct Act<__nv_bfloat16> {
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) { return __float2bfloat16_rn(v); }
};

}  // namespace qhead::cuda_detail
