// CUDA implementations of the ops (internal). ops.cc checks the arguments
// and calls these when the table is on the GPU; every tensor is a device
// tensor then. Built without CUDA, src/cuda/stub.cc defines them to throw.
#pragma once

#include "qhead/ops.h"

namespace qhead::cuda_ops {

void embed(const Table& table, const TensorView& ids, const TensorView& out);
// kFallbackBlas: dequant + cuBLAS; kFused: the fused kernel at any M (where a
// fused kernel exists for the scheme); kAuto/kReference: the faster of the two.
void logits(const Table& table, const TensorView& x, const TensorView& out, Backend backend);
// kFused where the fused top-k takes the shape (4-bit, M <= 8, k <= 256):
// the staged logits kernel with the top-k + log-sum-exp epilogue (the [M, V]
// logits never reach memory), then the merge levels. Otherwise — and for
// kAuto, where it measured faster — logits (as above) into a workspace, then
// per-slice selection and the same merge levels.
void topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
          const TensorView& lse, Backend backend);
// The second way only (benchmarks and tests: logits, then a separate top-k).
// Takes arguments ops.cc has checked, as topk does.
void topk_separate(const Table& table, const TensorView& x, int64_t k, const TensorView& values,
                   const TensorView& ids, const TensorView& lse, Backend backend);
void rescore(const Table& dense, const TensorView& x, const TensorView& candidates, const TensorView& values,
             const TensorView& ids);

}  // namespace qhead::cuda_ops
