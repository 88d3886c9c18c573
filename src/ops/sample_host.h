// The sample op's host side (internal, sample.cc): argument checks shared by
// every device, the exact draw from logits (the reference, and the fallback
// of every path), and the CPU driver ops.cc calls.
#pragma once

#include <cstdint>

#include "ops/sample.h"
#include "qhead/ops.h"

namespace qhead::sampling {

// Candidates a truncated draw without top_k takes (the rows whose cut lies
// past them are drawn from their whole row).
constexpr int64_t kFirstCandidates = 1024;

// Throws Error(kInvalidArgument) naming the setting and its range.
void check_params(const SampleParams& p, int64_t vocab);
// top_k, top_p or min_p cut the distribution.
bool truncated(const SampleParams& p);
Cut cut_of(const SampleParams& p);
// ids[i] drawn from logits row i ([m, v] row-major, f32) exactly as the
// contract says, with the same random numbers as every fused path. rows:
// the call's row of each logits row (its counter and its slot in ids);
// null: 0 .. m-1.
void from_logits(const float* logits, int64_t m, int64_t v, const SampleParams& p, int32_t* ids,
                 const int64_t* rows = nullptr);
// The op on a CPU table (arguments checked): the fused kernels for kAuto and
// kFused where they take the table, else the logits (reference or BLAS) and
// from_logits.
void run_cpu(const Table& table, const TensorView& x, const SampleParams& p, const TensorView& ids,
             Backend backend);

}  // namespace qhead::sampling
