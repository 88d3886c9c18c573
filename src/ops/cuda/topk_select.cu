// The selection levels of the CUDA top-k: per-slice (or per-row) blocks
// that keep the best k entries and the (max, Σ exp) of their logits, and the
// merge of the levels into the top-k and lse.
#include "cuda/epilogue.cuh"
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
//   1. the summaries → each tile's max into shared memory, the thread's
//      largest (over its ~V / 16 / T tiles) and its online (max, Σ exp)
//      (ex2.approx, branch-free); the warps' combine into the row's lse;
//   2. tau, a lower bound of the row's k-th logit: each warp offers its Q
//      largest thread maxima (Q rounds of a warp max, redux.sync), and tau
//      is the k-th largest of those 32·Q by rank counting (k <= 32·Q). They
//      are k distinct tiles' maxima, each a logit, so at least k logits reach
//      tau: every top-k entry is >= tau and lies in a tile whose max reaches
//      it. The k largest tile maxima rarely share a thread (T = 1024) or
//      crowd a warp, so tau sits near the k-th largest tile max and the
//      candidate tiles are about k;
//   3. the candidate tiles are listed, every warp gathers two of them per
//      step (their logits >= tau, about k in all: one round trip to L2
//      whichever warps held them), and the candidates are ranked by
//      counting, all threads at once: rank = the candidates above.
// The block runs on one multiprocessor, and its time follows its instruction
// count (ncu, docs/tuning-notes.md "Top-k selection": 40 000 warp
// instructions and 12.7 us with radix passes for the bound and the
// selection, a double-precision lse), so each step costs a few instructions
// per tile or candidate. Where the candidates outgrow the counting (more
// than kRankMax: heavy ties) they are selected above tau by
// block_select_above over the gathered ones; where the candidate tiles
// outgrow the list (kHotTiles: a tied row makes every tile a candidate) the
// whole row is, with the same threshold.
struct TileSelectArgs {
  const float* logits;  // [M, V], row stride ldo
  int64_t ldo, V;
  const float2* part;  // [M, tiles]: each tile's (max, Σ exp(l − max))
  int64_t tiles;
  int k;
  float* values;
  int* ids;
  float* lse;
  bool dependent;  // launched as a programmatic dependent: wait for the grid ahead first
};

constexpr int kTileHotCap = cuda_plan::kTileThreads * cuda_plan::kTileHotPer;  // gathered candidates, at most
constexpr int kTileRows = 16;  // rows per summary: the staged GEMV's warp tile (one 16-row tile)
constexpr int kHotTiles = kTileHotCap / kTileRows;  // candidate tiles listed, at most
constexpr int kRankMax = 256;  // candidates ranked by counting; above, block_select_above
constexpr int kRankParts = cuda_plan::kTileThreads / kRankMax;  // threads counting each candidate's rank

struct TileSelectSmem {
  SelectSmem sel;  // its pool doubles as the rank counters (steps 2 and 3 end before any fallback uses it)
  float2 wlse[cuda_plan::kTileThreads / 32];  // each warp's (max, Σ exp)
  uint32_t bound[kRankMax];                   // the warps' largest thread maxima (order keys; 0 = none)
  int hot[kHotTiles];                         // the candidate tiles
  uint32_t tau;
  unsigned nhot, ncand;
};
static_assert(sizeof(TileSelectSmem) <= cuda_plan::kTileStaticSmem, "plan.h: kTileStaticSmem");
static_assert(sizeof(SelectSmem::pool) >= cuda_plan::kTileThreads * sizeof(unsigned), "rank counters");

// (m, s) += (m2, s2) for online log-sum-exps (Σ exp(l − m)): taken relative to the larger max,
// exact where the maxima tie (inf too), no NaN from two −inf maxima (a −inf side's s is 0 and
// its scale unused) — equality tests instead of branches.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  constexpr float kLog2e = 1.4426950408889634f;
  const float n = fmaxf(m, m2);
  s = (m == n ? s : s * ex2_ftz((m - n) * kLog2e)) + (m2 == n ? s2 : s2 * ex2_ftz((m2 - n) * kLog2e));
  m = n;
}

// Q: the thread maxima each warp offers to the bound (k <= 32·Q).
template <int Q>
__global__ void __launch_bounds__(cuda_plan::kTileThreads) topk_tile_select_kernel(const TileSelectArgs a) {
  constexpr int T = cuda_plan::kTileThreads;
  constexpr int NB = 32 * Q, BPARTS = 4;  // bound values; threads counting each one's rank
  static_assert(NB <= kRankMax && NB * BPARTS <= T, "bound geometry");
  __shared__ TileSelectSmem ts;
  SelectSmem& sm = ts.sel;
  unsigned* prank = reinterpret_cast<unsigned*>(sm.pool);  // [parts][values] partial ranks
  extern __shared__ __align__(16) unsigned char tile_smem[];
  float* tmax = reinterpret_cast<float*>(tile_smem);  // [tiles], then kTileHotCap candidate entries
  uint64_t* items = reinterpret_cast<uint64_t*>(tile_smem + (a.tiles * 4 + 15) / 16 * 16);
  const int m = blockIdx.x, tid = int(threadIdx.x), lane = tid & 31, w = tid >> 5;
  if (tid == 0) {
    ts.nhot = 0;
    ts.ncand = 0;
  }
  if (a.dependent) pdl_wait();  // the GEMV that wrote the logits and summaries may still run
  const float2* pr = a.part + int64_t(m) * a.tiles;
  const float* lrow = a.logits + int64_t(m) * a.ldo;

  // 1. The thread's tiles c = tid + j·T, up to 16 loads in flight (V <= 262144 in one batch;
  // slots past its tiles are predicated off): maxima to shared memory, the thread's
  // (max, Σ exp) online, branch-free (an empty slot is (−inf, 0)); then the warp's.
  constexpr int kBatch = 16;
  const int tiles = int(a.tiles), mine = tid < tiles ? (tiles - tid + T - 1) / T : 0;
  float mx = -INFINITY, s = 0.0f;
  for (int j0 = 0; j0 < mine; j0 += kBatch) {
    float2 v[kBatch];
#pragma unroll
    for (int i = 0; i < kBatch; ++i) v[i] = j0 + i < mine ? pr[tid + (j0 + i) * T] : make_float2(-INFINITY, 0.0f);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (j0 + i < mine) tmax[tid + (j0 + i) * T] = v[i].x;
      lse_merge(mx, s, v[i].x, v[i].y);
    }
  }
  {
    float wm = mx, ws = s;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      lse_merge(wm, ws, __shfl_xor_sync(0xffffffffu, wm, o), __shfl_xor_sync(0xffffffffu, ws, o));
    if (lane == 0) ts.wlse[w] = make_float2(wm, ws);
  }
  uint32_t key = mx == -INFINITY ? 0u : order_key(mx);
  // 2a. The warp's Q largest thread maxima (ties kept: the lowest lane of a tie leaves per round).
#pragma unroll
  for (int r = 0; r < Q; ++r) {
    const uint32_t top = __reduce_max_sync(0xffffffffu, key);
    if (lane == 0) ts.bound[w * Q + r] = top;
    const unsigned tied = __ballot_sync(0xffffffffu, key == top);
    if (lane == __ffs(tied) - 1) key = 0;
  }
  key = mx == -INFINITY ? 0u : order_key(mx);
  __syncthreads();
  // 2b. The lse (warp 0), and each bound value's rank among the NB (ties by position) in parts.
  if (w == 0) {
    float2 p = ts.wlse[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
      lse_merge(p.x, p.y, __shfl_xor_sync(0xffffffffu, p.x, o), __shfl_xor_sync(0xffffffffu, p.y, o));
    if (lane == 0) a.lse[m] = p.x + logf(p.y);
  }
  if (tid < NB * BPARTS) {
    const int i = tid % NB, part = tid / NB;
    const uint32_t bi = ts.bound[i];
    unsigned r = 0;
#pragma unroll 4
    for (int j = part; j < NB; j += BPARTS) {
      const uint32_t bj = ts.bound[j];
      r += (bj > bi || (bj == bi && j < i)) ? 1u : 0u;
    }
    prank[part * NB + i] = r;
  }
  __syncthreads();
  if (tid < NB) {
    unsigned r = 0;
#pragma unroll
    for (int part = 0; part < BPARTS; ++part) r += prank[part * NB + tid];
    if (r == unsigned(a.k - 1)) ts.tau = ts.bound[tid];  // exactly one value has each rank
  }
  __syncthreads();
  const uint32_t tau = ts.tau;  // 0 (fewer than k tiles hold a logit): every tile, every logit
  const uint64_t tau_entry = uint64_t(tau) << 32;

  // 3a. The candidate tiles (max >= tau), listed: each warp scans its lanes' tiles, one atomic
  // per warp step.
  const unsigned below = (1u << lane) - 1u;
  if (__any_sync(0xffffffffu, key >= tau)) {
    for (int j = 0; j * T + w * 32 < tiles; ++j) {
      const int c = j * T + tid;
      const bool hot = c < tiles && order_key(tmax[c]) >= tau;
      const unsigned hb = __ballot_sync(0xffffffffu, hot);
      if (hb == 0) continue;
      unsigned base = 0;
      if (lane == 0) base = atomicAdd(&ts.nhot, unsigned(__popc(hb)));
      base = __shfl_sync(0xffffffffu, base, 0);
      const unsigned pos = base + unsigned(__popc(hb & below));
      if (hot && pos < unsigned(kHotTiles)) ts.hot[pos] = c;
    }
  }
  __syncthreads();
  const unsigned nhot = ts.nhot;
  auto emit = [&](int j, uint64_t e) {
    a.values[int64_t(m) * a.k + j] = entry_value(e);
    a.ids[int64_t(m) * a.k + j] = entry_id_or_last(e);
  };
  if (nhot > unsigned(kHotTiles)) {  // the whole row, above the same tau
    const int64_t per = (a.V + T - 1) / T;
    auto for_each = [&](auto&& f) {
      for (int64_t j = 0; j < per; ++j) {
        const int64_t r = j * T + tid;
        f(r < a.V ? make_entry(lrow[r], r) : 0ull);
      }
    };
    block_select_above(for_each, tau_entry, a.k, emit, sm);
    return;
  }
  // 3b. Their logits >= tau, gathered: two tiles per warp step (lanes 0-15 the first one's 16
  // rows, lanes 16-31 the second's), every warp at once; one atomic per step.
  for (unsigned p = unsigned(w); 2 * p < nhot; p += T / 32) {
    const unsigned h = 2 * p + unsigned(lane >> 4);
    const int64_t r = h < nhot ? int64_t(ts.hot[h]) * kTileRows + (lane & 15) : a.V;
    const float v = r < a.V ? lrow[r] : -INFINITY;
    const bool take = r < a.V && order_key(v) >= tau;
    const unsigned tk = __ballot_sync(0xffffffffu, take);
    unsigned base = 0;
    if (lane == 0 && tk) base = atomicAdd(&ts.ncand, unsigned(__popc(tk)));
    base = __shfl_sync(0xffffffffu, base, 0);
    if (take) items[base + unsigned(__popc(tk & below))] = make_entry(v, r);
  }
  __syncthreads();
  const unsigned c = ts.ncand;  // >= k, unless the row has fewer than k logits
  if (c > unsigned(kRankMax)) {  // the gathered ones, above tau
    auto for_each = [&](auto&& f) {  // each thread its own candidates (gather and radix_pass count per thread)
      for (int j = tid; j < int(c); j += T) f(items[j]);
    };
    block_select_above(for_each, tau_entry, a.k, emit, sm);
    return;
  }
  // 3b. Rank by counting: candidate i's rank = the candidates above it (entries are distinct).
  {
    const int i = tid % kRankMax, part = tid / kRankMax;
    unsigned r = 0;
    if (i < int(c)) {
      const uint64_t ei = items[i];
#pragma unroll 4
      for (int j = part; j < int(c); j += kRankParts) r += items[j] > ei ? 1u : 0u;
    }
    prank[part * kRankMax + i] = r;
  }
  __syncthreads();
  if (tid < int(c)) {
    unsigned r = 0;
#pragma unroll
    for (int part = 0; part < kRankParts; ++part) r += prank[part * kRankMax + tid];
    if (r < unsigned(a.k)) emit(int(r), items[tid]);
  } else if (tid < a.k) {
    emit(tid, 0ull);  // a row of fewer than k logits
  }
}

template <int Q>
void launch_tile_select(const TileSelectArgs& a, int64_t M, int smem_bytes, int most, cudaStream_t s,
                        bool dependent) {
  allow_dynamic_smem<topk_tile_select_kernel<Q>>(most);
  launch_kernel(dependent, "topk_tile_select_kernel", topk_tile_select_kernel<Q>, dim3(unsigned(M)),
                dim3(cuda_plan::kTileThreads), size_t(smem_bytes), s, a);
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
  // The warps offer 64, 128 or 256 maxima to the bound: about 1.25 k, enough that the k-th
  // largest of them stays near the k-th largest tile max (k <= kTopkGather).
  if (k <= 51) launch_tile_select<2>(a, M, smem_bytes, most, s, dependent);
  else if (k <= 102) launch_tile_select<4>(a, M, smem_bytes, most, s, dependent);
  else launch_tile_select<8>(a, M, smem_bytes, most, s, dependent);
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
