// One configuration per translation unit: 4-bit codes, bf16 activations.
#include "cuda/launch.cuh"

namespace qhead::cuda_detail {
void launch_logits_w4_bf16(const LogitsArgs& a, const LogitsPlan& plan, cudaStream_t s) {
  launch_logits<4, __nv_bfloat16>(a, plan, s);
}
int staged_occupancy_w4_bf16(const LogitsPlan& plan, bool asym, int smem_bytes) {
  return staged_occupancy<4, __nv_bfloat16>(plan, asym, smem_bytes);
}
}  // namespace qhead::cuda_detail
