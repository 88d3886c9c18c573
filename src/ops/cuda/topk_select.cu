// The selection levels of the CUDA top-k: per-slice (or per-row) blocks
// that keep the best k entries and the (max, Σ exp) of their logits, and the
// merge of the levels into the top-k and lse.
#include "ops/cuda/select.cuh"

namespace qhead::cuda_ops {

using namespace cuda_detail;

namespace {

// The block's items live in shared memory (dynamic, select_smem_bytes), not
// registers, and every pass over them is a rolled loop: a selection block
// runs its code once, so with the items in registers (fully unrolled passes,
// ~6400 SASS instructions) it was bound by instruction fetch — ~9 us per block
// whatever its size, most of it i-cache misses (ncu, docs/tuning-notes.md, "Top-k selection").
template <class In, int PER>
constexpr int select_smem_bytes() { return kSelThreads * PER * int(sizeof(In)); }

template <class In, int PER = kSelPer>
__global__ void __launch_bounds__(kSelThreads) topk_select_kernel(const SelectArgs a) {
  constexpr int64_t SLICE = int64_t(kSelThreads) * PER;
  __shared__ SelectSmem sm;
  __shared__ double dred[kSelThreads / 32];
  extern __shared__ __align__(16) unsigned char sel_items[];
  In* items = reinterpret_cast<In*>(sel_items);  // item i = j·T + thread
  const int p = blockIdx.x, m = blockIdx.y, P = gridDim.x;
  const int64_t b = int64_t(p) * SLICE;
  const int cnt = int(a.n - b < SLICE ? a.n - b : SLICE);
  const In* in = static_cast<const In*>(a.in) + int64_t(m) * a.n + b;
  // Load (entries past cnt: 0 = empty; logits past cnt are never read), the
  // thread's max; unrolled so that all PER loads are in flight at once.
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < PER; ++j) {
    const int i = j * kSelThreads + int(threadIdx.x);
    if constexpr (std::is_same_v<In, float>) {
      if (i < cnt) {
        const float v = in[i];
        items[i] = v;
        mx = fmaxf(mx, v);
      }
    } else {
      items[i] = i < cnt ? in[i] : 0ull;
    }
  }
  // Each thread reads back only its own items: no barrier needed before the passes.
  // Four items per iteration: their shared-memory loads overlap, and the
  // loop stays small (a block runs each pass once: its code is cold).
  auto for_each = [&](auto&& f) {
#pragma unroll 4
    for (int j = 0; j < PER; ++j) {
      const int i = j * kSelThreads + int(threadIdx.x);
      if constexpr (std::is_same_v<In, float>) f(i < cnt ? make_entry(items[i], b + i) : 0ull);
      else f(items[i]);
    }
  };
  if constexpr (std::is_same_v<In, float>) {
    // The slice's (max, Σ exp(l − max)): independent exps, not the online update's chain.
    float s = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll 4
      for (int j = 0; j < PER; ++j) {
        const int i = j * kSelThreads + int(threadIdx.x);
        if (i < cnt) s += expf(items[i] - mx);
      }
    }
    const float2 l = block_lse(mx, s, sm);
    if (threadIdx.x == 0) a.part[int64_t(m) * P + p] = l;
  }
  uint64_t my_max = 0;
  for_each([&](uint64_t e) { my_max = e > my_max ? e : my_max; });
  if (a.lse) {  // final level: the row's log-sum-exp from the level-0 partial sums
    const float2* pr = a.part_in + int64_t(m) * a.P0;
    float mx = -INFINITY;
    for (int q = threadIdx.x; q < a.P0; q += blockDim.x) mx = fmaxf(mx, pr[q].x);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if ((threadIdx.x & 31) == 0) sm.fred[threadIdx.x >> 5] = mx;
    __syncthreads();
    mx = -INFINITY;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) mx = fmaxf(mx, sm.fred[w]);
    double s = 0.0;
    for (int q = threadIdx.x; q < a.P0; q += blockDim.x)
      if (pr[q].x != -INFINITY) s += double(pr[q].y) * exp(double(pr[q].x) - double(mx));
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) dred[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      double t = 0.0;
      for (int w = 0; w < int(blockDim.x >> 5); ++w) t += dred[w];
      a.lse[m] = float(double(mx) + log(t));
    }
  }
  if (a.values) {
    block_select(for_each, my_max, a.k, [&](int j, uint64_t e) {
      a.values[int64_t(m) * a.k + j] = entry_value(e);
      a.ids[int64_t(m) * a.k + j] = entry_id_or_last(e);
    }, sm);
  } else {
    uint64_t* out = a.cand + (int64_t(m) * P + p) * a.k;
    block_select(for_each, my_max, a.k, [&](int j, uint64_t e) { out[j] = e; }, sm);
  }
}

template <class In, int PER = kSelPer>
void launch_select(dim3 grid, const SelectArgs& a, cudaStream_t s) {
  constexpr auto kernel = topk_select_kernel<In, PER>;
  constexpr int bytes = select_smem_bytes<In, PER>();
  allow_dynamic_smem<kernel>(bytes);
  kernel<<<grid, kSelThreads, bytes, s>>>(a);
  QHEAD_CUDA_CHECK_LAUNCH("topk_select_kernel");
}

}  // namespace

// Level-0 candidates cand[M, P0, k] and partial sums part[M, P0] → the top-k
// and lse: selection levels of kSlice entries per block until one block per
// row holds them all, then the final level.
void merge_topk(const uint64_t* cand, const float2* part, int P0, int64_t M, int64_t k, float* values, int* ids,
                float* lse) {
  cudaStream_t s = current_stream();
  int64_t n = int64_t(P0) * k;  // entries per row
  uint64_t* buf[2] = {nullptr, nullptr};
  if (n > kSlice) {
    const int64_t P1 = (n + kSlice - 1) / kSlice;
    char* w = static_cast<char*>(workspace(kWsTopkLevels, size_t(2 * M * P1 * k) * 8));
    buf[0] = reinterpret_cast<uint64_t*>(w);
    buf[1] = buf[0] + M * P1 * k;
  }
  SelectArgs a;
  a.in = cand;
  a.k = int(k);
  for (int level = 0; n > kSlice; ++level) {
    const int64_t P = (n + kSlice - 1) / kSlice;
    a.n = n;
    a.cand = buf[level & 1];
    launch_select<uint64_t>(dim3(unsigned(P), unsigned(M)), a, s);
    a.in = a.cand;
    n = P * k;
  }
  a.n = n;
  a.cand = nullptr;
  a.values = values;
  a.ids = ids;
  a.lse = lse;
  a.part_in = part;
  a.P0 = P0;
  // The final block's items per thread sized to its entries: every pass of a block runs over all
  // its slots (empty ones too), so 3750 entries (M = 1 on a 152k vocab: 75 slices × 50) in 8192
  // slots made each pass twice as long as needed (final block 9.0 -> 7.1 us on the H200 with
  // the rank sort); 25 fits the 6400 of a 262144 vocab.
  const dim3 one(1u, unsigned(M));
  if (n <= kSelThreads * 16) launch_select<uint64_t, 16>(one, a, s);
  else if (n <= kSelThreads * 25) launch_select<uint64_t, 25>(one, a, s);
  else launch_select<uint64_t>(one, a, s);
}
void select_from_logits(const float* l, int64_t M, int64_t V, int64_t k, int select_blocks, bool select_small,
                        float* values, int* ids, float* lse) {
  cudaStream_t s = current_stream();
  const int P = select_blocks;
  char* ws = static_cast<char*>(workspace(kWsTopkCandidates, size_t(M) * P * (size_t(k) + 1) * 8));
  SelectArgs sa;
  sa.in = l;
  sa.n = V;
  sa.k = int(k);
  sa.cand = reinterpret_cast<uint64_t*>(ws);
  sa.part = reinterpret_cast<float2*>(sa.cand + M * P * k);
  if (select_small) launch_select<float, kSelPer / 4>(dim3(unsigned(P), unsigned(M)), sa, s);
  else launch_select<float>(dim3(unsigned(P), unsigned(M)), sa, s);
  merge_topk(sa.cand, sa.part, P, M, k, values, ids, lse);
}

}  // namespace qhead::cuda_ops
