// Column permutation of activations and gathered rows, for packed tables
// stored in a permuted column order (PackedTable::col_perm, GPTQ act-order).
// ops.cc applies these around the backends, which run on Table::stored_order().
#pragma once

#include "qhead/tensor.h"

namespace qhead {

// dst[m, j] = src[m, perm[j]].   src, dst: [M, H] of one 2- or 4-byte dtype;
// perm: I32 [H]. All three on one device (CPU or CUDA).
void gather_columns(const TensorView& src, const TensorView& perm, const TensorView& dst);
// dst[m, perm[j]] = src[m, j].   The inverse of gather_columns.
void scatter_columns(const TensorView& src, const TensorView& perm, const TensorView& dst);

namespace cuda_ops {
// The CUDA forms (src/cuda/perm.cu; stub.cc throws without CUDA).
void gather_columns(const TensorView& src, const TensorView& perm, const TensorView& dst);
void scatter_columns(const TensorView& src, const TensorView& perm, const TensorView& dst);
}  // namespace cuda_ops

}  // namespace qhead
