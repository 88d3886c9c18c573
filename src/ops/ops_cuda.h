// CUDA implementations of the ops (internal: src/ops/cuda/). ops.cc checks
// the arguments and calls these when the table is on the GPU; every tensor is
// a device tensor then. Built without CUDA, src/cuda/stub.cc defines them to
// throw.
//
// This is also the kernel-plan door of the tests and the benchmark: the plan
// a call would run (plan_logits, plan_topk: no launch) and the call under
// explicit overrides (run_logits, run_topk) instead of the environment's.
// Those take arguments ops.cc would accept, and hold no lock: one caller at a
// time.
#pragma once

#include "cuda/plan.h"
#include "qhead/ops.h"

namespace qhead::cuda_ops {

void embed(const Table& table, const TensorView& ids, const TensorView& out);

// logits and topk run the plan select_logits_kernel / select_topk_path give
// for `backend` under cuda_plan::env_overrides(). On CUDA, Backend::kReference
// runs as kAuto (there is no separate reference kernel on the GPU).
void logits(const Table& table, const TensorView& x, const TensorView& out, Backend backend);
void topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
          const TensorView& lse, Backend backend);
void rescore(const Table& dense, const TensorView& x, const TensorView& candidates, const TensorView& values,
             const TensorView& ids);
// The sample op (sample.cu): the draws of src/ops/sample.h on the device;
// arguments checked by ops.cc.
void sample(const Table& table, const TensorView& x, const SampleParams& params, const TensorView& ids,
            Backend backend);

// The GPU of this process (the current device, read once), with the real
// kernels' occupancy.
const cuda_plan::DeviceInfo& device_info();
cuda_plan::LogitsProblem logits_problem(const Table& table, const TensorView& x);
cuda_plan::LogitsPlan plan_logits(const Table& table, const TensorView& x, Backend backend,
                                  const cuda_plan::LogitsOverrides& ov);
cuda_plan::TopkPlan plan_topk(const Table& table, const TensorView& x, int64_t k, Backend backend,
                              const cuda_plan::LogitsOverrides& ov);
// Runs the plan (and returns it).
cuda_plan::LogitsPlan run_logits(const Table& table, const TensorView& x, const TensorView& out, Backend backend,
                                 const cuda_plan::LogitsOverrides& ov);
cuda_plan::TopkPlan run_topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values,
                             const TensorView& ids, const TensorView& lse, Backend backend,
                             const cuda_plan::LogitsOverrides& ov);
void run_sample(const Table& table, const TensorView& x, const SampleParams& params, const TensorView& ids,
                Backend backend, const cuda_plan::LogitsOverrides& ov);

}  // namespace qhead::cuda_ops
