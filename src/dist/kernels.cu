// Device helpers of the sharded ops: the candidate pack and merge of the
// top-k exchange, the id ownership of the sharded embed, and the flag and
// strided copies around them.
#include <cuda_runtime.h>

#include "cuda/common.cuh"
#include "core/entry.h"
#include "dist/kernels.h"

namespace qhead::dist::kernels {

namespace {

using namespace qhead::entry;

unsigned blocks(int64_t n, int threads) { return unsigned((n + threads - 1) / threads); }

__global__ void pack_kernel(const float* __restrict__ values, const int32_t* __restrict__ ids,
                            const float* __restrict__ lse, int64_t m, int64_t k_local, int64_t k, int64_t first_row,
                            uint64_t* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * (k + 1)) return;
  const int64_t r = i / (k + 1), j = i % (k + 1);
  uint64_t w;
  if (j == k) w = lse_entry(lse[r]);
  else if (j < k_local) w = make_entry(values[r * k_local + j], first_row + ids[r * k_local + j]);
  else w = 0;
  out[i] = w;
}

// Entries of a descending list p[0, k) strictly greater than e.
__device__ __forceinline__ int64_t count_greater(const uint64_t* p, int64_t k, uint64_t e) {
  int64_t lo = 0, hi = k;
  while (lo < hi) {
    const int64_t mid = (lo + hi) >> 1;
    if (p[mid] > e) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// One thread per (row, rank, position).
__global__ void merge_kernel(const uint64_t* __restrict__ g, int world, int64_t m, int64_t k,
                             float* __restrict__ values, int32_t* __restrict__ ids, float* __restrict__ lse) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= m * world * k) return;
  const int64_t row = i / (int64_t(world) * k);
  const int w = int((i / k) % world);
  const int64_t p = i % k;
  const uint64_t* msg = g + (int64_t(w) * m + row) * (k + 1);
  if (p == 0 && w == 0) {  // the row's log-sum-exp: largest term factored out
    double mx = -INFINITY;
    bool nan = false;
    for (int r = 0; r < world; ++r) {
      const double v = entry_lse(g[(int64_t(r) * m + row) * (k + 1) + k]);
      nan |= isnan(v);
      mx = fmax(mx, v);
    }
    float out;
    if (nan) out = NAN;
    else if (isinf(mx)) out = float(mx);
    else {
      double s = 0;
      for (int r = 0; r < world; ++r) s += exp(double(entry_lse(g[(int64_t(r) * m + row) * (k + 1) + k])) - mx);
      out = float(mx + log(s));
    }
    lse[row] = out;
  }
  const uint64_t e = msg[p];
  if (e == 0) return;
  int64_t rank = p;
  for (int r = 0; r < world && rank < k; ++r)
    if (r != w) rank += count_greater(g + (int64_t(r) * m + row) * (k + 1), k, e);
  if (rank < k) {
    values[row * k + rank] = entry_value(e);
    ids[row * k + rank] = entry_id(e);
  }
}

template <class IdT>
__global__ void map_ids_kernel(const IdT* __restrict__ ids, int64_t n, int64_t begin, int64_t end, int64_t vocab,
                               int32_t* __restrict__ local, uint8_t* __restrict__ owned, int* bad) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t id = int64_t(ids[i]);
  if (id < 0 || id >= vocab) *bad = 1;
  const bool mine = id >= begin && id < end;
  local[i] = mine ? int32_t(id - begin) : 0;
  owned[i] = mine ? 1 : 0;
}

__global__ void zero_unowned_kernel(char* __restrict__ out, int64_t row_bytes, const uint8_t* __restrict__ owned) {
  if (owned[blockIdx.x]) return;
  char* row = out + int64_t(blockIdx.x) * row_bytes;
  if (row_bytes % 4 == 0 && (reinterpret_cast<uintptr_t>(row) & 3) == 0) {
    for (int64_t j = threadIdx.x; j < row_bytes / 4; j += blockDim.x) reinterpret_cast<uint32_t*>(row)[j] = 0;
  } else {
    for (int64_t j = threadIdx.x; j < row_bytes; j += blockDim.x) row[j] = 0;
  }
}

}  // namespace

void pack_candidates(const float* values, const int32_t* local_ids, const float* lse, int64_t m, int64_t k_local,
                     int64_t k, int64_t first_row, uint64_t* out, void* stream) {
  const int64_t n = m * (k + 1);
  if (n == 0) return;
  pack_kernel<<<blocks(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(values, local_ids, lse, m, k_local, k,
                                                                             first_row, out);
  QHEAD_CUDA_CHECK_LAUNCH("dist pack_kernel");
}

void merge_candidates(const uint64_t* gathered, int world, int64_t m, int64_t k, float* values, int32_t* ids,
                      float* lse, void* stream) {
  const int64_t n = m * world * k;
  if (n == 0) return;
  merge_kernel<<<blocks(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(gathered, world, m, k, values, ids, lse);
  QHEAD_CUDA_CHECK_LAUNCH("dist merge_kernel");
}

void map_ids(const void* ids, bool ids_i64, int64_t n, int64_t begin, int64_t end, int64_t vocab, int32_t* local,
             uint8_t* owned, int* bad, void* stream) {
  if (n == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (ids_i64)
    map_ids_kernel<<<blocks(n, 256), 256, 0, s>>>(static_cast<const int64_t*>(ids), n, begin, end, vocab, local, owned, bad);
  else
    map_ids_kernel<<<blocks(n, 256), 256, 0, s>>>(static_cast<const int32_t*>(ids), n, begin, end, vocab, local, owned, bad);
  QHEAD_CUDA_CHECK_LAUNCH("dist map_ids_kernel");
}

void zero_unowned(void* out, int64_t n, int64_t row_bytes, const uint8_t* owned, void* stream) {
  if (n == 0 || row_bytes == 0) return;
  zero_unowned_kernel<<<unsigned(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<char*>(out), row_bytes, owned);
  QHEAD_CUDA_CHECK_LAUNCH("dist zero_unowned_kernel");
}

void clear_flag(int* flag, void* stream) {
  QHEAD_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), static_cast<cudaStream_t>(stream)));
}

int read_flag(const int* flag, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  int v = 0;
  QHEAD_CUDA_CHECK(cudaMemcpyAsync(&v, flag, sizeof v, cudaMemcpyDeviceToHost, s));
  QHEAD_CUDA_CHECK(cudaStreamSynchronize(s));
  return v;
}

void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes, int64_t rows,
               void* stream) {
  QHEAD_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row_bytes, size_t(rows), cudaMemcpyDeviceToDevice,
                                     static_cast<cudaStream_t>(stream)));
}

}  // namespace qhead::dist::kernels

namespace qhead::dist {

int device_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

}  // namespace qhead::dist
