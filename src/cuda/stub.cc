// Built without CUDA: the device API and the CUDA ops say so.
#include "ops/ops_cuda.h"
#include "ops/ops_perm.h"
#include "qhead/cuda.h"
#include "qhead/error.h"

namespace qhead {
namespace {
[[noreturn]] void no_cuda(const char* what) {
  throw Error(ErrorCode::kUnsupported, what, "qhead was built without CUDA (configure with -DQHEAD_CUDA=ON)");
}
}  // namespace

namespace cuda {
bool available() { return false; }
const char* device_name() { return ""; }
Tensor empty(DType, Shape) { no_cuda("cuda::empty"); }
Tensor to_device(const TensorView&) { no_cuda("cuda::to_device"); }
Tensor to_host(const TensorView&) { no_cuda("cuda::to_host"); }
Table to_device(const Table&) { no_cuda("cuda::to_device"); }
void synchronize() {}
void set_stream(void*) { no_cuda("cuda::set_stream"); }
void* stream() { return nullptr; }
size_t allocated_bytes() { return 0; }
size_t allocation_count() { return 0; }
}  // namespace cuda

namespace cuda_ops {
void embed(const Table&, const TensorView&, const TensorView&) { no_cuda("embed"); }
void logits(const Table&, const TensorView&, const TensorView&, Backend) { no_cuda("logits"); }
void topk(const Table&, const TensorView&, int64_t, const TensorView&, const TensorView&, const TensorView&, Backend) {
  no_cuda("topk");
}
const cuda_plan::DeviceInfo& device_info() { no_cuda("cuda device"); }
cuda_plan::LogitsProblem logits_problem(const Table&, const TensorView&) { no_cuda("logits"); }
cuda_plan::LogitsPlan plan_logits(const Table&, const TensorView&, Backend, const cuda_plan::LogitsOverrides&) {
  no_cuda("logits");
}
cuda_plan::TopkPlan plan_topk(const Table&, const TensorView&, int64_t, Backend, const cuda_plan::LogitsOverrides&) {
  no_cuda("topk");
}
cuda_plan::LogitsPlan run_logits(const Table&, const TensorView&, const TensorView&, Backend,
                                 const cuda_plan::LogitsOverrides&) {
  no_cuda("logits");
}
cuda_plan::TopkPlan run_topk(const Table&, const TensorView&, int64_t, const TensorView&, const TensorView&,
                             const TensorView&, Backend, const cuda_plan::LogitsOverrides&) {
  no_cuda("topk");
}
void rescore(const Table&, const TensorView&, const TensorView&, const TensorView&, const TensorView&) {
  no_cuda("rescore");
}
void sample(const Table&, const TensorView&, const SampleParams&, const TensorView&, Backend) { no_cuda("sample"); }
void gather_columns(const TensorView&, const TensorView&, const TensorView&) { no_cuda("gather_columns"); }
void scatter_columns(const TensorView&, const TensorView&, const TensorView&) { no_cuda("scatter_columns"); }
}  // namespace cuda_ops
}  // namespace qhead
