// One configuration per translation unit: 8-bit codes, bf16 activations.
#include "logits.cuh"

namespace qhead::cuda_detail {
bool launch_logits_w8_bf16(const LogitsArgs& a, cudaStream_t s) { return launch_logits<8, __nv_bfloat16>(a, s); }
int launch_logits_topk_w8_bf16(LogitsArgs& a, cudaStream_t s, TopkWorkspaceFn ws) {
  return launch_logits_topk<8, __nv_bfloat16>(a, s, ws);
}
}  // namespace qhead::cuda_detail
