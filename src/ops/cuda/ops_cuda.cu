// The CUDA logits and top-k: the problem of a call, its plan (select.cc), and
// the plan run — a fused kernel (src/cuda/launch.cuh) or the cuBLAS fallback,
// then for a top-k the selection or merge its path needs.
#include <algorithm>
#include <string>

#include "cuda/launch.cuh"
#include "ops/cuda/internal.cuh"
#include "ops/ops_cuda.h"

namespace qhead::cuda_ops {

using cuda_plan::DeviceInfo;
using cuda_plan::LogitsOverrides;
using cuda_plan::LogitsProblem;
using cuda_plan::TopkPath;
using cuda_plan::TopkPlan;

namespace {

// Resident staged-GEMV CTAs per SM of the real kernel (DeviceInfo::occupancy).
int staged_occupancy(const LogitsProblem& p, const LogitsPlan& plan, int smem_bytes) {
  if (plan.kernel != LogitsKernel::kGemvStaged) return 0;
  const bool asym = !p.symmetric;
  if (p.bits == 4)
    return p.act_bf16 ? staged_occupancy_w4_bf16(plan, asym, smem_bytes) : staged_occupancy_w4_f16(plan, asym, smem_bytes);
  return p.act_bf16 ? staged_occupancy_w8_bf16(plan, asym, smem_bytes) : staged_occupancy_w8_f16(plan, asym, smem_bytes);
}

// The fused kernels' arguments for table × x (a packed table whose scheme a
// fused kernel takes: the plan says so).
LogitsArgs kernel_args(const Table& table, const TensorView& x) {
  const PackedTable& p = table.packed();
  const int64_t mpad = (x.size(0) + kGemmMaxCols - 1) / kGemmMaxCols * kGemmMaxCols;  // the GEMMs pad columns to their tile
  LogitsArgs a;
  a.packed = static_cast<const uint32_t*>(p.packed.data());
  a.scale = p.scale.data();
  a.scale_type = scale_type(p.scheme.scale_dtype);
  a.zp = p.scheme.symmetric ? nullptr : static_cast<const uint32_t*>(p.zero_point.data());
  a.x = x.data;
  a.x_frag = workspace(kWsActivations, size_t(mpad * p.hidden) * 2 + size_t(staged_x_extra(mpad)));
  a.out = nullptr;
  a.ldo = 0;
  a.V = p.vocab;
  a.H = static_cast<int>(p.hidden);
  a.group = static_cast<int>(p.scheme.group_len(p.hidden));
  a.groups = static_cast<int>(p.scheme.groups(p.hidden));
  a.M = static_cast<int>(x.size(0));
  return a;
}

// Launches a fused plan (instances/: one .cu per code width and activation dtype). A
// failure names the plan and the problem.
void launch(const LogitsProblem& problem, const LogitsArgs& a, const LogitsPlan& plan) {
  cudaStream_t s = current_stream();
  try {
    if (problem.bits == 4) {
      if (problem.act_bf16) launch_logits_w4_bf16(a, plan, s);
      else launch_logits_w4_f16(a, plan, s);
    } else {
      if (problem.act_bf16) launch_logits_w8_bf16(a, plan, s);
      else launch_logits_w8_f16(a, plan, s);
    }
  } catch (const Error& e) {
    throw Error(e.code(), "logits", std::string(e.what()) + " [" + plan.describe() + "; " + problem.describe() + "]");
  }
}


// kPoolEpilogue: the staged kernel keeps per (row, CTA) its best k and
// (max, Σ exp); the [M, V] logits never reach memory. Then the merge levels.
void topk_pools(const Table& table, const TensorView& x, const LogitsProblem& problem, const TopkPlan& plan,
                int64_t k, float* values, int* ids, float* lse) {
  const LogitsPlan& lp = plan.main;
  LogitsArgs a = kernel_args(table, x);
  a.k = static_cast<int>(k);
  const size_t cand = size_t(problem.M) * lp.grid * size_t(k) * 8;
  char* w = static_cast<char*>(workspace(kWsTopkCandidates, cand + size_t(problem.M) * lp.grid * 8));
  a.tk_cand = reinterpret_cast<uint64_t*>(w);
  a.tk_part = reinterpret_cast<float2*>(w + cand);
  launch(problem, a, lp);
  merge_topk(a.tk_cand, a.tk_part, lp.grid, problem.M, k, values, ids, lse, plan.dependent_launch);
}

// kLists: the sample's logits give each row's threshold; the main pass writes
// the candidate lists and the sums below the thresholds; one block per row
// merges.
void topk_lists(const Table& table, const TensorView& x, const LogitsProblem& problem, const TopkPlan& plan,
                int64_t k, float* values, int* ids, float* lse) {
  const int64_t M = problem.M;
  LogitsArgs a = kernel_args(table, x);
  a.k = static_cast<int>(k);
  if (plan.sample) {  // the sample's logits straight from the table (its tiles sample_stride apart), then the thresholds
    const int64_t Vs = plan.sample_rows;
    char* w = static_cast<char*>(workspace(kWsTopkSample, size_t(M * Vs * 4 + M * 4)));
    LogitsArgs b = a;
    b.tile_stride = plan.sample_stride;
    b.V = Vs;
    b.ldo = Vs;
    float* sample_logits = reinterpret_cast<float*>(w);
    b.out = sample_logits;
    LogitsProblem sp = problem;
    sp.tile_stride = plan.sample_stride;
    sp.V = Vs;
    launch(sp, b, *plan.sample);
    float* thr = sample_logits + M * Vs;
    list_thresholds(sample_logits, M, int(Vs), int(k), thr);
    a.tk_thr = thr;
    a.x_frag_ready = true;  // the same activation layout as the main pass (128 columns)
  }
  const LogitsPlan& lp = plan.main;
  const size_t n = size_t(M) * size_t(lp.list_segments);
  char* w = static_cast<char*>(workspace(kWsTopkCandidates, n * size_t(lp.list_seg_cap) * 8 + n * 8));
  a.tk_out.list = reinterpret_cast<uint64_t*>(w);
  a.tk_out.count = reinterpret_cast<uint32_t*>(w + n * size_t(lp.list_seg_cap) * 8);
  a.tk_out.sum = reinterpret_cast<float*>(a.tk_out.count + n);
  a.tk_out.nseg = lp.list_segments;
  a.tk_out.seg_cap = lp.list_seg_cap;
  launch(problem, a, lp);
  merge_lists(a.tk_out, a.tk_thr, M, k, values, ids, lse);
}

}  // namespace

// Logits of `plan` into out (row stride ldo, dtype out_dtype).
void logits_into(const Table& table, const TensorView& x, const LogitsProblem& problem, const LogitsPlan& plan,
                 void* out, int64_t ldo, DType out_dtype) {
  if (problem.M == 0 || problem.V == 0) return;
  if (plan.kernel == LogitsKernel::kCublasFallback) return gemm_fallback(table, x, out, out_dtype, ldo);
  LogitsArgs a = kernel_args(table, x);
  a.out = out;
  a.ldo = ldo;
  a.out_type = out_dtype == DType::kF16 ? kOutF16 : out_dtype == DType::kBF16 ? kOutBF16 : kOutF32;
  launch(problem, a, plan);
}

// ---- plans -------------------------------------------------------------------------------

const DeviceInfo& device_info() {
  static const DeviceInfo d = [] {
    DeviceInfo info;
    int dev = 0;
    QHEAD_CUDA_CHECK(cudaGetDevice(&dev));
    QHEAD_CUDA_CHECK(cudaDeviceGetAttribute(&info.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
    QHEAD_CUDA_CHECK(cudaDeviceGetAttribute(&info.cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
    info.sm_count = sm_count();
    QHEAD_CUDA_CHECK(cudaDeviceGetAttribute(&info.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    QHEAD_CUDA_CHECK(cudaDeviceGetAttribute(&info.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    QHEAD_CUDA_CHECK(cudaDeviceGetAttribute(&info.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, dev));
    info.occupancy = staged_occupancy;
    return info;
  }();
  return d;
}

LogitsProblem logits_problem(const Table& table, const TensorView& x) {
  LogitsProblem p;
  p.packed = table.is_packed();
  p.V = table.vocab();
  p.H = table.hidden();
  p.M = x.size(0);
  p.act_bf16 = x.dtype == DType::kBF16;
  if (p.packed) {
    const QuantScheme& s = table.packed().scheme;
    p.bits = s.bits;
    p.group = static_cast<int>(s.group_len(p.H));
    p.symmetric = s.symmetric;
    p.scale_bytes = static_cast<int>(dtype_size(s.scale_dtype));
  }
  return p;
}

LogitsPlan plan_logits(const Table& table, const TensorView& x, Backend backend, const LogitsOverrides& ov) {
  return cuda_plan::select_logits_kernel(logits_problem(table, x), device_info(), ov, backend);
}

TopkPlan plan_topk(const Table& table, const TensorView& x, int64_t k, Backend backend, const LogitsOverrides& ov) {
  return cuda_plan::select_topk_path(logits_problem(table, x), k, device_info(), ov, backend);
}

// ---- entry points ---------------------------------------------------------------------

LogitsPlan run_logits(const Table& table, const TensorView& x, const TensorView& out, Backend backend,
                      const LogitsOverrides& ov) {
  check_act(x, "logits");
  const LogitsProblem problem = logits_problem(table, x);
  const LogitsPlan plan = cuda_plan::select_logits_kernel(problem, device_info(), ov, backend);
  logits_into(table, x, problem, plan, out.data, table.vocab(), out.dtype);
  return plan;
}

void logits(const Table& table, const TensorView& x, const TensorView& out, Backend backend) {
  run_logits(table, x, out, backend, cuda_plan::env_overrides());
}

TopkPlan run_topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
                  const TensorView& lse, Backend backend, const LogitsOverrides& ov) {
  check_act(x, "topk");
  if (k > cuda_plan::kTopkMaxK)
    fail("topk", "CUDA top-k takes k <= " + std::to_string(cuda_plan::kTopkMaxK) + ", got " + std::to_string(k));
  const LogitsProblem problem = logits_problem(table, x);
  const TopkPlan plan = cuda_plan::select_topk_path(problem, k, device_info(), ov, backend);
  if (problem.M == 0) return plan;
  float* ov_ = values.ptr<float>();
  int* oi = ids.ptr<int>();
  float* ol = lse.ptr<float>();
  switch (plan.path) {
    case TopkPath::kPoolEpilogue: topk_pools(table, x, problem, plan, k, ov_, oi, ol); break;
    case TopkPath::kLists: topk_lists(table, x, problem, plan, k, ov_, oi, ol); break;
    case TopkPath::kLogitsThenSelect: {
      const int64_t V = problem.V;
      float* l = static_cast<float*>(workspace(kWsLogits, size_t(problem.M * V) * sizeof(float)));
      logits_into(table, x, problem, plan.main, l, V);
      select_from_logits(l, problem.M, V, k, plan.select_blocks, plan.select_small, ov_, oi, ol, plan.dependent_launch);
      break;
    }
    case TopkPath::kTileSelect: {
      const int64_t V = problem.V, tiles = (V + plan.tile_rows - 1) / plan.tile_rows;
      const size_t lbytes = (size_t(problem.M * V) * sizeof(float) + 15) / 16 * 16;  // the summaries 16-byte aligned
      char* w = static_cast<char*>(workspace(kWsLogits, lbytes + size_t(problem.M * tiles) * sizeof(float2)));
      float* l = reinterpret_cast<float*>(w);
      LogitsArgs a = kernel_args(table, x);
      a.out = l;
      a.ldo = V;
      a.tile_part = reinterpret_cast<float2*>(w + lbytes);
      a.tile_ld = tiles;
      launch(problem, a, plan.main);
      select_from_tiles(l, a.tile_part, problem.M, V, plan.tile_rows, k, plan.tile_smem, ov_, oi, ol,
                        plan.dependent_launch);
      break;
    }
  }
  return plan;
}

void topk(const Table& table, const TensorView& x, int64_t k, const TensorView& values, const TensorView& ids,
          const TensorView& lse, Backend backend) {
  run_topk(table, x, k, values, ids, lse, backend, cuda_plan::env_overrides());
}

}  // namespace qhead::cuda_ops
