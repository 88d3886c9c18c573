// Shared-memory hand-off patterns of qhead's kernels, in isolation, for
// compute-sanitizer's racecheck: which reports are the pattern's and which
// are the tool's. Not part of the qhead build (README.md beside this file).
//
//   warp_ring           a warp's own cp.async ring read by ldmatrix, the slot
//                       handed back by __syncwarp (the staged GEMV's pattern)
//   warp_ring_unsynced  the same without the __syncwarp hand-offs: a real race
//   mbar_store          a producer warp's st.shared, __syncwarp, one
//                       mbarrier.arrive; the consumer warp's try_wait, reads,
//                       __syncwarp, arrive on the slot's "empty" barrier
//   mbar_cp_async       the producer's cp.async with every lane's
//                       cp.async.mbarrier.arrive.noinc (the warp-specialized
//                       GEMM's pattern), the consumer as above
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "cuda/ptx.cuh"  // the kernels' own wrappers of cp.async, ldmatrix and mbarrier

namespace {

using namespace qhead::cuda_detail;

// The staged GEMV's ring: NS slots of 16 rows × (C + 16) bytes per warp,
// each lane copying 16-byte pieces, ldmatrix.x4 reading them.
constexpr int kNs = 3, kC = 128, kPitch = kC + 16, kRows = 16, kStage = kRows * kPitch;
constexpr int kCopies = kRows * (kC / 16) / 32;
constexpr int kRowBytes = 4096, kStages = 30;

template <bool SYNC>
__global__ void warp_ring(const char* g, unsigned* out) {
  extern __shared__ __align__(16) unsigned char ring[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t base = smem_u32(ring + warp * kNs * kStage);
  const char* src = g + size_t(blockIdx.x * (blockDim.x / 32) + warp) * kRows * kRowBytes;
  int issued = 0;
  auto issue = [&](int slot) {
    if (issued < kStages) {
#pragma unroll
      for (int j = 0; j < kCopies; ++j) {
        const int q = lane + 32 * j, row = q / (kC / 16), seg = q % (kC / 16);
        cp_async<16>(base + slot * kStage + row * kPitch + seg * 16, src + row * kRowBytes + issued * kC + seg * 16,
                     16);
      }
    }
    cp_async_commit();
    ++issued;
  };
  for (int d = 0; d < kNs - 1; ++d) issue(d);
  const uint32_t lane_off = uint32_t(((lane & 7) + ((lane >> 3) & 1) * 8) * kPitch + (lane >> 4) * 16);
  unsigned acc = 0;
  for (int q0 = 0; q0 < kStages; q0 += kNs) {
#pragma unroll
    for (int d = 0; d < kNs; ++d) {
      if (q0 + d >= kStages) break;
      issue((d + kNs - 1) % kNs);
      cp_async_wait<kNs - 1>();
      if (SYNC) __syncwarp();
#pragma unroll
      for (int s = 0; s < kC / 32; ++s) {
        uint32_t r[4];
        ldmatrix_x4(base + d * kStage + s * 32 + lane_off, r[0], r[1], r[2], r[3]);
        acc ^= r[0] + 3 * r[1] + 5 * r[2] + 7 * r[3];
      }
      if (SYNC) __syncwarp();
    }
  }
  cp_async_wait<0>();
  out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}

// Producer warp 0, consumer warp 1, kSlots slots of 32 × 16 bytes.
constexpr int kSlots = 2, kRounds = 20;

template <bool CP_ASYNC>
__global__ void mbar_handoff(const uint4* g, unsigned* out) {
  __shared__ __align__(16) uint4 slot[kSlots][32];
  __shared__ __align__(8) uint64_t full[kSlots], empty[kSlots];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x == 0)
    for (int i = 0; i < kSlots; ++i) {
      mbar_init(smem_u32(&full[i]), CP_ASYNC ? 32 : 1);
      mbar_init(smem_u32(&empty[i]), 1);
    }
  __syncthreads();
  if (warp == 0) {
    for (int q = 0; q < kRounds; ++q) {
      const int s = q % kSlots;
      if (q >= kSlots) mbar_wait(smem_u32(&empty[s]), ((q / kSlots) & 1) ^ 1u);
      if (CP_ASYNC) {
        cp_async<16>(smem_u32(&slot[s][lane]), g + q * 32 + lane, 16);
        cp_async_mbar_arrive(smem_u32(&full[s]));
      } else {
        slot[s][lane] = g[q * 32 + lane];
        __syncwarp();
        if (lane == 0) mbar_arrive(smem_u32(&full[s]));
      }
    }
    asm volatile("cp.async.wait_all;" ::: "memory");  // as the GEMM's producer: also the uncommitted copies
  } else {
    unsigned acc = 0;
    for (int q = 0; q < kRounds; ++q) {
      const int s = q % kSlots;
      mbar_wait(smem_u32(&full[s]), (q / kSlots) & 1);
      const uint4 v = slot[s][31 - lane];  // another lane's bytes
      acc += v.x ^ v.w;
      __syncwarp();
      if (lane == 0) mbar_arrive(smem_u32(&empty[s]));
    }
    out[lane] = acc;
  }
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "racecheck_probes: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const char* modes[] = {"warp_ring", "warp_ring_unsynced", "mbar_store", "mbar_cp_async"};
  int mode = -1;
  for (int i = 0; i < 4 && argc == 2; ++i)
    if (std::strcmp(argv[1], modes[i]) == 0) mode = i;
  if (mode < 0) {
    std::fprintf(stderr, "usage: racecheck_probes warp_ring|warp_ring_unsynced|mbar_store|mbar_cp_async\n");
    return 2;
  }
  constexpr int kBlocks = 8, kWarps = 4;
  const size_t bytes = size_t(kBlocks) * kWarps * kRows * kRowBytes;
  char* g = nullptr;
  unsigned* out = nullptr;
  if (!ok(cudaMalloc(&g, bytes), "cudaMalloc") || !ok(cudaMalloc(&out, kBlocks * kWarps * 32 * 4), "cudaMalloc") ||
      !ok(cudaMemset(g, 0x5a, bytes), "cudaMemset"))
    return 1;
  const int smem = kWarps * kNs * kStage;
  if (mode <= 1) {
    auto kernel = mode == 0 ? warp_ring<true> : warp_ring<false>;
    if (!ok(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem), "smem attribute"))
      return 1;
    kernel<<<kBlocks, kWarps * 32, smem>>>(g, out);
  } else {
    (mode == 2 ? mbar_handoff<false> : mbar_handoff<true>)<<<1, 64>>>(reinterpret_cast<const uint4*>(g), out);
  }
  if (!ok(cudaGetLastError(), "launch") || !ok(cudaDeviceSynchronize(), "kernel")) return 1;
  std::printf("%s: ran\n", modes[mode]);
  return 0;
}
