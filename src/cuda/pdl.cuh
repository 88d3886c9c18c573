// Programmatic dependent launch: a kernel scheduled while the kernel ahead of
// it in the stream finishes.
#pragma once

#include <string>
#include <utility>

#include "cuda/common.cuh"

namespace qhead::cuda_detail {

// Programmatic dependent launch (sm_90). A kernel launched as a dependent
// (launch_kernel with dependent = true) may be scheduled before the kernel
// ahead of it in the stream has finished: its launch overlaps that grid's
// last blocks and its completion, instead of following it. It must call
// pdl_wait() before it reads anything an earlier kernel wrote: pdl_wait()
// returns once the grid ahead has completed and its writes are visible. No
// kernel here calls griddepcontrol.launch_dependents, so a dependent is
// scheduled only as the grid ahead's blocks exit and never holds a
// multiprocessor that grid still needs (docs/tuning-notes.md, "Top-k
// selection"). A kernel calls it only when it was launched as a dependent
// (a flag among its arguments): a plain launch starts after the grid ahead has
// completed, and then the wait is not executed at all. Whether to launch so is
// the plan's (cuda_plan::dependent_launch).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// kernel<<<grid, block, smem, s>>>(args...), as a programmatic dependent of
// the stream's previous kernel when `dependent`; a failed launch names the
// kernel.
template <class... P, class... A>
void launch_kernel(bool dependent, const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t s, A&&... args) {
  if (!dependent) {
    kernel<<<grid, block, smem, s>>>(std::forward<A>(args)...);
    check(cudaGetLastError(), (std::string("launch of ") + name).c_str(), __FILE__, __LINE__);
    return;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...), (std::string("launch of ") + name).c_str(),
        __FILE__, __LINE__);
}

}  // namespace qhead::cuda_detail
