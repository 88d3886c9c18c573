// CUDA implementations of the ops (internal). ops.cc checks the arguments
// and calls these when the table is on the GPU; every tensor is a device
// tensor then. Built without CUDA, src/cuda/stub.cc defines them to throw.
#pragma once

#include "qhead/ops.h"

namespace qhead::cuda_ops {

void embed(const Table& table, const TensorView& ids, const TensorView& out);
// fused = false forces the dequant + cuBLAS fallback.
void logits(const Table& table, const TensorView& x, const TensorView& out, bool fused);
// fused = false: fused logits into a workspace, then the separate top-k kernel
// (the baseline the fused epilogue is measured against).
void topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
          const TensorView& lse, bool fused);
void rescore(const Table& dense, const TensorView& x, const TensorView& candidates, const TensorView& values,
             const TensorView& ids);

}  // namespace qhead::cuda_ops
