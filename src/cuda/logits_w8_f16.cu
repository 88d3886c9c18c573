// One configuration per translation unit: 8-bit codes, f16 activations.
#include "logits.cuh"

namespace qhead::cuda_detail {
bool launch_logits_w8_f16(const LogitsArgs& a, cudaStream_t s) { return launch_logits<8, __half>(a, s); }
int launch_logits_topk_w8_f16(LogitsArgs& a, cudaStream_t s, TopkWorkspaceFn ws) {
  return launch_logits_topk<8, __half>(a, s, ws);
}
}  // namespace qhead::cuda_detail
