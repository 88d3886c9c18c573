// One configuration per translation unit: 4-bit codes, bf16 activations.
#include "logits.cuh"

namespace qhead::cuda_detail {
bool launch_logits_w4_bf16(const LogitsArgs& a, cudaStream_t s) { return launch_logits<4, __nv_bfloat16>(a, s); }
int launch_logits_topk_w4_bf16(LogitsArgs& a, cudaStream_t s, TopkWorkspaceFn ws) {
  return launch_logits_topk<4, __nv_bfloat16>(a, s, ws);
}
}  // namespace qhead::cuda_detail
