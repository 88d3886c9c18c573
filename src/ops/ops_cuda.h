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
// Logits (as above) into a workspace, then the two-stage top-k kernels.
void topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
          const TensorView& lse, Backend backend);
void rescore(const Table& dense, const TensorView& x, const TensorView& candidates, const TensorView& values,
             const TensorView& ids);

}  // namespace qhead::cuda_ops
