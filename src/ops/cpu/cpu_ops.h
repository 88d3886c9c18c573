// The CPU fast paths of the ops (internal): ops.cc calls these for
// Backend::kAuto on CPU tables after checking every argument. Each returns
// false when it does not take the case (no usable ISA, a forced reference
// path, a dense table, bits other than 4 and 8, H or the group length not a
// multiple of 32); ops.cc then runs the scalar reference.
#pragma once

#include <cstdint>

#include "qhead/ops.h"

namespace qhead::cpu {

struct KernelTable;
// The kernels kAuto runs now (null: the reference). For the benchmark.
const KernelTable* active_kernels();

bool logits(const Table& table, const TensorView& x, const TensorView& out);
bool topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
          const TensorView& lse);
bool embed(const Table& table, const TensorView& ids, const TensorView& out);
bool rescore(const Table& dense, const TensorView& x, const TensorView& candidates, const TensorView& values,
             const TensorView& ids);

}  // namespace qhead::cpu
