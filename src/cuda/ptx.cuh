// Inline PTX the kernels share: shared-memory addresses, cp.async, ldmatrix,
// mma.sync m16n8k16, the wgmma wrappers (sm_90a), mbarriers, bulk copies and
// setmaxnreg.
#pragma once

#include "common.cuh"

namespace qhead::cuda_detail {

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


__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// cp.async of N bytes (4, 8 or 16) global → shared, zero-filled past
// src_bytes: 16-byte copies bypass L1 (.cg: streamed weights), smaller ones
// cannot (.ca).
template <int N>
__device__ __forceinline__ void cp_async(uint32_t dst, const void* src, int src_bytes) {
  static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
  if constexpr (N == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(src), "n"(N), "r"(src_bytes) : "memory");
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr) : "memory");
}



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

// wgmma.mma_async with A from registers and B from shared memory (desc), f32
// accumulators c[N/8][4], f16 or bf16 operands; scale_d = 0 starts the
// accumulators from zero. One asm shape for every N: the accumulator operands
// are numbered first, then the four A registers, desc and scale_d.
#define QHEAD_WG_C(i) "+f"(c[i][0]), "+f"(c[i][1]), "+f"(c[i][2]), "+f"(c[i][3])
#define QHEAD_WG_C4(i) QHEAD_WG_C(i), QHEAD_WG_C(i + 1), QHEAD_WG_C(i + 2), QHEAD_WG_C(i + 3)
#define QHEAD_WGMMA_RS(SHAPE, AB, CREGS, AREGS, DESC, PRED, ...)                                            \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" PRED ", 0;\n"                                       \
               "wgmma.mma_async.sync.aligned." SHAPE ".f32." AB "." AB " " CREGS ", " AREGS ", %" DESC  \
               ", p, 1, 1, 0;\n}\n"                                                                     \
               : __VA_ARGS__                                                                            \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d))
#define QHEAD_WG_REGS16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
#define QHEAD_WG_REGS32 QHEAD_WG_REGS16 ",%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
#define QHEAD_WG_REGS64                                                                                  \
  QHEAD_WG_REGS32 ",%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53," \
                  "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"

// m64n32k16 (four 8-column tiles): the staged GEMV's warpgroup form.
template <class T>
__device__ __forceinline__ void wgmma_n32(float (&c)[4][4], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool f16 = std::is_same_v<T, __half>;
  if constexpr (f16) QHEAD_WGMMA_RS("m64n32k16", "f16", QHEAD_WG_REGS16 "}", "{%16,%17,%18,%19}", "20", "21", QHEAD_WG_C4(0));
  else QHEAD_WGMMA_RS("m64n32k16", "bf16", QHEAD_WG_REGS16 "}", "{%16,%17,%18,%19}", "20", "21", QHEAD_WG_C4(0));
#endif
}

template <class T>
__device__ __forceinline__ void wgmma_n64(float (&c)[8][4], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool f16 = std::is_same_v<T, __half>;
  if constexpr (f16)
    QHEAD_WGMMA_RS("m64n64k16", "f16", QHEAD_WG_REGS32 "}", "{%32,%33,%34,%35}", "36", "37", QHEAD_WG_C4(0), QHEAD_WG_C4(4));
  else
    QHEAD_WGMMA_RS("m64n64k16", "bf16", QHEAD_WG_REGS32 "}", "{%32,%33,%34,%35}", "36", "37", QHEAD_WG_C4(0), QHEAD_WG_C4(4));
#endif
}

template <class T>
__device__ __forceinline__ void wgmma_n128(float (&c)[16][4], const uint32_t (&a)[4], uint64_t desc, int scale_d) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr bool f16 = std::is_same_v<T, __half>;
  if constexpr (f16)
    QHEAD_WGMMA_RS("m64n128k16", "f16", QHEAD_WG_REGS64 "}", "{%64,%65,%66,%67}", "68", "69", QHEAD_WG_C4(0),
                   QHEAD_WG_C4(4), QHEAD_WG_C4(8), QHEAD_WG_C4(12));
  else
    QHEAD_WGMMA_RS("m64n128k16", "bf16", QHEAD_WG_REGS64 "}", "{%64,%65,%66,%67}", "68", "69", QHEAD_WG_C4(0),
                   QHEAD_WG_C4(4), QHEAD_WG_C4(8), QHEAD_WG_C4(12));
#endif
}
#undef QHEAD_WG_REGS64
#undef QHEAD_WG_REGS32
#undef QHEAD_WG_REGS16
#undef QHEAD_WGMMA_RS
#undef QHEAD_WG_C4
#undef QHEAD_WG_C

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

}  // namespace qhead::cuda_detail
