// Device memory: tensors, the one-allocation table upload, the stream.
#include <atomic>
#include <cstring>
#include <mutex>

#include "common.cuh"
#include "qhead/cuda.h"

namespace qhead {
namespace cuda_detail {

namespace {
std::atomic<size_t> g_bytes{0}, g_count{0};
cudaStream_t g_stream = nullptr;
}  // namespace

cudaStream_t current_stream() { return g_stream; }

// A cudaMalloc'd block shared by the tensors that view it.
std::shared_ptr<const void> device_alloc(size_t bytes) {
  void* p = nullptr;
  const size_t n = bytes ? bytes : 256;
  QHEAD_CUDA_CHECK(cudaMalloc(&p, n));
  QHEAD_CUDA_CHECK(cudaMemsetAsync(p, 0, n, g_stream));
  g_bytes += n;
  g_count += 1;
  return std::shared_ptr<const void>(p, [n](const void* q) {
    cudaFree(const_cast<void*>(q));  // never throws from a deleter
    g_bytes -= n;
    g_count -= 1;
  });
}

void set_stream_impl(cudaStream_t s) { g_stream = s; }
size_t bytes_in_use() { return g_bytes; }
size_t blocks_in_use() { return g_count; }

}  // namespace cuda_detail

namespace cuda {

using cuda_detail::device_alloc;

bool available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

const char* device_name() {
  static char name[256] = {0};
  if (!name[0]) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, 0) == cudaSuccess) std::strncpy(name, p.name, sizeof name - 1);
  }
  return name;
}

Tensor empty(DType t, Shape shape) {
  for (int64_t d : shape)
    if (d < 0) throw Error(ErrorCode::kInvalidArgument, "cuda::empty", "negative dim in " + shape_str(shape));
  const size_t bytes = size_t(shape_numel(shape)) * dtype_size(t);
  auto owner = device_alloc(bytes);
  return Tensor::borrow(owner, TensorView(const_cast<void*>(owner.get()), t, std::move(shape), Device::kCUDA));
}

Tensor to_device(const TensorView& host) {
  if (host.device != Device::kCPU || !host.is_contiguous())
    throw Error(ErrorCode::kInvalidArgument, "cuda::to_device", "source must be a contiguous CPU tensor");
  Tensor d = empty(host.dtype, host.shape);
  if (host.nbytes())
    QHEAD_CUDA_CHECK(cudaMemcpyAsync(d.data(), host.data, host.nbytes(), cudaMemcpyHostToDevice, cuda_detail::current_stream()));
  QHEAD_CUDA_CHECK(cudaStreamSynchronize(cuda_detail::current_stream()));
  return d;
}

Tensor to_host(const TensorView& dev) {
  if (dev.device != Device::kCUDA)
    throw Error(ErrorCode::kInvalidArgument, "cuda::to_host", "source must be a CUDA tensor");
  Tensor h = Tensor::empty(dev.dtype, dev.shape);
  if (dev.nbytes())
    QHEAD_CUDA_CHECK(cudaMemcpyAsync(h.data(), dev.data, dev.nbytes(), cudaMemcpyDeviceToHost, cuda_detail::current_stream()));
  QHEAD_CUDA_CHECK(cudaStreamSynchronize(cuda_detail::current_stream()));
  return h;
}

Table to_device(const Table& host) {
  if (host.device() != Device::kCPU) return host;
  if (!host.is_packed()) return Table::dense(to_device(host.dense().view()));
  const PackedTable& p = host.packed();
  // One allocation: [packed | scale | zero points | col_perm], each part 256-byte aligned.
  auto up = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t b_packed = p.packed.nbytes(), b_scale = p.scale.nbytes();
  const size_t b_zp = p.zero_point.defined() ? p.zero_point.nbytes() : 0;
  const size_t b_perm = p.col_perm.defined() ? p.col_perm.nbytes() : 0;
  const size_t total = up(b_packed) + up(b_scale) + up(b_zp) + up(b_perm);
  auto owner = device_alloc(total);
  char* base = static_cast<char*>(const_cast<void*>(owner.get()));
  cudaStream_t s = cuda_detail::current_stream();
  auto part = [&](const Tensor& src, size_t offset) {
    if (src.nbytes()) QHEAD_CUDA_CHECK(cudaMemcpyAsync(base + offset, src.data(), src.nbytes(), cudaMemcpyHostToDevice, s));
    return Tensor::borrow(owner, TensorView(base + offset, src.dtype(), src.shape(), Device::kCUDA));
  };
  PackedTable d;
  d.scheme = p.scheme;
  d.vocab = p.vocab;
  d.hidden = p.hidden;
  d.packed = part(p.packed, 0);
  d.scale = part(p.scale, up(b_packed));
  if (b_zp || p.zero_point.defined()) d.zero_point = part(p.zero_point, up(b_packed) + up(b_scale));
  if (p.col_perm.defined()) d.col_perm = part(p.col_perm, up(b_packed) + up(b_scale) + up(b_zp));
  QHEAD_CUDA_CHECK(cudaStreamSynchronize(s));
  return Table::packed(std::move(d), "cuda::to_device");
}

void synchronize() { QHEAD_CUDA_CHECK(cudaStreamSynchronize(cuda_detail::current_stream())); }
void set_stream(void* s) { cuda_detail::set_stream_impl(static_cast<cudaStream_t>(s)); }
void* stream() { return cuda_detail::current_stream(); }
size_t allocated_bytes() { return cuda_detail::bytes_in_use(); }
size_t allocation_count() { return cuda_detail::blocks_in_use(); }

}  // namespace cuda
}  // namespace qhead
