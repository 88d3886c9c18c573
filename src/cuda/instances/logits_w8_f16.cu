// One configuration per translation unit: 8-bit codes, f16 activations.
#include "cuda/launch.cuh"

namespace qhead::cuda_detail {
void launch_logits_w8_f16(const LogitsArgs& a, const LogitsPlan& plan, cudaStream_t s) {
  launch_logits<8, __half>(a, plan, s);
}
int staged_occupancy_w8_f16(const LogitsPlan& plan, bool asym, int smem_bytes) {
  return staged_occupancy<8, __half>(plan, asym, smem_bytes);
}
}  // namespace qhead::cuda_detail
