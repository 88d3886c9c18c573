// The CUDA ops' process-wide workspaces and cuBLAS handle.
#include <mutex>

#include "ops/cuda/internal.cuh"

namespace qhead::cuda_ops {

using namespace cuda_detail;

namespace {
struct Workspace {
  std::mutex mu;
  std::shared_ptr<const void> block;
  size_t bytes = 0;
};
Workspace& workspace_slot(int i) {
  static Workspace w[kWsCount];
  return w[i];
}
}  // namespace

void* workspace(int slot, size_t bytes) {
  Workspace& w = workspace_slot(slot);
  std::lock_guard<std::mutex> lock(w.mu);
  if (w.bytes < bytes) {
    QHEAD_CUDA_CHECK(cudaStreamSynchronize(current_stream()));
    w.block.reset();
    w.block = device_alloc(bytes);
    w.bytes = bytes;
  }
  return const_cast<void*>(w.block.get());
}

cublasHandle_t blas() {
  static cublasHandle_t h = [] {
    cublasHandle_t x = nullptr;
    if (cublasCreate(&x) != CUBLAS_STATUS_SUCCESS)
      throw Error(ErrorCode::kInternal, "cuda", "cublasCreate failed");
    return x;
  }();
  cublasSetStream(h, current_stream());
  return h;
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw Error(ErrorCode::kInternal, "cuda",
                std::string(what) + " failed: " + cublasGetStatusName(s) + " (" + cublasGetStatusString(s) + ")");
}

}  // namespace qhead::cuda_ops
