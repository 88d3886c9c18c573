// The selection levels of the CUDA top-k: per-slice (or per-row) blocks
// that keep the best k entries and the (max, Σ exp) of their logits, and the
// merge of the levels into the top-k and lse.
#include "cuda/pdl.cuh"
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
  if (a.dependent) pdl_wait();  // the kernel that wrote `in` may still run
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
void launch_select(dim3 grid, SelectArgs a, cudaStream_t s, bool dependent) {
  constexpr auto kernel = topk_select_kernel<In, PER>;
  constexpr int bytes = select_smem_bytes<In, PER>();
  allow_dynamic_smem<kernel>(bytes);
  a.dependent = dependent;
  launch_kernel(dependent, "topk_select_kernel", kernel, grid, dim3(kSelThreads), bytes, s, a);
}

// ---- tile select ---------------------------------------------------------------------
//
// One block per row over the staged GEMV's tile summaries (kStoreTiles): the
// (max, Σ exp) of every `rows`-row tile, beside the logits.
//   1. the summaries → the row's lse (combined in double), each tile's max
//      into shared memory, and each thread's largest;
//   2. tau = maxima_threshold of those: at least k logits are >= it (each
//      thread's largest is some tile's max, itself a logit), so every top-k
//      entry is >= tau and lies in a tile whose max reaches tau;
//   3. those tiles' logits — typically k to a few k of them — are read from
//      the logits and selected above tau (block_select_above).
// When the candidate tiles hold more than kTileHotPer logits per thread
// (heavy ties: a tied row makes every tile a candidate) step 3 reads the
// whole row instead, with the same threshold. One launch after the logits,
// where logits + levels took two (docs/tuning-notes.md, "Top-k selection").
struct TileSelectArgs {
  const float* logits;  // [M, V], row stride ldo
  int64_t ldo, V;
  const float2* part;  // [M, tiles]
  int64_t tiles;
  int k;
  float* values;
  int* ids;
  float* lse;
  bool dependent;  // launched as a programmatic dependent: wait for the grid ahead first
};

constexpr int kTileHotCap = cuda_plan::kTileThreads * cuda_plan::kTileHotPer;
constexpr int kTileRows = 16;  // rows per summary: the staged GEMV's warp tile (one 16-row tile)

struct TileSelectSmem {
  SelectSmem sel;
  double dred[cuda_plan::kTileThreads / 32];
  int hot[kTileHotCap / kTileRows];  // the candidate tiles, when they hold <= kTileHotCap logits
};
static_assert(sizeof(TileSelectSmem) <= cuda_plan::kTileStaticSmem, "plan.h: kTileStaticSmem");

__global__ void __launch_bounds__(cuda_plan::kTileThreads) topk_tile_select_kernel(const TileSelectArgs a) {
  constexpr int T = cuda_plan::kTileThreads, PER = cuda_plan::kTileHotPer;
  __shared__ TileSelectSmem ts;
  SelectSmem& sm = ts.sel;
  double* dred = ts.dred;
  int* hot = ts.hot;
  extern __shared__ __align__(16) unsigned char tile_smem[];
  float* tmax = reinterpret_cast<float*>(tile_smem);  // [tiles], then kTileHotCap candidate entries
  const int m = blockIdx.x, tid = int(threadIdx.x), lane = tid & 31, w = tid >> 5;
  if (a.dependent) pdl_wait();  // the GEMV that wrote the logits and summaries may still run
  const float2* pr = a.part + int64_t(m) * a.tiles;
  const float* lrow = a.logits + int64_t(m) * a.ldo;

  // 1. The thread's tiles c = tid + j·T, eight loads in flight; its max and Σ exp online.
  float mx = -INFINITY, s = 0.0f;
  for (int64_t c0 = tid; c0 < a.tiles; c0 += 8 * T) {
    float2 v[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t c = c0 + int64_t(i) * T;
      v[i] = c < a.tiles ? pr[c] : make_float2(-INFINITY, 0.0f);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t c = c0 + int64_t(i) * T;
      if (c < a.tiles) tmax[c] = v[i].x;
      if (v[i].x == -INFINITY) continue;
      if (v[i].x > mx) {
        s = s * expf(mx - v[i].x) + v[i].y;
        mx = v[i].x;
      } else {
        s += v[i].y * expf(v[i].x - mx);
      }
    }
  }
  float bm = mx;
  for (int o = 16; o > 0; o >>= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, o));
  if (lane == 0) sm.fred[w] = bm;
  __syncthreads();
  bm = -INFINITY;
  for (int i = 0; i < T / 32; ++i) bm = fmaxf(bm, sm.fred[i]);
  double ds = mx == -INFINITY ? 0.0 : double(s) * exp(double(mx) - double(bm));
  for (int o = 16; o > 0; o >>= 1) ds += __shfl_xor_sync(0xffffffffu, ds, o);
  if (lane == 0) dred[w] = ds;
  __syncthreads();
  if (tid == 0) {
    double t = 0.0;
    for (int i = 0; i < T / 32; ++i) t += dred[i];
    a.lse[m] = float(double(bm) + log(t));
  }

  // 2. The threshold: the k-th largest of the threads' largest tile maxima (as entries with
  // all id bits set: an entry's key bits alone decide against it), first to 16 bits; where
  // that lets through more candidate tiles than the block holds (a row whose logits sit in
  // a narrow band far from 0, where 16 bits of the key are coarse), to all 32.
  const uint64_t my_max = mx == -INFINITY ? 0ull : (uint64_t(order_key(mx)) << 32) | 0xFFFFFFFFull;
  auto maxima = [&](auto&& f) { f(my_max); };
  uint64_t tau = 0;
  unsigned need = unsigned(a.k);
  const bool bounded = radix_pass(maxima, 56, tau, need, sm) && radix_pass(maxima, 48, tau, need, sm);
  if (!bounded) tau = 1;  // fewer than k tiles with a logit: every tile
  auto reaches = [&](int64_t c) { return ((uint64_t(order_key(tmax[c])) << 32) | 0xFFFFFFFFull) >= tau; };
  auto count_tiles = [&]() {
    unsigned cnt = 0;
    for (int64_t c = tid; c < a.tiles; c += T) cnt += reaches(c) ? 1u : 0u;
    return cnt;
  };

  // 3. The candidate tiles, listed in order by a block scan of per-thread counts.
  unsigned cnt = count_tiles();
  unsigned ntiles;
  unsigned base = block_exclusive_scan(cnt, ntiles, sm);
  if (bounded && int64_t(ntiles) * kTileRows > kTileHotCap) {
    __syncthreads();  // sm.wsum is read by the scan above
    radix_pass(maxima, 40, tau, need, sm);
    radix_pass(maxima, 32, tau, need, sm);
    cnt = count_tiles();
    base = block_exclusive_scan(cnt, ntiles, sm);
  }
  const int64_t nhot = int64_t(ntiles) * kTileRows;
  const bool listed = nhot <= kTileHotCap;
  if (listed)
    for (int64_t c = tid; c < a.tiles; c += T)
      if (reaches(c)) hot[base++] = int(c);
  __syncthreads();
  auto emit = [&](int j, uint64_t e) {
    a.values[int64_t(m) * a.k + j] = entry_value(e);
    a.ids[int64_t(m) * a.k + j] = entry_id_or_last(e);
  };
  if (listed) {
    // Candidate logit i = (tile hot[i / 16], its row i % 16), loaded as an entry once (all PER
    // loads in flight); each thread reads back only its own.
    uint64_t* items = reinterpret_cast<uint64_t*>(tile_smem + (a.tiles * 4 + 15) / 16 * 16);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
      const int i = j * T + tid;
      uint64_t e = 0;
      if (i < nhot) {
        const int64_t r = int64_t(hot[i / kTileRows]) * kTileRows + i % kTileRows;
        if (r < a.V) e = make_entry(lrow[r], r);
      }
      items[i] = e;
    }
    auto for_each = [&](auto&& f) {
#pragma unroll 4
      for (int j = 0; j < PER; ++j) f(items[j * T + tid]);
    };
    block_select_above(for_each, tau, a.k, emit, sm);
  } else {
    const int64_t per = (a.V + T - 1) / T;
    auto for_each = [&](auto&& f) {
      for (int64_t j = 0; j < per; ++j) {
        const int64_t r = j * T + tid;
        f(r < a.V ? make_entry(lrow[r], r) : 0ull);
      }
    };
    block_select_above(for_each, tau, a.k, emit, sm);
  }
}

}  // namespace

void select_from_tiles(const float* l, const float2* part, int64_t M, int64_t V, int rows, int64_t k, int smem_bytes,
                       float* values, int* ids, float* lse, bool dependent) {
  if (rows != kTileRows) fail("topk", "tile select takes 16-row tile summaries, got " + std::to_string(rows));
  cudaStream_t s = current_stream();
  TileSelectArgs a;
  a.logits = l;
  a.ldo = V;
  a.V = V;
  a.part = part;
  a.tiles = (V + rows - 1) / rows;
  a.k = int(k);
  a.values = values;
  a.ids = ids;
  a.lse = lse;
  a.dependent = dependent;
  // The attribute is set once, to the most any plan asks (plan.h: the opt-in less the static part).
  static const int most = [] {
    int dev = 0, b = 0;
    QHEAD_CUDA_CHECK(cudaGetDevice(&dev));
    QHEAD_CUDA_CHECK(cudaDeviceGetAttribute(&b, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return b - cuda_plan::kTileStaticSmem;
  }();
  if (smem_bytes > most)
    fail("topk", "tile select: " + std::to_string(smem_bytes) + " bytes of shared memory asked, " +
                     std::to_string(most) + " available");
  allow_dynamic_smem<topk_tile_select_kernel>(most);
  launch_kernel(dependent, "topk_tile_select_kernel", topk_tile_select_kernel, dim3(unsigned(M)),
                dim3(cuda_plan::kTileThreads), size_t(smem_bytes), s, a);
}

// Level-0 candidates cand[M, P0, k] and partial sums part[M, P0] → the top-k
// and lse: selection levels of kSlice entries per block until one block per
// row holds them all, then the final level.
void merge_topk(const uint64_t* cand, const float2* part, int P0, int64_t M, int64_t k, float* values, int* ids,
                float* lse, bool dependent) {
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
    launch_select<uint64_t>(dim3(unsigned(P), unsigned(M)), a, s, dependent);
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
  if (n <= kSelThreads * 16) launch_select<uint64_t, 16>(one, a, s, dependent);
  else if (n <= kSelThreads * 25) launch_select<uint64_t, 25>(one, a, s, dependent);
  else launch_select<uint64_t>(one, a, s, dependent);
}
void select_from_logits(const float* l, int64_t M, int64_t V, int64_t k, int select_blocks, bool select_small,
                        float* values, int* ids, float* lse, bool dependent) {
  cudaStream_t s = current_stream();
  const int P = select_blocks;
  char* ws = static_cast<char*>(workspace(kWsTopkCandidates, size_t(M) * P * (size_t(k) + 1) * 8));
  SelectArgs sa;
  sa.in = l;
  sa.n = V;
  sa.k = int(k);
  sa.cand = reinterpret_cast<uint64_t*>(ws);
  sa.part = reinterpret_cast<float2*>(sa.cand + M * P * k);
  if (select_small) launch_select<float, kSelPer / 4>(dim3(unsigned(P), unsigned(M)), sa, s, dependent);
  else launch_select<float>(dim3(unsigned(P), unsigned(M)), sa, s, dependent);
  merge_topk(sa.cand, sa.part, P, M, k, values, ids, lse, dependent);
}

}  // namespace qhead::cuda_ops
