// Scalar reference implementations (internal). Arguments are already checked
// by ops.cc; see qhead/ops.h for the contract of each op.
#pragma once

#include "qhead/ops.h"

namespace qhead::ref {

void embed(const Table& table, const TensorView& ids, const TensorView& out);
void logits(const Table& table, const TensorView& x, const TensorView& out);
void topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values,
          const TensorView& ids, const TensorView& lse);
void rescore(const Table& dense, const TensorView& x, const TensorView& candidates,
             const TensorView& values, const TensorView& ids);

// Id of element i of an I32/I64 tensor.
inline int64_t id_at(const TensorView& ids, int64_t i) {
  return ids.dtype == DType::kI64 ? ids.ptr<const int64_t>()[i] : ids.ptr<const int32_t>()[i];
}

}  // namespace qhead::ref

namespace qhead::blas {
void logits_fallback(const Table& table, const TensorView& x, const TensorView& out);
}  // namespace qhead::blas
