// The selection levels' arguments; the block-wide machinery they share with
// the list merge and the staged GEMV's tail select is cuda/block_select.cuh.
#pragma once

#include "cuda/block_select.cuh"
#include "ops/cuda/internal.cuh"

namespace qhead::cuda_ops {

using namespace cuda_detail;

namespace {

using cuda_plan::kSelPer;
using cuda_plan::kSelThreads;
using cuda_plan::kSlice;
using cuda_plan::kTopkGather;

// One selection level. Block (p, m) takes items [p·S, (p+1)·S) of row m of
// `in` (n items per row; S = kSelThreads·PER): logits (In = float, id =
// index) or entries (In = uint64_t) — PER per thread, loaded once into
// shared memory — and
//   level: writes its best k entries → cand[m, p, :] and, for logits, the
//          slice's (max, Σ exp) → part[m, p];
//   final (values != nullptr, one block per row): writes the row's top-k
//          values and ids, and lse[m] from the P0 partial sums part_in[m, :]
//          (combined in double).
struct SelectArgs {
  const void* in;
  int64_t n;  // items per row
  int k;
  uint64_t* cand = nullptr;
  float2* part = nullptr;
  float* values = nullptr;
  int* ids = nullptr;
  float* lse = nullptr;
  const float2* part_in = nullptr;
  int P0 = 0;
  bool dependent = false;  // launched as a programmatic dependent: wait for the grid ahead first
};
}  // namespace

}  // namespace qhead::cuda_ops
